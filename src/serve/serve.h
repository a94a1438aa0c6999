// serve: the reference CPU engine (model/) behind an OpenAI-compatible HTTP API that behaves
// like an SGLang server wherever kvaudit looks: the same launch flags, `auto` KV dtype
// resolution and scale loading as engines/ predicts for SGLang, start-up log lines in SGLang's
// format (so `kvaudit logs` and `plan --from-log` read them like a real launch), an
// SGLang-shaped /get_server_info and a vLLM-style cache-config gauge on /metrics. It lets
// probe/ and the demo compare a BF16 and an FP8 deployment end to end on one machine.
// Not here: the HTTP client (net/), process signals and stderr (cli/), throughput: one worker
// runs one request at a time (the ThreadPool parallelises inside each forward pass), so greedy
// output never depends on what else is being served.
//
// "Device memory" in the log is a virtual budget: the KV pool (--kv-pool-mib or
// --max-total-tokens) plus the mapped weights, scaled by --mem-fraction-static, so that
// SGLang's own capacity arithmetic on the printed figures gives exactly the pool this server
// allocates.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "engines/engines.h"
#include "model/model.h"
#include "numerics/numerics.h"

namespace kvaudit::serve {

// The engine whose start-up, /server_info answer and KV set-up serve reproduces.
inline constexpr const char* kEmulatedEngine = "sglang";

struct ServeOptions {
  std::filesystem::path model_dir;
  std::string served_model_name;        // "" = the model folder's name
  std::string kv_cache_dtype = "auto";  // SGLang spelling, or a numerics spec (kvaudit extension)
  std::string engine_version;           // SGLang version whose behaviour to follow ("" = latest)
  std::string quantization_param_path;  // SGLang's KV-scale JSON
  // Hybrids: SGLang's --mamba-ssm-dtype (float32, bfloat16, float16; int8 is a kvaudit
  // extension). "" = the config's mamba_ssm_dtype, else float32.
  std::string mamba_ssm_dtype;
  std::optional<int64_t> context_length;    // tokens; default: max_position_embeddings
  std::optional<int64_t> max_total_tokens;  // KV pool size in tokens (overrides kv_pool_mib)
  int64_t kv_pool_mib = 64;                 // KV pool budget when max_total_tokens is unset
  double mem_fraction_static = 0.9;
  std::string host = "127.0.0.1";
  int port = 30000;  // 0: any free port
  int compute_threads = 2;
  int http_threads = 64;  // connections served at once (keep-alive holds one each)
  int64_t max_body_bytes = 8 << 20;
  int64_t max_tokens_limit = 4096;  // largest max_tokens a request may ask for
  int max_queued_requests = 128;    // waiting + running; more get 429
  uint64_t random_seed = 0;         // seeds sampling when a request gives no seed
  std::string api_key;  // when set, every route but /health and /metrics needs Bearer auth
  // The prefix cache, in SGLang's flags: the radix cache in the device pool (on unless
  // disabled), HiCache's host tier behind it (sized by hicache_size GB per rank, else
  // hicache_ratio x the device pool, and larger than it, as SGLang's HostKVCache demands),
  // and usage.prompt_tokens_details.cached_tokens in answers (--enable-cache-report).
  bool disable_radix_cache = false;
  bool enable_hierarchical_cache = false;
  double hicache_ratio = 2.0;
  double hicache_size_gb = 0.0;
  bool enable_cache_report = false;
  // kvaudit extension, for tests of the round-trip probe: the host tier corrupts what it
  // stores ("none", "drop-scales", "swap-layers"; see serve/prefix_cache.h).
  std::string fault_host_tier = "none";
};

// ---------------------------------------------------------------- KV set-up (SGLang semantics)

// One start-up log line (message only; the server adds the timestamp).
struct LogLine {
  std::string level;  // "INFO", "WARNING", "ERROR"
  std::string text;
};

// What the server allocates, decided the way SGLang decides it.
struct KvSetup {
  std::string engine_version;   // the SGLang version followed ("0.5.10")
  std::string requested;        // --kv-cache-dtype as given
  bool sglang_spelling = true;  // false: a numerics spec (kvaudit extension)
  std::string kv_cache_dtype;   // resolved, SGLang-normalised (bf16, fp8_e4m3, ...) or the spec
  std::string torch_dtype;      // "torch.float8_e4m3fn" for the log ("" for extensions)
  engines::ResolvedKv resolved;
  numerics::KvFormat format;
  // Per layer {K, V} explicit scales (StaticAmax::scales); empty: the format needs none.
  std::vector<std::array<numerics::StaticAmax, 2>> scales;
  engines::ScaleSource scale_source = engines::ScaleSource::not_applicable;
  std::vector<float> k_scales, v_scales;  // per layer, what the cache divides by (1.0 default)
  std::vector<LogLine> load_messages;     // logged between "Load weight begin" and "... end"
  // A hybrid's recurrent state: rounded where SGLang stores it, at the end of each prefill
  // and after every decode step (model::StateFormat::store_every_tokens 0).
  model::StateFormat state;
};

// Resolves --kv-cache-dtype (and --quantization-param-path) against the checkpoint.
// Throws InputError for unknown dtypes, dtypes this engine cannot store, and checkpoint scales
// SGLang refuses at load time (per-head vectors under an SGLang spelling).
// `registry` gives the emulated engine's model (kEmulatedEngine).
KvSetup resolve_kv_setup(const engines::Registry& registry, const checkpoint::ModelFacts& facts,
                         const ServeOptions& options);

// Reads SGLang's --quantization-param-path JSON for TP rank 0 as SGLang's
// kv_cache_scales_loader validates it; on any problem returns nullopt and appends SGLang's
// error and "Defaulting to KV cache scaling factors = 1.0" lines to `messages`.
std::optional<std::vector<float>> read_quantization_param_file(const std::filesystem::path& path,
                                                               const std::string& model_type,
                                                               int num_layers,
                                                               std::vector<LogLine>& messages);

// KV pool sizing in the engine's own units.
struct PoolPlan {
  int64_t k_bytes_per_token = 0;  // all layers, the real encoded row bytes
  int64_t v_bytes_per_token = 0;
  int64_t cell_bytes_per_token = 0;  // K + V
  int64_t max_total_num_tokens = 0;
  int64_t page_size = 1;
  int64_t context_length = 0;
  int64_t max_req_input_len = 0;
  int64_t weight_bytes = 0;
  // Virtual device memory, bytes (see the note at the top).
  double total_before_load_bytes = 0;
  double avail_after_weights_bytes = 0;
  double avail_after_pool_bytes = 0;
};
PoolPlan plan_pool(const KvSetup& kv, int num_layers, int kv_heads, int head_dim,
                   int64_t weight_bytes, int64_t max_position_embeddings,
                   const ServeOptions& options);

// ---------------------------------------------------------------- the server

class Server {
 public:
  using LogSink = std::function<void(std::string_view line)>;

  // Loads the model and tokenizer, resolves the KV setup and writes the start-up log lines
  // (through `log`, one call per line) up to "max_total_num_tokens=...". Throws InputError
  // for bad options or an unreadable model.
  Server(const engines::Registry& registry, const ServeOptions& options, LogSink log);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the listening socket (port 0 picks a free one) and returns the port. Throws
  // InputError when the address cannot be bound.
  int bind();
  // Serves until stop(); logs the ready line first. Returns after in-flight requests finished.
  void run();
  // Stops accepting, lets queued and running requests finish. Safe from any thread.
  void stop();

  int port() const;
  const PoolPlan& pool() const;
  // The JSON /get_server_info returns.
  nlohmann::json server_info() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvaudit::serve
