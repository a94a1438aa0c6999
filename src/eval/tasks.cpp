// Long-context tasks that do not saturate: an MRCR-style task (multi-round co-reference over
// near-duplicate functions) and a tool-call task (JSON arguments, validated against the
// tool's JSON Schema). Like the recall probe, the text is engine-independent (probe/ sends
// it to live servers) and scored teacher-forced on the reference engine here.
//
// What makes them harder than recall (where one definition is the only match): every needle
// has near-duplicates that share its name stem, its body and most of its text, and the
// rounds ask for them one after another, each after the previous rounds' correct answers,
// so a cache that blurs which near-duplicate a position came from copies the wrong one.
// Each needle differs from its near-duplicates within the few tokens before every
// differing value (the first parameter; every argument value of a call), so a model that
// matches a few tokens of context exactly can answer: a 16-bit model is meant to score
// high, and a degraded cache shows as a drop.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
// GCC 12 reports false -Wstringop-overflow / -Wrestrict inside valijson's JSON-pointer code once it
// is inlined (GCC bug 105651, as in the tests' CMakeLists).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#pragma GCC diagnostic ignored "-Wrestrict"
#pragma GCC diagnostic ignored "-Warray-bounds"
#endif
#include <valijson/adapters/nlohmann_json_adapter.hpp>
#include <valijson/schema.hpp>
#include <valijson/schema_parser.hpp>
#include <valijson/validator.hpp>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include "eval/eval.h"
#include "stats/stats.h"
#include "util/util.h"

namespace kvaudit::eval {

// Names differ from recall.cpp's generator: unity builds put both in one translation unit.
namespace {

using nlohmann::json;

using TaskRandom = SplitMix64;

constexpr std::array<std::string_view, 16> kTaskVerbs = {
    "load",   "parse",  "build",  "merge",   "split", "scale",   "encode", "decode",
    "render", "update", "filter", "collect", "apply", "resolve", "fetch",  "store"};
constexpr std::array<std::string_view, 32> kTaskNouns = {
    "buffer", "record", "header",  "offset", "window", "token",  "layer",  "block",
    "column", "table",  "cursor",  "packet", "signal", "vector", "matrix", "index",
    "limit",  "margin", "weight",  "bucket", "entry",  "node",   "edge",   "frame",
    "socket", "stream", "channel", "batch",  "shard",  "range",  "queue",  "label"};
constexpr std::array<std::string_view, 12> kTaskAdjectives = {"raw",   "last",  "next",  "max",
                                                              "min",   "total", "local", "remote",
                                                              "valid", "dirty", "fresh", "stale"};
constexpr std::array<std::string_view, 8> kOrdinals = {"first", "second", "third",   "fourth",
                                                       "fifth", "sixth",  "seventh", "eighth"};

std::string task_identifier(TaskRandom& rng) {
  return fmt::format("{}_{}", rng.pick(kTaskAdjectives), rng.pick(kTaskNouns));
}

// A filler function: plausible code that mentions none of the needles' names.
std::string filler_function(TaskRandom& rng) {
  std::string name = fmt::format("{}_{}", rng.pick(kTaskVerbs), rng.pick(kTaskNouns));
  std::string a = task_identifier(rng), b = task_identifier(rng);
  if (a == b) b += "_2";
  switch (rng.next() % 3) {
    case 0:
      return fmt::format(
          "def {}({}, {}):\n    if {} is None:\n        return {}\n    return {} + {}\n\n\n", name,
          a, b, a, b, a, b);
    case 1:
      return fmt::format(
          "def {}({}, {}):\n    total = 0\n    for item in {}:\n        total += item * {}\n"
          "    return total\n\n\n",
          name, a, b, a, b);
    default:
      return fmt::format("def {}({}, {}):\n    result = dict({}={})\n    return result\n\n\n", name,
                         a, b, a, b);
  }
}

int64_t counted(const TokenCounter& count, const std::string& text, const char* task) {
  int64_t n = count(text);
  if (n <= 0 && !text.empty())
    throw InputError(task, fmt::format("the token counter gave {} tokens for {} bytes of text: it "
                                       "makes no progress",
                                       n, text.size()));
  return n;
}

// Fills `budget` tokens with filler pieces made by `make_filler` and places the needles among
// them at random positions (each needle in its own slot, in a shuffled order), so needles sit
// at different depths. Returns the text; throws when the needles alone do not fit.
template <class MakeFiller>
std::string spread(TaskRandom& rng, const std::vector<std::string>& needles, int64_t budget,
                   const TokenCounter& count, MakeFiller make_filler, const char* task) {
  int64_t needle_tokens = 0;
  for (const auto& needle : needles) needle_tokens += counted(count, needle, task);
  if (needle_tokens > budget)
    throw InputError(task, fmt::format("{} tokens of needles leave no room in {} tokens",
                                       needle_tokens, budget));
  std::vector<std::string> fillers;
  int64_t used = needle_tokens;
  while (true) {
    std::string filler = make_filler(rng);
    int64_t tokens = counted(count, filler, task);
    if (used + tokens > budget) break;
    fillers.push_back(std::move(filler));
    used += tokens;
  }
  // Slots: needle k goes after filler position[k] (positions spread over the fillers).
  std::vector<size_t> positions;
  for (size_t k = 0; k < needles.size(); ++k)
    positions.push_back(fillers.empty() ? 0 : rng.next() % (fillers.size() + 1));
  std::sort(positions.begin(), positions.end());
  std::string out;
  size_t next_needle = 0;
  for (size_t i = 0; i <= fillers.size(); ++i) {
    while (next_needle < needles.size() && positions[next_needle] == i)
      out += needles[next_needle++];
    if (i < fillers.size()) out += fillers[i];
  }
  return out;
}

// Distinct values drawn from `make` (no two needles share one).
template <class Make>
std::vector<std::string> distinct(TaskRandom& rng, size_t n, Make make) {
  std::vector<std::string> out;
  for (int attempts = 0; out.size() < n && attempts < 10000; ++attempts) {
    std::string v = make(rng);
    if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(std::move(v));
  }
  return out;
}

// 0..n-1 in a random order (Fisher-Yates).
std::vector<int> shuffled_indices(TaskRandom& rng, int n) {
  std::vector<int> order(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) order[size_t(i)] = i;
  for (int i = n - 1; i > 0; --i) std::swap(order[size_t(i)], order[rng.next() % size_t(i + 1)]);
  return order;
}

// Tokens the rounds add to the context (asks, answers and what follows them).
int64_t rounds_tokens(const std::vector<TaskRound>& rounds, const TokenCounter& count,
                      const char* task) {
  int64_t tokens = 0;
  for (const auto& round : rounds)
    tokens += counted(count, round.ask + round.expected + round.after, task);
  return tokens;
}

}  // namespace

std::string round_prompt(const TaskCase& task, size_t round) {
  std::string prompt = task.context;
  for (size_t r = 0; r < round && r < task.rounds.size(); ++r)
    prompt += task.rounds[r].ask + task.rounds[r].expected + task.rounds[r].after;
  if (round < task.rounds.size()) prompt += task.rounds[round].ask;
  return prompt;
}

TaskCase make_mrcr_case(const TaskCaseOptions& options, const TokenCounter& count_tokens) {
  const int variants = std::clamp(options.variants, 2, 8);
  const int rounds = std::clamp(options.rounds, 1, variants);
  TaskRandom rng{options.seed * 0x2545F4914F6CDD1Dull + 101};
  TaskCase task;
  task.kind = "mrcr";
  task.ctx_tokens = options.ctx_tokens;
  // The near-duplicates: one stem, suffixes _v1.._vN, one docstring and body, the first
  // parameter different per variant and the others shared.
  const std::string stem =
      fmt::format("{}_{}_{}", rng.pick(kTaskVerbs), rng.pick(kTaskNouns), rng.pick(kTaskNouns));
  std::vector<std::string> shared = distinct(rng, 2, task_identifier);
  std::vector<std::string> firsts = distinct(rng, size_t(variants) + 2, task_identifier);
  firsts.erase(std::remove_if(firsts.begin(), firsts.end(),
                              [&](const std::string& f) {
                                return std::find(shared.begin(), shared.end(), f) != shared.end();
                              }),
               firsts.end());
  if (firsts.size() < size_t(variants))
    throw InputError("mrcr", "could not draw distinct parameter names");
  const std::string doc = fmt::format("{} the {} of {}", rng.pick(kTaskVerbs), rng.pick(kTaskNouns),
                                      rng.pick(kTaskNouns));
  const std::string body = fmt::format(
      "    total = 0\n    for item in {}:\n        total += item * {}\n    return total\n",
      shared[0], shared[1]);
  std::vector<std::string> needles, params;
  for (int v = 0; v < variants; ++v) {
    params.push_back(fmt::format("{}, {}, {}", firsts[size_t(v)], shared[0], shared[1]));
    needles.push_back(fmt::format("def {}_v{}({}):\n    \"\"\"{}.\"\"\"\n{}\n\n", stem, v + 1,
                                  params.back(), doc, body));
  }
  // The rounds: distinct variants in a random order.
  const std::vector<int> asked = shuffled_indices(rng, variants);
  for (int r = 0; r < rounds; ++r) {
    const int v = asked[size_t(r)];
    task.rounds.push_back({fmt::format("    {} = {}_v{}(", kOrdinals[size_t(r)], stem, v + 1),
                           params[size_t(v)] + ")", "\n"});
  }
  const std::string header =
      "# Generated by kvaudit's MRCR probe: near-duplicate functions, asked in rounds.\n"
      "import os\n\n\n";
  const std::string main_def = "def main():\n";
  const int64_t fixed = counted(count_tokens, header, "mrcr") +
                        counted(count_tokens, main_def, "mrcr") +
                        rounds_tokens(task.rounds, count_tokens, "mrcr");
  task.context =
      header +
      spread(rng, needles, options.ctx_tokens - fixed, count_tokens, filler_function, "mrcr") +
      main_def;
  task.prompt_tokens = count_tokens(round_prompt(task, task.rounds.size()));
  return task;
}

std::string make_prose(uint64_t seed, int64_t tokens, const TokenCounter& count_tokens) {
  static constexpr std::array<std::string_view, 12> kSubjects = {
      "The operator",    "Our team",           "The scheduler",   "Each replica",
      "The first shard", "A careful reviewer", "The night shift", "The new cluster",
      "The old gateway", "Every worker",       "The audit",       "The release manager"};
  static constexpr std::array<std::string_view, 12> kVerbsPast = {
      "checked",   "moved",    "rebuilt",  "measured", "replaced", "logged",
      "restarted", "compared", "archived", "reviewed", "tuned",    "reported"};
  static constexpr std::array<std::string_view, 10> kTails = {
      "before the morning traffic arrived",
      "after the last deployment",
      "while the queue was still short",
      "because the numbers looked wrong",
      "so that nobody would be surprised later",
      "without stopping the service",
      "as the checklist asked",
      "and wrote down what changed",
      "when the alert fired twice",
      "and then went home"};
  TaskRandom rng{seed * 0x94D049BB133111EBull + 303};
  std::string text;
  int64_t used = 0;
  while (true) {
    std::string sentence =
        fmt::format("{} {} the {} {} {}. ", rng.pick(kSubjects), rng.pick(kVerbsPast),
                    rng.pick(kTaskAdjectives), rng.pick(kTaskNouns), rng.pick(kTails));
    if (rng.next() % 5 == 0) sentence += "\n\n";
    const int64_t n = counted(count_tokens, sentence, "prose");
    if (used + n > tokens && !text.empty()) break;
    text += sentence;
    used += n;
  }
  return text;
}

namespace {

// One tool of the registry: its name, JSON Schema (compact), and a generator of valid
// arguments.
struct Tool {
  std::string name;
  json schema;
};

json tool_schema() {
  return json::parse(R"({"type":"object","properties":{
    "id":{"type":"string","pattern":"^[A-Z][0-9]{4}$"},
    "region":{"type":"string","enum":["eu","us","ap","sa","af","me"]},
    "limit":{"type":"integer","minimum":1,"maximum":999},
    "label":{"type":"string","minLength":3}},
    "required":["id","region","limit","label"],"additionalProperties":false})");
}

}  // namespace

TaskCase make_toolcall_case(const TaskCaseOptions& options, const TokenCounter& count_tokens) {
  const int variants = std::clamp(options.variants, 2, 8);
  const int rounds = std::clamp(options.rounds, 1, variants);
  TaskRandom rng{options.seed * 0x9E3779B97F4A7C15ull + 202};
  TaskCase task;
  task.kind = "toolcall";
  task.ctx_tokens = options.ctx_tokens;
  const std::string stem = fmt::format("{}_{}", rng.pick(kTaskVerbs), rng.pick(kTaskNouns));
  const json schema = tool_schema();
  task.schema = schema.dump();
  // Every call's values distinct from every other call's, field by field, so the few tokens
  // before each value differ between near-duplicate calls.
  std::vector<std::string> ids = distinct(rng, size_t(variants), [](TaskRandom& r) {
    return fmt::format("{}{:04}", char('A' + r.next() % 26), r.next() % 10000);
  });
  std::vector<std::string> labels = distinct(rng, size_t(variants), task_identifier);
  const std::vector<int> regions_order = shuffled_indices(rng, 6);
  std::vector<std::string> needles, arguments;
  for (int v = 0; v < variants; ++v) {
    json args = json::object();
    args["id"] = ids[size_t(v)];
    args["region"] = schema["properties"]["region"]["enum"][size_t(regions_order[size_t(v % 6)])];
    args["limit"] = 1 + int((rng.next() % 99) * 10 + uint64_t(v));
    args["label"] = labels[size_t(v)];
    // Compact JSON as most tool-call emitters write it, keys in schema order. The first key
    // is short, so the tool's name stays within a few tokens of the first value.
    arguments.push_back(fmt::format(R"({{"id":"{}","region":"{}","limit":{},"label":"{}"}})",
                                    args["id"].get<std::string>(),
                                    args["region"].get<std::string>(), args["limit"].get<int>(),
                                    args["label"].get<std::string>()));
    needles.push_back(fmt::format("{}_v{} {} -> timeout\n", stem, v + 1, arguments.back()));
  }
  const std::vector<int> asked = shuffled_indices(rng, variants);
  for (int r = 0; r < rounds; ++r) {
    const int v = asked[size_t(r)];
    // The ask ends in the name and the answer starts with " {": a prompt ending in a space
    // makes a live server's tokenizer split " {" unnaturally (the space alone, then "{"),
    // which a model copying the log's " {" tokens does not produce.
    task.rounds.push_back({fmt::format("{}_v{}", stem, v + 1), " " + arguments[size_t(v)], "\n"});
  }
  std::string header =
      "# Tool registry (JSON Schema) and call log. Generated by kvaudit's tool-call probe.\n";
  std::vector<std::string> names;
  names.reserve(size_t(variants));
  for (int v = 0; v < variants; ++v) names.push_back(fmt::format("{}_v{}", stem, v + 1));
  header +=
      fmt::format("tools {} take arguments with schema {}\n", fmt::join(names, ", "), task.schema);
  header += "# call log: tool arguments -> status\n";
  const std::string footer = "# retry every call that timed out, with the same arguments:\n";
  auto filler_call = [&](TaskRandom& r) {
    return fmt::format(R"({}_{} {{"id":"{}{:04}","limit":{}}} -> ok)"
                       "\n",
                       r.pick(kTaskVerbs), r.pick(kTaskNouns), char('A' + r.next() % 26),
                       r.next() % 10000, 1 + r.next() % 999);
  };
  const int64_t fixed = counted(count_tokens, header, "toolcall") +
                        counted(count_tokens, footer, "toolcall") +
                        rounds_tokens(task.rounds, count_tokens, "toolcall");
  task.context =
      header +
      spread(rng, needles, options.ctx_tokens - fixed, count_tokens, filler_call, "toolcall") +
      footer;
  task.prompt_tokens = count_tokens(round_prompt(task, task.rounds.size()));
  return task;
}

ToolCallCheck check_tool_call(const std::string& schema_text, const std::string& expected,
                              const std::string& output) {
  ToolCallCheck check;
  // The first JSON value in the output: everything up to where the parser stops.
  const size_t start = output.find_first_not_of(" \t");
  if (start == std::string::npos || output[start] != '{') {
    check.problem = "the answer does not start with a JSON object";
    return check;
  }
  // Find the end of the first object by balancing braces outside strings.
  int depth = 0;
  bool in_string = false, escaped = false;
  size_t end = std::string::npos;
  for (size_t i = start; i < output.size(); ++i) {
    char c = output[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"')
      in_string = true;
    else if (c == '{')
      ++depth;
    else if (c == '}' && --depth == 0) {
      end = i + 1;
      break;
    }
  }
  if (end == std::string::npos) {
    check.problem = "the JSON object is not closed";
    return check;
  }
  json value = json::parse(output.substr(start, end - start), nullptr, false);
  if (value.is_discarded()) {
    check.problem = "the arguments are not valid JSON";
    return check;
  }
  check.parsed = true;
  json schema_document = json::parse(schema_text, nullptr, false);
  valijson::Schema schema;
  valijson::SchemaParser parser;
  valijson::adapters::NlohmannJsonAdapter schema_adapter(schema_document);
  parser.populateSchema(schema_adapter, schema);
  valijson::Validator validator(valijson::Validator::kStrongTypes);
  valijson::ValidationResults results;
  valijson::adapters::NlohmannJsonAdapter target(value);
  if (!validator.validate(schema, target, &results)) {
    valijson::ValidationResults::Error error;
    if (results.popError(error)) {
      std::string where;
      for (const auto& part : error.context) where += part;
      check.problem = fmt::format("schema: {} ({})", error.description, where);
    } else {
      check.problem = "schema validation failed";
    }
    return check;
  }
  check.schema_valid = true;
  check.exact = value == json::parse(expected, nullptr, false);
  if (!check.exact) check.problem = "valid arguments, but not the ones the log holds";
  return check;
}

namespace {

// Tokens of `ids` that overlap the byte span [begin, end) of the text they encode (a token
// straddling `begin` counts: it cannot be written without the answer's first bytes).
std::vector<size_t> tokens_in_span(const tokenizer::Tokenizer& tokenizer,
                                   const std::vector<int32_t>& ids, size_t begin, size_t end) {
  std::vector<size_t> out;
  size_t offset = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const size_t start = offset;
    offset += tokenizer.token_bytes(ids[i]).value_or("").size();
    if (offset > begin && start < end) out.push_back(i);
    if (start >= end) break;
  }
  return out;
}

struct TaskScore {
  int64_t rounds = 0, rounds_exact = 0, answer_tokens = 0;
  double logprob = 0.0;
};

TaskScore score_task_case(model::Session& session, const tokenizer::Tokenizer& tokenizer,
                          const TaskCase& task) {
  const std::string text = round_prompt(task, task.rounds.size());
  std::vector<int32_t> ids = tokenizer.encode(text);
  // Byte spans of each round's answer in the full text.
  std::vector<std::pair<size_t, size_t>> spans;
  for (size_t r = 0; r < task.rounds.size(); ++r) {
    const size_t begin = round_prompt(task, r).size();
    spans.push_back({begin, begin + task.rounds[r].expected.size()});
  }
  std::vector<std::vector<size_t>> answer_tokens;
  size_t first_scored = ids.size();
  for (const auto& [begin, end] : spans) {
    answer_tokens.push_back(tokens_in_span(tokenizer, ids, begin, end));
    if (answer_tokens.back().empty() || answer_tokens.back().front() == 0)
      throw InputError(task.kind, "an answer produced no tokens of its own");
    first_scored = std::min(first_scored, answer_tokens.back().front());
  }
  session.reset();
  std::vector<float> logits;
  // Logits for positions first_scored - 1 .. end: row k predicts token first_scored + k.
  session.forward(ids, static_cast<int64_t>(first_scored) - 1, logits);
  const int64_t rows = static_cast<int64_t>(ids.size() - first_scored) + 1;
  const int64_t width = static_cast<int64_t>(logits.size()) / rows;
  std::vector<float> log_probs(static_cast<size_t>(width));
  // Byte offset where each token starts, to judge a token that straddles an answer's end.
  std::vector<size_t> token_start(ids.size() + 1, 0);
  for (size_t i = 0; i < ids.size(); ++i)
    token_start[i + 1] = token_start[i] + tokenizer.token_bytes(ids[i]).value_or("").size();
  TaskScore score;
  for (size_t r = 0; r < answer_tokens.size(); ++r) {
    const size_t answer_end = spans[r].second;
    bool exact = true;
    for (size_t index : answer_tokens[r]) {
      std::span<const float> row(&logits[(index - first_scored) * size_t(width)], size_t(width));
      log_softmax(row, log_probs);
      const int32_t next = ids[index];
      score.logprob += log_probs[size_t(next)];
      ++score.answer_tokens;
      const auto best =
          static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
      if (!std::isfinite(log_probs[size_t(next)])) exact = false;
      if (best == next) continue;
      // The text's last answer token may run past the answer (")\n" where the answer ends in
      // ")"). A prediction that writes the rest of the answer and agrees with the text after it
      // (")") is what greedy decoding would produce: the answer is complete and exact.
      const std::string best_bytes = tokenizer.token_bytes(best).value_or("");
      const size_t start = token_start[index];
      const bool completes_answer = token_start[index + 1] > answer_end && !best_bytes.empty() &&
                                    start + best_bytes.size() >= answer_end &&
                                    std::string_view(text).substr(start).starts_with(best_bytes);
      if (!completes_answer) exact = false;
    }
    ++score.rounds;
    score.rounds_exact += exact;
  }
  return score;
}

}  // namespace

TaskResult run_tasks(const model::Model& model, const tokenizer::Tokenizer& tokenizer,
                     const TaskOptions& options, ThreadPool& pool) {
  if (options.kv_formats.empty()) throw InputError("--kv", "give at least one KV format");
  TokenCounter counter = [&](std::string_view text) {
    return static_cast<int64_t>(tokenizer.encode(text).size());
  };
  struct Cell {
    std::string kind;
    int64_t ctx;
    std::vector<TaskCase> cases;
  };
  TaskResult result;
  std::vector<Cell> cells;
  for (const std::string& kind : options.kinds) {
    if (kind != "mrcr" && kind != "toolcall")
      throw InputError("--task", fmt::format("unknown task '{}' (mrcr, toolcall)", kind));
    for (int64_t ctx : options.ctx_tokens) {
      Cell cell{kind, ctx, {}};
      try {
        for (int i = 0; i < options.cases_per_cell; ++i) {
          TaskCaseOptions o{ctx, options.seed * 7919 + uint64_t(ctx) * 31 + uint64_t(i),
                            options.variants, options.rounds};
          cell.cases.push_back(kind == "mrcr" ? make_mrcr_case(o, counter)
                                              : make_toolcall_case(o, counter));
        }
      } catch (const InputError& error) {
        result.notes.push_back(fmt::format("skipped {} at ctx {}: {}", kind, ctx, error.problem()));
        continue;
      }
      cells.push_back(std::move(cell));
    }
  }
  if (cells.empty()) throw InputError("tasks", "no task fits its context length");
  std::vector<int32_t> calibration_tokens =
      tokenizer.encode(round_prompt(cells.back().cases[0], cells.back().cases[0].rounds.size()));
  std::vector<numerics::KvFormat> formats;
  for (const std::string& spec : options.kv_formats)
    formats.push_back(numerics::parse_kv_format(spec));
  for (const auto& format : formats) {
    using numerics::ScaleStrategy;
    auto calibration = loaded_scales_for(format, options.loaded_scales, model.config());
    if (calibration.empty() &&
        (format.strategy == ScaleStrategy::tensor || format.strategy == ScaleStrategy::head ||
         format.strategy == ScaleStrategy::channel || format.kind == numerics::KvFormatKind::nvfp4))
      calibration = calibrate_static_scales(model, formats[0], format, calibration_tokens, pool);
    model::Session session(model, format, pool, calibration);
    TaskFormatResult fr;
    fr.spec = format.spec;
    for (const Cell& cell : cells) {
      TaskCell out;
      out.kind = cell.kind;
      out.ctx_tokens = cell.ctx;
      out.cases = static_cast<int>(cell.cases.size());
      int64_t answer_tokens = 0;
      double logprob = 0.0;
      for (const TaskCase& task : cell.cases) {
        TaskScore s = score_task_case(session, tokenizer, task);
        out.rounds += s.rounds;
        out.rounds_exact += s.rounds_exact;
        answer_tokens += s.answer_tokens;
        logprob += s.logprob;
      }
      out.accuracy = out.rounds > 0 ? double(out.rounds_exact) / double(out.rounds) : 0.0;
      const stats::Interval ci = stats::wilson_interval(out.rounds_exact, out.rounds, 0.95);
      out.accuracy_low = ci.low;
      out.accuracy_high = ci.high;
      out.mean_logprob_per_token = answer_tokens > 0 ? logprob / double(answer_tokens) : 0.0;
      fr.cells.push_back(out);
    }
    result.formats.push_back(std::move(fr));
  }
  return result;
}

}  // namespace kvaudit::eval
