// kvaudit probe: verify a live OpenAI-compatible server (SGLang, vLLM, kvaudit serve), or
// A/B two deployments on long-context code recall; with --load, the load bench (loadbench/).
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>

#include "cli/commands.h"
#include "loadbench/loadbench.h"
#include "plan/plan.h"
#include "probe/probe.h"
#include "util/util.h"

namespace kvaudit::cli {

namespace {

struct ProbeFlags {
  std::string url;
  std::string compare_url;
  bool smoke = false;
  bool recall = false;
  std::string recall_ctx = "1k,4k";
  std::string recall_depth = "256,2k";
  int recall_cases = 2;
  uint64_t seed = 1;
  int top_logprobs = 20;
  bool forced = false;
  int forced_cases = 8;
  std::vector<std::string> tasks;
  std::string task_ctx = "4k";
  int task_cases = 0;  // 0: the probe module's default (more in an A/B)
  std::string control_url;
  bool no_control = false;
  double alpha = 0.01;
  std::string gates;
  std::string model;
  std::string checkpoint;
  std::string results;
  std::string gpu;
  std::string kv_policy = "evidence";
  std::string api_key;
  double timeout_s = 600;
  double connect_timeout_s = 10;
  int retries = 4;
  double backoff_s = 0.5;
  int concurrency = 2;
  bool insecure = false;
  std::string ca_cert;
  bool progress = false;
  std::string fail_on = "critical";
  // --load
  bool load = false;
  std::string load_concurrency = "1,4,16,32";
  int64_t load_requests = 0;
  int64_t load_budget = 2000;
  double load_time_s = 900;
  std::string load_prompt_tokens = "1k,2k,4k";
  std::string load_output_tokens = "64,128,256";
  std::string load_corpus;
  int load_turns = 1;
  bool no_random_control = false;
  bool no_stream = false;
  // --roundtrip
  bool roundtrip = false;
  int roundtrip_prompts = 10;
  int64_t roundtrip_prompt_tokens = 384;
  int64_t roundtrip_generate = 16;
  double roundtrip_overrun = 1.5;
  int64_t roundtrip_filler_tokens = 0;
  int64_t roundtrip_max_filler = 4'000'000;
  int roundtrip_max_requests = 4000;
  double roundtrip_time_s = 900;
  double roundtrip_tolerance = probe::kDifferentKl;
  OutputOptions output;
};

std::chrono::milliseconds milliseconds(double seconds, const char* flag) {
  if (!(seconds > 0) || seconds > 86'400) throw InputError(flag, "expects seconds in (0, 86400]");
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

// A one-line progress bar on stderr, redrawn in place.
void draw_progress(int64_t done, int64_t total, const std::string& label) {
  constexpr int kWidth = 30;
  int filled = total > 0 ? static_cast<int>(kWidth * done / total) : kWidth;
  std::string bar(filled, '=');
  bar.resize(kWidth, ' ');
  std::string shown = label.size() > 40 ? label.substr(0, 40) : label;
  std::fprintf(stderr, "\r[%s] %lld/%lld %-40s", bar.c_str(), static_cast<long long>(done),
               static_cast<long long>(total), shown.c_str());
  if (done == total) std::fputc('\n', stderr);
  std::fflush(stderr);
}

// Ctrl-C during a load test: the run stops cleanly and reports what it measured.
std::atomic<bool> g_interrupted{false};
extern "C" void on_interrupt(int) {
  g_interrupted = true;
}

int run_load_command(const engines::Registry& registry, const ProbeFlags& flags,
                     const net::ClientOptions& client) {
  loadbench::LoadOptions options;
  options.concurrency.clear();
  for (int64_t c : parse_token_counts(flags.load_concurrency, "--load-concurrency", "1,4,16,32"))
    options.concurrency.push_back(static_cast<int>(std::min<int64_t>(c, 1 << 20)));
  options.requests_per_level = flags.load_requests;
  options.max_requests = flags.load_budget;
  options.max_seconds = flags.load_time_s;
  options.prompt_tokens =
      parse_token_counts(flags.load_prompt_tokens, "--load-prompt-tokens", "1k,4k");
  options.output_tokens =
      parse_token_counts(flags.load_output_tokens, "--load-output-tokens", "64,256");
  options.corpus_dir = flags.load_corpus;
  options.turns = flags.load_turns;
  options.random_control = !flags.no_random_control;
  options.stream = !flags.no_stream;
  options.seed = flags.seed;
  options.model = flags.model;
  options.results_path = flags.results;
  options.interrupted = [] { return g_interrupted.load(); };
  if (flags.progress || isatty(STDERR_FILENO)) options.on_progress = draw_progress;
  std::vector<std::string> urls = {flags.url};
  if (!flags.compare_url.empty()) urls.push_back(flags.compare_url);
  std::signal(SIGINT, on_interrupt);
  loadbench::LoadResult result = loadbench::run_load(registry, urls, client, options);
  std::signal(SIGINT, SIG_DFL);
  // Failed requests, or a server that stopped answering, fail the command (the report
  // keeps what was measured); reaching the time limit or the budget does not. One check per
  // level, so JUnit names the level that failed.
  report::ExitGate gate;
  for (const loadbench::LoadLevel& level : result.levels)
    gate.checks.push_back({"load",
                           fmt::format("{} {} prompts @ concurrency {}", level.server,
                                       level.prompts, level.concurrency),
                           level.failures == 0, fmt::format("{} failed requests", level.failures)});
  report::Report out = loadbench::to_report(result, options);
  emit(out, flags.output, gate);
  return report::gate_fails(out, gate) ? kExitGateFailed : kExitOk;
}

int run_roundtrip_command(const engines::Registry& registry, const ProbeFlags& flags,
                          const net::ClientOptions& client) {
  if (!flags.compare_url.empty())
    throw InputError("--roundtrip", "checks one server: drop --compare");
  probe::RoundTripOptions options;
  options.prompts = flags.roundtrip_prompts;
  options.prompt_tokens = flags.roundtrip_prompt_tokens;
  options.generate_tokens = flags.roundtrip_generate;
  options.overrun = flags.roundtrip_overrun;
  options.filler_prompt_tokens = flags.roundtrip_filler_tokens;
  options.max_filler_tokens = flags.roundtrip_max_filler;
  options.max_requests = flags.roundtrip_max_requests;
  options.time_limit_seconds = flags.roundtrip_time_s;
  options.tolerance_kl = flags.roundtrip_tolerance;
  options.alpha = flags.alpha;
  options.top_logprobs = std::min(flags.top_logprobs, 5);
  options.concurrency = flags.concurrency;
  options.seed = flags.seed;
  options.model = flags.model;
  if (flags.progress || isatty(STDERR_FILENO))
    options.on_progress = [](const std::string& stage, int64_t done, int64_t total) {
      draw_progress(done, total, stage);
    };
  probe::RoundTripResult result = probe::run_roundtrip(registry, flags.url, client, options);
  report::Report out = probe::to_report(result, options);
  report::ExitGate gate;
  for (const probe::TierCheck& check : result.checks)
    gate.checks.push_back({"roundtrip", check.name,
                           check.verdict != "changed" && check.verdict != "inconclusive",
                           check.sentence});
  gate.checks.push_back({"roundtrip", "verdict", !probe::roundtrip_failed(result),
                         result.verdict + ": " + result.reason});
  emit(out, flags.output, gate);
  return report::gate_fails(out, gate) ? kExitGateFailed : kExitOk;
}

int run_probe_command(const engines::Registry& registry, const ProbeFlags& flags) {
  net::ClientOptions client;
  client.api_key = flags.api_key.empty() ? net::api_key_from_environment() : flags.api_key;
  client.read_timeout = milliseconds(flags.timeout_s, "--timeout");
  client.connect_timeout = milliseconds(flags.connect_timeout_s, "--connect-timeout");
  client.max_retries = flags.retries;
  client.backoff_initial = milliseconds(flags.backoff_s, "--backoff");
  client.max_concurrency = flags.concurrency;
  client.verify_tls = !flags.insecure;
  client.ca_cert_file = flags.ca_cert;

  if (flags.load && flags.roundtrip)
    throw InputError("--roundtrip", "cannot be combined with --load");
  if (flags.load) return run_load_command(registry, flags, client);
  if (flags.roundtrip) return run_roundtrip_command(registry, flags, client);
  probe::ProbeOptions options;
  options.smoke = flags.smoke;
  options.recall = flags.recall;
  options.ctx_tokens = parse_token_counts(flags.recall_ctx, "--recall-ctx", "1k,4k,32k");
  options.depth_tokens = parse_token_counts(flags.recall_depth, "--recall-depth", "1k,4k,32k");
  options.cases_per_cell = flags.recall_cases;
  options.seed = flags.seed;
  options.top_logprobs = flags.top_logprobs;
  options.forced = flags.forced;
  options.forced_cases = flags.forced_cases;
  options.tasks = flags.tasks;
  options.task_ctx_tokens = parse_token_counts(flags.task_ctx, "--task-ctx", "4k,16k");
  options.task_cases = flags.task_cases;
  options.control_url = flags.control_url;
  options.control = !flags.no_control;
  options.alpha = flags.alpha;
  if (!flags.gates.empty()) options.gates = probe::parse_gates(flags.gates);
  if (flags.compare_url.empty() && (!flags.control_url.empty() || !flags.gates.empty()))
    throw InputError(flags.control_url.empty() ? "--gate" : "--control",
                     "an A/B option: give --compare URL");
  if (!flags.control_url.empty() && flags.no_control)
    throw InputError("--control", "cannot be combined with --no-control");
  options.model = flags.model;
  options.results_path = flags.results;
  options.concurrency = flags.concurrency;
  options.deployment.policy = *audit::parse_kv_policy(flags.kv_policy);  // CLI11 checked it
  if (!flags.gpu.empty()) {
    const plan::GpuPreset gpu = plan::find_gpu(flags.gpu);
    options.deployment.gpu_name = gpu.name;
    options.deployment.gpu_arch = gpu.arch;
    options.deployment.platform = gpu.platform;
  }
  if (flags.progress || isatty(STDERR_FILENO)) options.on_progress = draw_progress;

  std::vector<std::string> urls = {flags.url};
  if (!flags.compare_url.empty()) urls.push_back(flags.compare_url);
  probe::RunResult result = probe::run_probes(registry, urls, client, options, flags.checkpoint);
  report::Report out = probe::to_report(result, options);
  report::ExitGate gate;
  gate.checks = probe::gate_checks(result);
  if (flags.fail_on == "critical") gate.fail_on = report::Severity::critical;
  if (flags.fail_on == "warning") gate.fail_on = report::Severity::warning;
  emit(out, flags.output, gate);
  return report::gate_fails(out, gate) ? kExitGateFailed : kExitOk;
}

// probe --load's flags (the load bench, loadbench/).
void add_load_flags(CLI::App* probe, ProbeFlags& flags_in) {
  ProbeFlags* flags = &flags_in;
  probe->add_flag("--load", flags->load,
                  "Load test: throughput and latency at a ladder of concurrencies, real code "
                  "against random-token prompts of the same lengths (with --compare: A/B)");
  probe->add_option("--load-concurrency", flags->load_concurrency, "Concurrency ladder");
  probe->add_option("--load-requests", flags->load_requests,
                    "Requests per level (default: max(8, 2 x concurrency))");
  probe->add_option("--load-budget", flags->load_budget, "Most requests in the whole run")
      ->check(CLI::Range(int64_t{1}, int64_t{1000000}));
  probe->add_option("--load-time", flags->load_time_s, "Seconds the whole run may take")
      ->check(CLI::Range(1.0, 86400.0));
  probe->add_option("--load-prompt-tokens", flags->load_prompt_tokens,
                    "Prompt lengths, cycled over each level's requests");
  probe->add_option("--load-output-tokens", flags->load_output_tokens,
                    "max_tokens per request, cycled");
  probe->add_option("--load-corpus", flags->load_corpus,
                    "Folder of your own files to build the prompts from (default: synthetic code)");
  probe
      ->add_option("--load-turns", flags->load_turns,
                   "Requests per session, sent one after another, each re-sending the "
                   "session's context grown (a coding agent's loop; shows prefix caching)")
      ->check(CLI::Range(1, 64));
  probe->add_flag("--no-random-control", flags->no_random_control,
                  "Skip the random-token control runs");
  probe->add_flag("--no-stream", flags->no_stream, "Do not ask for streamed answers (no TTFT/ITL)");
}

// probe --roundtrip's flags (KV tiers).
void add_roundtrip_flags(CLI::App* probe, ProbeFlags& flags_in) {
  ProbeFlags* flags = &flags_in;
  probe->add_flag("--roundtrip", flags->roundtrip,
                  "KV tiers: the same prompts scored cold, from the device prefix cache, and "
                  "after filler evicts them to whatever tier keeps them; each tier's answers "
                  "must match the pass before it within the floor");
  probe->add_option("--roundtrip-prompts", flags->roundtrip_prompts, "Prompts per pass")
      ->capture_default_str();
  probe
      ->add_option("--roundtrip-prompt-tokens", flags->roundtrip_prompt_tokens,
                   "Tokens per prompt (about)")
      ->capture_default_str();
  probe
      ->add_option("--roundtrip-generate", flags->roundtrip_generate,
                   "Greedy tokens scored per prompt and pass")
      ->capture_default_str();
  probe
      ->add_option("--roundtrip-overrun", flags->roundtrip_overrun,
                   "Filler sent, as a multiple of the device pool's tokens")
      ->capture_default_str();
  probe->add_option("--roundtrip-filler-tokens", flags->roundtrip_filler_tokens,
                    "Tokens per filler request (default: half the context, at most 2048)");
  probe
      ->add_option("--roundtrip-max-filler-tokens", flags->roundtrip_max_filler,
                   "Most filler tokens the run may send")
      ->capture_default_str();
  probe
      ->add_option("--roundtrip-max-requests", flags->roundtrip_max_requests,
                   "Most requests the run may send, filler included")
      ->capture_default_str();
  probe
      ->add_option("--roundtrip-time-limit", flags->roundtrip_time_s,
                   "Seconds the run may take (it stops there and reports what it measured)")
      ->capture_default_str();
  probe
      ->add_option("--roundtrip-tolerance", flags->roundtrip_tolerance,
                   "KL (nats per position) a tier may add to the floor")
      ->capture_default_str();
}

}  // namespace

void add_probe_command(CLI::App& app, Runner& run, EngineData& engines) {
  auto flags = std::make_shared<ProbeFlags>();
  CLI::App* probe = app.add_subcommand(
      "probe",
      "Verify a live OpenAI-compatible server (engine, KV dtype, capacity, smoke, recall) or "
      "A/B two deployments");
  probe->add_option("url", flags->url, "Server base URL, e.g. http://127.0.0.1:30000")->required();
  probe->add_option("--compare", flags->compare_url,
                    "Second server: run the identical probes on both and compare them");
  probe->add_flag("--smoke", flags->smoke,
                  "Short completion, arithmetic with a checkable answer, medium-length prompt");
  probe->add_flag("--recall", flags->recall, "Long-context code recall over ctx x depth");
  probe->add_option("--recall-ctx", flags->recall_ctx, "Context lengths of the recall grid");
  probe->add_option("--recall-depth", flags->recall_depth, "Depths of the recall grid (tokens)");
  probe->add_option("--recall-cases", flags->recall_cases, "Cases per grid cell")
      ->check(CLI::Range(1, 1000));
  probe->add_option("--seed", flags->seed, "Seed of the probe texts and of sampling");
  probe
      ->add_option("--top-logprobs", flags->top_logprobs,
                   "Alternatives per token for the KL estimate: asked for, lowered to what each "
                   "server grants (vLLM --max-logprobs)")
      ->check(CLI::Range(1, 100));
  probe->add_flag("--forced", flags->forced,
                  "Teacher-forced fixed sequences (code and prose) scored token by token, "
                  "where the server returns prompt log-probs (else generated-token KL)");
  probe
      ->add_option("--forced-cases", flags->forced_cases, "Fixed sequences (half code, half prose)")
      ->check(CLI::Range(2, 1000));
  probe
      ->add_option("--task", flags->tasks,
                   "Long-context task, repeatable: mrcr (near-duplicate functions asked in "
                   "rounds), toolcall (near-duplicate tools' JSON arguments, schema-checked)")
      ->check(CLI::IsMember({"mrcr", "toolcall"}));
  probe->add_option("--task-ctx", flags->task_ctx, "Context lengths of the tasks (tokens)");
  probe
      ->add_option("--task-cases", flags->task_cases,
                   "Cases per task and context length (default 4; in an A/B at least twice "
                   "the fewest paired probes that can reach --alpha)")
      ->check(CLI::Range(1, 1000));
  probe->add_option("--control", flags->control_url,
                    "A/B control arm: a second replica of A (default: A itself, asked again "
                    "with the probes in reverse order)");
  probe->add_flag("--no-control", flags->no_control,
                  "A/B without a control arm (the noise floor is taken as 0)");
  probe->add_option("--alpha", flags->alpha, "Error rate of the A/B verdict (Holm over metrics)")
      ->check(CLI::Range(1e-6, 0.5));
  probe->add_option("--gate", flags->gates,
                    "A/B acceptance limits for CI, e.g. kl<=0.01,mrcr_drop<=2pt (kl, "
                    "logprob_drop in nats; recall_drop, mrcr_drop, toolcall_drop, smoke_drop "
                    "in points); exit 1 when one fails");
  probe->add_option("--model", flags->model, "Model name to request (default: /v1/models)");
  probe->add_option(
      "--checkpoint", flags->checkpoint,
      "Local copy of the served checkpoint: run the full check on the server's flags");
  probe->add_option("--results", flags->results,
                    "JSON-lines results file: each finished probe is appended; a rerun resumes");
  probe->add_option("--api-key", flags->api_key,
                    "Bearer token (default: $KVAUDIT_API_KEY, then $OPENAI_API_KEY)");
  probe->add_option("--timeout", flags->timeout_s,
                    "Seconds to wait for bytes of an answer before giving up (read timeout)");
  probe->add_option("--connect-timeout", flags->connect_timeout_s, "Seconds to connect");
  probe
      ->add_option("--retries", flags->retries,
                   "Retries on 429/5xx, refused connections and timeouts (exponential backoff)")
      ->check(CLI::Range(0, 20));
  probe->add_option("--backoff", flags->backoff_s, "First retry delay in seconds (doubles)");
  probe->add_option("--concurrency", flags->concurrency, "Requests in flight per server")
      ->check(CLI::Range(1, 256));
  probe->add_flag("--insecure", flags->insecure, "https: skip certificate verification");
  probe->add_option("--ca-cert", flags->ca_cert, "https: extra CA bundle (PEM)");
  probe->add_flag("--progress", flags->progress,
                  "Progress bar on stderr even when it is not a terminal");
  probe->add_option("--gpu", flags->gpu,
                    "The servers' GPU preset (data/gpus.json): decides the combinations known to "
                    "break on one GPU architecture");
  probe
      ->add_option("--kv-policy", flags->kv_policy,
                   "How the servers' KV findings are judged: lossless, evidence (default), "
                   "permissive (as kvaudit check)")
      ->check(CLI::IsMember({"lossless", "evidence", "permissive"}));
  probe->add_option("--fail-on", flags->fail_on, "Exit 1 on findings at this level")
      ->check(CLI::IsMember({"critical", "warning", "never"}));
  add_load_flags(probe, *flags);
  add_roundtrip_flags(probe, *flags);
  add_output_options(*probe, flags->output);
  probe->callback([flags, &run, &engines] {
    run = [flags, &engines] { return run_probe_command(engines.registry(), *flags); };
  });
}

}  // namespace kvaudit::cli
