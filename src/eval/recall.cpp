// The long-range recall probe: a synthetic Python file of random functions in which a call at
// the end must reproduce the parameter list of a function defined `depth` tokens earlier.
// Text generation is engine-independent (probe/ sends the same text to live servers); the
// scoring here runs it teacher-forced on the reference engine.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <chrono>
#include <cmath>

#include "eval/eval.h"
#include "util/util.h"

namespace kvaudit::eval {

namespace {

// Cases are drawn from a splitmix64 sequence: identical on every platform.
struct Random : SplitMix64 {
  int range(int lo, int hi) { return lo + static_cast<int>(next() % uint64_t(hi - lo + 1)); }
};

constexpr std::array<std::string_view, 24> kVerbs = {
    "load",   "parse",  "build",  "merge",   "split", "scale",   "encode", "decode",
    "render", "update", "filter", "collect", "apply", "resolve", "check",  "format",
    "read",   "write",  "count",  "select",  "sort",  "reduce",  "fetch",  "store"};
constexpr std::array<std::string_view, 40> kNouns = {
    "buffer", "record", "header",  "offset", "window", "token",  "layer",  "block",
    "column", "table",  "cursor",  "packet", "signal", "vector", "matrix", "index",
    "limit",  "margin", "weight",  "bucket", "entry",  "node",   "edge",   "frame",
    "socket", "stream", "channel", "batch",  "shard",  "range",  "queue",  "label",
    "prefix", "suffix", "budget",  "quota",  "ledger", "anchor", "ticket", "sample"};
constexpr std::array<std::string_view, 16> kAdjectives = {
    "raw",   "last",  "next",  "max",   "min",     "total", "local",   "remote",
    "valid", "dirty", "fresh", "stale", "primary", "extra", "pending", "shared"};

std::string identifier(Random& rng) {
  if (rng.next() % 2 == 0) return fmt::format("{}_{}", rng.pick(kAdjectives), rng.pick(kNouns));
  return fmt::format("{}_{}", rng.pick(kNouns), rng.pick(kNouns));
}

struct Function {
  std::string name;
  std::vector<std::string> params;
  std::string text;
};

// A plausible function with 2-4 distinct parameters and a short body that uses them.
Function random_function(Random& rng, int min_params) {
  Function f;
  f.name = fmt::format("{}_{}_{}", rng.pick(kVerbs), rng.pick(kNouns), rng.pick(kNouns));
  const int count = rng.range(min_params, 4);
  while (static_cast<int>(f.params.size()) < count) {
    std::string p = identifier(rng);
    if (std::find(f.params.begin(), f.params.end(), p) == f.params.end()) f.params.push_back(p);
  }
  std::string body;
  const std::string& a = f.params[0];
  const std::string& b = f.params[1];
  switch (rng.next() % 4) {
    case 0:
      body = fmt::format("    if {} is None:\n        return {}\n    return {} + {}\n", a, b, a, b);
      break;
    case 1:
      body = fmt::format(
          "    total = 0\n    for item in {}:\n        total += item * {}\n"
          "    return total\n",
          a, b);
      break;
    case 2:
      body = fmt::format("    result = dict({}={})\n    result[\"{}\"] = {}\n    return result\n",
                         a, a, b, b);
      break;
    default:
      body = fmt::format("    {} = {} or []\n    return [x for x in {} if x != {}]\n", a, a, a, b);
      break;
  }
  f.text = fmt::format("def {}({}):\n    \"\"\"{} the {} of {}.\"\"\"\n{}\n\n", f.name,
                       fmt::join(f.params, ", "), rng.pick(kVerbs), rng.pick(kNouns),
                       rng.pick(kNouns), body);
  return f;
}

}  // namespace

RecallCase make_recall_case(const RecallCaseOptions& options, const TokenCounter& count_tokens) {
  if (options.depth_tokens <= 0 || options.depth_tokens >= options.ctx_tokens)
    throw InputError("recall", fmt::format("depth {} must lie in (0, ctx {})", options.depth_tokens,
                                           options.ctx_tokens));
  Random rng{options.seed * 0x2545F4914F6CDD1Dull + 17};
  Function target = random_function(rng, 3);
  Function decoy = random_function(rng, 3);  // replaces the target in the control case
  // The call passes variables named like the parameters (as code often does), so the
  // argument list can only come from the definition `depth` tokens back.
  const std::string call = fmt::format("def main():\n    value = {}(", target.name);
  RecallCase result;
  result.function_name = target.name;
  result.expected = fmt::format("{})", fmt::join(target.params, ", "));

  // After the definition: fillers until the distance to the call reaches depth. Token
  // counts of separate functions add up (each ends in a blank line, where pre-tokenizers
  // split), so pieces are counted once and summed; the final text is counted exactly.
  // Every filler function is at least a few tokens; a counter that says 0 (a server's
  // tokenizer answering no tokens) would make these loops wait forever.
  auto counted = [&](const std::string& text) {
    int64_t n = count_tokens(text);
    if (n <= 0 && !text.empty())
      throw InputError("recall", fmt::format("the token counter gave {} tokens for {} bytes of "
                                             "text: it makes no progress",
                                             n, text.size()));
    return n;
  };
  std::string after;
  int64_t after_tokens = counted(call);
  while (after_tokens < options.depth_tokens) {
    Function filler = random_function(rng, 2);
    after += filler.text;
    after_tokens += counted(filler.text);
  }
  const std::string definition = options.control ? decoy.text : target.text;
  const std::string header = "# Generated by kvaudit's recall probe.\nimport os\n\n\n";
  int64_t used = count_tokens(header) + count_tokens(definition) + after_tokens +
                 count_tokens(result.expected);
  if (used > options.ctx_tokens)
    throw InputError("recall", fmt::format("depth {} leaves no room in a context of {} tokens",
                                           options.depth_tokens, options.ctx_tokens));
  std::string before;
  while (true) {
    Function filler = random_function(rng, 2);
    int64_t tokens = counted(filler.text);
    if (used + tokens > options.ctx_tokens) break;
    before += filler.text;
    used += tokens;
  }
  result.prompt = header + before + definition + after + call;
  result.depth_tokens = count_tokens(after + call);
  result.prompt_tokens = count_tokens(result.prompt + result.expected);
  return result;
}

std::string make_code(uint64_t seed, int64_t tokens, const TokenCounter& count_tokens) {
  Random rng{seed * 0x2545F4914F6CDD1Dull + 29};
  std::string text = "# Generated by kvaudit: fixed code for teacher-forced scoring.\n\n\n";
  int64_t used = count_tokens(text);
  while (true) {
    Function f = random_function(rng, 2);
    const int64_t n = count_tokens(f.text);
    if (n <= 0) throw InputError("code", "the token counter makes no progress");
    if (used + n > tokens && used > 0 && text.size() > 80) break;
    text += f.text;
    used += n;
  }
  return text;
}

RecallScore score_recall_case(model::Session& session, const tokenizer::Tokenizer& tokenizer,
                              const RecallCase& recall_case) {
  const std::string text = recall_case.prompt + recall_case.expected;
  std::vector<int32_t> ids = tokenizer.encode(text);
  // The expected text's tokens: those ending after the prompt's bytes (a token may straddle
  // the boundary, e.g. "(a" under Qwen's pre-tokenizer; it then counts as expected).
  size_t first_expected = ids.size();
  size_t offset = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    offset += tokenizer.token_bytes(ids[i]).value_or("").size();
    if (offset > recall_case.prompt.size()) {
      first_expected = i;
      break;
    }
  }
  if (first_expected == 0 || first_expected >= ids.size())
    throw InputError("recall", "the expected text produced no tokens of its own");
  session.reset();
  std::vector<float> logits;
  session.forward(ids, static_cast<int64_t>(first_expected) - 1, logits);
  const int64_t rows = static_cast<int64_t>(ids.size() - first_expected);
  const int64_t width = static_cast<int64_t>(logits.size()) / (rows + 1);
  RecallScore score;
  score.expected_tokens = rows;
  score.exact = true;
  std::vector<float> log_probs(width);
  for (int64_t r = 0; r < rows; ++r) {
    std::span<const float> row(&logits[r * width], width);
    log_softmax(row, log_probs);
    const int32_t next = ids[first_expected + r];
    score.logprob += log_probs[next];
    int64_t best = std::max_element(row.begin(), row.end()) - row.begin();
    if (best != next || !std::isfinite(log_probs[next])) score.exact = false;
  }
  return score;
}

RecallResult run_recall(const model::Model& model, const tokenizer::Tokenizer& tokenizer,
                        const RecallOptions& options, ThreadPool& pool) {
  if (options.kv_formats.empty()) throw InputError("--kv", "give at least one KV format");
  TokenCounter counter = [&](std::string_view text) {
    return static_cast<int64_t>(tokenizer.encode(text).size());
  };
  RecallResult result;
  std::vector<numerics::KvFormat> formats;
  for (const std::string& spec : options.kv_formats)
    formats.push_back(numerics::parse_kv_format(spec));

  struct Cell {
    int64_t ctx, depth;
    std::vector<RecallCase> cases, controls;
  };
  std::vector<Cell> cells;
  for (int64_t ctx : options.ctx_tokens) {
    for (int64_t depth : options.depth_tokens) {
      if (depth >= ctx) continue;
      Cell cell{ctx, depth, {}, {}};
      try {
        for (int i = 0; i < options.cases_per_cell; ++i) {
          RecallCaseOptions o{ctx, depth,
                              options.seed * 7919 + uint64_t(ctx) * 31 + uint64_t(depth) * 131 + i,
                              false};
          cell.cases.push_back(make_recall_case(o, counter));
          o.control = true;
          if (options.with_control) cell.controls.push_back(make_recall_case(o, counter));
        }
      } catch (const InputError& error) {
        // A depth that leaves no room for the definition and the call at this length: the
        // cell is skipped and said so, the rest of the grid still runs.
        result.notes.push_back(
            fmt::format("skipped ctx {} x depth {}: {}", ctx, depth, error.problem()));
        continue;
      }
      cells.push_back(std::move(cell));
    }
  }
  if (cells.empty())
    throw InputError("recall",
                     "no depth fits its context length (each needs room for the "
                     "definition, the fillers and the call)");

  // Every KV format with every state precision (KV-major order, as run_perplexity): the
  // first variant is the baseline.
  const bool state_axis = !options.state_formats.empty();
  const std::vector<model::StateFormat> states =
      state_variants(model, options.state_formats, options.state_store_every_tokens);

  std::vector<int32_t> calibration_tokens = tokenizer.encode(cells.back().cases[0].prompt);
  const size_t variants = formats.size() * states.size();
  std::vector<std::array<numerics::StaticAmax, 2>> calibration;
  for (size_t f = 0; f < variants; ++f) {
    using numerics::ScaleStrategy;
    const auto& format = formats[f / states.size()];
    const model::StateFormat& state = states[f % states.size()];
    if (f % states.size() == 0) {  // once per KV format, shared by its state variants
      calibration = loaded_scales_for(format, options.loaded_scales, model.config());
      if (calibration.empty() &&
          (format.strategy == ScaleStrategy::tensor || format.strategy == ScaleStrategy::head ||
           format.strategy == ScaleStrategy::channel ||
           format.kind == numerics::KvFormatKind::nvfp4))
        calibration = calibrate_static_scales(model, formats[0], format, calibration_tokens, pool);
    }
    model::Session session(model, format, pool, calibration, state);
    RecallFormatResult fr;
    fr.spec = format.spec;
    if (state_axis) fr.state = state.spec;
    for (const Cell& cell : cells) {
      RecallCell out;
      out.ctx_tokens = cell.ctx;
      out.depth_tokens = cell.depth;
      out.cases = static_cast<int>(cell.cases.size());
      double logprob = 0.0, control_logprob = 0.0;
      int64_t tokens = 0, control_tokens = 0;
      int exact = 0, control_exact = 0;
      for (const RecallCase& c : cell.cases) {
        RecallScore s = score_recall_case(session, tokenizer, c);
        logprob += s.logprob;
        tokens += s.expected_tokens;
        exact += s.exact ? 1 : 0;
      }
      if (f == 0) {
        for (const RecallCase& c : cell.controls) {
          RecallScore s = score_recall_case(session, tokenizer, c);
          control_logprob += s.logprob;
          control_tokens += s.expected_tokens;
          control_exact += s.exact ? 1 : 0;
        }
      }
      out.mean_logprob_per_token = tokens > 0 ? logprob / static_cast<double>(tokens) : 0.0;
      out.exact_match = out.cases > 0 ? static_cast<double>(exact) / out.cases : 0.0;
      if (control_tokens > 0) {
        out.control_logprob_per_token = control_logprob / static_cast<double>(control_tokens);
        out.control_exact_match = static_cast<double>(control_exact) / cell.controls.size();
      }
      fr.cells.push_back(out);
    }
    result.formats.push_back(fr);
  }
  return result;
}

}  // namespace kvaudit::eval
