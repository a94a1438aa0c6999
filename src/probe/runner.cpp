// Running probes against one or two servers: each detected (with its findings), the control
// arm of an A/B, the log-probs every server grants, the probe list (smoke, the recall grid,
// teacher-forced sequences, tasks), resume from the results file, workers bounded by
// --concurrency appending each record as it finishes, and the A/B comparison at the end.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>

#include "probe/internal.h"
#include "util/util.h"

namespace kvaudit::probe {

using nlohmann::json;

namespace {

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

// The control arm: A again on its own connections, or the replica --control names (with a
// note when it does not serve what A serves).
void open_control_arm(const engines::Registry& registry, const std::string& url_a,
                      const net::ClientOptions& client_options, const ProbeOptions& options,
                      std::vector<std::unique_ptr<net::Client>>& clients, RunResult& result) {
  ServerRun run;
  if (options.control_url.empty()) {
    run.facts = result.servers[0].facts;
    clients.push_back(std::make_unique<net::Client>(net::parse_url(url_a), client_options));
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

// What the servers grant: the smallest top-k any of them allows, echo unless one refuses (a
// control arm that is A itself is not asked again), with a note when that is less than asked.
RunSettings negotiate_settings(const std::vector<std::unique_ptr<net::Client>>& clients,
                               const std::vector<std::string>& models, const ProbeOptions& options,
                               bool with_control, RunResult& result) {
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
  return settings;
}

}  // namespace

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
  if (with_control) open_control_arm(registry, urls[0], client_options, options, clients, result);

  std::vector<std::string> models;
  for (const auto& run : result.servers)
    models.push_back(options.model.empty() ? run.facts.model_id : options.model);
  if (with_control)
    models.push_back(options.model.empty() ? result.control->facts.model_id : options.model);

  const RunSettings settings = negotiate_settings(clients, models, options, with_control, result);

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
