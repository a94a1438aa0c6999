// The server: start-up in SGLang's order and log format (server_args, weight loading with the
// KV scale messages, KV dtype, pool, capacity, ready), then the HTTP routes over cpp-httplib.
// Every handler answers JSON; errors are OpenAI-style {"error": {...}}; /get_server_info has
// SGLang's shape (server args flattened at the top, scheduler info, internal_states, version)
// and /metrics vLLM's cache-config info gauge, so probe/ can read either.
//
// Debian's libcpp-httplib is compiled with these (cpp-httplib.pc Cflags): the header must see
// the same ones or the library's and our idea of the class layouts differ.
#ifndef CPPHTTPLIB_OPENSSL_SUPPORT
#define CPPHTTPLIB_OPENSSL_SUPPORT 1
#endif
#ifndef CPPHTTPLIB_ZLIB_SUPPORT
#define CPPHTTPLIB_ZLIB_SUPPORT 1
#endif
#ifndef CPPHTTPLIB_BROTLI_SUPPORT
#define CPPHTTPLIB_BROTLI_SUPPORT 1
#endif
#include <httplib.h>

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <thread>

#include "serve/internal.h"
#include "util/util.h"

namespace kvaudit::serve {

namespace {

using nlohmann::json;
constexpr const char* kSglangReady = "The server is fired up and ready to roll!";

std::string timestamp() {
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%d %H:%M:%S", &local);
  return buffer;
}

// Python repr of a str.
std::string py_str(const std::string& text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\\' || c == '\'') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "'";
}

std::string gib(double bytes) {
  return gib_text(bytes);
}

std::vector<int32_t> eos_ids(const checkpoint::ModelFacts& facts,
                             const tokenizer::Tokenizer& tokenizer) {
  std::vector<int32_t> ids;
  auto add = [&](int64_t id) {
    if (id >= 0 && std::find(ids.begin(), ids.end(), id) == ids.end())
      ids.push_back(static_cast<int32_t>(id));
  };
  if (auto id = tokenizer.config().eos_token_id) add(*id);
  json config = json::parse(read_text_file(facts.config_file, 16 << 20), nullptr, false);
  if (config.is_object() && config.contains("eos_token_id")) {
    const json& eos = config["eos_token_id"];
    if (eos.is_number_integer()) add(eos.get<int64_t>());
    if (eos.is_array())
      for (const auto& id : eos)
        if (id.is_number_integer()) add(id.get<int64_t>());
  }
  return ids;
}

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

json parse_body(const httplib::Request& req) {
  json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded()) throw HttpError(400, "the request body is not valid JSON");
  return body;
}

// POST /tokenize: the ids of 'prompt' (vLLM), 'text' (SGLang) or the rendered 'messages'.
json tokenize_response(const json& body, tokenizer::Tokenizer& tokenizer,
                       const ServedModel& served) {
  if (!body.is_object()) throw HttpError(400, "the request body must be a JSON object");
  bool add_special = !body.contains("add_special_tokens") ||
                     !body["add_special_tokens"].is_boolean() ||
                     body["add_special_tokens"].get<bool>();
  std::string text;
  if (body.contains("prompt") && body["prompt"].is_string())
    text = body["prompt"];
  else if (body.contains("text") && body["text"].is_string())
    text = body["text"];
  else if (body.contains("messages"))
    text = render_chat(body["messages"]);
  else
    throw HttpError(400, "give 'prompt' (vLLM), 'text' (SGLang) or 'messages' as a string");
  auto ids = tokenizer.encode(text, {.add_special_tokens = add_special});
  return {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", served.max_model_len}};
}

// POST /detokenize: the text of 'tokens' (ids inside the vocabulary).
json detokenize_response(const json& body, tokenizer::Tokenizer& tokenizer,
                         const ServedModel& served) {
  if (!body.is_object() || !body.contains("tokens") || !body["tokens"].is_array())
    throw HttpError(400, "give 'tokens' as a list of token ids");
  std::vector<int32_t> ids;
  for (const auto& id : body["tokens"]) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= served.vocab_size)
      throw HttpError(400, "'tokens' must hold ids inside the vocabulary");
    ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return {{"prompt", tokenizer.decode(ids)}};
}

}  // namespace

struct Server::Impl {
  const engines::Registry* registry = nullptr;
  ServeOptions options;
  LogSink log;
  checkpoint::ModelFacts facts;
  std::unique_ptr<model::Model> model;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  KvSetup kv;
  PoolPlan pool;
  ServedModel served;
  Metrics metrics;
  std::unique_ptr<Engine> engine;
  httplib::Server http;
  int port = -1;
  std::atomic<bool> stopping{false};
  std::atomic<bool> run_entered{false}, run_returned{false};
  std::atomic<int> open_streams{0};     // streamed answers still being written
  std::atomic<int64_t> streams_cut{0};  // ended before their last event (client or shutdown)
  int64_t created = 0;

  void line(const std::string& text) { log(fmt::format("[{}] {}", timestamp(), text)); }

  // (name, Python repr) in SGLang's ServerArgs order; `resolved` switches kv_cache_dtype.
  std::vector<std::pair<std::string, json>> server_args(bool resolved) const {
    auto opt = [](const std::optional<int64_t>& v) { return v ? json(*v) : json(nullptr); };
    auto str_or_null = [](const std::string& s) { return s.empty() ? json(nullptr) : json(s); };
    return {{"model_path", options.model_dir.string()},
            {"tokenizer_path", options.model_dir.string()},
            {"tokenizer_mode", "auto"},
            {"load_format", "auto"},
            {"trust_remote_code", false},
            {"context_length", opt(options.context_length)},
            {"dtype", "auto"},
            {"quantization", nullptr},
            {"quantization_param_path", str_or_null(options.quantization_param_path)},
            {"kv_cache_dtype", resolved ? kv.kv_cache_dtype : kv.requested},
            {"served_model_name", served.id},
            {"mem_fraction_static", options.mem_fraction_static},
            {"max_running_requests", 1},
            {"max_queued_requests", options.max_queued_requests},
            {"max_total_tokens", opt(options.max_total_tokens)},
            {"chunked_prefill_size", 256},
            {"max_prefill_tokens", 16384},
            {"schedule_policy", "fcfs"},
            {"page_size", pool.page_size},
            {"device", "cpu"},
            {"tp_size", 1},
            {"pp_size", 1},
            {"dp_size", 1},
            {"enable_dp_attention", false},
            {"random_seed", options.random_seed},
            {"host", options.host},
            {"port", port > 0 ? port : options.port},
            {"api_key", options.api_key.empty() ? json(nullptr) : json("<redacted>")}};
  }

  std::string server_args_repr() const {
    std::string out = "server_args=ServerArgs(";
    bool first = true;
    for (const auto& [key, value] : server_args(false)) {
      out += first ? "" : ", ";
      first = false;
      out += key + "=";
      if (value.is_null())
        out += "None";
      else if (value.is_boolean())
        out += value.get<bool>() ? "True" : "False";
      else if (value.is_string())
        out += py_str(value.get<std::string>());
      else
        out += value.dump();
    }
    return out + ")";
  }

  void start_up();
  void add_routes();
  json server_info() const;
  std::string metrics_text() const;

  using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;
  // The parts of add_routes, in registration order.
  Handler wrap(Handler handler);
  void add_info_routes();
  void add_token_routes();
  void add_generation_routes();
  void add_access_handlers();
  void record_timing(const GenerationResult& result, std::chrono::steady_clock::time_point start);
  void stream_response(httplib::Response& res, GenerationRequest request, Streaming streaming,
                       bool chat, std::chrono::steady_clock::time_point start);
};

void Server::Impl::start_up() {
  facts = checkpoint::read_checkpoint(options.model_dir);
  if (!facts.has_weights)
    throw InputError(options.model_dir.string(), "no safetensors weights to serve");
  if (options.compute_threads < 1 || options.compute_threads > 1024)
    throw InputError("--threads", "must be between 1 and 1024");
  if (options.http_threads < 1 || options.http_threads > 4096)
    throw InputError("--http-threads", "must be between 1 and 4096");
  if (options.max_queued_requests < 1)
    throw InputError("--max-queued-requests", "must be at least 1");
  if (options.max_body_bytes < 1024) throw InputError("--max-body-bytes", "must be >= 1024");
  if (options.max_tokens_limit < 1) throw InputError("--max-tokens-limit", "must be >= 1");
  kv = resolve_kv_setup(*registry, facts, options);
  const numerics::KvLayout layout = [&] {
    numerics::KvLayout l{facts.num_kv_heads, facts.head_dim};
    return l;
  }();
  pool =
      plan_pool(kv, facts.num_layers, layout.kv_heads, layout.head_dim,
                static_cast<int64_t>(facts.weight_bytes), facts.max_position_embeddings, options);
  served.id =
      options.served_model_name.empty()
          ? std::filesystem::absolute(options.model_dir).lexically_normal().filename().string()
          : options.served_model_name;
  if (served.id.empty()) served.id = options.model_dir.string();

  line(server_args_repr());
  line(fmt::format("Load weight begin. avail mem={} GB", gib(pool.total_before_load_bytes)));
  model = model::Model::load(options.model_dir);
  tokenizer = std::make_unique<tokenizer::Tokenizer>(tokenizer::Tokenizer::load(options.model_dir));
  const auto& config = model->config();
  if (config.num_layers != facts.num_layers || config.num_kv_heads != layout.kv_heads ||
      config.head_dim != layout.head_dim)
    throw InputError(options.model_dir.string(),
                     "config.json and the loaded model disagree on the KV geometry");
  line("Using model weights format ['*.safetensors']");
  for (const auto& message : kv.load_messages) line(message.text);
  line(fmt::format("Load weight end. type={}, dtype=torch.{}, avail mem={} GB, mem usage={} GB.",
                   config.architecture, facts.torch_dtype.empty() ? "bfloat16" : facts.torch_dtype,
                   gib(pool.avail_after_weights_bytes),
                   gib(static_cast<double>(pool.weight_bytes))));
  if (!kv.torch_dtype.empty()) line("Using KV cache dtype: " + kv.torch_dtype);
  const int64_t rows = pool.max_total_num_tokens + pool.page_size;
  line(fmt::format("KV Cache is allocated. #tokens: {}, K size: {} GB, V size: {} GB",
                   pool.max_total_num_tokens, gib(double(rows * pool.k_bytes_per_token)),
                   gib(double(rows * pool.v_bytes_per_token))));
  line(fmt::format("Memory pool end. avail mem={} GB", gib(pool.avail_after_pool_bytes)));

  served.max_model_len = pool.context_length;
  served.vocab_size = config.vocab_size;
  served.max_tokens_limit = options.max_tokens_limit;
  served.max_total_num_tokens = pool.max_total_num_tokens;
  served.eos_token_ids = eos_ids(facts, *tokenizer);
  engine = std::make_unique<Engine>(*model, *tokenizer, kv, options.compute_threads,
                                    options.max_queued_requests, options.random_seed, metrics);
  line(fmt::format(
      "max_total_num_tokens={}, chunked_prefill_size=256, max_prefill_tokens=16384, "
      "max_running_requests=1, context_len={}, available_gpu_mem={} GB",
      pool.max_total_num_tokens, pool.context_length, gib(pool.avail_after_pool_bytes)));
  created = std::chrono::duration_cast<std::chrono::seconds>(
                std::chrono::system_clock::now().time_since_epoch())
                .count();
}

std::string Server::Impl::metrics_text() const {
  const std::string model_label = fmt::format("model_name=\"{}\"", served.id);
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help,
                    const std::vector<std::pair<std::string, double>>& samples) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
    for (const auto& [labels, value] : samples)
      out += fmt::format("{}{{{}}} {:.6g}\n", name, labels, value);
  };
  const double blocks = static_cast<double>(pool.max_total_num_tokens / pool.page_size);
  metric("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig",
         {{fmt::format("block_size=\"{}\",cache_dtype=\"{}\",calculate_kv_scales=\"False\","
                       "enable_prefix_caching=\"False\",gpu_memory_utilization=\"{}\","
                       "is_attention_free=\"False\",num_cpu_blocks=\"None\","
                       "num_gpu_blocks=\"{}\",num_gpu_blocks_override=\"None\","
                       "sliding_window=\"None\",swap_space_bytes=\"0\",kv_format=\"{}\","
                       "scale_source=\"{}\"",
                       pool.page_size, kv.kv_cache_dtype, options.mem_fraction_static,
                       pool.max_total_num_tokens / pool.page_size, kv.format.spec,
                       engines::scale_source_name(kv.scale_source)),
           1.0}});
  metric("vllm:num_requests_running", "gauge", "Number of requests running.",
         {{model_label, double(metrics.requests_running.load())}});
  metric("vllm:num_requests_waiting", "gauge", "Number of requests waiting.",
         {{model_label, double(metrics.requests_waiting.load())}});
  metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
         {{model_label, blocks > 0 ? double(metrics.kv_tokens_in_use.load()) / blocks : 0.0}});
  metric("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
         {{model_label, double(metrics.prompt_tokens.load())}});
  metric("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
         {{model_label, double(metrics.generation_tokens.load())}});
  metric("vllm:request_success_total", "counter", "Count of successfully processed requests.",
         {{"finished_reason=\"stop\"," + model_label, double(metrics.finished_stop.load())},
          {"finished_reason=\"length\"," + model_label, double(metrics.finished_length.load())},
          {"finished_reason=\"abort\"," + model_label, double(metrics.finished_abort.load())}});
  // Summaries as sum and count (microsecond counters, written in seconds).
  auto summary = [&](const char* name, const char* help, int64_t micros, int64_t count) {
    metric(name, "summary", help, {});
    out += fmt::format("{}_sum{{{}}} {:.6f}\n", name, model_label, micros / 1e6);
    out += fmt::format("{}_count{{{}}} {}\n", name, model_label, count);
  };
  summary("vllm:e2e_request_latency_seconds",
          "End-to-end request latency in seconds (sum and count).", metrics.e2e_microseconds.load(),
          metrics.e2e_count.load());
  summary("vllm:time_to_first_token_seconds",
          "Time from arrival to the first output token, in seconds (sum and count).",
          metrics.ttft_microseconds.load(), metrics.ttft_count.load());
  summary("vllm:request_queue_time_seconds",
          "Time spent waiting in the queue, in seconds (sum and count).",
          metrics.queue_microseconds.load(), metrics.e2e_count.load());
  metric("kvaudit:http_requests_total", "counter", "HTTP requests received.",
         {{model_label, double(metrics.http_requests.load())}});
  metric("kvaudit:http_errors_total", "counter", "HTTP responses with status >= 400.",
         {{model_label, double(metrics.http_errors.load())}});
  metric("kvaudit:requests_rejected_total", "counter", "Requests refused with 429 (queue full).",
         {{model_label, double(metrics.rejected_queue_full.load())}});
  metric("kvaudit:requests_failed_total", "counter", "Requests that failed inside the engine.",
         {{model_label, double(metrics.failed.load())}});
  return out;
}

// Counts a handler's requests and maps its exceptions to OpenAI-style error bodies.
Server::Impl::Handler Server::Impl::wrap(Handler handler) {
  return [this, handler](const httplib::Request& req, httplib::Response& res) {
    ++metrics.http_requests;
    try {
      handler(req, res);
    } catch (const HttpError& error) {
      send_json(res, error.status, error_body(error.status, error.what()));
    } catch (const InputError& error) {
      send_json(res, 400, error_body(400, error.what()));
    } catch (const std::exception& error) {
      send_json(res, 500, error_body(500, std::string("internal error: ") + error.what()));
    }
    if (res.status >= 400) ++metrics.http_errors;
  };
}

// Health, the served model, server info and the Prometheus metrics.
void Server::Impl::add_info_routes() {
  using httplib::Request;
  using httplib::Response;
  auto health = wrap([this](const Request&, Response& res) {
    res.status = stopping ? 503 : 200;
    res.set_content("", "text/plain");
  });
  http.Get("/health", health);
  http.Get("/health_generate", health);
  http.Get("/v1/models", wrap([this](const Request&, Response& res) {
             send_json(res, 200,
                       {{"object", "list"},
                        {"data", json::array({{{"id", served.id},
                                               {"object", "model"},
                                               {"created", created},
                                               {"owned_by", "kvaudit"},
                                               {"root", options.model_dir.string()},
                                               {"parent", nullptr},
                                               {"max_model_len", served.max_model_len}}})}});
           }));
  http.Get("/get_model_info", wrap([this](const Request&, Response& res) {
             send_json(res, 200,
                       {{"model_path", options.model_dir.string()},
                        {"tokenizer_path", options.model_dir.string()},
                        {"is_generation", true}});
           }));
  http.Get("/get_server_info",
           wrap([this](const Request&, Response& res) { send_json(res, 200, server_info()); }));
  http.Get("/metrics", wrap([this](const Request&, Response& res) {
             res.set_content(metrics_text(), "text/plain; version=0.0.4; charset=utf-8");
           }));
}

// /tokenize and /detokenize with the served tokenizer.
void Server::Impl::add_token_routes() {
  using httplib::Request;
  using httplib::Response;
  http.Post("/tokenize", wrap([this](const Request& req, Response& res) {
              send_json(res, 200, tokenize_response(parse_body(req), *tokenizer, served));
            }));
  http.Post("/detokenize", wrap([this](const Request& req, Response& res) {
              send_json(res, 200, detokenize_response(parse_body(req), *tokenizer, served));
            }));
}

// Adds one generation's end-to-end and queue time to the metrics.
void Server::Impl::record_timing(const GenerationResult& result,
                                 std::chrono::steady_clock::time_point start) {
  auto micros = std::chrono::duration_cast<std::chrono::microseconds>(
                    std::chrono::steady_clock::now() - start)
                    .count();
  metrics.e2e_microseconds += micros;
  metrics.queue_microseconds += static_cast<int64_t>(result.queue_seconds * 1e6);
  ++metrics.e2e_count;
}

// /v1/completions and /v1/chat/completions through the engine (refused while stopping).
void Server::Impl::add_generation_routes() {
  using httplib::Request;
  using httplib::Response;
  auto refuse_when_stopping = [this] {
    if (stopping) throw HttpError(503, "The server is shutting down.");
  };
  http.Post("/v1/completions",
            wrap([this, refuse_when_stopping](const Request& req, Response& res) {
              auto start = std::chrono::steady_clock::now();
              refuse_when_stopping();
              CompletionCall call = parse_completion(parse_body(req), served, *tokenizer);
              if (call.streaming.enabled)
                return stream_response(res, std::move(call.request), call.streaming, false, start);
              GenerationResult result = engine->generate(call.request);
              record_timing(result, start);
              send_json(res, 200, completion_response(call, result, served, *tokenizer));
            }));
  http.Post("/v1/chat/completions",
            wrap([this, refuse_when_stopping](const Request& req, Response& res) {
              auto start = std::chrono::steady_clock::now();
              refuse_when_stopping();
              ChatCall call = parse_chat(parse_body(req), served, *tokenizer);
              if (call.streaming.enabled)
                return stream_response(res, std::move(call.request), call.streaming, true, start);
              GenerationResult result = engine->generate(call.request);
              record_timing(result, start);
              send_json(res, 200, chat_response(call, result, served, *tokenizer));
            }));
}

namespace {

// Writes one streamed answer's events as the worker publishes text: the chat role event
// first, a text event whenever new settled text is there (several tokens' text merge when
// the client reads slower than the engine generates), then the last event with the
// finish_reason, the usage event when asked, and [DONE]. httplib calls step() until done;
// each call waits at most kPoll, so a shutdown check runs between calls. A failed write
// means the client left: the worker is told to stop generating.
struct StreamWriter {
  static constexpr std::chrono::milliseconds kPoll{250};

  std::shared_ptr<TokenStream> stream;
  StreamIds ids;
  const ServedModel& served;
  int64_t prompt_tokens = 0;
  Streaming streaming;
  std::function<void(const GenerationResult&)> on_done;
  std::atomic<int>& open_streams;
  std::atomic<int64_t>& streams_cut;
  bool role_sent = false;
  bool done = false;

  ~StreamWriter() {
    if (!done) {
      stream->cancelled = true;
      ++streams_cut;
    }
    --open_streams;
  }

  bool write(httplib::DataSink& sink, const std::string& event) {
    if (sink.write(event.data(), event.size())) return true;
    stream->cancelled = true;
    return false;
  }

  bool step(httplib::DataSink& sink) {
    if (ids.chat && !role_sent) {
      role_sent = true;
      return write(sink, sse_event(role_chunk(ids, served)));
    }
    std::string text;
    bool finished = false;
    {
      std::unique_lock<std::mutex> lock(stream->mutex);
      stream->changed.wait_for(lock, kPoll,
                               [&] { return !stream->text.empty() || stream->finished; });
      text.swap(stream->text);
      finished = stream->finished;
    }
    if (!finished)
      return text.empty() || write(sink, sse_event(text_chunk(ids, served, text, nullptr)));
    std::string tail;
    if (!stream->error.empty()) {
      if (!text.empty()) tail += sse_event(text_chunk(ids, served, text, nullptr));
      tail += sse_event(error_body(500, "internal error: " + stream->error));
    } else {
      const GenerationResult& result = stream->result;
      tail += sse_event(text_chunk(ids, served, text, result.finish_reason));
      if (streaming.include_usage)
        tail += sse_event(usage_chunk(ids, served, prompt_tokens, result));
    }
    tail += "data: [DONE]\n\n";
    if (!write(sink, tail)) return false;
    done = true;
    if (stream->error.empty() && on_done) on_done(stream->result);
    sink.done();
    return true;
  }
};

}  // namespace

// stream=true: admits the request (a refusal is still a JSON error with its status), then
// answers with server-sent events while the worker generates.
void Server::Impl::stream_response(httplib::Response& res, GenerationRequest request,
                                   Streaming streaming, bool chat,
                                   std::chrono::steady_clock::time_point start) {
  auto stream = std::make_shared<TokenStream>();
  const int64_t prompt_tokens = static_cast<int64_t>(request.prompt.size());
  request.stream = stream;
  engine->start(std::move(request));
  ++open_streams;
  auto writer = std::shared_ptr<StreamWriter>(new StreamWriter{
      stream, new_stream_ids(chat), served, prompt_tokens, streaming,
      [this, start](const GenerationResult& result) { record_timing(result, start); }, open_streams,
      streams_cut});
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [writer](size_t, httplib::DataSink& sink) {
    return writer->step(sink);
  });
}

// The API key check (when one is set) and JSON bodies for routing misses and the like.
void Server::Impl::add_access_handlers() {
  using httplib::Request;
  using httplib::Response;
  // --api-key: SGLang's middleware lets health checks and metrics through, nothing else.
  if (!options.api_key.empty()) {
    http.set_pre_routing_handler([this](const Request& req, Response& res) {
      if (req.path == "/health" || req.path == "/health_generate" || req.path == "/metrics")
        return httplib::Server::HandlerResponse::Unhandled;
      if (req.get_header_value("Authorization") == "Bearer " + options.api_key)
        return httplib::Server::HandlerResponse::Unhandled;
      ++metrics.http_requests;
      ++metrics.http_errors;
      send_json(res, 401,
                error_body(401, "Unauthorized: give the API key as 'Authorization: Bearer KEY'"));
      return httplib::Server::HandlerResponse::Handled;
    });
  }
  // Routing misses (404), oversized bodies (413) and the like: fill in a JSON body.
  http.set_error_handler([this](const Request&, Response& res) {
    if (!res.body.empty()) return;
    ++metrics.http_errors;
    std::string message = res.status == 404   ? "Not Found"
                          : res.status == 413 ? "Request body too large"
                                              : fmt::format("HTTP status {}", res.status);
    send_json(res, res.status, error_body(res.status, message));
  });
}

void Server::Impl::add_routes() {
  add_info_routes();
  add_token_routes();
  add_generation_routes();
  add_access_handlers();
}

Server::Server(const engines::Registry& registry, const ServeOptions& options, LogSink log)
    : impl_(std::make_unique<Impl>()) {
  impl_->registry = &registry;
  impl_->options = options;
  impl_->log = log ? std::move(log) : [](std::string_view) {};
  impl_->start_up();
  impl_->add_routes();
  const size_t threads = static_cast<size_t>(options.http_threads);
  impl_->http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  // httplib's default also sets SO_REUSEPORT, which lets a second server bind a port that is
  // in use and silently split the traffic: keep SO_REUSEADDR only.
  impl_->http.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const void*>(&yes), sizeof yes);
  });
  impl_->http.set_payload_max_length(static_cast<size_t>(options.max_body_bytes));
  impl_->http.set_tcp_nodelay(true);
  impl_->http.set_keep_alive_max_count(1 << 20);
  impl_->http.set_keep_alive_timeout(2);  // bounds how long a drain waits for idle clients
  impl_->http.set_read_timeout(30);
  impl_->http.set_write_timeout(30);
}

Server::~Server() {
  stop();
  impl_->engine.reset();  // drains anything still queued
}

int Server::bind() {
  Impl& s = *impl_;
  if (s.options.port == 0) {
    s.port = s.http.bind_to_any_port(s.options.host);
  } else if (s.options.port > 0 && s.options.port < 65536 &&
             s.http.bind_to_port(s.options.host, s.options.port)) {
    s.port = s.options.port;
  } else {
    s.port = -1;
  }
  if (s.port <= 0)
    throw InputError(fmt::format("{}:{}", s.options.host, s.options.port),
                     "cannot listen here (address in use, or not an address of this machine)");
  return s.port;
}

void Server::run() {
  Impl& s = *impl_;
  if (s.port <= 0) bind();
  s.log(fmt::format("INFO:     Uvicorn running on http://{}:{} (Press CTRL+C to quit)",
                    s.options.host, s.port));
  s.line(fmt::format("{} Serving {} on http://{}:{}", kSglangReady, s.served.id, s.options.host,
                     s.port));
  s.run_entered = true;
  if (!s.stopping) s.http.listen_after_bind();
  s.run_returned = true;
  // Handler threads have finished; the engine has nothing left in flight.
  s.engine->begin_shutdown();
  if (const int64_t cut = s.streams_cut.load(); cut > 0)
    s.line(
        fmt::format("Shutdown complete: {} streamed answer(s) ended early because their "
                    "client went away; every other accepted request was answered.",
                    cut));
  else
    s.line("Shutdown complete: every accepted request was answered.");
}

void Server::stop() {
  Impl& s = *impl_;
  s.stopping = true;
  // run() may sit between its `stopping` check and httplib's listen loop, where http.stop()
  // would be lost: give it a moment to start listening first.
  for (int i = 0; i < 2000 && s.run_entered && !s.run_returned && !s.http.is_running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // httplib ends chunked answers as soon as it stops: let accepted streams finish first. Each
  // is bounded (max_tokens, and a client that stops reading fails a write within the write
  // timeout), and new requests are refused meanwhile.
  while (s.open_streams > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  s.http.stop();
}

int Server::port() const {
  return impl_->port;
}
const PoolPlan& Server::pool() const {
  return impl_->pool;
}

json Server::server_info() const {
  return impl_->server_info();
}

json Server::Impl::server_info() const {
  const Impl& s = *this;
  json args = json::object();
  for (const auto& [key, value] : s.server_args(true)) args[key] = value;
  json info = args;
  info["kv_cache_dtype_requested"] = s.kv.requested;
  info["status"] = "ready";
  info["max_total_num_tokens"] = s.pool.max_total_num_tokens;
  info["max_req_input_len"] = s.pool.max_req_input_len;
  json state = args;
  state["last_gen_throughput"] = 0.0;
  state["memory_usage"] = {
      {"weight", std::round(s.pool.weight_bytes / kBytesPerGiB * 100) / 100},
      {"kvcache", std::round(double((s.pool.max_total_num_tokens + s.pool.page_size) *
                                    s.pool.cell_bytes_per_token) /
                             kBytesPerGiB * 100) /
                      100},
      {"token_capacity", s.pool.max_total_num_tokens}};
  state["waiting_queue_size"] = s.metrics.requests_waiting.load();
  state["running_batch_size"] = s.metrics.requests_running.load();
  info["internal_states"] = json::array({state});
  info["version"] = s.kv.engine_version;
  info["kvaudit"] = {{"engine_emulated", kEmulatedEngine},
                     {"kv_format", s.kv.format.spec},
                     {"scale_source", engines::scale_source_name(s.kv.scale_source)},
                     {"k_scales", s.kv.k_scales},
                     {"v_scales", s.kv.v_scales},
                     {"resolution_rule", s.kv.resolved.rule_id},
                     {"cell_bytes_per_token", s.pool.cell_bytes_per_token},
                     {"context_length", s.pool.context_length}};
  return info;
}

}  // namespace kvaudit::serve
