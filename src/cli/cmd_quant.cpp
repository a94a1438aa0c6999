// kvaudit quant: KV formats x (file or synthetic Q/K/V) -> tensor and attention error report.
#include <algorithm>
#include <thread>

#include "cli/commands.h"
#include "quant/quant.h"
#include "util/util.h"

namespace kvaudit::cli {

namespace {

struct QuantOptions {
  std::string formats;
  std::string input;
  std::string synthetic;
  std::string contexts = "1k,4k,16k";
  int kv_heads = 8, q_heads = 32, head_dim = 128;
  int query_positions = 16;
  int top_k = 32;
  int threads = 0;
  uint64_t seed = 1;
  OutputOptions output;
};

int run_quant_command(const QuantOptions& options) {
  if (options.input.empty() == options.synthetic.empty()) {
    throw InputError("kvaudit quant", "give exactly one of --input FILE or --synthetic PROFILE");
  }
  const std::vector<numerics::KvFormat> formats = numerics::parse_kv_formats(options.formats);
  quant::AnalysisOptions analysis;
  analysis.contexts.clear();
  for (const std::string& text : split_list(options.contexts)) {
    std::optional<int64_t> tokens = parse_token_count(text);
    if (!tokens || *tokens < 1) throw InputError("--ctx", "not a token count: '" + text + "'");
    analysis.contexts.push_back(*tokens);
  }
  if (analysis.contexts.empty()) throw InputError("--ctx", "no context length given");
  if (options.query_positions < 1 || options.query_positions > 1024)
    throw InputError("--queries", "must be 1..1024");
  if (options.top_k < 1) throw InputError("--top-k", "must be at least 1");
  analysis.query_positions = options.query_positions;
  analysis.top_k = options.top_k;
  std::unique_ptr<quant::QkvSource> source;
  if (!options.input.empty()) {
    source = quant::load_qkv(options.input);
  } else {
    quant::AttentionShape shape{options.q_heads, options.kv_heads, options.head_dim};
    const int64_t tokens = *std::max_element(analysis.contexts.begin(), analysis.contexts.end());
    source = quant::make_synthetic(options.synthetic, shape, tokens, options.seed);
  }
  const int threads = options.threads > 0
                          ? options.threads
                          : std::clamp(int(std::thread::hardware_concurrency()), 1, 8);
  ThreadPool pool(threads);
  const quant::QuantAnalysis result = quant::analyze(*source, formats, analysis, pool);
  emit(quant::to_report(result), options.output);
  return kExitOk;
}

}  // namespace

void add_quant_command(CLI::App& app, Runner& run) {
  auto options = std::make_shared<QuantOptions>();
  CLI::App* quant = app.add_subcommand(
      "quant", "Measure what KV formats (FP8, INT4, NVFP4, ...) do to K/V values and attention");
  quant
      ->add_option("--formats", options->formats,
                   "Comma-separated formats, e.g. fp8_e4m3:none,fp8_e4m3:tensor,nvfp4,int4:kivi "
                   "(modifiers: +nan torch cast, +hadamard)")
      ->required();
  quant->add_option("--input", options->input,
                    "Q/K/V: a .safetensors file (tensors k, v, optional q) or a folder of "
                    "k.npy, v.npy, q.npy");
  quant->add_option("--synthetic", options->synthetic,
                    "Synthetic Q/K/V profile: outlier-keys, gaussian, small-values");
  quant->add_option("--ctx", options->contexts, "Context lengths, e.g. 1k,4k,16k,128k");
  quant->add_option("--kv-heads", options->kv_heads, "Synthetic: KV heads (default 8)");
  quant->add_option("--q-heads", options->q_heads, "Synthetic: query heads (default 32)");
  quant->add_option("--head-dim", options->head_dim, "Synthetic: head dimension (default 128)");
  quant->add_option("--queries", options->query_positions,
                    "Decode positions queried after each context (default 16)");
  quant->add_option("--top-k", options->top_k, "Keys compared for top-k agreement (default 32)");
  quant->add_option("--threads", options->threads, "Worker threads (default: all cores, max 8)");
  quant->add_option("--seed", options->seed, "Synthetic data seed (default 1)");
  add_output_options(*quant, options->output);
  quant->callback([options, &run] { run = [options] { return run_quant_command(*options); }; });
}

}  // namespace kvaudit::cli
