// Engine detection: what the server says about itself, read by one adapter per server, and
// what the engine data says each server adds to a completion and counts on /metrics (for the
// load bench).
// TensorRT-LLM: /v1/models owned_by "tensorrt_llm", /version, and
// /metrics as a JSON array of iteration stats (tensorrt_llm/serve/openai_server.py); no
// route reports its KV dtype.
// SGLang: GET /server_info (older: /get_server_info) returns its ServerArgs flattened plus
// scheduler info (max_total_num_tokens) and internal_states[] (python/sglang/srt/entrypoints/
// http_server.py). vLLM: /metrics carries vllm:cache_config_info, an info gauge whose
// labels are the CacheConfig fields; /version the release; /v1/models max_model_len.
// llama.cpp's llama-server: /props (default_generation_settings.n_ctx, total_slots,
// build_info); it does not report its KV cache types (-ctk/-ctv) over HTTP at all.
#include <fmt/format.h>

#include <filesystem>

#include "audit/audit.h"
#include "engines/engines.h"
#include "probe/probe.h"
#include "util/json.h"

namespace kvaudit::probe {

using nlohmann::json;

namespace {

std::optional<int64_t> integer_of(const json& value) {
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_number_float()) {
    double number = value.get<double>();
    if (number >= 0 && number < 9e15 && number == static_cast<double>(int64_t(number)))
      return static_cast<int64_t>(number);
  }
  if (value.is_string()) {
    try {
      size_t used = 0;
      int64_t number = std::stoll(value.get<std::string>(), &used);
      if (used == value.get<std::string>().size()) return number;
    } catch (const std::exception&) {
    }
  }
  return std::nullopt;
}

}  // namespace

void read_sglang_server_info(const json& info, ServerFacts& facts, const std::string& path) {
  const std::string where = facts.url + path;
  facts.engine = "sglang";
  facts.detected_by = path;
  auto field = [&](const char* key) -> const json* {
    auto it = info.find(key);
    return it == info.end() || it->is_null() ? nullptr : &*it;
  };
  if (auto* v = field("version")) facts.engine_version = json_text(*v);
  if (auto* v = field("model_path")) facts.model_path = json_text(*v);
  if (auto* v = field("served_model_name"); v && facts.model_id.empty())
    facts.model_id = json_text(*v);
  if (auto* v = field("kv_cache_dtype")) {
    facts.kv_cache_dtype = json_text(*v);
    facts.kv_cache_dtype_source = where + " kv_cache_dtype";
    facts.evidence.push_back({where, "kv_cache_dtype", facts.kv_cache_dtype});
  }
  if (auto* v = field("quantization_param_path")) facts.quantization_param_path = json_text(*v);
  if (auto* v = field("quantization")) facts.quantization = json_text(*v);
  if (auto* v = field("dtype")) facts.dtype = json_text(*v);
  if (auto* v = field("context_length")) facts.context_length = integer_of(*v);
  if (auto* v = field("page_size")) facts.page_size = integer_of(*v);
  if (auto* v = field("tp_size"); v && integer_of(*v)) facts.tp = static_cast<int>(*integer_of(*v));
  if (auto* v = field("attention_backend"); v && v->is_string() && !v->get<std::string>().empty()) {
    facts.attention_backend = ascii_lower(v->get<std::string>());
    facts.evidence.push_back({where, "attention_backend", facts.attention_backend});
  }
  // max_total_num_tokens: scheduler info at the top level in most releases; newer ones
  // report per-DP internal states. Take the top level, else the smallest DP rank's.
  if (auto* v = field("max_total_num_tokens"); v && integer_of(*v)) {
    facts.capacity_tokens = integer_of(*v);
    facts.capacity_source = where + " max_total_num_tokens";
  } else if (auto* states = field("internal_states"); states && states->is_array()) {
    for (const auto& state : *states) {
      if (!state.is_object() || !state.contains("max_total_num_tokens")) continue;
      auto tokens = integer_of(state["max_total_num_tokens"]);
      if (tokens && (!facts.capacity_tokens || *tokens < *facts.capacity_tokens)) {
        facts.capacity_tokens = tokens;
        facts.capacity_source = where + " internal_states[].max_total_num_tokens";
      }
    }
  }
  if (facts.capacity_tokens)
    facts.evidence.push_back(
        {where, "max_total_num_tokens", with_thousands(*facts.capacity_tokens)});
  // The launch value stays at the top level after the engine caps it (sglang#38846); the
  // scheduler's own value, per DP worker, is in internal_states on newer builds.
  if (auto* v = field("max_running_requests"); v && integer_of(*v))
    facts.running_requests_launched = integer_of(*v);
  if (auto* states = field("internal_states"); states && states->is_array()) {
    int64_t total = 0;
    bool every = !states->empty();
    for (const auto& state : *states) {
      auto it =
          state.is_object() ? state.find("effective_max_running_requests_per_dp") : state.end();
      auto n = it != state.end() ? integer_of(*it) : std::nullopt;
      if (!n) {
        every = false;
        break;
      }
      total += *n;
    }
    if (every) {
      facts.running_requests_effective = total;
      facts.running_requests_source =
          where + " internal_states[].effective_max_running_requests_per_dp";
      facts.evidence.push_back({where, "effective max_running_requests", std::to_string(total)});
    }
  }
  if (!facts.quantization_param_path.empty())
    facts.evidence.push_back({where, "quantization_param_path", facts.quantization_param_path});
}

bool read_vllm_metrics(const std::vector<net::MetricSample>& samples, ServerFacts& facts) {
  const std::string where = facts.url + "/metrics";
  for (const auto& sample : samples) {
    if (sample.name != "vllm:cache_config_info") continue;
    facts.engine = "vllm";
    facts.detected_by = "/metrics vllm:cache_config_info";
    auto label = [&](const char* key) -> std::string {
      auto it = sample.labels.find(key);
      return it == sample.labels.end() ? "" : it->second;
    };
    facts.kv_cache_dtype = label("cache_dtype");
    facts.kv_cache_dtype_source = where + " vllm:cache_config_info{cache_dtype}";
    facts.evidence.push_back({where, "vllm:cache_config_info cache_dtype", facts.kv_cache_dtype});
    std::string calculate = label("calculate_kv_scales");
    facts.calculate_kv_scales = calculate == "True" || calculate == "true";
    auto block = integer_of(json(label("block_size")));
    auto blocks = integer_of(json(label("num_gpu_blocks")));
    auto size_tokens = integer_of(json(label("kv_cache_size_tokens")));
    if (block) facts.page_size = block;
    if (size_tokens) {
      facts.capacity_tokens = size_tokens;
      facts.capacity_source = where + " vllm:cache_config_info{kv_cache_size_tokens}";
    } else if (block && blocks) {
      facts.capacity_tokens = *block * *blocks;
      facts.capacity_source = where + " num_gpu_blocks x block_size";
    }
    if (facts.capacity_tokens)
      facts.evidence.push_back({where, "KV cache tokens", with_thousands(*facts.capacity_tokens)});
    return true;
  }
  return false;
}

bool read_llamacpp_props(const json& props, ServerFacts& facts) {
  if (!props.is_object() || !props.contains("default_generation_settings") ||
      !(props.contains("total_slots") || props.contains("build_info")))
    return false;
  const std::string where = facts.url + "/props";
  facts.engine = "llama.cpp";
  facts.detected_by = "/props";
  if (auto it = props.find("build_info"); it != props.end() && it->is_string())
    facts.engine_version = it->get<std::string>();
  if (auto it = props.find("model_path"); it != props.end() && it->is_string())
    facts.model_path = it->get<std::string>();
  if (auto it = props.find("total_slots"); it != props.end()) facts.slots = integer_of(*it);
  const json& settings = props["default_generation_settings"];
  if (settings.is_object() && settings.contains("n_ctx")) {
    facts.context_length = integer_of(settings["n_ctx"]);
    if (facts.context_length)
      facts.evidence.push_back(
          {where, "default_generation_settings.n_ctx", with_thousands(*facts.context_length)});
  }
  if (facts.slots) facts.evidence.push_back({where, "total_slots", std::to_string(*facts.slots)});
  return true;
}

bool read_tgi_info(const json& info, ServerFacts& facts) {
  if (!info.is_object() || !info.contains("model_id") || !info.contains("max_total_tokens"))
    return false;
  const std::string where = facts.url + "/info";
  facts.engine = "tgi";
  facts.detected_by = "/info";
  if (auto it = info.find("version"); it != info.end() && it->is_string())
    facts.engine_version = it->get<std::string>();
  if (auto it = info.find("model_id"); it != info.end() && it->is_string())
    facts.model_path = it->get<std::string>();
  if (auto it = info.find("model_dtype"); it != info.end() && it->is_string())
    facts.dtype = it->get<std::string>();
  facts.context_length = integer_of(info["max_total_tokens"]);  // input + output per request
  if (auto it = info.find("max_batch_total_tokens"); it != info.end()) {
    // The tokens all running requests may hold at once: TGI's KV budget.
    facts.capacity_tokens = integer_of(*it);
    if (facts.capacity_tokens) {
      facts.capacity_source = where + " max_batch_total_tokens";
      facts.evidence.push_back(
          {where, "max_batch_total_tokens", with_thousands(*facts.capacity_tokens)});
    }
  }
  if (facts.context_length)
    facts.evidence.push_back({where, "max_total_tokens", with_thousands(*facts.context_length)});
  return true;
}

bool read_trtllm_iteration_stats(const json& stats, ServerFacts& facts, const std::string& where) {
  if (!stats.is_array()) return false;
  // The newest entry that carries the cache's counters (entries are oldest first).
  for (auto it = stats.rbegin(); it != stats.rend(); ++it) {
    if (!it->is_object() || !it->contains("kvCacheStats") || !(*it)["kvCacheStats"].is_object())
      continue;
    const json& kv = (*it)["kvCacheStats"];
    const std::optional<int64_t> read_blocks =
        kv.contains("maxNumBlocks") ? integer_of(kv["maxNumBlocks"]) : std::nullopt;
    const std::optional<int64_t> read_per_block =
        kv.contains("tokensPerBlock") ? integer_of(kv["tokensPerBlock"]) : std::nullopt;
    const int64_t blocks = read_blocks.value_or(-1), per_block = read_per_block.value_or(0);
    if (blocks < 0 || per_block <= 0 || blocks > (int64_t{1} << 40) || per_block > (1 << 20))
      continue;
    facts.page_size = per_block;
    facts.capacity_tokens = blocks * per_block;
    facts.capacity_source = where + " kvCacheStats.maxNumBlocks x tokensPerBlock";
    facts.evidence.push_back({where, "kvCacheStats.maxNumBlocks x tokensPerBlock",
                              fmt::format("{} x {} = {}", with_thousands(blocks), per_block,
                                          with_thousands(blocks * per_block))});
    return true;
  }
  return false;
}

std::optional<json> ServerAnswers::get_json(const std::string& path) {
  auto body = get(path);
  if (!body) return std::nullopt;
  auto doc = json::parse(*body, nullptr, false);
  if (doc.is_discarded()) return std::nullopt;
  return doc;
}

namespace {

// SGLang: GET /server_info (older: /get_server_info; the data lists them newest first).
bool sglang_adapter(const engines::EngineModel* engine, ServerAnswers& answers,
                    ServerFacts& facts) {
  if (!engine || !engine->server_info) return false;
  for (const std::string& path : engine->server_info->endpoints) {
    auto info = answers.get_json(path);
    if (info && info->is_object() &&
        (info->contains("model_path") || info->contains("kv_cache_dtype"))) {
      read_sglang_server_info(*info, facts, path);
      facts.engine = engine->engine;
      return true;
    }
  }
  return false;
}

// vLLM: the vllm:cache_config_info gauge of /metrics (Prometheus text), and its version
// endpoint.
bool vllm_adapter(const engines::EngineModel* engine, ServerAnswers& answers, ServerFacts& facts) {
  if (!engine || !engine->server_info) return false;
  for (const std::string& path : engine->server_info->endpoints) {
    auto body = answers.get(path);
    if (!body) continue;
    std::vector<net::MetricSample> samples;
    try {
      samples = net::parse_prometheus(*body, answers.where(path));
    } catch (const InputError& error) {
      if (!json::accept(*body))  // a JSON answer is another server's, not a broken one
        facts.notes.push_back(fmt::format("{} is not Prometheus text: {}", path, error.what()));
      continue;
    }
    if (!read_vllm_metrics(samples, facts)) continue;
    facts.engine = engine->engine;
    if (!engine->server_info->version_endpoint.empty())
      if (auto version = answers.get_json(engine->server_info->version_endpoint);
          version && version->is_object() && version->contains("version"))
        facts.engine_version = json_text((*version)["version"]);
    return true;
  }
  return false;
}

// TensorRT-LLM: no route reports the KV dtype. /v1/models names it (owned_by), /version its
// release, and /metrics (iteration stats, when enabled) its pool.
bool trtllm_adapter(const engines::EngineModel* engine, ServerAnswers& answers,
                    ServerFacts& facts) {
  if (!engine || !engine->server_info || engine->server_info->owned_by.empty()) return false;
  const engines::ServerInfoSpec& info = *engine->server_info;
  auto models = answers.get_json("/v1/models");
  if (!models || !models->is_object() || !models->contains("data") || !(*models)["data"].is_array())
    return false;
  bool owned = false;
  for (const auto& card : (*models)["data"])
    owned |= card.is_object() && card.contains("owned_by") && card["owned_by"] == info.owned_by;
  if (!owned) return false;
  facts.engine = engine->engine;
  facts.detected_by = "/v1/models owned_by " + info.owned_by;
  facts.evidence.push_back({answers.where("/v1/models"), "owned_by", info.owned_by});
  if (!info.version_endpoint.empty())
    if (auto version = answers.get_json(info.version_endpoint);
        version && version->is_object() && version->contains("version")) {
      facts.engine_version = json_text((*version)["version"]);
      facts.evidence.push_back(
          {answers.where(info.version_endpoint), "version", facts.engine_version});
    }
  if (!info.stats_endpoint.empty()) {
    auto stats = answers.get_json(info.stats_endpoint);
    if (!stats || !read_trtllm_iteration_stats(*stats, facts, answers.where(info.stats_endpoint)))
      facts.notes.push_back(fmt::format(
          "{} gave no KV cache counters ({}){}", info.stats_endpoint,
          !stats ? "no JSON answer: iteration stats are off unless the launch's config sets "
                   "enable_iter_perf_stats"
                 : "an empty list: nothing ran since the last read",
          info.stats_drain_on_read ? "; each read drains the stats, so kvaudit read it once and "
                                     "another reader (a dashboard) may have taken them"
                                   : ""));
  }
  return true;
}

bool llamacpp_adapter(const engines::EngineModel*, ServerAnswers& answers, ServerFacts& facts) {
  auto props = answers.get_json("/props");
  return props && read_llamacpp_props(*props, facts);
}

bool tgi_adapter(const engines::EngineModel*, ServerAnswers& answers, ServerFacts& facts) {
  auto info = answers.get_json("/info");
  return info && read_tgi_info(*info, facts);
}

// probe over HTTP: each path once; a persistent 5xx on an optional endpoint is a note.
class HttpAnswers : public ServerAnswers {
 public:
  HttpAnswers(net::Client& client, std::vector<std::string>& notes)
      : client_(client), notes_(notes) {}
  std::string where(const std::string& path) const override { return client_.where(path); }
  std::optional<std::string> get(const std::string& path) override {
    auto cached = bodies_.find(path);
    if (cached != bodies_.end()) return cached->second;
    std::optional<std::string> body;
    try {
      net::HttpResponse response = client_.get(path.c_str());
      if (response.status == 200) body = response.body;
    } catch (const net::RequestError& error) {
      if (error.kind() != net::FailureKind::http) throw;
      notes_.push_back(error.what());
    }
    bodies_[path] = body;
    return body;
  }

 private:
  net::Client& client_;
  std::vector<std::string>& notes_;
  std::map<std::string, std::optional<std::string>> bodies_;
};

}  // namespace

const std::vector<ServerAdapter>& server_adapters() {
  static const std::vector<ServerAdapter> adapters = {
      {"sglang", sglang_adapter},      {"trtllm", trtllm_adapter}, {"vllm", vllm_adapter},
      {"llama.cpp", llamacpp_adapter}, {"tgi", tgi_adapter},
  };
  return adapters;
}

void identify_server(const engines::Registry& registry, ServerAnswers& answers,
                     ServerFacts& facts) {
  for (const ServerAdapter& adapter : server_adapters())
    if (adapter.read(registry.find(adapter.engine), answers, facts)) return;
}

ServerFacts detect_server(const engines::Registry& registry, net::Client& client) {
  ServerFacts facts;
  facts.url = client.url().text();
  // Optional endpoints: a persistent 5xx there is a note, not a failure of the probe.
  auto optional_get = [&](const char* path) {
    try {
      return client.get(path);
    } catch (const net::RequestError& error) {
      if (error.kind() != net::FailureKind::http) throw;
      facts.notes.push_back(error.what());
      net::HttpResponse failed;
      failed.status = error.status();
      return failed;
    }
  };
  HttpAnswers answers(client, facts.notes);
  identify_server(registry, answers, facts);
  net::HttpResponse models = optional_get("/v1/models");
  if (models.status == 200) {
    try {
      auto cards = net::parse_model_list(json::parse(models.body), client.where("/v1/models"));
      if (!cards.empty()) {
        facts.model_id = cards[0].id;
        if (cards[0].max_model_len && !facts.context_length)
          facts.context_length = cards[0].max_model_len;
        if (facts.model_path.empty() && !cards[0].root.empty()) facts.model_path = cards[0].root;
        facts.evidence.push_back({client.where("/v1/models"), "data[0].id", facts.model_id});
      }
    } catch (const std::exception& error) {
      facts.notes.push_back(fmt::format("/v1/models: {}", error.what()));
    }
  } else if (models.status == 401 || models.status == 403) {
    throw net::RequestError(client.where("/v1/models"),
                            fmt::format("HTTP {}: {} (pass --api-key or set KVAUDIT_API_KEY)",
                                        models.status, net::error_message_of(models.body)),
                            net::FailureKind::http, models.status);
  } else {
    facts.notes.push_back(fmt::format("/v1/models answered HTTP {}: {}", models.status,
                                      net::error_message_of(models.body)));
  }
  if (facts.detected_by.empty()) facts.detected_by = models.status == 200 ? "/v1/models" : "none";
  // The tokenizer, in its dialect, and whether its ids decode back to the text (then
  // prompt lengths are the served model's own counts).
  net::Tokenizer tokenizer(client, facts.model_id);
  const std::string sample = "def kvaudit(value):";
  try {
    if (auto tokens = tokenizer.tokenize(sample)) {
      facts.has_tokenize = true;
      facts.tokenize_dialect = tokenizer.dialect();
      facts.evidence.push_back({client.where("/tokenize"), "dialect", facts.tokenize_dialect});
      if (auto text = tokenizer.detokenize(tokens->ids); text && *text != sample)
        facts.notes.push_back(fmt::format(
            "/detokenize of /tokenize's {} ids gives '{}', not '{}': prompt lengths are counted "
            "with a tokenizer that does not round-trip",
            tokens->ids.size(), *text, sample));
    }
  } catch (const net::RequestError& error) {
    if (error.kind() != net::FailureKind::no_progress &&
        error.kind() != net::FailureKind::malformed)
      throw;
    facts.notes.push_back(fmt::format(
        "{}: not used; prompt lengths are approximated (4 bytes per token)", error.what()));
  }
  return facts;
}

std::map<std::string, std::vector<std::string>> load_counter_names(
    const engines::Registry& registry, const std::string& engine) {
  // llama.cpp's llama-server has no engine data: its one name is here.
  std::map<std::string, std::vector<std::string>> llamacpp = {
      {"generated_tokens", {"llamacpp:tokens_predicted_total"}}};
  if (engine == "llama.cpp") return llamacpp;
  if (const engines::EngineModel* model = registry.find(engine))
    return model->server_info ? model->server_info->counters
                              : std::map<std::string, std::vector<std::string>>{};
  // A server no adapter recognised: every name kvaudit knows (the names carry their prefix).
  std::map<std::string, std::vector<std::string>> all = llamacpp;
  for (const std::string& name : registry.names())
    if (const auto& info = registry.engine(name).server_info)
      for (const auto& [kind, names] : info->counters)
        all[kind].insert(all[kind].end(), names.begin(), names.end());
  return all;
}

json completion_extra_fields(const engines::Registry& registry, const std::string& engine) {
  const engines::EngineModel* served = registry.find(engine);
  if (!served || !served->server_info) return json::object();
  return json::parse(served->server_info->completion_extra_json);
}

}  // namespace kvaudit::probe
