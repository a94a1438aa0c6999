// net: the HTTP client kvaudit uses to talk to live servers, and the OpenAI-style
// protocol on top of it: URL parsing, timeouts, retries with exponential backoff
// (honouring Retry-After) on 429/5xx and connection failures, a concurrency limit,
// bearer-token auth, typed request/response structs with strict parsing, and the
// Prometheus text format (vLLM's /metrics). Every failure becomes one RequestError
// naming the URL and the problem; nothing here prints, exits or decides what a
// server's answers mean (that is probe/).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "util/util.h"

namespace kvaudit::net {

// ---------------------------------------------------------------- URLs

struct Url {
  std::string scheme;        // "http" | "https"
  std::string host;          // "127.0.0.1", "example.com", "::1" (no brackets)
  int port = 0;              // explicit, or 80 / 443 by scheme
  std::string base_path;     // "" or "/prefix" (no trailing slash); "/v1" is dropped
  std::string text() const;  // "http://127.0.0.1:8000/prefix"
};
// Accepts "http://host:port/path", "https://host", "host:port" (http assumed) and
// "[::1]:8000". Throws InputError(text, problem) for anything else.
Url parse_url(std::string_view text);

// ---------------------------------------------------------------- client

struct ClientOptions {
  std::string api_key;  // sent as "Authorization: Bearer KEY" when non-empty
  std::chrono::milliseconds connect_timeout{10'000};
  std::chrono::milliseconds read_timeout{600'000};  // longest silence while waiting for bytes
  int max_retries = 4;  // extra attempts after the first, on 429/5xx/connection/timeouts
  std::chrono::milliseconds backoff_initial{500};  // doubles each retry
  std::chrono::milliseconds backoff_max{30'000};   // also caps Retry-After
  int max_concurrency = 4;                         // requests in flight at once, per client
  uint64_t max_response_bytes = 256ull << 20;      // larger answers are refused
  bool verify_tls = true;                          // false: --insecure
  std::string ca_cert_file;                        // extra CA bundle for https
};

// KVAUDIT_API_KEY, then OPENAI_API_KEY, else "".
std::string api_key_from_environment();

// What went wrong, so callers can tell "the server is gone" from "it said no".
enum class FailureKind {
  dns,        // the host name does not resolve
  refused,    // nothing listens (or the connection was reset before an answer)
  timeout,    // connect or read timeout
  tls,        // handshake or certificate failure
  http,       // an HTTP error status after retries
  malformed,  // the body is not what the protocol promises
  too_large,  // the body exceeds max_response_bytes
  // The server answers but makes no progress: no tokens for a non-empty text, a
  // completion of zero tokens. Retrying would loop forever, so callers stop.
  no_progress,
};

class RequestError : public InputError {
 public:
  RequestError(std::string where, std::string problem, FailureKind kind, int status = 0);
  FailureKind kind() const { return kind_; }
  int status() const { return status_; }  // HTTP status for kind http, else 0
  // True when the server itself is unreachable or failing (not a refusal of one request):
  // a run should stop and keep what it finished.
  bool server_unavailable() const;

 private:
  FailureKind kind_;
  int status_;
};

struct HttpResponse {
  int status = 0;
  std::string body;
  std::string content_type;
  int attempts = 1;                            // 1 + retries used
  std::map<std::string, std::string> headers;  // response headers, names in lower case
  bool body_cut = false;                       // reading stopped at the request's stop_after_bytes
  std::string header(const std::string& lower_case_name) const {
    auto it = headers.find(lower_case_name);
    return it == headers.end() ? "" : it->second;
  }
};

// A GET with request headers of its own (Range, Accept-Encoding) and a limit after which
// the client stops reading the body without failing (a server that ignores Range).
struct GetRequest {
  std::string path;  // may carry a query string
  std::vector<std::pair<std::string, std::string>> headers;
  uint64_t stop_after_bytes = 0;  // 0: read it all (up to max_response_bytes)
  // When set, a success body is handed over piece by piece as it arrives instead of being
  // kept (an error body is still kept: it is the message); returning false stops reading.
  // Once a piece was delivered the request is not retried (the caller saw part of it).
  std::function<bool(std::string_view piece)> on_body_piece;
};

// Counts of what the client did (for tests and the report).
struct ClientStats {
  int64_t requests = 0;  // logical requests
  int64_t attempts = 0;  // HTTP attempts including retries
  int64_t retries = 0;
  int64_t connections = 0;  // TCP (or TLS) connections opened: keep-alive reuses them
};

// Thread-safe: a counting semaphore bounds how many requests run at once, and each takes
// an idle keep-alive connection from a pool (at most one per slot); a connection that
// failed is dropped, not reused.
class Client {
 public:
  Client(Url url, ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const Url& url() const { return url_; }
  const ClientOptions& options() const { return options_; }

  // One request with retries. Returns the final answer whatever its status (a 404 is an
  // answer); throws RequestError for transport failures once retries are spent, and for
  // 429/5xx that persist after retries (kind http).
  HttpResponse get(std::string_view path);
  HttpResponse get(const GetRequest& request);
  HttpResponse post_json(std::string_view path, const nlohmann::json& body);
  // A POST whose success body streams to on_piece as it arrives (server-sent events; the
  // Accept header asks for text/event-stream). Retries as post_json until the first piece.
  HttpResponse post_stream(std::string_view path, const nlohmann::json& body,
                           const std::function<bool(std::string_view piece)>& on_piece,
                           std::string_view accept = "text/event-stream");

  // As above, but a non-2xx status throws RequestError(kind http) with the server's
  // OpenAI-style error message, and the body must parse as JSON (kind malformed).
  nlohmann::json get_json(std::string_view path);
  nlohmann::json post_json_checked(std::string_view path, const nlohmann::json& body);

  ClientStats stats() const;
  std::string where(std::string_view path) const;  // "http://host:port/path" for messages

 private:
  HttpResponse send(const std::string& method, std::string_view path, const std::string* body,
                    const GetRequest* extra = nullptr);
  struct Connection;
  std::unique_ptr<Connection> take_connection();
  void give_back(std::unique_ptr<Connection> connection);
  struct State;
  Url url_;
  ClientOptions options_;
  std::unique_ptr<State> state_;
};

// The message of an OpenAI-style error body ({"error": {"message"}} or vLLM/SGLang's
// flat {"object": "error", "message"}), or a short excerpt of the body.
std::string error_message_of(std::string_view body);

// Parses Retry-After: delta-seconds only (HTTP dates are ignored), nullopt when absent.
std::optional<std::chrono::milliseconds> parse_retry_after(std::string_view value);

// ---------------------------------------------------------------- OpenAI protocol

struct TopLogprob {
  std::string token;
  double logprob = 0.0;
};

// One generated (or echoed) token with its log-prob and the top alternatives.
struct TokenLogprob {
  std::string token;
  std::optional<double> logprob;  // null for the first echoed token
  std::vector<TopLogprob> top;    // most likely first
  int64_t text_offset = -1;       // byte offset into prompt+completion (legacy format)
};

struct CompletionRequest {
  std::string model;
  std::string prompt;  // used when prompt_ids is empty
  std::vector<int32_t> prompt_ids;
  int64_t max_tokens = 16;
  double temperature = 0.0;  // 0: greedy
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool echo = false;
  int logprobs = 0;  // 0: none; N: N alternatives per token (legacy "logprobs": N)
};

struct ChatMessage {
  std::string role;
  std::string content;
};

struct ChatRequest {
  std::string model;
  std::vector<ChatMessage> messages;
  int64_t max_tokens = 16;
  double temperature = 0.0;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  int top_logprobs = 0;  // 0: no logprobs; N: logprobs=true, top_logprobs=N
};

// A completion or chat answer, reduced to what the probes read.
struct Completion {
  std::string text;
  std::string finish_reason;
  std::string model;
  bool has_logprobs = false;
  std::vector<TokenLogprob> tokens;  // echo: prompt tokens first
  std::optional<int64_t> prompt_tokens;
  std::optional<int64_t> completion_tokens;
  // Prompt tokens the server's prefix cache served, when it says, and the field that said.
  std::optional<int64_t> cached_tokens;
  std::string cached_tokens_field;
};

nlohmann::json to_json(const CompletionRequest& request);
nlohmann::json to_json(const ChatRequest& request);
// Strict parsers: a missing or mistyped field throws RequestError(kind malformed) naming
// `where` and the JSON path.
Completion parse_completion(const nlohmann::json& body, const std::string& where);
Completion parse_chat_completion(const nlohmann::json& body, const std::string& where);

struct ModelCard {
  std::string id;
  std::string owned_by;
  std::optional<int64_t> max_model_len;  // vLLM
  std::string root;                      // vLLM: the path or repo served
};
std::vector<ModelCard> parse_model_list(const nlohmann::json& body, const std::string& where);

struct Tokenized {
  std::vector<int32_t> ids;
  std::optional<int64_t> max_model_len;
};
// {"tokens": [ids]} (every engine) or llama-server's with_pieces [{id, piece}]; "count"
// and "max_model_len" (vLLM) are checked / read when present.
Tokenized parse_tokenize(const nlohmann::json& body, const std::string& where);
// /detokenize's text: "prompt" (vLLM), "content" (llama-server) or "text" (SGLang).
std::string parse_detokenize(const nlohmann::json& body, const std::string& where);

// Calls on a client.
Completion complete(Client& client, const CompletionRequest& request);
Completion chat(Client& client, const ChatRequest& request);
std::vector<ModelCard> list_models(Client& client);

// A server's /tokenize and /detokenize in whichever dialect it speaks, found on first use
// and kept: {"prompt"} (vLLM, SGLang), {"content"} (llama.cpp's llama-server, which
// answers {"tokens": []} to {"prompt"}), {"text"} (older SGLang), /v1/tokenize. A dialect
// that returns no tokens for a non-empty text is not the server's: the next is tried.
// Thread-safe.
class Tokenizer {
 public:
  Tokenizer(Client& client, std::string model);
  // nullopt: no tokenizer endpoint (404/405/400/422 in every dialect). Throws
  // RequestError(kind no_progress) when every dialect that answers returns no tokens for a
  // non-empty text, and once a dialect is known, when it does so for any text.
  std::optional<Tokenized> tokenize(std::string_view text);
  // The text of `ids` (vLLM {"prompt"}, llama-server {"content"}, SGLang {"text"}); nullopt
  // when the server has no /detokenize.
  std::optional<std::string> detokenize(const std::vector<int32_t>& ids);
  std::string dialect() const;  // e.g. "POST /tokenize {\"content\"}"; "" before one is known

 private:
  Client& client_;
  std::string model_;
  mutable std::mutex mutex_;
  int form_ = -1;  // index of the dialect that worked
};

// One tokenize call with a throwaway Tokenizer (detection, tests).
std::optional<Tokenized> tokenize(Client& client, std::string_view text,
                                  const std::string& model = "");

// ---------------------------------------------------------------- server-sent events

// A streamed answer (text/event-stream) read as it arrives: feed() the body piece by piece;
// each complete "data:" line goes to on_data without its prefix and leading spaces (other
// fields and comments are skipped). A line longer than max_line_bytes throws
// RequestError(malformed): a server that never ends a line cannot grow memory unboundedly.
class SseParser {
 public:
  SseParser(std::string where, std::function<void(std::string_view data)> on_data,
            size_t max_line_bytes = 1 << 20);
  void feed(std::string_view piece);

 private:
  std::string where_;
  std::function<void(std::string_view)> on_data_;
  size_t max_line_bytes_;
  std::string line_;
};

// ---------------------------------------------------------------- Prometheus text

struct MetricSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0.0;
};
// Parses the Prometheus text exposition format (comments and blank lines skipped;
// escaped label values \\, \", \n). A malformed line throws InputError(where, "line N: ...").
std::vector<MetricSample> parse_prometheus(std::string_view text, const std::string& where);

}  // namespace kvaudit::net
