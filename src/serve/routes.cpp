// serve's HTTP routes over cpp-httplib: health, models, server info, /metrics (vLLM's
// cache-config info gauge, so probe/ can read it), /tokenize and /detokenize, the OpenAI
// completions endpoints, the API key check and JSON error bodies ({"error": {...}}).
#include <fmt/format.h>
#include <openssl/crypto.h>

#include <chrono>
#include <utility>

#include "serve/server_impl.h"
#include "util/util.h"

namespace kvaudit::serve {

using nlohmann::json;

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

namespace {

// "Bearer KEY" compared in time that does not depend on where the first difference lies (as
// SGLang's and vLLM's secrets.compare_digest), so the key cannot be guessed byte by byte from
// response times; only its length shows.
bool bearer_matches(const std::string& authorization, const std::string& api_key) {
  const std::string expected = "Bearer " + api_key;
  return authorization.size() == expected.size() &&
         CRYPTO_memcmp(authorization.data(), expected.data(), expected.size()) == 0;
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

std::string Server::Impl::metrics_text() const {
  const std::string model_label = fmt::format("model_name=\"{}\"", served.id);
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help,
                    const std::vector<std::pair<std::string, double>>& samples) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
    for (const auto& [labels, value] : samples)
      out += fmt::format("{}{{{}}} {:.6g}\n", name, labels, value);
  };
  const int64_t blocks = pool.max_total_num_tokens / pool.page_size;  // whole pages
  metric("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig",
         {{fmt::format("block_size=\"{}\",cache_dtype=\"{}\",calculate_kv_scales=\"False\","
                       "enable_prefix_caching=\"{}\",gpu_memory_utilization=\"{}\","
                       "is_attention_free=\"False\",num_cpu_blocks=\"None\","
                       "num_gpu_blocks=\"{}\",num_gpu_blocks_override=\"None\","
                       "sliding_window=\"None\",swap_space_bytes=\"0\",kv_format=\"{}\","
                       "scale_source=\"{}\"",
                       pool.page_size, kv.kv_cache_dtype, prefix_cache ? "True" : "False",
                       options.mem_fraction_static, blocks, kv.format.spec,
                       engines::scale_source_name(kv.scale_source)),
           1.0}});
  metric("vllm:num_requests_running", "gauge", "Number of requests running.",
         {{model_label, double(metrics.requests_running.load())}});
  metric("vllm:num_requests_waiting", "gauge", "Number of requests waiting.",
         {{model_label, double(metrics.requests_waiting.load())}});
  // Tokens in use over the pool's tokens (whole pages), not over its page count.
  const double pool_tokens = double(blocks) * double(pool.page_size);
  const double usage =
      pool_tokens > 0 ? double(metrics.kv_tokens_in_use.load()) / pool_tokens : 0.0;
  metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
         {{model_label, usage}});
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
  if (prefix_cache) {
    // vLLM's names: hits in the device pool, and in a tier behind it ("external": vLLM
    // counts its KV connectors' hits there; here, the host tier's).
    const PrefixCacheCounters cache = prefix_cache->counters();
    metric("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in tokens.",
           {{model_label, double(cache.queried_tokens)}});
    metric("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in tokens.",
           {{model_label, double(cache.device_hit_tokens)}});
    if (prefix_cache->options().host_tier) {
      metric("vllm:external_prefix_cache_queries_total", "counter",
             "Host-tier prefix cache queries, in tokens.",
             {{model_label, double(cache.queried_tokens)}});
      metric("vllm:external_prefix_cache_hits_total", "counter",
             "Host-tier prefix cache hits, in tokens.",
             {{model_label, double(cache.host_hit_tokens)}});
    }
    metric("kvaudit:prefix_cache_tokens", "gauge", "Tokens the prefix cache holds, per tier.",
           {{"tier=\"device\"," + model_label, double(cache.device_tokens)},
            {"tier=\"host\"," + model_label, double(cache.host_tokens)}});
    metric("kvaudit:prefix_cache_evicted_tokens_total", "counter",
           "Tokens evicted from the device pool (to the host tier when it is on).",
           {{model_label, double(cache.evicted_tokens)}});
    metric("kvaudit:host_tier_written_tokens_total", "counter", "Tokens written to the host tier.",
           {{model_label, double(cache.host_written_tokens)}});
  }
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
  return [this, handler = std::move(handler)](const httplib::Request& req, httplib::Response& res) {
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

// The API key check (when one is set) and JSON bodies for routing misses and the like.
void Server::Impl::add_access_handlers() {
  using httplib::Request;
  using httplib::Response;
  // --api-key: SGLang's middleware lets health checks and metrics through, nothing else.
  if (!options.api_key.empty()) {
    http.set_pre_routing_handler([this](const Request& req, Response& res) {
      if (req.path == "/health" || req.path == "/health_generate" || req.path == "/metrics")
        return httplib::Server::HandlerResponse::Unhandled;
      if (bearer_matches(req.get_header_value("Authorization"), options.api_key))
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

}  // namespace kvaudit::serve
