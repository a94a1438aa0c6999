// Running probes against one or two servers: the smoke prompts, recall cases from eval's
// generator, greedy completions with top-k log-probs, teacher-forced scoring of the
// expected text (echo + logprobs), workers bounded by --concurrency, results appended to
// the results file as each probe finishes, and resume from it.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <regex>
#include <thread>
#include <unordered_map>

#include "eval/eval.h"
#include "probe/probe.h"
#include "util/util.h"

namespace kvaudit::probe {

using nlohmann::json;

namespace {

struct Spec {
  std::string id;
  std::string kind;   // "smoke" | "recall" | "forced" | "mrcr" | "toolcall"
  std::string smoke;  // "short" | "arithmetic" | "medium"; forced: "code" | "text"
  int64_t ctx = 0, depth = 0;
  int case_index = 0;
};

struct Prepared {
  std::string prompt;
  std::string expected;
  int64_t prompt_tokens = 0;  // as counted
  int64_t depth_tokens = 0;
  int64_t expected_tokens = 0;
  std::optional<eval::TaskCase> task;  // mrcr / toolcall
  std::vector<int64_t> round_tokens;   // each round's answer, as counted
  std::string error;                   // the case cannot be built
};

// What every probe of a run asks for, once the servers said what they grant.
struct RunSettings {
  int top_logprobs = 0;  // alternatives per token, the smallest any server granted
  bool echo = true;      // prompt log-probs (echo) asked for: no server refused them
};

constexpr int64_t kForcedWindow = 64;  // prompt positions kept before the expected text

// Counts tokens with the server's /tokenize (in the dialect it speaks), memoised; else
// bytes / 4. A tokenizer that stops answering tokens stops the run (no_progress).
class TokenCounter {
 public:
  TokenCounter(net::Client* client, std::string model) {
    if (client) tokenizer_.emplace(*client, std::move(model)), client_ = client;
  }
  int64_t operator()(std::string_view text) {
    if (!tokenizer_) return static_cast<int64_t>((text.size() + 3) / 4);
    {
      std::lock_guard lock(mutex_);
      if (auto it = cache_.find(std::string(text)); it != cache_.end()) return it->second;
    }
    auto tokens = tokenizer_->tokenize(text);
    if (!tokens)
      throw net::RequestError(client_->where("/tokenize"), "the tokenizer endpoint went away",
                              net::FailureKind::http, 404);
    int64_t count = static_cast<int64_t>(tokens->ids.size());
    std::lock_guard lock(mutex_);
    if (cache_.size() > 200'000) cache_.clear();
    cache_.emplace(std::string(text), count);
    return count;
  }

 private:
  net::Client* client_ = nullptr;
  std::optional<net::Tokenizer> tokenizer_;
  std::mutex mutex_;
  std::unordered_map<std::string, int64_t> cache_;
};

Prepared prepare_smoke(const std::string& which, uint64_t seed, std::optional<int64_t> context) {
  Prepared p;
  if (which == "short") {
    p.prompt = "The capital of France is";
  } else if (which == "arithmetic") {
    p.prompt = "What is 17 + 25? Answer with the number only.";
    p.expected = "42";
  } else {
    // About 12 tokens per line; at most ~1,500 tokens, and half the context.
    int64_t budget = std::min<int64_t>(1500, context ? *context / 2 : 1500);
    int items = static_cast<int>(std::clamp<int64_t>(budget / 12, 8, 125));
    std::string codes_text;
    std::vector<std::string> codes;
    for (int i = 0; i < items; ++i) {
      uint64_t r = splitmix64(seed * 1000 + i);
      std::string code = fmt::format("{}{}-{:04}", char('A' + r % 26), char('A' + (r >> 8) % 26),
                                     (r >> 16) % 10000);
      codes.push_back(code);
      codes_text += fmt::format("Item {:03} has code {}.\n", i + 1, code);
    }
    int asked = static_cast<int>(splitmix64(seed + 77) % items);
    p.prompt = fmt::format(
        "Inventory list.\n{}\nQuestion: which code does item {:03} have?\n"
        "Answer: Item {:03} has code",
        codes_text, asked + 1, asked + 1);
    p.expected = " " + codes[asked];
  }
  return p;
}

std::vector<Position> positions_of(const std::vector<net::TokenLogprob>& tokens, size_t begin,
                                   size_t end) {
  std::vector<Position> out;
  for (size_t i = begin; i < end && i < tokens.size(); ++i) {
    Position position{tokens[i].token, tokens[i].logprob, {}};
    for (const auto& top : tokens[i].top) position.top.push_back({top.token, top.logprob});
    out.push_back(std::move(position));
  }
  return out;
}

bool fatal(const net::RequestError& error) {
  return error.server_unavailable() || error.kind() == net::FailureKind::malformed ||
         error.kind() == net::FailureKind::too_large ||
         error.kind() == net::FailureKind::no_progress || error.status() == 401 ||
         error.status() == 403 || error.status() == 404;
}

// A completion that produced nothing for max_tokens >= 1: asking again would get nothing
// again, so the run stops (with what it finished) instead of scoring emptiness forever.
void require_progress(const net::Completion& answer, const std::string& where) {
  const bool reported_zero = answer.completion_tokens && *answer.completion_tokens == 0;
  const bool silent_zero = !answer.completion_tokens && answer.tokens.empty() &&
                           answer.text.empty() && answer.finish_reason == "length";
  if (reported_zero || silent_zero)
    throw net::RequestError(
        where,
        fmt::format("no progress: the completion has 0 tokens (finish_reason '{}'){}",
                    answer.finish_reason,
                    reported_zero ? " per its usage" : ", no text and no log-probs"),
        net::FailureKind::no_progress);
}

// Teacher-forced score of `expected` after `prompt`: one echo request over the whole text.
void score_forced(net::Client& client, const std::string& model, const Prepared& prepared,
                  int top_k, ProbeRecord& record) {
  net::CompletionRequest request;
  request.model = model;
  request.prompt = prepared.prompt + prepared.expected;
  request.max_tokens = 1;
  request.echo = true;
  request.logprobs = std::max(1, top_k);
  net::Completion answer;
  try {
    answer = net::complete(client, request);
  } catch (const net::RequestError& error) {
    if (fatal(error)) throw;
    record.error = fmt::format("echo + logprobs refused: {}", error.problem());
    return;
  }
  if (!answer.has_logprobs) return;
  const size_t prompt_bytes = prepared.prompt.size();
  const size_t full_bytes = request.prompt.size();
  // llama-server accepts echo and ignores it: only the generated tokens come back, which
  // must not be read as the prompt's.
  size_t returned_bytes = 0;
  for (const auto& token : answer.tokens) returned_bytes += token.token.size();
  const bool offsets = !answer.tokens.empty() && answer.tokens[0].text_offset >= 0;
  if (!offsets && returned_bytes < full_bytes) {
    record.forced_note =
        "echo ignored: the server returned only the generated tokens, so the expected text has "
        "no teacher-forced score (compare uses the greedy prefix)";
    return;
  }
  size_t first = answer.tokens.size(), last = answer.tokens.size();
  size_t offset = 0;
  for (size_t i = 0; i < answer.tokens.size(); ++i) {
    const auto& token = answer.tokens[i];
    size_t start = token.text_offset >= 0 ? static_cast<size_t>(token.text_offset) : offset;
    size_t stop = start + token.token.size();
    offset = stop;
    if (start >= full_bytes) {  // the one generated token
      last = i;
      break;
    }
    if (stop > prompt_bytes && first == answer.tokens.size()) first = i;
  }
  if (first >= last) return;
  double sum = 0.0;
  int64_t counted = 0;
  for (size_t i = first; i < last; ++i)
    if (answer.tokens[i].logprob) {
      sum += *answer.tokens[i].logprob;
      ++counted;
    }
  if (counted > 0) {
    record.expected_logprob = sum;
    record.expected_tokens = counted;
  }
  size_t window_begin = first > size_t(kForcedWindow) ? first - kForcedWindow : 0;
  record.forced = positions_of(answer.tokens, window_begin, last);
}

// Teacher-forced score of a whole fixed sequence: one echo request; every prompt position
// after the first with its top-k, the tail mass the list leaves out, and the log-prob of the
// sequence's own tokens. Leaves record.forced empty (with a note) when no prompt log-probs
// come back.
void score_sequence(net::Client& client, const std::string& model, const std::string& text,
                    int top_k, ProbeRecord& record) {
  net::CompletionRequest request;
  request.model = model;
  request.prompt = text;
  request.max_tokens = 1;
  request.echo = true;
  request.logprobs = std::max(1, top_k);
  net::Completion answer;
  try {
    answer = net::complete(client, request);
  } catch (const net::RequestError& error) {
    if (fatal(error)) throw;
    record.forced_note = fmt::format("echo + logprobs refused: {}", error.problem());
    return;
  }
  size_t returned_bytes = 0;
  for (const auto& token : answer.tokens) returned_bytes += token.token.size();
  const bool offsets = !answer.tokens.empty() && answer.tokens[0].text_offset >= 0;
  if (!answer.has_logprobs || (!offsets && returned_bytes < text.size())) {
    record.forced_note = "no prompt log-probs: the server returned only the generated tokens";
    return;
  }
  size_t offset = 0, last = answer.tokens.size();
  for (size_t i = 0; i < answer.tokens.size(); ++i) {
    const auto& token = answer.tokens[i];
    size_t start = token.text_offset >= 0 ? static_cast<size_t>(token.text_offset) : offset;
    offset = start + token.token.size();
    if (start >= text.size()) {  // the generated token
      last = i;
      break;
    }
  }
  if (last < 2) {
    record.forced_note = "no prompt log-probs: the echo held fewer than two prompt tokens";
    return;
  }
  record.forced = positions_of(answer.tokens, 1, last);
  double sum = 0.0, tail = 0.0;
  int64_t counted = 0, with_top = 0;
  for (const Position& position : record.forced) {
    if (position.logprob) {
      sum += *position.logprob;
      ++counted;
    }
    if (!position.top.empty()) {
      double listed = 0.0;
      for (const auto& entry : position.top) listed += std::exp(entry.logprob);
      tail += std::max(0.0, 1.0 - listed);
      ++with_top;
    }
  }
  if (counted > 0) {
    record.expected_logprob = sum;
    record.expected_tokens = counted;
  }
  if (with_top > 0) record.tail_mass = tail / double(with_top);
}

// Where a sequence is cut when the server has no prompt log-probs: about half way, at a line
// end, so the greedy continuation is scored instead.
std::string first_half(const std::string& text) {
  size_t cut = text.rfind('\n', text.size() / 2);
  if (cut == std::string::npos || cut < text.size() / 4) cut = text.size() / 2;
  return text.substr(0, cut + 1);
}

// One multi-round task: each round asked after the earlier rounds' correct answers, greedy;
// the first round's tokens (with top-k) are kept for the KL estimate.
void run_task(net::Client& client, const std::string& model, const Prepared& prepared,
              const ProbeOptions& options, const RunSettings& settings, ProbeRecord& record) {
  const eval::TaskCase& task = *prepared.task;
  std::string outputs, expected;
  for (size_t r = 0; r < task.rounds.size(); ++r) {
    net::CompletionRequest request;
    request.model = model;
    request.prompt = eval::round_prompt(task, r);
    request.max_tokens = prepared.round_tokens[r] + 8;
    request.seed = options.seed;
    request.logprobs = settings.top_logprobs;
    request.stop = {"\n"};
    net::Completion answer = net::complete(client, request);
    require_progress(answer, client.where("/v1/completions"));
    if (r == 0) {
      record.generated = positions_of(answer.tokens, 0, answer.tokens.size());
      if (answer.prompt_tokens) record.prompt_tokens = *answer.prompt_tokens;
    }
    bool passed = false;
    if (task.kind == "toolcall") {
      eval::ToolCallCheck check =
          eval::check_tool_call(task.schema, task.rounds[r].expected, answer.text);
      passed = check.exact;
      record.schema_valid += check.schema_valid;
    } else {
      passed = answer.text.rfind(task.rounds[r].expected, 0) == 0;
    }
    ++record.rounds;
    record.rounds_passed += passed;
    outputs += (r ? "\n" : "") + answer.text;
    expected += (r ? "\n" : "") + task.rounds[r].expected;
  }
  record.output = outputs;
  record.expected = expected;
  record.passed = record.rounds > 0 && record.rounds_passed == record.rounds;
}

ProbeRecord run_one(net::Client& client, const std::string& model, const Spec& spec,
                    const Prepared& prepared, const ProbeOptions& options,
                    const RunSettings& settings) {
  auto started = std::chrono::steady_clock::now();
  ProbeRecord record;
  record.server = client.url().text();
  record.id = spec.id;
  record.kind = spec.kind;
  record.expected = prepared.expected;
  record.ctx_tokens = spec.ctx;
  record.depth_tokens = prepared.depth_tokens;
  record.prompt_tokens = prepared.prompt_tokens;
  if (!prepared.error.empty()) {
    record.error = prepared.error;
    return record;
  }
  record.top_k = settings.top_logprobs;
  if (spec.kind == "mrcr" || spec.kind == "toolcall" || spec.kind == "forced") {
    try {
      if (spec.kind == "forced") {
        record.endpoint = "/v1/completions (echo)";
        if (settings.echo)
          score_sequence(client, model, prepared.prompt, settings.top_logprobs, record);
        else
          record.forced_note = "no prompt log-probs (the server refused or ignored echo)";
        if (record.forced.empty()) {
          // Generated-token KL instead: greedy from the sequence's first half.
          net::CompletionRequest request;
          request.model = model;
          request.prompt = first_half(prepared.prompt);
          request.max_tokens = 32;
          request.seed = options.seed;
          request.logprobs = settings.top_logprobs;
          record.endpoint = "/v1/completions";
          net::Completion answer = net::complete(client, request);
          require_progress(answer, client.where("/v1/completions"));
          record.output = answer.text;
          record.generated = positions_of(answer.tokens, 0, answer.tokens.size());
          record.forced_note += "; scored by generated-token KL from the sequence's first half";
        }
        record.passed = true;
      } else {
        record.endpoint = "/v1/completions";
        run_task(client, model, prepared, options, settings, record);
      }
    } catch (const net::RequestError& error) {
      if (fatal(error)) throw;
      record.error = error.problem();
    }
    record.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    return record;
  }
  net::Completion answer;
  try {
    if (spec.smoke == "arithmetic") {
      net::ChatRequest chat;
      chat.model = model;
      chat.messages = {{"user", prepared.prompt}};
      chat.max_tokens = 256;  // room for a reasoning model's thinking before the answer
      chat.seed = options.seed;
      chat.top_logprobs = settings.top_logprobs;
      record.endpoint = "/v1/chat/completions";
      try {
        answer = net::chat(client, chat);
      } catch (const net::RequestError& error) {
        if (error.server_unavailable() || error.kind() != net::FailureKind::http) throw;
        // No chat template (or no chat endpoint): ask the same as plain completion.
        net::CompletionRequest request;
        request.model = model;
        request.prompt = "Question: " + prepared.prompt + "\nAnswer:";
        request.max_tokens = 16;
        request.seed = options.seed;
        request.logprobs = settings.top_logprobs;
        request.stop = {"\n"};
        record.endpoint = fmt::format("/v1/completions (chat refused: {})", error.problem());
        answer = net::complete(client, request);
      }
    } else {
      net::CompletionRequest request;
      request.model = model;
      request.prompt = prepared.prompt;
      request.max_tokens = spec.kind == "recall" ? prepared.expected_tokens + 8 : 16;
      request.seed = options.seed;
      request.logprobs = settings.top_logprobs;
      if (spec.kind == "recall" || spec.smoke == "medium") request.stop = {"\n"};
      record.endpoint = "/v1/completions";
      answer = net::complete(client, request);
    }
  } catch (const net::RequestError& error) {
    if (fatal(error)) throw;
    record.error = error.problem();
    return record;
  }
  require_progress(answer, client.where(record.endpoint.substr(0, record.endpoint.find(' '))));
  record.output = answer.text;
  if (answer.prompt_tokens) record.prompt_tokens = *answer.prompt_tokens;
  record.generated = positions_of(answer.tokens, 0, answer.tokens.size());
  if (spec.smoke == "short") {
    record.passed = answer.text.find_first_not_of(" \t\n") != std::string::npos;
  } else if (spec.smoke == "arithmetic") {
    static const std::regex forty_two("(^|[^0-9])42([^0-9]|$)");
    record.passed = std::regex_search(answer.text, forty_two);
  } else {
    record.passed = answer.text.rfind(prepared.expected, 0) == 0;
  }
  if ((spec.kind == "recall" || spec.smoke == "medium") && settings.echo)
    score_forced(client, model, prepared, settings.top_logprobs, record);
  else if (spec.kind == "recall" || spec.smoke == "medium")
    record.forced_note =
        "no prompt log-probs (the server refused or ignored echo): compare uses "
        "the greedy prefix";
  record.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return record;
}

// Runs f(i) for i in [0, n) on `threads` workers until done or `abort` is set.
template <class F>
void run_parallel(size_t n, int threads, std::atomic<bool>& abort, F f) {
  std::atomic<size_t> next{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < std::max(1, threads); ++t)
    workers.emplace_back([&] {
      while (!abort) {
        size_t i = next++;
        if (i >= n) break;
        f(i);
      }
    });
  for (auto& worker : workers) worker.join();
}

std::optional<checkpoint::ModelFacts> local_checkpoint(const std::string& dir,
                                                       const ServerFacts& facts,
                                                       std::vector<std::string>& notes) {
  std::string path = dir;
  if (path.empty()) {
    std::error_code error;
    if (facts.model_path.empty() ||
        !std::filesystem::exists(std::filesystem::path(facts.model_path) / "config.json", error))
      return std::nullopt;
    path = facts.model_path;
    notes.push_back(
        fmt::format("{}: read the served checkpoint at its model_path {} (found on "
                    "this machine) for the findings",
                    facts.url, path));
  }
  return checkpoint::read_checkpoint(path);
}

}  // namespace

namespace {

// The probes to run: the smoke set and the recall grid (cells the server's context cannot
// hold are skipped with a note).
std::vector<Spec> probe_specs(const ProbeOptions& options, bool compare,
                              std::optional<int64_t> context, RunResult& result) {
  std::vector<Spec> specs;
  int task_cases = options.task_cases;
  if (task_cases <= 0) {
    task_cases = 4;
    const auto contexts = static_cast<int64_t>(std::max<size_t>(1, options.task_ctx_tokens.size()));
    const int64_t needed = stats::min_samples_for(options.alpha, stats::Alternative::two_sided);
    // Twice the fewest paired probes that can reach alpha: that fewest reaches it only
    // when every probe moves the same way, and probes where both sides answer alike (both
    // right, both wrong) carry no sign.
    if (compare && !options.tasks.empty() && task_cases * contexts < 2 * needed) {
      task_cases = static_cast<int>((2 * needed + contexts - 1) / contexts);
      result.notes.push_back(fmt::format(
          "tasks: {} cases per task and context length, twice the {} paired probes that can "
          "reach p < {} at best (set --task-cases to change it)",
          task_cases, needed, options.alpha));
    }
  }
  if (options.smoke)
    for (const char* which : {"short", "arithmetic", "medium"})
      specs.push_back({fmt::format("smoke/{}", which), "smoke", which});
  if (options.recall) {
    for (int64_t ctx : options.ctx_tokens)
      for (int64_t depth : options.depth_tokens) {
        if (depth >= ctx) continue;
        if (context && ctx + 64 > *context) {
          result.notes.push_back(fmt::format(
              "recall ctx {} skipped: the server's context length is {} tokens", ctx, *context));
          continue;
        }
        for (int c = 0; c < options.cases_per_cell; ++c)
          specs.push_back({fmt::format("recall/ctx={}/depth={}/case={}", ctx, depth, c), "recall",
                           "", ctx, depth, c});
      }
    std::sort(result.notes.begin(), result.notes.end());
    result.notes.erase(std::unique(result.notes.begin(), result.notes.end()), result.notes.end());
  }
  if (options.forced)
    for (int c = 0; c < options.forced_cases; ++c) {
      const char* which = c % 2 == 0 ? "code" : "text";
      specs.push_back({fmt::format("forced/{}/case={}", which, c / 2), "forced", which, 0, 0, c});
    }
  for (const std::string& kind : options.tasks)
    for (int64_t ctx : options.task_ctx_tokens) {
      if (context && ctx + 64 > *context) {
        result.notes.push_back(
            fmt::format("{} ctx {} skipped: the server's context length is {} "
                        "tokens",
                        kind, ctx, *context));
        continue;
      }
      for (int c = 0; c < task_cases; ++c)
        specs.push_back({fmt::format("{}/ctx={}/case={}", kind, ctx, c), kind, "", ctx, 0, c});
    }
  return specs;
}

// Side 0 is A, 1 is B, 2 the control arm.
ServerRun& arm(RunResult& result, size_t side) {
  return side < result.servers.size() ? result.servers[side] : *result.control;
}

// Records a results file already holds, keyed by server, probe and settings, into their
// slots (a resumed run asks nothing twice).
void resume_from_file(const ProbeOptions& options, const std::vector<Spec>& specs,
                      const std::function<std::string(size_t, const Spec&)>& key_of,
                      std::vector<std::vector<std::optional<ProbeRecord>>>& slots,
                      RunResult& result) {
  const size_t sides = slots.size();
  if (options.results_path.empty()) return;
  {
    ResultsFile previous = load_results(options.results_path);
    std::map<std::string, ProbeRecord> by_key;
    for (auto& [key, record] : previous.records) by_key[key] = std::move(record);
    for (size_t side = 0; side < sides; ++side)
      for (size_t i = 0; i < specs.size(); ++i)
        if (auto it = by_key.find(key_of(side, specs[i])); it != by_key.end()) {
          slots[side][i] = it->second;
          arm(result, side).resumed++;
        }
    if (previous.skipped_lines > 0)
      result.notes.push_back(
          fmt::format("{}: skipped {} unreadable line(s) (a torn last line "
                      "from a killed run is expected)",
                      options.results_path, previous.skipped_lines));
  }
}

// The finished records into each server's run, with the notes the probes forced and the
// clients' request counts.
void collect_records(std::vector<std::vector<std::optional<ProbeRecord>>>& slots,
                     const std::vector<std::unique_ptr<net::Client>>& clients, RunResult& result) {
  const size_t sides = slots.size();
  for (size_t side = 0; side < sides; ++side) {
    std::map<std::string, int> notes;  // forced_note -> probes
    for (auto& slot : slots[side])
      if (slot) {
        if (!slot->forced_note.empty()) ++notes[slot->forced_note];
        arm(result, side).records.push_back(std::move(*slot));
      }
    for (const auto& [note, count] : notes)
      result.notes.push_back(fmt::format("{}{}: {} of {} probes: {}", arm(result, side).facts.url,
                                         side == 2 ? " (control arm)" : "", count,
                                         arm(result, side).records.size(), note));
    arm(result, side).client_stats = clients[side]->stats();
  }
}

// One probe on one server: indices into the servers and the specs.
struct Task {
  size_t side, spec;
};

// What the parallel passes share: the first failure stops the rest. `mutex` also guards
// the results file, the slots and the progress count in run_pending.
struct RunControl {
  std::atomic<bool> abort{false};
  std::mutex mutex;
  std::optional<std::string> failure;
  void fail(const std::string& message) {
    std::lock_guard lock(mutex);
    if (!failure) failure = message;
    abort = true;
  }
};

// A client per server URL and what each serves (detect_server), with the findings on it
// (from the local checkpoint when one is given or found beside the server).
std::vector<std::unique_ptr<net::Client>> open_servers(const engines::Registry& registry,
                                                       const std::vector<std::string>& urls,
                                                       const net::ClientOptions& client_options,
                                                       const std::string& checkpoint_dir,
                                                       const Deployment& deployment,
                                                       RunResult& result) {
  std::vector<std::unique_ptr<net::Client>> clients;
  for (const std::string& url : urls) {
    clients.push_back(std::make_unique<net::Client>(net::parse_url(url), client_options));
    ServerRun run;
    run.facts = detect_server(registry, *clients.back());
    auto model = local_checkpoint(checkpoint_dir, run.facts, result.notes);
    run.findings = server_findings(registry, run.facts, model ? &*model : nullptr, deployment);
    result.servers.push_back(std::move(run));
  }
  if (urls.size() == 2 && result.servers[0].facts.url == result.servers[1].facts.url)
    throw InputError("--compare", "both URLs name the same server");
  return clients;
}

// The smallest context length the servers report (nullopt when none does).
std::optional<int64_t> shared_context(const RunResult& result) {
  std::optional<int64_t> context;
  for (const auto& run : result.servers)
    if (run.facts.context_length && (!context || *run.facts.context_length < *context))
      context = run.facts.context_length;
  return context;
}

// The probes still to run: one task per (probe, server) without a resumed record,
// interleaved by probe so a killed run leaves the pairs balanced.
// The control arm (side 2) walks the probes in reverse, so the same probe meets other batch
// neighbours on its second visit to A than on its first.
std::vector<Task> pending_tasks(const std::vector<std::vector<std::optional<ProbeRecord>>>& slots,
                                size_t spec_count) {
  std::vector<Task> tasks;
  for (size_t i = 0; i < spec_count; ++i)
    for (size_t side = 0; side < slots.size(); ++side) {
      const size_t spec = side == 2 ? spec_count - 1 - i : i;
      if (!slots[side][spec]) tasks.push_back({side, spec});
    }
  return tasks;
}

// The prompt of one recall probe: a generated case whose lengths `counter` measures.
void prepare_recall(const Spec& spec, const ProbeOptions& options, TokenCounter& counter,
                    Prepared& p) {
  eval::RecallCaseOptions recall;
  recall.ctx_tokens = spec.ctx;
  recall.depth_tokens = spec.depth;
  recall.seed = options.seed * 1'000'003ull + uint64_t(spec.ctx) * 131 + uint64_t(spec.depth) * 7 +
                uint64_t(spec.case_index);
  eval::RecallCase recall_case =
      eval::make_recall_case(recall, [&](std::string_view text) { return counter(text); });
  p.prompt = std::move(recall_case.prompt);
  p.expected = std::move(recall_case.expected);
  p.prompt_tokens = recall_case.prompt_tokens;
  p.depth_tokens = recall_case.depth_tokens;
  p.expected_tokens = counter(p.expected);
}

// The prompts of the probes some server still runs, options.concurrency at a time (one
// Prepared per spec; the others stay empty). A case that cannot be built is a finished,
// failed probe (its error set); a failed request or anything else stops the run.
std::vector<Prepared> prepare_prompts(const std::vector<Spec>& specs,
                                      const std::vector<Task>& tasks, const ProbeOptions& options,
                                      std::optional<int64_t> context, TokenCounter& counter,
                                      RunControl& control) {
  std::vector<bool> needs_prompt(specs.size(), false);
  for (const Task& task : tasks) needs_prompt[task.spec] = true;
  std::vector<Prepared> prepared(specs.size());
  std::vector<size_t> to_prepare;
  for (size_t i = 0; i < specs.size(); ++i)
    if (needs_prompt[i]) to_prepare.push_back(i);
  run_parallel(to_prepare.size(), options.concurrency, control.abort, [&](size_t k) {
    const Spec& spec = specs[to_prepare[k]];
    Prepared& p = prepared[to_prepare[k]];
    try {
      if (spec.kind == "smoke") {
        p = prepare_smoke(spec.smoke, options.seed, context);
        return;
      }
      const uint64_t seed =
          options.seed * 1'000'003ull + uint64_t(spec.ctx) * 131 + uint64_t(spec.case_index);
      const eval::TokenCounter count = [&](std::string_view text) { return counter(text); };
      if (spec.kind == "forced") {
        // About 384 tokens each: synthetic code from the recall generator, or prose.
        if (spec.smoke == "code") {
          p.prompt = eval::make_code(seed, 384, count);
        } else {
          p.prompt = eval::make_prose(seed, 384, count);
        }
        p.prompt_tokens = counter(p.prompt);
        return;
      }
      if (spec.kind == "mrcr" || spec.kind == "toolcall") {
        eval::TaskCaseOptions task{spec.ctx, seed, 4, 3};
        p.task = spec.kind == "mrcr" ? eval::make_mrcr_case(task, count)
                                     : eval::make_toolcall_case(task, count);
        for (const auto& round : p.task->rounds) p.round_tokens.push_back(counter(round.expected));
        p.prompt_tokens = p.task->prompt_tokens;
        return;
      }
      prepare_recall(spec, options, counter, p);
    } catch (const net::RequestError& error) {
      control.fail(error.what());
    } catch (const InputError& error) {
      p.error = error.problem();  // e.g. the depth leaves no room: a finished, failed probe
    } catch (const std::exception& error) {
      control.fail(fmt::format("{}: {}", spec.id, error.what()));
    }
  });
  return prepared;
}

// The results file, opened for appending when there is one and something will run.
std::ofstream open_results(const ProbeOptions& options, const std::vector<Task>& tasks) {
  std::ofstream results_out;
  if (!options.results_path.empty() && !tasks.empty()) {
    results_out.open(options.results_path, std::ios::app);
    if (!results_out)
      throw InputError(options.results_path, "cannot open the results file for appending");
  }
  return results_out;
}

// What run_pending runs: the probes, the prompts, and where the records go.
struct PendingRun {
  const std::vector<Task>& tasks;
  const std::vector<Spec>& specs;
  const std::vector<Prepared>& prepared;
  const std::vector<std::unique_ptr<net::Client>>& clients;
  const std::vector<std::string>& models;  // per server
  const std::function<std::string(size_t, const Spec&)>& key_of;
  const RunSettings& settings;
};

// Runs the tasks, options.concurrency at a time (none once the preparation failed); each
// finished record is appended to the results file (when open) and put in its slot. Returns
// how many finished.
int64_t run_pending(const PendingRun& run, const ProbeOptions& options, std::ofstream& results_out,
                    std::vector<std::vector<std::optional<ProbeRecord>>>& slots,
                    RunControl& control) {
  int64_t done = 0;
  const int threads = control.abort ? 0 : options.concurrency;
  run_parallel(run.tasks.size(), threads, control.abort, [&](size_t k) {
    const Task& task = run.tasks[k];
    const Spec& spec = run.specs[task.spec];
    try {
      ProbeRecord record = run_one(*run.clients[task.side], run.models[task.side], spec,
                                   run.prepared[task.spec], options, run.settings);
      std::lock_guard lock(control.mutex);
      if (results_out.is_open()) {
        results_out << json({{"key", run.key_of(task.side, spec)}, {"record", to_json(record)}})
                           .dump(-1, ' ', false, json::error_handler_t::replace)
                    << '\n';
        results_out.flush();
      }
      slots[task.side][task.spec] = std::move(record);
      ++done;
      if (options.on_progress)
        options.on_progress(done, static_cast<int64_t>(run.tasks.size()), spec.id);
    } catch (const net::RequestError& error) {
      control.fail(error.what());
    } catch (const std::exception& error) {
      control.fail(fmt::format("{}: {}", spec.id, error.what()));
    }
  });
  return done;
}

// The error a stopped run ends with: the first failure, how many of the probes finished
// (resumed ones included) and whether they were saved.
[[noreturn]] void throw_stopped(const std::string& failure, int64_t done, const RunResult& result,
                                int64_t total, const ProbeOptions& options) {
  int64_t finished = done;
  for (const auto& run : result.servers) finished += run.resumed;
  if (result.control) finished += result.control->resumed;
  std::string kept =
      options.results_path.empty()
          ? "finished probes were not saved: pass --results FILE to make a run resumable"
          : fmt::format("finished probes are saved in {}; rerun the same command to resume",
                        options.results_path);
  throw InputError("probe", fmt::format("{} (stopped after {} of {} probes; {})", failure, finished,
                                        total, kept));
}

}  // namespace

void negotiate_logprobs(net::Client& client, const std::string& model, int wanted,
                        ServerFacts& facts) {
  // One small request per try, without retries: an answer that says no is the answer.
  net::ClientOptions quick = client.options();
  quick.max_retries = 0;
  net::Client probe_client(client.url(), quick);
  static const std::regex allowed(R"((?:max allowed|more than)[^0-9]{0,12}([0-9]{1,6}))");
  int asking = std::max(1, wanted);
  std::vector<std::string> said;
  const std::string text = "The quick brown fox jumps over the lazy dog.";
  for (int attempt = 0; attempt < 6 && asking >= 1; ++attempt) {
    net::CompletionRequest request;
    request.model = model;
    request.prompt = text;
    request.max_tokens = 1;
    request.logprobs = asking;
    request.echo = facts.prompt_logprobs.value_or(true);
    try {
      net::Completion answer = net::complete(probe_client, request);
      facts.top_logprobs_granted = asking;
      size_t longest = 0, returned_bytes = 0;
      for (const auto& token : answer.tokens) {
        longest = std::max(longest, token.top.size());
        returned_bytes += token.token.size();
      }
      if (request.echo) {
        const bool offsets = !answer.tokens.empty() && answer.tokens[0].text_offset >= 0;
        facts.prompt_logprobs = answer.has_logprobs && (offsets || returned_bytes >= text.size());
        if (!*facts.prompt_logprobs)
          said.push_back("echo ignored: only generated tokens came back");
      }
      if (answer.has_logprobs && longest > 0 && int(longest) < asking)
        said.push_back(fmt::format("asked {} alternatives, {} came back", asking, longest));
      said.push_back(
          fmt::format("granted {} log-probs per token{}", asking,
                      facts.prompt_logprobs.value_or(false) ? " with the prompt's (echo)" : ""));
      break;
    } catch (const net::RequestError& error) {
      if (error.kind() != net::FailureKind::http || error.status() == 401 ||
          error.status() == 403 || error.status() == 404)
        break;  // not an answer about log-probs: leave it unknown
      const std::string problem = error.problem();
      said.push_back(fmt::format("asked {}{}: {}", asking, request.echo ? " with echo" : "",
                                 problem.substr(0, 200)));
      std::string lower = problem;
      std::transform(lower.begin(), lower.end(), lower.begin(),
                     [](unsigned char c) { return std::tolower(c); });
      if (request.echo && lower.find("echo") != std::string::npos) {
        // llama-server: "Only no echo is supported" (HTTP 500); ask again without echo.
        facts.prompt_logprobs = false;
        continue;
      }
      if (error.status() >= 500) break;  // overload, not an answer about log-probs
      std::smatch match;
      if (std::regex_search(problem, match, allowed)) {
        const int limit = std::stoi(match[1]);
        if (limit >= 1 && limit < asking) {
          asking = limit;
          continue;
        }
      }
      asking /= 2;
    }
  }
  facts.logprobs_note = fmt::format("{}", fmt::join(said, "; "));
}

RunResult run_probes(const engines::Registry& registry, const std::vector<std::string>& urls,
                     const net::ClientOptions& client_options, const ProbeOptions& options,
                     const std::string& checkpoint_dir) {
  if (urls.empty() || urls.size() > 2)
    throw InputError("probe", "give one server URL, or two with --compare");
  if (!options.control_url.empty() && urls.size() != 2)
    throw InputError("--control", "a control arm needs --compare");
  RunResult result;
  std::vector<std::unique_ptr<net::Client>> clients =
      open_servers(registry, urls, client_options, checkpoint_dir, options.deployment, result);
  if (!options.smoke && !options.recall && !options.forced && options.tasks.empty()) return result;

  // The control arm: A again on its own connections, or the replica --control names.
  const bool with_control = urls.size() == 2 && options.control;
  if (with_control) {
    ServerRun run;
    if (options.control_url.empty()) {
      run.facts = result.servers[0].facts;
      clients.push_back(std::make_unique<net::Client>(net::parse_url(urls[0]), client_options));
    } else {
      clients.push_back(
          std::make_unique<net::Client>(net::parse_url(options.control_url), client_options));
      run.facts = detect_server(registry, *clients.back());
      const ServerFacts& a = result.servers[0].facts;
      std::vector<std::string> differ;
      if (run.facts.model_id != a.model_id) differ.push_back("model " + run.facts.model_id);
      if (run.facts.kv_cache_dtype != a.kv_cache_dtype)
        differ.push_back("KV dtype " + run.facts.kv_cache_dtype);
      if (run.facts.engine != a.engine) differ.push_back("engine " + run.facts.engine);
      if (!differ.empty())
        result.notes.push_back(fmt::format(
            "the control {} is not a replica of A (it differs in {}): its floor is not A's own",
            options.control_url, fmt::join(differ, ", ")));
    }
    result.control = std::move(run);
  }

  std::vector<std::string> models;
  for (const auto& run : result.servers)
    models.push_back(options.model.empty() ? run.facts.model_id : options.model);
  if (with_control)
    models.push_back(options.model.empty() ? result.control->facts.model_id : options.model);

  // What the servers grant: the smallest top-k any of them allows, echo unless one refuses.
  RunSettings settings;
  settings.top_logprobs = options.top_logprobs;
  int granted = 0;
  for (size_t side = 0; side < clients.size(); ++side) {
    ServerFacts& facts = arm(result, side).facts;
    if (side == 2 && options.control_url.empty()) continue;  // A itself
    negotiate_logprobs(*clients[side], models[side], options.top_logprobs, facts);
    if (facts.top_logprobs_granted > 0)
      granted =
          granted == 0 ? facts.top_logprobs_granted : std::min(granted, facts.top_logprobs_granted);
    if (facts.prompt_logprobs == false) settings.echo = false;
  }
  if (granted > 0) settings.top_logprobs = granted;
  if (with_control && options.control_url.empty()) result.control->facts = result.servers[0].facts;
  if (settings.top_logprobs < options.top_logprobs)
    result.notes.push_back(
        fmt::format("log-probs: {} alternatives per token asked, {} used (the "
                    "most every server grants)",
                    options.top_logprobs, settings.top_logprobs));
  if (!settings.echo && (options.forced || options.recall || options.smoke))
    result.notes.push_back(
        "no teacher-forced scoring: a server returns no prompt log-probs "
        "(echo); KL is estimated on generated tokens instead");

  const std::optional<int64_t> context = shared_context(result);
  std::vector<Spec> specs = probe_specs(options, urls.size() == 2, context, result);

  // Prompt lengths are measured with the first server's tokenizer when it has one; both
  // sides get the identical text either way.
  const bool remote_counter = result.servers[0].facts.has_tokenize;
  TokenCounter counter(remote_counter ? clients[0].get() : nullptr, models[0]);
  result.token_counting =
      remote_counter ? fmt::format("{} /tokenize", result.servers[0].facts.url)
                     : "approximation: 4 bytes per token (the server has no /tokenize); context "
                       "lengths are approximate, prompt_tokens shows the server's own count";
  const std::string fingerprint =
      fmt::format("seed={};top={};echo={};count={}", options.seed, settings.top_logprobs,
                  settings.echo ? 1 : 0, remote_counter ? "tokenize" : "bytes/4");

  // Resume: records already in the results file are kept, keyed by arm, server, probe,
  // settings.
  const size_t sides = clients.size();
  std::vector<std::vector<std::optional<ProbeRecord>>> slots(
      sides, std::vector<std::optional<ProbeRecord>>(specs.size()));
  const std::function<std::string(size_t, const Spec&)> key_of = [&](size_t side,
                                                                     const Spec& spec) {
    return fmt::format("{}{}|{}|{}|model={}", side == 2 ? "control|" : "",
                       arm(result, side).facts.url, spec.id, fingerprint, models[side]);
  };
  resume_from_file(options, specs, key_of, slots, result);

  const std::vector<Task> tasks = pending_tasks(slots, specs.size());
  std::ofstream results_out = open_results(options, tasks);
  RunControl control;
  const std::vector<Prepared> prepared =
      prepare_prompts(specs, tasks, options, context, counter, control);
  const int64_t done = run_pending({tasks, specs, prepared, clients, models, key_of, settings},
                                   options, results_out, slots, control);
  if (control.failure)
    throw_stopped(*control.failure, done, result, static_cast<int64_t>(specs.size() * sides),
                  options);
  collect_records(slots, clients, result);

  if (urls.size() == 2) {
    CompareOptions compare;
    compare.alpha = options.alpha;
    compare.power = options.power;
    compare.gates = options.gates;
    compare.control_label = !with_control ? ""
                            : options.control_url.empty()
                                ? "A again, the probes in reverse order (other batch neighbours)"
                                : "replica " + options.control_url;
    result.compare = compare_records(
        result.servers[0].records, result.servers[1].records,
        with_control ? result.control->records : std::vector<ProbeRecord>{}, compare);
  }
  return result;
}

}  // namespace kvaudit::probe
