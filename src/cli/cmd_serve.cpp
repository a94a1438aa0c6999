// kvaudit serve: the reference engine behind an OpenAI-compatible HTTP API that starts, logs
// and resolves its KV cache like SGLang (see serve/serve.h). The start-up log goes to stderr;
// SIGTERM / SIGINT stop accepting, finish every accepted request and exit 0.
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "cli/commands.h"
#include "serve/serve.h"
#include "util/util.h"

namespace kvaudit::cli {

namespace {

struct ServeFlags {
  serve::ServeOptions options;
  std::string context_length;
  std::string max_total_tokens;
};

std::optional<int64_t> token_flag(const std::string& text, const char* flag) {
  if (text.empty()) return std::nullopt;
  auto tokens = parse_token_count(text);
  if (!tokens || *tokens <= 0) throw InputError(flag, "expects a token count such as 4096 or 8k");
  return tokens;
}

int run_serve_command(const engines::Registry& registry, ServeFlags flags) {
  flags.options.context_length = token_flag(flags.context_length, "--context-length");
  flags.options.max_total_tokens = token_flag(flags.max_total_tokens, "--max-total-tokens");

  block_stop_signals();  // before the server starts its threads

  auto log_mutex = std::make_shared<std::mutex>();
  serve::Server server(registry, flags.options, [log_mutex](std::string_view line) {
    std::lock_guard<std::mutex> lock(*log_mutex);
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fputc('\n', stderr);
    std::fflush(stderr);
  });
  server.bind();
  StopSignalWaiter waiter([&server] { server.stop(); });
  server.run();
  return kExitOk;
}

}  // namespace

void add_serve_command(CLI::App& app, Runner& run, EngineData& engines) {
  auto flags = std::make_shared<ServeFlags>();
  serve::ServeOptions& o = flags->options;
  CLI::App* command = app.add_subcommand(
      "serve",
      "Serve a checkpoint over an OpenAI-compatible HTTP API on the reference CPU engine, "
      "resolving and logging its KV cache exactly as SGLang would");
  command->add_option("--model,--model-path", o.model_dir, "Checkpoint folder (HF layout)")
      ->required();
  command
      ->add_option("--kv-cache-dtype", o.kv_cache_dtype,
                   "SGLang choice (auto, bf16, fp8_e4m3, fp8_e5m2, ...) or a kvaudit KV "
                   "format (fp8_e4m3:head, int8:token, int4:kivi, ...)")
      ->capture_default_str();
  command->add_option("--engine-version", o.engine_version,
                      "SGLang version whose behaviour to follow (default: latest known)");
  command->add_option("--quantization-param-path", o.quantization_param_path,
                      "SGLang KV-scale JSON ({kv_cache: {dtype, scaling_factor}})");
  command->add_option("--context-length", flags->context_length,
                      "Longest prompt + completion in tokens (default: max_position_embeddings)");
  command->add_option("--max-total-tokens", flags->max_total_tokens,
                      "KV pool size in tokens (default: from --kv-pool-mib)");
  command->add_option("--mamba-ssm-dtype", o.mamba_ssm_dtype,
                      "Hybrids (Qwen3.5): recurrent state dtype (float32, bfloat16, float16; "
                      "int8: kvaudit extension; default: the config's mamba_ssm_dtype)");
  command->add_option("--kv-pool-mib", o.kv_pool_mib, "KV pool budget in MiB")
      ->capture_default_str();
  command
      ->add_option("--mem-fraction-static", o.mem_fraction_static,
                   "Shapes the logged (virtual) device memory as SGLang's flag does")
      ->capture_default_str();
  command->add_option("--served-model-name", o.served_model_name,
                      "Model id in the API (default: the folder's name)");
  command->add_option("--host", o.host, "Address to listen on")->capture_default_str();
  command->add_option("--port", o.port, "Port (0: any free port, printed in the ready line)")
      ->capture_default_str();
  command->add_option("--threads", o.compute_threads, "Compute threads inside a forward pass")
      ->capture_default_str();
  command->add_option("--http-threads", o.http_threads, "Connections served at once")
      ->capture_default_str();
  command
      ->add_option("--max-queued-requests", o.max_queued_requests,
                   "Requests waiting or running before new ones get 429")
      ->capture_default_str();
  command->add_option("--max-body-bytes", o.max_body_bytes, "Largest request body (413 above)")
      ->capture_default_str();
  command
      ->add_option("--max-tokens-limit", o.max_tokens_limit,
                   "Largest max_tokens a request may ask for")
      ->capture_default_str();
  command
      ->add_option("--api-key", o.api_key,
                   "Require 'Authorization: Bearer KEY' on every route but /health and /metrics "
                   "(or set $KVAUDIT_API_KEY, which keeps the key out of the process list); the "
                   "key is never logged or reported")
      ->envname("KVAUDIT_API_KEY");
  command->add_flag("--disable-radix-cache", o.disable_radix_cache,
                    "SGLang's flag: no prefix cache (every prompt computed from its start)");
  command->add_flag("--enable-cache-report", o.enable_cache_report,
                    "SGLang's flag: usage.prompt_tokens_details.cached_tokens in answers");
  command->add_flag("--enable-hierarchical-cache", o.enable_hierarchical_cache,
                    "SGLang's HiCache: evicted prefixes go to a host tier and load back on a hit");
  command
      ->add_option("--hicache-ratio", o.hicache_ratio,
                   "Host tier size as a multiple of the device pool (must be > 1)")
      ->capture_default_str();
  command->add_option("--hicache-size", o.hicache_size_gb,
                      "Host tier size in GB (1e9 bytes); overrides --hicache-ratio");
  command
      ->add_option("--fault-host-tier", o.fault_host_tier,
                   "Test switch (kvaudit extension): the host tier corrupts what it stores: "
                   "drop-scales (codes kept, scales read back as 1.0) or swap-layers (each "
                   "layer's pages come back in the next layer's place)")
      ->capture_default_str();
  command
      ->add_option("--random-seed", o.random_seed, "Seeds sampling for requests that give no seed")
      ->capture_default_str();
  command->callback([&run, flags, &engines] {
    run = [flags, &engines] { return run_serve_command(engines.registry(), *flags); };
  });
}

}  // namespace kvaudit::cli
