// kvaudit calibrate: FP8 KV scales from the reference engine (or a statistics file),
// written where the target engine version loads them.
#include <fmt/format.h>

#include <optional>

#include "calibrate/calibrate.h"
#include "cli/commands.h"
#include "engines/engines.h"
#include "tokenizer/tokenizer.h"
#include "util/util.h"

namespace kvaudit::cli {

namespace {

struct CalibrateFlags {
  std::string model_dir;
  std::string tokenizer_dir;
  std::string text_file;
  std::string stats_file;
  std::string stats_out;
  std::string engine;
  std::string engine_version;
  std::string format = "fp8_e4m3";
  std::string granularity = "tensor";
  std::string out_dir;
  std::string ctx = "1024";
  double margin = 1.0;
  double percentile = 100.0;
  int tp = 1;
  int threads = 2;
  OutputOptions output;
};

int run_calibrate_command(const engines::Registry& registry, const CalibrateFlags& flags) {
  if (flags.format != "fp8_e4m3")
    throw InputError("--format", fmt::format("'{}' is not supported: engines load static KV "
                                             "scales for fp8_e4m3 only",
                                             flags.format));
  if (flags.text_file.empty() == flags.stats_file.empty())
    throw InputError("calibrate", "give exactly one of --text FILE and --from-stats FILE");
  calibrate::ScaleOptions options;
  options.granularity =
      flags.granularity == "head" ? calibrate::Granularity::head : calibrate::Granularity::tensor;
  options.margin = flags.margin;
  options.use_percentile = flags.percentile < 100.0;

  // Headers and config only: the weights are read only when the text is run.
  checkpoint::ModelFacts facts = checkpoint::read_checkpoint(flags.model_dir);
  calibrate::KvStats stats;
  std::optional<std::vector<calibrate::LayerClipping>> clipping;
  std::vector<calibrate::LayerScales> scales;
  calibrate::CollectOptions collect;
  collect.percentile = flags.percentile;
  if (!flags.text_file.empty()) {
    auto ctx = parse_token_count(flags.ctx);
    if (!ctx || *ctx < 1) throw InputError("--ctx", "expects a token count like 1024 or 4k");
    collect.chunk_tokens = *ctx;
    auto model = model::Model::load(flags.model_dir);
    ThreadPool pool(flags.threads);
    auto tokenizer = tokenizer::Tokenizer::load(flags.tokenizer_dir.empty() ? flags.model_dir
                                                                            : flags.tokenizer_dir);
    std::vector<int32_t> tokens = tokenizer.encode(read_text_file(flags.text_file));
    stats = calibrate::collect_kv_stats(*model, tokens, collect, pool);
    stats.source = fmt::format("reference engine over {}", flags.text_file);
    scales = calibrate::compute_scales(stats, options);
    clipping =
        calibrate::measure_clipping(*model, tokens, scales, options.granularity, collect, pool);
  } else {
    stats = calibrate::read_kv_stats(flags.stats_file);
    if (options.use_percentile && stats.percentile != flags.percentile)
      throw InputError(flags.stats_file,
                       fmt::format("holds p{:g} maxima, not the p{:g} that --percentile asks for",
                                   stats.percentile, flags.percentile));
    if (facts.num_layers > 0 && stats.num_layers != facts.num_layers)
      throw InputError(flags.stats_file,
                       fmt::format("describes {} layers; {} has {}", stats.num_layers,
                                   facts.config_file, facts.num_layers));
    if (facts.num_kv_heads > 0 && stats.num_kv_heads != facts.num_kv_heads)
      throw InputError(flags.stats_file,
                       fmt::format("describes {} KV heads; {} has {}", stats.num_kv_heads,
                                   facts.config_file, facts.num_kv_heads));
    scales = calibrate::compute_scales(stats, options);
  }
  if (!flags.stats_out.empty())
    write_file_atomically(flags.stats_out, calibrate::kv_stats_to_json(stats).dump(2) + "\n");

  calibrate::OverlayRequest request;
  request.model_dir = flags.model_dir;
  request.out_dir = flags.out_dir;
  request.engine = flags.engine;
  request.engine_version = flags.engine_version;
  request.tp = flags.tp;
  request.granularity = options.granularity;
  calibrate::OverlayResult overlay = calibrate::write_overlay(registry, facts, scales, request);

  report::Report out;
  out.command = "calibrate";
  out.title = fmt::format("kvaudit calibrate: {} for {} {}", flags.model_dir, flags.engine,
                          flags.engine_version.empty() ? "(latest known)" : flags.engine_version);
  calibrate::CalibrationSummary summary;
  summary.stats = &stats;
  summary.scales = &scales;
  summary.clipping = clipping ? &*clipping : nullptr;
  summary.overlay = &overlay;
  summary.options = options;
  summary.request = request;
  calibrate::add_to_report(summary, out);
  emit(out, flags.output);
  return kExitOk;
}

}  // namespace

void add_calibrate_command(CLI::App& app, Runner& run, EngineData& engines) {
  auto flags = std::make_shared<CalibrateFlags>();
  CLI::App* command = app.add_subcommand(
      "calibrate", "FP8 KV scales from calibration text, written where the engine loads them");
  command->add_option("--model", flags->model_dir, "Hugging Face checkpoint folder")->required();
  command->add_option("--tokenizer", flags->tokenizer_dir,
                      "Folder with tokenizer.json (default: --model)");
  command->add_option("--text", flags->text_file, "Calibration text (run on the CPU engine)");
  command->add_option("--from-stats", flags->stats_file,
                      "Per-layer K/V maxima collected elsewhere (kvaudit-kv-stats/1 JSON)");
  command->add_option("--stats-out", flags->stats_out, "Also write the maxima used (JSON)");
  command->add_option("--engine", flags->engine, "Target engine (a file of data/engines/)")
      ->required();
  command->add_option("--engine-version", flags->engine_version,
                      "Target engine version (default: latest known)");
  command->add_option("--format", flags->format, "KV cache format of the scales")
      ->check(CLI::IsMember({"fp8_e4m3"}));
  command->add_option("--granularity", flags->granularity, "One scale per layer or per KV head")
      ->check(CLI::IsMember({"tensor", "head"}));
  command
      ->add_option("--margin", flags->margin,
                   "scale = amax x margin / 448; > 1 leaves headroom above the maxima seen")
      ->check(CLI::Range(1.0, 16.0));
  command
      ->add_option("--percentile", flags->percentile,
                   "Use this percentile of per-token head maxima instead of the maximum")
      ->check(CLI::Range(50.0, 100.0));
  command->add_option("--ctx", flags->ctx, "Tokens per calibration sequence");
  command->add_option("--tp", flags->tp, "Tensor-parallel ranks to write in SGLang's JSON")
      ->check(CLI::Range(1, 1024));
  command->add_option("--threads", flags->threads, "Worker threads")->check(CLI::Range(1, 256));
  command->add_option("--out", flags->out_dir, "Overlay folder to write (never the checkpoint)")
      ->required();
  add_output_options(*command, flags->output);
  command->callback([flags, &run, &engines] {
    run = [flags, &engines] { return run_calibrate_command(engines.registry(), *flags); };
  });
}

}  // namespace kvaudit::cli
