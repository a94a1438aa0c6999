// serve internals: the generation worker and the OpenAI protocol pieces. Private to src/serve/.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/model.h"
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
};

struct GenerationResult {
  std::vector<int32_t> output;           // generated ids, stop token excluded
  std::string text;                      // decoded output, cut before a stop string
  std::string finish_reason = "length";  // "stop" | "length"
  std::vector<TokenLogprobs> prompt_logprobs;
  std::vector<TokenLogprobs> output_logprobs;  // one per kept output token
  double queue_seconds = 0.0;
  double run_seconds = 0.0;
};

// Counters shared by the worker and /metrics.
struct Metrics {
  std::atomic<int64_t> requests_waiting{0};
  std::atomic<int64_t> requests_running{0};
  std::atomic<int64_t> finished_stop{0};
  std::atomic<int64_t> finished_length{0};
  std::atomic<int64_t> failed{0};
  std::atomic<int64_t> rejected_queue_full{0};
  std::atomic<int64_t> prompt_tokens{0};
  std::atomic<int64_t> generation_tokens{0};
  std::atomic<int64_t> kv_tokens_in_use{0};
  std::atomic<int64_t> e2e_microseconds{0};
  std::atomic<int64_t> queue_microseconds{0};
  std::atomic<int64_t> e2e_count{0};
  std::atomic<int64_t> http_requests{0};
  std::atomic<int64_t> http_errors{0};
};

// One worker thread owning a Session; requests run one at a time in arrival order.
class Engine {
 public:
  Engine(const model::Model& model, const tokenizer::Tokenizer& tokenizer, const KvSetup& kv,
         int compute_threads, int max_queued, uint64_t default_seed, Metrics& metrics);
  ~Engine();  // drains the queue, then joins the worker

  // Blocks until the request ran. Throws HttpError(429) when the queue is full and
  // HttpError(503) once shutdown began.
  GenerationResult generate(GenerationRequest request);
  // Refuses new requests; those already queued still run.
  void begin_shutdown();

 private:
  struct Job;
  void worker_loop();
  GenerationResult run(const GenerationRequest& request);

  const model::Model& model_;
  const tokenizer::Tokenizer& tokenizer_;
  const KvSetup& kv_;
  ThreadPool pool_;
  std::unique_ptr<model::Session> session_;
  Metrics& metrics_;
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
};

// Qwen-style ChatML: <|im_start|>role\ncontent<|im_end|>\n ..., then <|im_start|>assistant\n.
std::string render_chat(const nlohmann::json& messages);

// Parses a /v1/completions body into a request; `echo` and `logprobs` are returned for the
// response. Throws HttpError(400) on anything malformed or out of bounds.
struct CompletionCall {
  GenerationRequest request;
  bool echo = false;
  std::string prompt_text;  // what echo prepends
};
CompletionCall parse_completion(const nlohmann::json& body, const ServedModel& served,
                                const tokenizer::Tokenizer& tokenizer);
nlohmann::json completion_response(const CompletionCall& call, const GenerationResult& result,
                                   const ServedModel& served,
                                   const tokenizer::Tokenizer& tokenizer);

struct ChatCall {
  GenerationRequest request;
};
ChatCall parse_chat(const nlohmann::json& body, const ServedModel& served,
                    const tokenizer::Tokenizer& tokenizer);
nlohmann::json chat_response(const ChatCall& call, const GenerationResult& result,
                             const ServedModel& served, const tokenizer::Tokenizer& tokenizer);

// {"error": {"message", "type", "param", "code"}}
nlohmann::json error_body(int status, const std::string& message);

// Text a token stands for in log-prob listings (its bytes, invalid UTF-8 as U+FFFD).
std::string token_text(const tokenizer::Tokenizer& tokenizer, int32_t token);

}  // namespace kvaudit::serve
