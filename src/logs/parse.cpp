// logs parse: which launch each recognised line belongs to. Lines are recognised by the
// engines' own log messages (the templates in data/engines/<engine>.json), plus the generic
// Python and systemd lines no engine data owns (tracebacks, exception lines, OOM, unit start
// and exit). Launch boundaries come from start-up markers: a marker opens a new launch when
// the current one has already passed that stage. What a line says about its launch:
// parse_args.cpp (the start-up markers) and parse_facts.cpp (the rest).
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "logs/parse.h"
#include "util/util.h"

namespace kvaudit::logs {

namespace {

using engines::LogKind;

bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

// "DP0 TP3", "PP1 TP3", "rank=2": the TP and DP indices, for the rank counts.
void note_rank_indices(Launch& launch, std::string_view rank) {
  size_t i = 0;
  while (i < rank.size()) {
    size_t end = rank.find(' ', i);
    if (end == std::string_view::npos) end = rank.size();
    std::string_view token = rank.substr(i, end - i);
    auto index = [&](size_t skip) { return parse_count(token.substr(skip)); };
    if (token.rfind("TP", 0) == 0) {
      if (auto n = index(2); n && *n < 1 << 16) launch.tp_ranks_seen.insert(static_cast<int>(*n));
    } else if (token.rfind("rank=", 0) == 0) {
      if (auto n = index(5); n && *n < 1 << 16) launch.tp_ranks_seen.insert(static_cast<int>(*n));
    } else if (token.rfind("DP", 0) == 0) {
      if (auto n = index(2); n && *n < 1 << 16) launch.dp_ranks_seen.insert(static_cast<int>(*n));
    }
    i = end + 1;
  }
}

}  // namespace

std::string clip(std::string_view text, size_t n) {
  return std::string(text.substr(0, std::min(n, text.size())));
}

std::optional<double> parse_number(std::string_view text) {
  std::string digits;
  for (char c : text)
    if (c != ',') digits.push_back(c);
  while (!digits.empty() && digits.back() == ' ') digits.pop_back();
  while (!digits.empty() && digits.front() == ' ') digits.erase(digits.begin());
  if (digits.empty()) return std::nullopt;
  char* end = nullptr;
  double value = std::strtod(digits.c_str(), &end);
  if (end != digits.c_str() + digits.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

std::optional<int64_t> parse_count(std::string_view text) {
  auto v = parse_number(text);
  if (!v || *v < 0 || *v > 9.0e18 || *v != std::floor(*v)) return std::nullopt;
  return static_cast<int64_t>(*v);
}

std::string word_after(std::string_view text, std::string_view key) {
  size_t at = text.find(key);
  if (at == std::string_view::npos) return "";
  size_t i = at + key.size();
  while (i < text.size() && text[i] == ' ') ++i;
  size_t j = i;
  while (j < text.size() && text[j] != ' ' && text[j] != ',' && text[j] != ')' && text[j] != ';')
    ++j;
  return std::string(text.substr(i, j - i));
}
namespace {

// Every engine's log templates (engine models live for the process).
std::vector<std::pair<const engines::EngineModel*, const engines::LogTemplate*>> all_templates(
    const engines::Registry& registry) {
  std::vector<std::pair<const engines::EngineModel*, const engines::LogTemplate*>> out;
  for (const std::string& name : registry.names()) {
    const engines::EngineModel& engine = registry.engine(name);
    for (const auto& log : engine.log_templates) out.push_back({&engine, &log});
  }
  return out;
}

bool is_marker(LogKind kind) {
  return kind == LogKind::launch_args || kind == LogKind::engine_version ||
         kind == LogKind::engine_config;
}

}  // namespace

// The literal runs the scanner looks for: every template's anchor plus the generic lines.
std::vector<std::string> scan_patterns(const engines::Registry& registry) {
  std::vector<std::string> out;
  for (const auto& [engine, log] : all_templates(registry))
    if (std::find(out.begin(), out.end(), log->anchor) == out.end()) out.push_back(log->anchor);
  for (const char* generic : {"Traceback (most recent call last)", "CUDA out of memory",
                              "OutOfMemoryError", "CUDA error: out of memory", "HIP out of memory",
                              "Error: ", "Exception: ", "AssertionError", "Main process exited",
                              "Failed with result", "Started ", "Stopped "})
    out.emplace_back(generic);
  return out;
}

LaunchBuilder::LaunchBuilder(const engines::Registry& registry, size_t max_launches,
                             audit::KvPolicy kv_policy)
    : registry_(registry),
      templates_(all_templates(registry)),
      max_launches_(std::max<size_t>(1, max_launches)),
      kv_policy_(kv_policy) {}

Launch& LaunchBuilder::current(int64_t line_no, const std::string& timestamp) {
  if (launches_.empty()) return open_launch(line_no, timestamp);
  Launch& launch = launches_.back();
  launch.last_line = line_no;
  if (!timestamp.empty()) launch.end_time = timestamp;
  if (launch.start_time.empty()) launch.start_time = timestamp;
  return launch;
}

Launch& LaunchBuilder::open_launch(int64_t line_no, const std::string& timestamp) {
  Launch launch;
  launch.index = next_index_++;
  launch.kv_policy = kv_policy_;
  launch.first_line = line_no;
  launch.start_time = timestamp;
  launches_.push_back(std::move(launch));
  if (launches_.size() > max_launches_) {
    launches_.pop_front();
    ++dropped_;
  }
  return current(line_no, timestamp);
}

Launch& LaunchBuilder::start_marker(int stage, int64_t line_no, const std::string& timestamp) {
  if (!launches_.empty() && launches_.back().stage >= stage) open_launch(line_no, timestamp);
  Launch& launch = current(line_no, timestamp);
  launch.stage = std::max(launch.stage, stage);
  return launch;
}

Launch& LaunchBuilder::start_unmarked(int64_t line_no, const std::string& timestamp,
                                      std::string reason) {
  Launch& launch = open_launch(line_no, timestamp);
  launch.split_reason = std::move(reason);
  return launch;
}

void LaunchBuilder::record_failure(Launch& launch, const std::string& kind,
                                   const std::string& message, int64_t line_no) {
  if (launch.failures.size() >= 20) {
    ++launch.failures_dropped;
    return;
  }
  LogEvent event;
  event.line = line_no;
  event.kind = kind;
  event.text = clip(message);
  event.after_ready = launch.ready;
  launch.failures.push_back(std::move(event));
}

// A weights load is printed once per rank and process. The same rank loading again is a
// new process, even when the excerpt cut the new run's start-up markers, when its launch was
// ready by then or when the memory the first load took is free again: above what the rank had
// after its first load by more than half of what that load took (at least 0.25 GiB), or, with
// no figure after it, at 90% of what it had before it. A second model of the same process
// (SGLang's speculative draft) loads with the target's weights still held: before #23862 after
// the target's KV pool, since then right after the target's weights.
std::optional<std::string> LaunchBuilder::new_run_without_marker(
    const std::vector<TemplateHit>& hits, const std::string& rank, int64_t line_no) const {
  if (launches_.empty()) return std::nullopt;
  const Launch& launch = launches_.back();
  const auto first = launch.figures_by_rank.find(rank);
  if (first == launch.figures_by_rank.end()) return std::nullopt;
  const std::string where = rank.empty() ? "the unprefixed process" : rank;
  const auto after_ready = [&] {
    return fmt::format(
        "line {}: {} loads weights again after the launch was ready (line {}): a new run", line_no,
        where, launch.ready_line);
  };
  for (const TemplateHit& hit : hits) {
    if (hit.log->kind == LogKind::load_begin) {
      if (!first->second.free_before_gib) continue;
      if (launch.ready) return after_ready();
      const std::optional<double> free_gib = hit.number("avail_mem_gib");
      if (!free_gib) continue;
      const double before = *first->second.free_before_gib;
      const std::optional<double> after = first->second.free_after_gib;
      const bool released = after ? *free_gib - *after > std::max(0.25, 0.5 * (before - *after))
                                  : *free_gib >= 0.9 * before;
      if (released)
        return fmt::format(
            "line {}: {} loads weights again with {:.2f} GiB free, as before its first load "
            "({:.2f} GiB{}): the first load's memory was released, so a new process",
            line_no, where, *free_gib, before,
            after ? fmt::format(", {:.2f} GiB after it", *after) : std::string());
    } else if (hit.log->kind == LogKind::weights_loaded) {
      if (launch.ready && first->second.weights_loaded) return after_ready();
    }
  }
  return std::nullopt;
}

namespace {

void note_rank_figures(Launch& launch, const std::vector<TemplateHit>& hits,
                       const std::string& rank, int64_t line_no) {
  if (launch.figures_by_rank.size() >= 1024 && !launch.figures_by_rank.count(rank))
    return;  // bounded on hostile input
  for (const TemplateHit& hit : hits) {
    const LogKind kind = hit.log->kind;
    if (kind == LogKind::load_begin || kind == LogKind::load_end) {
      auto free_gib = hit.number("avail_mem_gib");
      if (!free_gib) continue;
      Launch::RankFigures& first = launch.figures_by_rank[rank];
      if (kind == LogKind::load_begin && !first.free_before_gib)
        first.free_before_gib = free_gib, first.begin_line = line_no;
      if (kind == LogKind::load_end && first.free_before_gib && !first.free_after_gib) {
        first.free_after_gib = free_gib, first.end_line = line_no;
        first.usage_gib = hit.number("mem_usage_gib");
      }
    } else if (kind == LogKind::kv_pool_allocated) {
      auto tokens = hit.count("pool_tokens");
      Launch::RankFigures& figures = launch.figures_by_rank[rank];
      if (tokens && figures.pool_tokens.size() < 8)
        figures.pool_tokens.emplace_back(*tokens, line_no);
    } else if (kind == LogKind::weights_loaded) {
      launch.figures_by_rank[rank].weights_loaded = true;
    }
  }
}

}  // namespace

void LaunchBuilder::handle(std::string_view raw_line, int64_t line_no) {
  LogLine line = normalise_line(raw_line);
  const std::string& m = line.message;
  const std::string& ts = line.timestamp;

  // systemd
  if (line.journal_ident == "systemd") {
    if (m.rfind("Started ", 0) == 0 || m.rfind("Starting ", 0) == 0) {
      start_marker(kSystemd, line_no, ts);
    } else if (contains(m, "Main process exited") || contains(m, "Failed with result")) {
      if (!launches_.empty()) record_failure(current(line_no, ts), "exited", m, line_no);
    }
    return;
  }

  // Every template that matches; of several of one kind (an older message that extends a
  // newer one, say), the longest says the most.
  std::vector<TemplateHit> hits;
  // Named pairs, not a structured binding: clang 14 (the sanitizer build) cannot capture
  // structured bindings in a lambda.
  for (const auto& pair : templates_) {
    const engines::EngineModel* engine = pair.first;
    const engines::LogTemplate* log = pair.second;
    auto captures = engines::match_log_template(*log, m);
    if (!captures) continue;
    auto same = std::find_if(hits.begin(), hits.end(), [&](const TemplateHit& h) {
      return h.log->kind == log->kind && h.engine == engine;
    });
    if (same == hits.end())
      hits.push_back({engine, log, std::move(*captures)});
    else if (log->text.size() > same->log->text.size())
      *same = {engine, log, std::move(*captures)};
  }
  for (const TemplateHit& hit : hits)
    if (is_marker(hit.log->kind)) {
      apply_marker(hit, line_no, ts);
      return;
    }

  if (auto reason = new_run_without_marker(hits, line.rank, line_no))
    start_unmarked(line_no, ts, std::move(*reason));
  Launch& launch = current(line_no, ts);
  note_rank_figures(launch, hits, line.rank, line_no);
  if (!line.rank.empty() && launch.ranks_seen.size() < 1024) {
    launch.ranks_seen.insert(line.rank);
    note_rank_indices(launch, line.rank);
  }
  bool engine_error = false;
  for (const TemplateHit& hit : hits) {
    apply_fact(launch, hit, line_no, m, line.rank);
    engine_error |= hit.log->kind == LogKind::startup_error;
  }
  if (engine_error) return;

  // Generic failures (Python, CUDA), which no engine template owns.
  // Not a bare "out of memory": vLLM's own advice says "If you are running out of memory".
  if (contains(m, "CUDA out of memory") || contains(m, "OutOfMemoryError") ||
      contains(m, "CUDA error: out of memory") || contains(m, "HIP out of memory")) {
    record_failure(launch, "oom", m, line_no);
  } else if (contains(m, "Traceback (most recent call last)")) {
    record_failure(launch, "traceback", m, line_no);
  } else if (hits.empty() && (contains(m, "Error: ") || contains(m, "AssertionError") ||
                              contains(m, "Exception: "))) {
    // The exception line that ends a traceback: "ValueError: ...", "Exception: ...". Only
    // lines that start with an exception name, not request logs that quote one.
    size_t name_end = m.find(": ");
    std::string_view name = std::string_view(m).substr(0, std::min(name_end, m.size()));
    bool exception_line = name_end != std::string::npos && name_end < 60 &&
                          name.find(' ') == std::string_view::npos &&
                          (name.ends_with("Error") || name.ends_with("Exception"));
    if (m.rfind("AssertionError", 0) == 0) exception_line = true;
    if (exception_line) record_failure(launch, "exception", m, line_no);
  }
}

void LaunchBuilder::finish(LogScan& out) {
  out.launches_dropped = dropped_;
  for (auto& launch : launches_) resolve(launch);
  for (size_t i = 0; i < launches_.size(); ++i)
    add_findings(registry_, launches_[i], i + 1 == launches_.size());
  out.launches.assign(std::make_move_iterator(launches_.begin()),
                      std::make_move_iterator(launches_.end()));
}

std::optional<Launch> LaunchBuilder::latest() const {
  if (launches_.empty()) return std::nullopt;
  Launch launch = launches_.back();
  resolve(launch);
  add_findings(registry_, launch, true);
  return launch;
}

void LaunchBuilder::resolve(Launch& launch) const {
  // A launch with no recognised content (e.g. systemd lines only) is still kept: it
  // shows a restart that never printed anything.
  // Without a printed size, the ranks seen bound TP from below: a log of TP0 lines only
  // says nothing (SGLang prints most lines on TP0), ranks 0, 2, 4, 6 say at least 7.
  if (launch.tp == 0 && !launch.tp_ranks_seen.empty() && *launch.tp_ranks_seen.rbegin() > 0) {
    launch.tp_at_least = *launch.tp_ranks_seen.rbegin() + 1;
    launch.memory.tp_at_least = launch.tp_at_least;
    launch.memory.tp_ranks_contiguous =
        static_cast<int>(launch.tp_ranks_seen.size()) == launch.tp_at_least;
  }
  launch.memory.tp_source = launch.tp_source;
  // Resolved dtype when no line said it (or only a bare "fp8" did): an explicit request
  // is what the engine allocates; vLLM's auto follows the model dtype.
  const engines::DtypeVocabulary& dtypes = registry_.dtypes();
  std::string requested = dtypes.normalise(launch.kv_cache_dtype_requested);
  if ((launch.kv_cache_dtype_resolved.empty() || launch.resolved_generic) && !requested.empty() &&
      requested != "auto" &&
      (launch.kv_cache_dtype_resolved.empty() || dtypes.is_quantized(requested))) {
    launch.kv_cache_dtype_resolved = requested;
    launch.resolved_evidence = "requested --kv-cache-dtype " + launch.kv_cache_dtype_requested;
  }
  // A scale warning the engine prints for one dtype only names that dtype.
  if (launch.kv_cache_dtype_resolved.empty())
    for (const auto& msg : launch.scale_messages) {
      if ((msg.message_kind != LogKind::scale_warning &&
           msg.message_kind != LogKind::scale_unit_fallback) ||
          msg.engine.empty())
        continue;
      for (const auto& rule : registry_.engine(msg.engine).scale_warnings)
        if (rule.log_message == msg.template_id && rule.dtypes.size() == 1) {
          launch.kv_cache_dtype_resolved = rule.dtypes[0];
          launch.resolved_evidence =
              fmt::format("log:{}: the engine prints this warning only for a {} cache", msg.line,
                          rule.dtypes[0]);
        }
      if (!launch.kv_cache_dtype_resolved.empty()) break;
    }
  // auto with no line naming the cache: both engines store it in the model dtype unless
  // the checkpoint declares a quantized KV cache, which the log may not show (older
  // SGLang pools do not print their dtype). Inferred, and said so; --checkpoint decides.
  // A launch that names a weight quantization is not inferred at all: its checkpoint may
  // well declare the KV cache quantized, and a wrong "bf16" is the all-clear kvaudit must
  // never give; it stays unknown until --checkpoint decides it.
  const bool quantized_weights = !launch.quantization.empty() && launch.quantization != "None";
  if (launch.kv_cache_dtype_resolved.empty() && requested == "auto" &&
      !launch.model_dtype.empty() && !launch.engine.empty()) {
    if (quantized_weights) {
      launch.resolved_auto_pending = true;
      launch.resolved_evidence = fmt::format(
          "kv_cache_dtype '{}' on a {}-quantized checkpoint and no line naming the cache: its "
          "quant config decides (pass --checkpoint)",
          launch.kv_cache_dtype_requested, launch.quantization);
    } else {
      launch.kv_cache_dtype_resolved = launch.model_dtype;
      launch.resolved_inferred = true;
      launch.resolved_evidence = fmt::format(
          "kv_cache_dtype '{}' and no line naming an FP8 cache: the model dtype {} (inferred)",
          launch.kv_cache_dtype_requested, launch.model_dtype);
    }
  }
  launch.memory.engine = launch.engine;
  launch.memory.engine_version = launch.engine_version;
  launch.memory.kv_cache_dtype = launch.kv_cache_dtype_resolved;
  // Checked: a damaged line can print any count (found by fuzz_logs: 7.6e18 blocks x 16
  // overflowed int64); a pool no int64 holds is not a pool size.
  int64_t pool_tokens = 0;
  if (!launch.max_total_tokens && launch.memory.num_gpu_blocks &&
      !__builtin_mul_overflow(*launch.memory.num_gpu_blocks, launch.memory.block_size.value_or(16),
                              &pool_tokens))
    launch.max_total_tokens = pool_tokens;
  decide_scale_fallback(registry_, launch);
}

// Scale fallback from the log alone: only the engine's own check of the loaded values
// (vLLM's "Using KV cache scaling factor 1.0") or a logged drop proves it.
void decide_scale_fallback(const engines::Registry& registry, Launch& launch) {
  const std::string& dtype = launch.kv_cache_dtype_resolved;
  const engines::KvDtype* kv = registry.dtypes().find(dtype);
  const LogEvent* unit = nullptr;
  const LogEvent* dropped = nullptr;
  const LogEvent* warning = nullptr;
  for (const auto& msg : launch.scale_messages) {
    if (msg.message_kind == LogKind::scale_unit_fallback ||
        msg.message_kind == LogKind::nvfp4_unit_global)
      unit = unit ? unit : &msg;
    if (msg.message_kind == LogKind::scale_not_loaded) dropped = dropped ? dropped : &msg;
    if (msg.message_kind == LogKind::scale_warning) warning = warning ? warning : &msg;
  }
  if (dtype.empty()) {
    launch.scale_fallback_reason = "the log does not say which KV dtype the launch used";
  } else if (!kv || !kv->quantized) {
    launch.scale_fallback = false;
    launch.scale_fallback_reason = dtype + " KV cache: no scales involved";
  } else if (kv->scales == engines::ScaleSemantics::dynamic_block ||
             kv->scales == engines::ScaleSemantics::dynamic_per_token_head ||
             kv->scales == engines::ScaleSemantics::packed_dynamic) {
    launch.scale_fallback = false;
    launch.scale_fallback_reason =
        dtype + " KV cache computes its own scales at cache write: no scale-1.0 fallback";
  } else if (unit) {
    launch.scale_fallback = true;
    launch.scale_fallback_reason = fmt::format(
        "the engine logged that it uses KV scaling factor 1.0 after checking the loaded values "
        "(log:{})",
        unit->line);
  } else if (dropped) {
    launch.scale_fallback = true;
    launch.scale_fallback_reason = fmt::format(
        "the engine dropped the checkpoint's KV scales (name not matched, log:{})", dropped->line);
  } else if (warning) {
    std::string meaning;
    if (const engines::EngineModel* engine =
            launch.engine.empty() ? nullptr : registry.find(warning->engine))
      for (const auto& rule : engine->scale_warnings)
        if (rule.log_message == warning->template_id) meaning = rule.meaning;
    launch.scale_fallback_reason = fmt::format(
        "the engine's warning does not prove a fallback{}{}; pass --checkpoint to decide",
        meaning.empty() ? "" : ": it is ", meaning);
  } else {
    launch.scale_fallback_reason =
        "no scale message: this engine version does not log whether it loaded KV scales";
  }
}

}  // namespace kvaudit::logs
