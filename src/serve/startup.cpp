// serve's start-up, in SGLang's order and log format: server_args, weight loading with the KV
// scale messages, the KV dtype, the pool and its capacity; the lines logs/ reads from a real
// SGLang read the same from serve.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <ctime>

#include "serve/server_impl.h"
#include "util/util.h"

namespace kvaudit::serve {

namespace {

using nlohmann::json;

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
  for (int64_t id : facts.eos_token_ids) add(id);
  return ids;
}

}  // namespace

void Server::Impl::line(const std::string& text) {
  log(fmt::format("[{}] {}", timestamp(), text));
}

// (name, Python repr) in SGLang's ServerArgs order; `resolved` switches kv_cache_dtype.
std::vector<std::pair<std::string, json>> Server::Impl::server_args(bool resolved) const {
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
          {"disable_radix_cache", options.disable_radix_cache},
          {"enable_cache_report", options.enable_cache_report},
          {"enable_hierarchical_cache", options.enable_hierarchical_cache},
          {"hicache_ratio", options.hicache_ratio},
          {"hicache_size", options.hicache_size_gb},
          {"host", options.host},
          {"port", port > 0 ? port : options.port},
          {"api_key", options.api_key.empty() ? json(nullptr) : json("<redacted>")}};
}

std::string Server::Impl::server_args_repr() const {
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
  served.cache_report = options.enable_cache_report;
  set_up_prefix_cache();
  engine = std::make_unique<Engine>(*model, *tokenizer, kv, options.compute_threads,
                                    options.max_queued_requests, options.random_seed, metrics,
                                    prefix_cache.get());
  line(fmt::format(
      "max_total_num_tokens={}, chunked_prefill_size=256, max_prefill_tokens=16384, "
      "max_running_requests=1, context_len={}, available_gpu_mem={} GB",
      pool.max_total_num_tokens, pool.context_length, gib(pool.avail_after_pool_bytes)));
  created = std::chrono::duration_cast<std::chrono::seconds>(
                std::chrono::system_clock::now().time_since_epoch())
                .count();
}

// SGLang's checks are those of server_args.py (a hierarchical cache needs the radix cache)
// and of HostKVCache.__init__ (python/sglang/srt/mem_cache/memory_pool_host.py): the host
// pool is hicache_size GB (1e9 bytes) per rank when given, else hicache_ratio x the device
// pool in tokens, and must be larger than the device pool; its line is logged as there.
void Server::Impl::set_up_prefix_cache() {
  PrefixCacheOptions cache;
  cache.enabled = !options.disable_radix_cache;
  cache.device_tokens = pool.max_total_num_tokens;
  cache.fault = parse_host_tier_fault(options.fault_host_tier);
  if (options.enable_hierarchical_cache) {
    if (options.disable_radix_cache)
      throw InputError("--enable-hierarchical-cache",
                       "needs the radix cache: drop --disable-radix-cache (SGLang refuses both)");
    if (!(options.hicache_ratio > 0.0) || !(options.hicache_size_gb >= 0.0) ||
        !std::isfinite(options.hicache_ratio) || !std::isfinite(options.hicache_size_gb))
      throw InputError("--hicache-ratio", "the ratio must be positive and the size >= 0 GB");
    const double tokens =
        options.hicache_size_gb > 0.0
            ? std::floor(options.hicache_size_gb * 1e9 / double(pool.cell_bytes_per_token))
            : std::floor(double(pool.max_total_num_tokens) * options.hicache_ratio);
    cache.host_tokens = static_cast<int64_t>(std::min(tokens, 1e15));
    cache.host_tokens -= cache.host_tokens % pool.page_size;
    if (cache.host_tokens <= pool.max_total_num_tokens)
      throw InputError(options.hicache_size_gb > 0.0 ? "--hicache-size" : "--hicache-ratio",
                       fmt::format("the host pool ({} tokens) must be larger than the device "
                                   "pool ({} tokens), as SGLang requires",
                                   cache.host_tokens, pool.max_total_num_tokens));
    cache.host_tier = true;
    line(fmt::format("Allocating {:.2f} GB host memory for hierarchical KV cache.",
                     double(cache.host_tokens) * double(pool.cell_bytes_per_token) / 1e9));
  }
  if (cache.fault != HostTierFault::none) {
    if (!cache.host_tier)
      throw InputError("--fault-host-tier", "needs the host tier (--enable-hierarchical-cache)");
    if (cache.fault == HostTierFault::swap_layers && facts.num_layers < 2)
      throw InputError("--fault-host-tier", "swap-layers needs a model with two layers or more");
    const auto unit = [](float scale) { return scale == 1.0f; };
    if (cache.fault == HostTierFault::drop_scales &&
        std::all_of(kv.k_scales.begin(), kv.k_scales.end(), unit) &&
        std::all_of(kv.v_scales.begin(), kv.v_scales.end(), unit))
      throw InputError("--fault-host-tier",
                       fmt::format("drop-scales changes nothing: every scale of this {} cache "
                                   "is 1.0 (give it scales, e.g. --quantization-param-path)",
                                   kv.kv_cache_dtype));
    line(
        fmt::format("WARNING kvaudit fault injection: the host tier corrupts what it stores "
                    "({})",
                    host_tier_fault_name(cache.fault)));
  }
  if (model->config().hybrid()) {
    if (cache.host_tier || cache.fault != HostTierFault::none)
      throw InputError("--enable-hierarchical-cache",
                       "this server keeps no prefix cache for a hybrid model (its recurrent "
                       "state is not snapshotted)");
    return;
  }
  if (cache.enabled) prefix_cache = std::make_unique<PrefixCache>(cache);
}

}  // namespace kvaudit::serve
