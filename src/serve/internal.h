// serve internals: the generation worker and the OpenAI protocol pieces. Private to src/serve/.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/model.h"
#include "serve/prefix_cache.h"
#include "serve/serve.h"
#include "tokenizer/tokenizer.h"

namespace kvaudit::serve {

// Thrown by request parsing and admission; the HTTP layer turns it into {"error": ...}.
struct HttpError : std::runtime_error {
  HttpError(int status_code, const std::string& message)
      : std::runtime_error(message), status(status_code) {}
  int status;
};

// ---------------------------------------------------------------- generation

struct TopLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct TokenLogprobs {
  int32_t token = 0;
  std::optional<float> logprob;  // null for the first prompt token (nothing predicts it)
  std::vector<TopLogprob> top;   // the `top_logprobs` most likely, best first
};

struct TokenStream;

struct GenerationRequest {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 16;
  double temperature = 1.0;  // 0: greedy
  double top_p = 1.0;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;        // strings that end generation (excluded from text)
  std::vector<int32_t> stop_token_ids;  // EOS and friends (the token is not part of the text)
  int top_logprobs = -1;                // -1: no log-probs; else how many alternatives
  bool prompt_logprobs = false;         // also score the prompt tokens (echo + logprobs)
  // Set for stream=true: the worker publishes the text here as it goes (see Engine::start).
  std::shared_ptr<TokenStream> stream;
};

struct GenerationResult {
  std::vector<int32_t> output;           // generated ids, stop token excluded
  std::string text;                      // decoded output, cut before a stop string
  std::string finish_reason = "length";  // "stop" | "length" | "abort" (the client left)
  std::vector<TokenLogprobs> prompt_logprobs;
  std::vector<TokenLogprobs> output_logprobs;  // one per kept output token
  double queue_seconds = 0.0;
  double run_seconds = 0.0;
  int64_t cached_tokens = 0;  // prompt tokens restored from the prefix cache
  CacheTier cached_tier = CacheTier::device;
};

// A streamed request's output as the worker produces it, taken by the HTTP thread that
// writes the server-sent events. Only text that can no longer change is published: never the
// bytes of a character still being completed by the next token, never a tail that could be
// the start of a stop string (the final text is cut before the stop string). So what the
// stream sends, concatenated, is exactly the non-streamed answer's text.
struct TokenStream {
  std::mutex mutex;
  std::condition_variable changed;
  std::string text;       // published, not yet taken by the writer
  bool finished = false;  // `result` (or `error`) is final
  GenerationResult result;
  std::string error;                   // the engine failed: what to tell the client
  std::atomic<bool> cancelled{false};  // the client went away: stop generating
  size_t published_bytes = 0;          // worker only: bytes of the output text published
};

// How many leading bytes of `text` (the decoded output so far) a stream may send: it stops
// before a trailing U+FFFD (a character whose other bytes may come with the next token) and
// before the longest tail that is a proper prefix of one of the stop strings.
size_t streamable_prefix(std::string_view text, const std::vector<std::string>& stop);

// Counters shared by the worker and /metrics.
struct Metrics {
  std::atomic<int64_t> requests_waiting{0};
  std::atomic<int64_t> requests_running{0};
  std::atomic<int64_t> finished_stop{0};
  std::atomic<int64_t> finished_length{0};
  std::atomic<int64_t> finished_abort{0};  // streams whose client went away
  std::atomic<int64_t> failed{0};
  std::atomic<int64_t> rejected_queue_full{0};
  std::atomic<int64_t> prompt_tokens{0};
  std::atomic<int64_t> generation_tokens{0};
  std::atomic<int64_t> kv_tokens_in_use{0};
  std::atomic<int64_t> e2e_microseconds{0};
  std::atomic<int64_t> queue_microseconds{0};
  std::atomic<int64_t> e2e_count{0};
  std::atomic<int64_t> ttft_microseconds{0};  // queued -> first output token sampled
  std::atomic<int64_t> ttft_count{0};
  std::atomic<int64_t> http_requests{0};
  std::atomic<int64_t> http_errors{0};
};

// One worker thread owning a Session; requests run one at a time in arrival order.
class Engine {
 public:
  // `prefix_cache` (may be null: none) outlives the engine.
  Engine(const model::Model& model, const tokenizer::Tokenizer& tokenizer, const KvSetup& kv,
         int compute_threads, int max_queued, uint64_t default_seed, Metrics& metrics,
         PrefixCache* prefix_cache = nullptr);
  ~Engine();  // drains the queue, then joins the worker

  // Blocks until the request ran. Throws HttpError(429) when the queue is full and
  // HttpError(503) once shutdown began.
  GenerationResult generate(GenerationRequest request);
  // Queues a streamed request (request.stream set) and returns at once; the worker fills the
  // stream and marks it finished. Throws like generate() when the request is not admitted.
  void start(GenerationRequest request);
  // Refuses new requests; those already queued still run.
  void begin_shutdown();

 private:
  struct Job;
  std::shared_ptr<Job> admit(GenerationRequest request);  // queues it, or throws 429/503
  void worker_loop();
  GenerationResult run(const GenerationRequest& request,
                       std::chrono::steady_clock::time_point queued_at);
  // Publishes the stable part of the output so far to a streamed request.
  void publish(TokenStream& stream, const std::string& text,
               const std::vector<std::string>& stop) const;

  const model::Model& model_;
  const tokenizer::Tokenizer& tokenizer_;
  const KvSetup& kv_;
  ThreadPool pool_;
  std::unique_ptr<model::Session> session_;
  Metrics& metrics_;
  PrefixCache* prefix_cache_;
  int max_queued_;
  uint64_t default_seed_;
  std::atomic<uint64_t> unseeded_requests_{0};

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> queue_;
  int64_t in_system_ = 0;  // queued + running
  bool shutting_down_ = false;
  std::thread worker_;
};

// Next token from logits: argmax (ties: lowest id) when temperature is 0, else a draw from
// softmax(logits / temperature) restricted to the top_p nucleus, with `random` in [0, 1).
int32_t sample_token(const std::vector<float>& logits, double temperature, double top_p,
                     double random);

// ---------------------------------------------------------------- protocol

struct ServedModel {
  std::string id;
  int64_t max_model_len = 0;
  std::vector<int32_t> eos_token_ids;
  int64_t vocab_size = 0;
  int64_t max_tokens_limit = 0;
  int64_t max_total_num_tokens = 0;
  bool cache_report = false;  // --enable-cache-report
};

// Qwen-style ChatML: <|im_start|>role\ncontent<|im_end|>\n ..., then <|im_start|>assistant\n.
std::string render_chat(const nlohmann::json& messages);

// stream / stream_options.include_usage of a request. Streams carry text only: log-probs and
// echo with stream=true are refused (400).
struct Streaming {
  bool enabled = false;
  bool include_usage = false;  // a last event with usage and no choices, as OpenAI sends
};

// Parses a /v1/completions body into a request; `echo` and `logprobs` are returned for the
// response. Throws HttpError(400) on anything malformed or out of bounds.
struct CompletionCall {
  GenerationRequest request;
  bool echo = false;
  std::string prompt_text;  // what echo prepends
  Streaming streaming;
};
CompletionCall parse_completion(const nlohmann::json& body, const ServedModel& served,
                                const tokenizer::Tokenizer& tokenizer);
nlohmann::json completion_response(const CompletionCall& call, const GenerationResult& result,
                                   const ServedModel& served,
                                   const tokenizer::Tokenizer& tokenizer);

struct ChatCall {
  GenerationRequest request;
  Streaming streaming;
};
ChatCall parse_chat(const nlohmann::json& body, const ServedModel& served,
                    const tokenizer::Tokenizer& tokenizer);
nlohmann::json chat_response(const ChatCall& call, const GenerationResult& result,
                             const ServedModel& served, const tokenizer::Tokenizer& tokenizer);

// Server-sent events of a stream, in vLLM's shapes: `text` is a completion chunk's text or a
// chat chunk's delta content; a null finish_reason until the last chunk.
struct StreamIds {
  std::string id;  // one per response: "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;
  bool chat = false;
};
StreamIds new_stream_ids(bool chat);
// "data: <json>\n\n"
std::string sse_event(const nlohmann::json& data);
// The chat stream's first event: delta {"role": "assistant", "content": ""}.
nlohmann::json role_chunk(const StreamIds& ids, const ServedModel& served);
nlohmann::json text_chunk(const StreamIds& ids, const ServedModel& served, const std::string& text,
                          const nlohmann::json& finish_reason);
nlohmann::json usage_chunk(const StreamIds& ids, const ServedModel& served, int64_t prompt_tokens,
                           const GenerationResult& result);

// {"error": {"message", "type", "param", "code"}}
nlohmann::json error_body(int status, const std::string& message);

// Text a token stands for in log-prob listings (its bytes, invalid UTF-8 as U+FFFD).
std::string token_text(const tokenizer::Tokenizer& tokenizer, int32_t token);

}  // namespace kvaudit::serve
