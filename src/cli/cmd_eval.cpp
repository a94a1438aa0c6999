// kvaudit eval: KV-format damage on a real checkpoint, measured on the reference CPU engine.
#include <fmt/format.h>

#include <iostream>
#include <optional>

#include "calibrate/calibrate.h"
#include "cli/commands.h"
#include "eval/eval.h"
#include "util/util.h"

namespace kvaudit::cli {

namespace {

struct EvalFlags {
  std::string model_dir;
  std::string tokenizer_dir;
  std::vector<std::string> kv = {};
  std::string text_file;
  std::string calibration_file;
  std::string kv_scales;
  std::string ctx = "512";
  int64_t chunks = 0;
  int64_t score_from = -1;
  int buckets = 4;
  int threads = 2;
  bool recall = false;
  std::string recall_ctx = "256,512";
  std::string recall_depth = "32,128,384";
  int recall_cases = 4;
  std::vector<std::string> tasks;  // "mrcr", "toolcall"
  std::string task_ctx = "1024,4096";
  int task_cases = 4;
  std::vector<std::string> state_dtypes;
  int64_t state_chunk = 1;
  uint64_t seed = 1;
  OutputOptions output;
};

// "3 Gated DeltaNet + 1 full attention" for a hybrid, "" otherwise.
std::string layer_mix(const model::ModelConfig& config) {
  if (!config.hybrid()) return "";
  const int attention = config.attention_layers();
  return fmt::format("{} Gated DeltaNet + {} full attention (KV cache in those only)",
                     config.num_layers - attention, attention);
}

int run_eval_command(const EvalFlags& flags) {
  if (flags.text_file.empty() && !flags.recall && flags.tasks.empty())
    throw InputError("eval", "nothing to measure: give --text FILE, --recall and/or --task");
  std::vector<std::string> formats = flags.kv.empty() ? std::vector<std::string>{"bf16"} : flags.kv;
  for (const std::string& spec : formats) numerics::parse_kv_format(spec);  // fail early
  for (const std::string& spec : flags.state_dtypes)
    model::parse_state_format(spec, flags.state_chunk);  // fail early
  auto model = model::Model::load(flags.model_dir);
  ThreadPool pool(flags.threads);  // owned here, shared by every pass
  auto tokenizer = tokenizer::Tokenizer::load(flags.tokenizer_dir.empty() ? flags.model_dir
                                                                          : flags.tokenizer_dir);

  eval::LoadedScales loaded;
  if (!flags.kv_scales.empty()) {
    std::vector<int> layers_without_kv;
    for (int layer = 0; layer < model->config().num_layers; ++layer)
      if (model->config().mixers[size_t(layer)] != model::Mixer::attention)
        layers_without_kv.push_back(layer);
    for (const auto& layer :
         calibrate::load_scales(flags.kv_scales, model->config().num_layers,
                                model->config().num_kv_heads, layers_without_kv))
      loaded.layers.push_back(
          {numerics::StaticAmax{{}, layer.k_scale}, numerics::StaticAmax{{}, layer.v_scale}});
    loaded.label = flags.kv_scales;
  }

  std::optional<eval::PerplexityResult> perplexity;
  if (!flags.text_file.empty()) {
    eval::PerplexityOptions options;
    options.kv_formats = formats;
    auto ctx = parse_token_count(flags.ctx);
    if (!ctx) throw InputError("--ctx", "expects a token count like 512 or 4k");
    options.ctx_tokens = *ctx;
    options.max_chunks = flags.chunks;
    options.first_scored = flags.score_from;
    options.position_buckets = flags.buckets;
    options.loaded_scales = loaded;
    options.state_formats = flags.state_dtypes;
    options.state_store_every_tokens = flags.state_chunk;
    if (!flags.calibration_file.empty())
      options.calibration_tokens = tokenizer.encode(read_text_file(flags.calibration_file));
    std::vector<int32_t> tokens = tokenizer.encode(read_text_file(flags.text_file));
    perplexity = eval::run_perplexity(*model, tokens, options, pool);
  }
  std::optional<eval::RecallResult> recall;
  if (flags.recall) {
    eval::RecallOptions options;
    options.kv_formats = formats;
    options.ctx_tokens = parse_token_counts(flags.recall_ctx, "--recall-ctx", "256,512,8k");
    options.depth_tokens = parse_token_counts(flags.recall_depth, "--recall-depth", "256,512,8k");
    options.cases_per_cell = flags.recall_cases;
    options.seed = flags.seed;
    options.loaded_scales = loaded;
    options.state_formats = flags.state_dtypes;
    options.state_store_every_tokens = flags.state_chunk;
    recall = eval::run_recall(*model, tokenizer, options, pool);
  }
  std::optional<eval::TaskResult> tasks;
  if (!flags.tasks.empty()) {
    if (!flags.state_dtypes.empty())
      throw InputError("--task",
                       "the long-context tasks run attention-only models (no --state-dtype)");
    eval::TaskOptions options;
    options.kv_formats = formats;
    options.kinds = flags.tasks;
    options.ctx_tokens = parse_token_counts(flags.task_ctx, "--task-ctx", "1024,4096,8k");
    options.cases_per_cell = flags.task_cases;
    options.seed = flags.seed;
    options.loaded_scales = loaded;
    tasks = eval::run_tasks(*model, tokenizer, options, pool);
  }
  eval::EvalSummary summary{flags.model_dir,
                            model->config().num_layers,
                            model->config().num_kv_heads,
                            model->config().head_dim,
                            std::string(model::weight_type_name(model->weight_type())),
                            formats[0],
                            flags.threads,
                            layer_mix(model->config()),
                            model->notes()};
  emit(eval::to_report(summary, perplexity ? &*perplexity : nullptr, recall ? &*recall : nullptr,
                       tasks ? &*tasks : nullptr),
       flags.output);
  return kExitOk;
}

}  // namespace

void add_eval_command(CLI::App& app, Runner& run) {
  auto flags = std::make_shared<EvalFlags>();
  CLI::App* eval = app.add_subcommand(
      "eval", "Measure KV-format damage (PPL ratio, KL divergence, top-1, recall) on a CPU");
  eval->add_option("--model", flags->model_dir,
                   "Hugging Face checkpoint folder (Llama/Mistral/Qwen2/Qwen3/Qwen3.5 dense)")
      ->required();
  eval->add_option("--tokenizer", flags->tokenizer_dir,
                   "Folder with tokenizer.json (default: --model)");
  eval->add_option("--kv", flags->kv,
                   "KV format, repeatable; the first is the baseline (bf16, fp8_e4m3:none, "
                   "fp8_e4m3:tensor, fp8_e5m2, nvfp4, int4:kivi, ...)");
  eval->add_option("--text", flags->text_file, "Text to score (llama.cpp perplexity semantics)");
  eval->add_option("--calib-text", flags->calibration_file,
                   "Text whose K/V calibrate static scales (default: the first chunk of --text)");
  eval->add_option("--kv-scales", flags->kv_scales,
                   "Scales the engine would load, used by fp8_e4m3:tensor / :head instead of "
                   "calibrating: a calibrate overlay folder, a .safetensors file, or SGLang's "
                   "--quantization-param-path JSON");
  eval->add_option("--ctx", flags->ctx, "Tokens per chunk (n_ctx)");
  eval->add_option("--chunks", flags->chunks, "Score at most this many chunks (default: all)");
  eval->add_option("--score-from", flags->score_from, "First scored position (default n_ctx/2)");
  eval->add_option("--buckets", flags->buckets, "Position buckets over the scored range")
      ->check(CLI::Range(1, 64));
  eval->add_option("--threads", flags->threads, "Worker threads")->check(CLI::Range(1, 256));
  eval->add_flag("--recall", flags->recall, "Run the long-range recall probe");
  eval->add_option("--recall-ctx", flags->recall_ctx, "Context lengths of the recall grid");
  eval->add_option("--recall-depth", flags->recall_depth, "Depths of the recall grid (tokens)");
  eval->add_option("--recall-cases", flags->recall_cases, "Cases per grid cell")
      ->check(CLI::Range(1, 1000));
  eval->add_option("--task", flags->tasks,
                   "Long-context task, repeatable: mrcr (near-duplicate functions asked in "
                   "rounds), toolcall (near-duplicate tools' JSON arguments, schema-checked)")
      ->check(CLI::IsMember({"mrcr", "toolcall"}));
  eval->add_option("--task-ctx", flags->task_ctx, "Context lengths of the tasks (tokens)");
  eval->add_option("--task-cases", flags->task_cases, "Cases per task and context length")
      ->check(CLI::Range(1, 1000));
  eval->add_option("--seed", flags->seed, "Seed of the recall and task generators");
  eval->add_option("--state-dtype", flags->state_dtypes,
                   "Hybrids (Qwen3.5): recurrent state precision, repeatable, crossed with "
                   "every --kv format; the first is the baseline (fp32, bf16, fp16, int8; add "
                   "\":fla\" to prefill through FLA's 64-token chunked kernel, as SGLang and "
                   "vLLM do)");
  eval->add_option("--state-chunk", flags->state_chunk,
                   "Where the state is stored and rounded: every N tokens and at the end of "
                   "each call (1 = every token, as decode does; 0 = end of each call only)")
      ->check(CLI::NonNegativeNumber);
  add_output_options(*eval, flags->output);
  eval->callback([flags, &run] { run = [flags] { return run_eval_command(*flags); }; });
}

}  // namespace kvaudit::cli
