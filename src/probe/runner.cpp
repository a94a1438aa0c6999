// Running probes against one or two servers: the smoke prompts, recall cases from eval's
// generator, greedy completions with top-k log-probs, teacher-forced scoring of the
// expected text (echo + logprobs), workers bounded by --concurrency, results appended to
// the results file as each probe finishes, and resume from it.
#include <fmt/format.h>

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

namespace kvaudit::probe {

using nlohmann::json;

namespace {

struct Spec {
  std::string id;
  std::string kind;   // "smoke" | "recall"
  std::string smoke;  // "short" | "arithmetic" | "medium"
  int64_t ctx = 0, depth = 0;
  int case_index = 0;
};

struct Prepared {
  std::string prompt;
  std::string expected;
  int64_t prompt_tokens = 0;  // as counted
  int64_t depth_tokens = 0;
  int64_t expected_tokens = 0;
  std::string error;  // the case cannot be built
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

// A tiny fixed generator (splitmix64) for the medium smoke prompt.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

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
      uint64_t r = mix(seed * 1000 + i);
      std::string code = fmt::format("{}{}-{:04}", char('A' + r % 26), char('A' + (r >> 8) % 26),
                                     (r >> 16) % 10000);
      codes.push_back(code);
      codes_text += fmt::format("Item {:03} has code {}.\n", i + 1, code);
    }
    int asked = static_cast<int>(mix(seed + 77) % items);
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

ProbeRecord run_one(net::Client& client, const std::string& model, const Spec& spec,
                    const Prepared& prepared, const ProbeOptions& options) {
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
  net::Completion answer;
  try {
    if (spec.smoke == "arithmetic") {
      net::ChatRequest chat;
      chat.model = model;
      chat.messages = {{"user", prepared.prompt}};
      chat.max_tokens = 256;  // room for a reasoning model's thinking before the answer
      chat.seed = options.seed;
      chat.top_logprobs = options.top_logprobs;
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
        request.logprobs = options.top_logprobs;
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
      request.logprobs = options.top_logprobs;
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
  if (spec.kind == "recall" || spec.smoke == "medium")
    score_forced(client, model, prepared, options.top_logprobs, record);
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
std::vector<Spec> probe_specs(const ProbeOptions& options, std::optional<int64_t> context,
                              RunResult& result) {
  std::vector<Spec> specs;
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

  return specs;
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
          result.servers[side].resumed++;
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
        result.servers[side].records.push_back(std::move(*slot));
      }
    for (const auto& [note, count] : notes)
      result.notes.push_back(fmt::format("{}: {} of {} probes: {}", result.servers[side].facts.url,
                                         count, result.servers[side].records.size(), note));
    result.servers[side].client_stats = clients[side]->stats();
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
std::vector<Task> pending_tasks(const std::vector<std::vector<std::optional<ProbeRecord>>>& slots,
                                size_t spec_count) {
  std::vector<Task> tasks;
  for (size_t i = 0; i < spec_count; ++i)
    for (size_t side = 0; side < slots.size(); ++side)
      if (!slots[side][i]) tasks.push_back({side, i});
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
                                   run.prepared[task.spec], options);
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
  std::string kept =
      options.results_path.empty()
          ? "finished probes were not saved: pass --results FILE to make a run resumable"
          : fmt::format("finished probes are saved in {}; rerun the same command to resume",
                        options.results_path);
  throw InputError("probe", fmt::format("{} (stopped after {} of {} probes; {})", failure, finished,
                                        total, kept));
}

}  // namespace

RunResult run_probes(const engines::Registry& registry, const std::vector<std::string>& urls,
                     const net::ClientOptions& client_options, const ProbeOptions& options,
                     const std::string& checkpoint_dir) {
  if (urls.empty() || urls.size() > 2)
    throw InputError("probe", "give one server URL, or two with --compare");
  RunResult result;
  std::vector<std::unique_ptr<net::Client>> clients =
      open_servers(registry, urls, client_options, checkpoint_dir, options.deployment, result);
  if (!options.smoke && !options.recall) return result;

  std::vector<std::string> models;
  for (const auto& run : result.servers)
    models.push_back(options.model.empty() ? run.facts.model_id : options.model);
  const std::optional<int64_t> context = shared_context(result);
  std::vector<Spec> specs = probe_specs(options, context, result);

  // Prompt lengths are measured with the first server's tokenizer when it has one; both
  // sides get the identical text either way.
  const bool remote_counter = result.servers[0].facts.has_tokenize;
  TokenCounter counter(remote_counter ? clients[0].get() : nullptr, models[0]);
  result.token_counting =
      remote_counter ? fmt::format("{} /tokenize", result.servers[0].facts.url)
                     : "approximation: 4 bytes per token (the server has no /tokenize); context "
                       "lengths are approximate, prompt_tokens shows the server's own count";
  const std::string fingerprint =
      fmt::format("seed={};top={};count={}", options.seed, options.top_logprobs,
                  remote_counter ? "tokenize" : "bytes/4");

  // Resume: records already in the results file are kept, keyed by server, probe, settings.
  const size_t sides = clients.size();
  std::vector<std::vector<std::optional<ProbeRecord>>> slots(
      sides, std::vector<std::optional<ProbeRecord>>(specs.size()));
  const std::function<std::string(size_t, const Spec&)> key_of = [&](size_t side,
                                                                     const Spec& spec) {
    return fmt::format("{}|{}|{}|model={}", result.servers[side].facts.url, spec.id, fingerprint,
                       models[side]);
  };
  resume_from_file(options, specs, key_of, slots, result);

  const std::vector<Task> tasks = pending_tasks(slots, specs.size());
  std::ofstream results_out = open_results(options, tasks);
  RunControl control;
  const std::vector<Prepared> prepared =
      prepare_prompts(specs, tasks, options, context, counter, control);
  const int64_t done = run_pending({tasks, specs, prepared, clients, models, key_of}, options,
                                   results_out, slots, control);
  if (control.failure)
    throw_stopped(*control.failure, done, result, static_cast<int64_t>(specs.size() * sides),
                  options);
  collect_records(slots, clients, result);

  if (sides == 2)
    result.compare = compare_records(result.servers[0].records, result.servers[1].records);
  return result;
}

}  // namespace kvaudit::probe
