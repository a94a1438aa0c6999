// Probe runs against fake servers: smoke, recall scoring, A/B verdicts, and the faults a
// live run meets (a server killed mid-run and resumed, a stall, garbage, 500s that pass).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/registry.h"
#include "common/schema_doc.h"
#include "probe/fake_server.h"
#include "probe/probe.h"

namespace kvaudit::probe {
namespace {

using testing::FakeConfig;
using testing::FakeServer;
using testing::fast_client_options;
using ::testing::HasSubstr;

ProbeOptions small_recall() {
  ProbeOptions options;
  options.recall = true;
  options.ctx_tokens = {1000, 2000};
  options.depth_tokens = {200, 1200};  // 1200 >= 1000: that cell is skipped
  options.cases_per_cell = 2;
  options.concurrency = 2;
  return options;
}

std::string temp_path(const std::string& name) {
  auto path =
      std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()) + ".jsonl");
  std::filesystem::remove(path);
  return path.string();
}

TEST(ProbeRun, SmokePassesOnASaneServer) {
  FakeServer server({});
  ProbeOptions options;
  options.smoke = true;
  RunResult result =
      run_probes(kvaudit::testing::registry(), {server.url()}, fast_client_options(), options);
  ASSERT_EQ(result.servers.size(), 1u);
  const auto& records = result.servers[0].records;
  ASSERT_EQ(records.size(), 3u);
  for (const auto& record : records)
    EXPECT_TRUE(record.passed) << record.id << ": " << record.output;
  EXPECT_EQ(records[1].id, "smoke/arithmetic");
  EXPECT_EQ(records[1].endpoint, "/v1/chat/completions");
  EXPECT_EQ(records[1].output, "42");
  EXPECT_THAT(records[2].expected, ::testing::MatchesRegex(" [A-Z][A-Z]-[0-9]{4}"));
  EXPECT_TRUE(records[2].expected_logprob);  // teacher-forced via echo
  EXPECT_FALSE(probe_failed(result));
  report::Report report = to_report(result, options);
  EXPECT_THAT(report.verdict, HasSubstr("smoke: 3 of 3 passed"));
}

TEST(ProbeRun, SmokeFailureIsReported) {
  FakeServer server({.wrong_recall = false});
  ProbeOptions options;
  options.smoke = true;
  RunResult result =
      run_probes(kvaudit::testing::registry(), {server.url()}, fast_client_options(), options);
  // Break the arithmetic answer after the fact: the gate reads records.
  result.servers[0].records[1].passed = false;
  EXPECT_TRUE(probe_failed(result));
  // One JUnit check per smoke probe, named by probe and server; only the broken one fails.
  std::vector<report::GateCheck> checks = gate_checks(result);
  ASSERT_EQ(checks.size(), 3u);
  EXPECT_EQ(checks[1].kind, "smoke");
  EXPECT_EQ(checks[1].name, "smoke/arithmetic @ " + server.url());
  EXPECT_FALSE(checks[1].passed);
  EXPECT_TRUE(checks[0].passed && checks[2].passed);
  EXPECT_THAT(report::render_junit(to_report(result, options), {.fail_on = {}, .checks = checks}),
              HasSubstr("tests=\"3\" failures=\"1\""));
  EXPECT_THAT(to_report(result, options).verdict, HasSubstr("smoke: 1 of 3 FAILED"));
}

TEST(ProbeRun, RecallScoresExactMatchAndLogprob) {
  FakeServer good({});
  ProbeOptions options = small_recall();
  RunResult result =
      run_probes(kvaudit::testing::registry(), {good.url()}, fast_client_options(), options);
  const auto& records = result.servers[0].records;
  ASSERT_EQ(records.size(), 6u);  // (1000,200) (2000,200) (2000,1200) x 2 cases
  for (const auto& record : records) {
    EXPECT_TRUE(record.passed) << record.id << " expected '" << record.expected << "' got '"
                               << record.output << "'";
    ASSERT_TRUE(record.expected_logprob) << record.id;
    // One byte per token, each at log(0.9): the expected text's log-prob is exact.
    EXPECT_EQ(record.expected_tokens, static_cast<int64_t>(record.expected.size()));
    EXPECT_NEAR(*record.expected_logprob, record.expected.size() * std::log(0.9), 1e-9);
    // Filled to within one filler function (~250 one-byte tokens).
    EXPECT_NEAR(record.prompt_tokens, record.ctx_tokens, 300) << record.id;
    EXPECT_FALSE(record.forced.empty());
  }
  EXPECT_THAT(result.token_counting, HasSubstr("/tokenize"));

  FakeServer bad({.wrong_recall = true, .tokenize = false});
  RunResult poor =
      run_probes(kvaudit::testing::registry(), {bad.url()}, fast_client_options(), options);
  for (const auto& record : poor.servers[0].records) EXPECT_FALSE(record.passed);
  EXPECT_THAT(poor.token_counting, HasSubstr("approximation"));
}

// Enough paired probes for the sign-flip test to reach p < 0.01 (2^-7 one-sided,
// 2^-7 two-sided needs 8): 6 recall + 10 fixed sequences.
ProbeOptions ab_options() {
  ProbeOptions options = small_recall();
  options.forced = true;
  options.forced_cases = 10;
  return options;
}

const MetricTest* metric(const CompareSummary& summary, const std::string& name) {
  for (const auto& m : summary.metrics)
    if (m.metric == name) return &m;
  return nullptr;
}

TEST(ProbeRun, CompareIdenticalServersFindsNoDifferenceAgainstTheFloor) {
  FakeServer a({}), b({});
  ProbeOptions options = ab_options();
  options.smoke = true;
  RunResult result =
      run_probes(kvaudit::testing::registry(), {a.url(), b.url()}, fast_client_options(), options);
  ASSERT_TRUE(result.compare);
  EXPECT_EQ(result.compare->verdict, "no difference detectable") << result.compare->reason;
  EXPECT_TRUE(result.compare->control);
  ASSERT_TRUE(result.control);
  EXPECT_EQ(result.control->records.size(), result.servers[0].records.size());
  EXPECT_EQ(result.compare->diverged, 0);
  ASSERT_TRUE(result.compare->mean_kl);
  EXPECT_EQ(*result.compare->mean_kl, 0.0);
  const MetricTest* kl = metric(*result.compare, "kl");
  ASSERT_NE(kl, nullptr);
  EXPECT_EQ(kl->test.nonzero, 0);
  EXPECT_EQ(kl->test.p_value, 1.0);
  EXPECT_THAT(kl->sentence, HasSubstr("no difference detectable at this sample size"));
  EXPECT_EQ(result.compare->better, "");
  EXPECT_FALSE(probe_failed(result));
  // A was asked every probe twice (the control arm), B once: the same prompts.
  EXPECT_EQ(a.greedy_requests(), 2 * b.greedy_requests());
  // Log-probs were negotiated: the fake grants the 20 asked, with prompt log-probs.
  EXPECT_EQ(result.servers[0].facts.top_logprobs_granted, 20);
  EXPECT_EQ(result.servers[0].facts.prompt_logprobs, true);
}

TEST(ProbeRun, CompareShiftedLogprobsIsDifferentAtTheStatedLevel) {
  FakeServer a({}), b({.confidence = 0.6});
  RunResult result = run_probes(kvaudit::testing::registry(), {a.url(), b.url()},
                                fast_client_options(), ab_options());
  ASSERT_TRUE(result.compare);
  EXPECT_EQ(result.compare->verdict, "different") << result.compare->reason;
  EXPECT_EQ(result.compare->diverged, 0);  // same greedy tokens, different distributions
  EXPECT_GT(*result.compare->mean_kl, kDifferentKl);
  for (const auto& probe : result.compare->probes) EXPECT_EQ(probe.kl_basis, "teacher-forced");
  const MetricTest* kl = metric(*result.compare, "kl");
  ASSERT_NE(kl, nullptr);
  EXPECT_EQ(kl->probes, 16);
  EXPECT_LT(kl->p_adjusted, 0.01);
  EXPECT_EQ(kl->floor, 0.0);  // A against itself
  EXPECT_GT(kl->excess_interval.low, 0.0);
  EXPECT_THAT(kl->sentence, HasSubstr("different at p < 0.01"));
  // Side A is more confident in the expected text: the log-prob metric says B is worse.
  const MetricTest* logprob = metric(*result.compare, "logprob");
  ASSERT_NE(logprob, nullptr);
  EXPECT_LT(logprob->excess, 0.0);
  EXPECT_EQ(result.compare->better, "a");
  EXPECT_TRUE(probe_failed(result));
  report::Report report = to_report(result, ab_options());
  EXPECT_THAT(report.verdict, HasSubstr("A/B: different"));
  EXPECT_EQ(report.verdict_severity, report::Severity::critical);
  std::vector<std::string> charts;
  for (const auto& chart : report.charts) charts.push_back(chart.id);
  EXPECT_THAT(charts,
              ::testing::ElementsAre("recall_A", "recall_B", "recall_difference", "kl_per_probe"));
  nlohmann::json doc = report::render_json(report);
  EXPECT_EQ(doc["compare"]["verdict"], "different");
  EXPECT_EQ(doc["servers"].size(), 2u);
  EXPECT_EQ(doc["control"]["records"].size(), doc["servers"][0]["records"].size());
  EXPECT_EQ(doc["compare"]["metrics"][0]["metric"], "kl");
  EXPECT_LT(doc["compare"]["metrics"][0]["p_adjusted"].get<double>(), 0.01);
  EXPECT_NE(report::render_html(report).find("kl_per_probe"), std::string::npos);
}

TEST(ProbeRun, CompareRecallLossIsDifferentAndNamesTheBetterSide) {
  FakeServer a({.wrong_recall = true}), b({});
  ProbeOptions options = small_recall();
  // 12 recall probes: exact two-sided p = 2^-11, below 0.01 after Holm over 3 metrics.
  options.cases_per_cell = 4;
  RunResult result =
      run_probes(kvaudit::testing::registry(), {a.url(), b.url()}, fast_client_options(), options);
  ASSERT_TRUE(result.compare);
  EXPECT_EQ(result.compare->verdict, "different") << result.compare->reason;
  EXPECT_EQ(result.compare->recall_exact_a, 0.0);
  EXPECT_EQ(result.compare->recall_exact_b, 1.0);
  EXPECT_EQ(result.compare->better, "b");
  EXPECT_EQ(result.compare->diverged, 12);
  EXPECT_EQ(result.compare->probes[0].first_divergence, 0);
  const MetricTest* recall = metric(*result.compare, "recall");
  ASSERT_NE(recall, nullptr);
  EXPECT_DOUBLE_EQ(recall->excess, 1.0);  // +100 points, exact McNemar p = 2^-11
  EXPECT_NEAR(recall->test.p_value, 1.0 / 2048, 1e-12);
}

TEST(ProbeRun, TooFewProbesAreInconclusiveAndSayHowManyAreNeeded) {
  FakeServer a({}), b({.confidence = 0.6});
  RunResult result = run_probes(kvaudit::testing::registry(), {a.url(), b.url()},
                                fast_client_options(), small_recall());  // 4 recall probes
  ASSERT_TRUE(result.compare);
  EXPECT_EQ(result.compare->verdict, "inconclusive") << result.compare->reason;
  EXPECT_THAT(result.compare->reason,
              HasSubstr("6 paired probes cannot reach p < 0.01 (at least 7 needed)"));
  EXPECT_FALSE(probe_failed(result));
}

TEST(ProbeRun, NoiseAroundIdenticalDistributionsIsNeverCalledDifferentBeyondTheErrorRate) {
  // Servers whose every log-prob is fresh noise around the same distribution: A, its control
  // pass and B are exchangeable, so "different" may come out in at most about alpha of runs.
  int different = 0, no_difference = 0;
  const int runs = 40;
  for (int run = 0; run < runs; ++run) {
    FakeServer a({.noise_sd = 0.3, .noise_seed = uint64_t(1000 + run)});
    FakeServer b({.noise_sd = 0.3, .noise_seed = uint64_t(5000 + run)});
    ProbeOptions options;
    options.forced = true;
    options.forced_cases = 10;
    // One request at a time: the servers' noise then falls on the same probes every run, so
    // the test's outcome is fixed by its seeds (with two in flight it would vary by timing).
    options.concurrency = 1;
    options.seed = uint64_t(run + 1);
    RunResult result = run_probes(kvaudit::testing::registry(), {a.url(), b.url()},
                                  fast_client_options(), options);
    ASSERT_TRUE(result.compare);
    different += result.compare->verdict == "different";
    no_difference += result.compare->verdict == "no difference detectable";
    // The noise is visible: the control's own KL is not 0.
    EXPECT_GT(metric(*result.compare, "kl")->floor, 0.0);
  }
  // alpha = 0.01 over 40 runs: 0.4 expected; P(Binomial(40, 0.01) >= 3) = 0.8%.
  EXPECT_LE(different, 2);
  EXPECT_GE(no_difference, runs - 2);
  // The same servers with B shifted: detected (the test has power, it is not always "no").
  FakeServer a({.noise_sd = 0.3, .noise_seed = 7});
  FakeServer b({.confidence = 0.6, .noise_sd = 0.3, .noise_seed = 8});
  ProbeOptions options;
  options.forced = true;
  options.forced_cases = 10;
  RunResult shifted =
      run_probes(kvaudit::testing::registry(), {a.url(), b.url()}, fast_client_options(), options);
  EXPECT_EQ(shifted.compare->verdict, "different") << shifted.compare->reason;
}

TEST(ProbeRun, GatesPassOrFailJunitStyleAndDecideTheExit) {
  FakeServer a({}), b({.confidence = 0.6});
  ProbeOptions options = ab_options();
  options.gates = parse_gates("kl<=0.001, recall_drop<=5pt,mrcr_drop<=2pt");
  RunResult result =
      run_probes(kvaudit::testing::registry(), {a.url(), b.url()}, fast_client_options(), options);
  ASSERT_EQ(result.compare->gates.size(), 3u);
  EXPECT_EQ(result.compare->gates[0].status, "failed");  // KL well above 0.001
  EXPECT_TRUE(result.compare->gates[0].settled);
  EXPECT_EQ(result.compare->gates[1].status, "passed");  // recall identical
  EXPECT_EQ(result.compare->gates[2].status, "failed");  // no MRCR probe ran: no data
  EXPECT_THAT(result.compare->gates[2].message, HasSubstr("no data"));
  EXPECT_TRUE(probe_failed(result));
  // The same gates as --junit's test cases (this A/B runs no smoke probe: gates only).
  std::vector<report::GateCheck> checks = gate_checks(result);
  ASSERT_EQ(checks.size(), 3u);
  EXPECT_EQ(checks[0].kind, "gate");
  EXPECT_EQ(checks[0].name, "kl<=0.001");
  EXPECT_EQ(std::vector<bool>({checks[0].passed, checks[1].passed, checks[2].passed}),
            std::vector<bool>({false, true, false}));
  EXPECT_EQ(checks[2].message, result.compare->gates[2].message);
  nlohmann::json doc = report::render_json(to_report(result, options));
  EXPECT_EQ(doc["compare"]["gates"]["tests"], 3);
  EXPECT_EQ(doc["compare"]["gates"]["failures"], 2);
  EXPECT_EQ(doc["compare"]["gates"]["testcases"][0]["name"], "kl<=0.001");
  EXPECT_TRUE(doc["compare"]["gates"]["testcases"][0]["failure"].is_object());
  EXPECT_TRUE(doc["compare"]["gates"]["testcases"][1]["failure"].is_null());
  // The payload against docs/json-schema.md's probe.* tables, both ways.
  kvaudit::testing::SchemaValidator validator(
      kvaudit::testing::load_schema_tables("## Payload object: "));
  validator.validate(doc["compare"], "probe.compare", "$.compare");
  EXPECT_TRUE(validator.problems.empty()) << [&] {
    std::string all;
    for (const auto& p : validator.problems) all += p + "\n";
    return all;
  }();
  for (const char* object : {"probe.compare", "probe.metric", "probe.gates", "probe.gate_case",
                             "probe.gate_failure", "probe.pair"})
    EXPECT_TRUE(validator.seen.count(object)) << object;
  // A generous KL gate passes, and with gates the verdict alone does not fail the run.
  options.gates = parse_gates("kl<=1.0");
  RunResult lenient =
      run_probes(kvaudit::testing::registry(), {a.url(), b.url()}, fast_client_options(), options);
  EXPECT_EQ(lenient.compare->verdict, "different");
  EXPECT_EQ(lenient.compare->gates[0].status, "passed");
  EXPECT_FALSE(probe_failed(lenient));
}

TEST(ProbeRun, GateSyntaxErrorsNameThePart) {
  EXPECT_EQ(parse_gates("kl<=0.01,mrcr_drop<=2pt")[1].limit, 0.02);
  for (const char* bad :
       {"kl>0.01", "perplexity<=2", "mrcr_drop<=2", "kl<=0.01pt", "kl<=abc", "kl<=-1", ""}) {
    try {
      parse_gates(bad);
      ADD_FAILURE() << bad;
    } catch (const InputError& error) {
      EXPECT_EQ(error.where(), "--gate") << bad;
    }
  }
}

TEST(ProbeRun, TasksAreScoredPerRoundAndALossIsDetected) {
  FakeServer a({}), b({.wrong_tasks = true});
  ProbeOptions options;
  options.tasks = {"mrcr", "toolcall"};
  options.task_ctx_tokens = {2000};
  // task_cases left at 0: an A/B with one context length asks 16 cases per task (4 could
  // never reach p < 0.01; 8 only when all 8 differ one way), and says so.
  RunResult result =
      run_probes(kvaudit::testing::registry(), {a.url(), b.url()}, fast_client_options(), options);
  EXPECT_EQ(result.servers[0].records.size(), 32u);
  EXPECT_NE(std::find_if(result.notes.begin(), result.notes.end(),
                         [](const std::string& note) {
                           return note.find("tasks: 16 cases per task") != std::string::npos;
                         }),
            result.notes.end());
  for (const auto& record : result.servers[0].records) {
    EXPECT_EQ(record.rounds, 3) << record.id;
    EXPECT_EQ(record.rounds_passed, 3) << record.id << ": " << record.output;
    if (record.kind == "toolcall") {
      EXPECT_EQ(record.schema_valid, 3);
    }
  }
  int b_passed = 0, b_valid = 0;
  for (const auto& record : result.servers[1].records) {
    b_passed += record.rounds_passed;
    b_valid += record.schema_valid;
  }
  EXPECT_LT(b_passed, 16);  // B copies the other near-duplicate in most rounds
  EXPECT_GT(b_valid, 0);    // ... with valid JSON: wrong values, not broken syntax
  ASSERT_TRUE(result.compare);
  EXPECT_EQ(result.compare->verdict, "different") << result.compare->reason;
  const MetricTest* mrcr = metric(*result.compare, "mrcr");
  ASSERT_NE(mrcr, nullptr);
  EXPECT_LT(mrcr->excess, -0.3);
  EXPECT_EQ(result.compare->better, "a");
  report::Report report = to_report(result, options);
  bool has_tasks = false;
  for (const auto& table : report.tables) has_tasks |= table.id == "tasks";
  EXPECT_TRUE(has_tasks);
}

TEST(ProbeRun, OneServerAsksFourTaskCasesByDefault) {
  FakeServer a({});
  ProbeOptions options;
  options.tasks = {"mrcr"};
  options.task_ctx_tokens = {2000};
  RunResult result =
      run_probes(kvaudit::testing::registry(), {a.url()}, fast_client_options(), options);
  EXPECT_EQ(result.servers[0].records.size(), 4u);
  for (const auto& note : result.notes) EXPECT_EQ(note.find("tasks:"), std::string::npos) << note;
}

TEST(ProbeRun, LogprobLimitsAndRefusedEchoAreNegotiatedNotFatal) {
  // B: vLLM-style cap of 5, and llama-server's refusal of echo.
  FakeServer a({}), b({.max_logprobs = 5, .refuse_echo = true});
  ProbeOptions options;
  options.forced = true;
  options.forced_cases = 4;
  options.smoke = true;
  RunResult result =
      run_probes(kvaudit::testing::registry(), {a.url(), b.url()}, fast_client_options(), options);
  const ServerFacts& facts = result.servers[1].facts;
  EXPECT_EQ(facts.top_logprobs_granted, 5);
  EXPECT_EQ(facts.prompt_logprobs, false);
  EXPECT_THAT(facts.logprobs_note, HasSubstr("max allowed: 5"));
  EXPECT_THAT(facts.logprobs_note, HasSubstr("Only no echo is supported"));
  // Every side used the smaller top-k, and no echo: fixed sequences fall back to generated
  // tokens, said so.
  for (const auto& run : result.servers)
    for (const auto& record : run.records) {
      EXPECT_EQ(record.top_k, 5) << record.id;
      if (record.kind == "forced") {
        EXPECT_TRUE(record.forced.empty());
        EXPECT_FALSE(record.generated.empty());
        EXPECT_THAT(record.forced_note, HasSubstr("generated-token KL"));
      }
    }
  EXPECT_THAT(fmt::format("{}", fmt::join(result.notes, "\n")),
              HasSubstr("20 alternatives per token asked, 5 used"));
  ASSERT_TRUE(result.compare);
  for (const auto& probe : result.compare->probes)
    if (probe.kind == "forced") {
      EXPECT_EQ(probe.kl_basis, "greedy prefix");
    }
}

TEST(ProbeFaults, KilledMidRunResumesOnlyTheRest) {
  const std::string results = temp_path("kvaudit-probe-resume");
  ProbeOptions options = small_recall();
  options.results_path = results;
  options.concurrency = 1;
  int port = 0;
  int64_t finished = 0;
  {
    FakeServer dying({.stop_after = 5});  // 2 requests per recall probe: dies in the third
    port = dying.port();
    try {
      run_probes(kvaudit::testing::registry(), {dying.url()}, fast_client_options(), options);
      FAIL() << "expected the run to stop";
    } catch (const InputError& error) {
      EXPECT_THAT(error.what(), HasSubstr("stopped after 2 of 6 probes"));
      EXPECT_THAT(error.what(), HasSubstr("rerun the same command to resume"));
    }
    finished = static_cast<int64_t>(load_results(results).records.size());
    EXPECT_EQ(finished, 2);
  }
  FakeServer revived({}, port);
  ASSERT_EQ(revived.port(), port);
  RunResult result =
      run_probes(kvaudit::testing::registry(), {revived.url()}, fast_client_options(), options);
  EXPECT_EQ(result.servers[0].resumed, finished);
  EXPECT_EQ(result.servers[0].records.size(), 6u);
  EXPECT_EQ(revived.greedy_requests(), 6 - finished);  // only the remaining probes ran
  EXPECT_EQ(load_results(results).records.size(), 6u);
  // A third run has nothing left to do.
  FakeServer idle({}, port);
  RunResult again =
      run_probes(kvaudit::testing::registry(), {idle.url()}, fast_client_options(), options);
  EXPECT_EQ(again.servers[0].resumed, 6);
  EXPECT_EQ(idle.greedy_requests(), 0);
  std::filesystem::remove(results);
}

TEST(ProbeFaults, TornLastLineIsSkipped) {
  const std::string results = temp_path("kvaudit-probe-torn");
  FakeServer server({});
  ProbeOptions options;
  options.smoke = true;
  options.results_path = results;
  run_probes(kvaudit::testing::registry(), {server.url()}, fast_client_options(), options);
  { std::ofstream(results, std::ios::app) << R"({"key": "x", "record": {"serv)"; }
  ResultsFile file = load_results(results);
  EXPECT_EQ(file.records.size(), 3u);
  EXPECT_EQ(file.skipped_lines, 1);
  RunResult result =
      run_probes(kvaudit::testing::registry(), {server.url()}, fast_client_options(), options);
  EXPECT_EQ(result.servers[0].resumed, 3);
  std::filesystem::remove(results);
}

TEST(ProbeFaults, StallEndsInATimeoutMessage) {
  FakeServer server({.stall_ms = 3000});
  net::ClientOptions client = fast_client_options();
  client.read_timeout = std::chrono::milliseconds(300);
  client.max_retries = 0;
  ProbeOptions options;
  options.smoke = true;
  auto start = std::chrono::steady_clock::now();
  try {
    run_probes(kvaudit::testing::registry(), {server.url()}, client, options);
    FAIL();
  } catch (const InputError& error) {
    EXPECT_THAT(error.what(), HasSubstr("no answer within 0.3 s"));
    EXPECT_THAT(error.what(), HasSubstr("/v1/completions"));
    EXPECT_THAT(error.what(), HasSubstr("pass --results FILE"));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
}

TEST(ProbeFaults, GarbageIsAClearMessage) {
  FakeServer server({.garbage = true});
  ProbeOptions options;
  options.smoke = true;
  try {
    run_probes(kvaudit::testing::registry(), {server.url()}, fast_client_options(), options);
    FAIL();
  } catch (const InputError& error) {
    EXPECT_THAT(error.what(), HasSubstr("/v1/completions: malformed answer: not JSON"));
  }
}

TEST(ProbeFaults, ServerErrorsThenRecovery) {
  // The first 500 answers the log-prob negotiation (no retries there); three more meet the
  // probes, which retry through them.
  FakeServer server({.fail_first = 4});
  ProbeOptions options;
  options.smoke = true;
  options.concurrency = 1;
  RunResult result =
      run_probes(kvaudit::testing::registry(), {server.url()}, fast_client_options(), options);
  ASSERT_EQ(result.servers[0].records.size(), 3u);
  for (const auto& record : result.servers[0].records) EXPECT_TRUE(record.passed) << record.id;
  EXPECT_GE(result.servers[0].client_stats.retries, 3);
}

TEST(ProbeFaults, RefusedServerFailsBeforeProbing) {
  FakeServer server({});
  std::string url = server.url();
  server.stop();
  try {
    run_probes(kvaudit::testing::registry(), {url}, fast_client_options(), ProbeOptions{});
    FAIL();
  } catch (const net::RequestError& error) {
    EXPECT_EQ(error.kind(), net::FailureKind::refused);
    EXPECT_THAT(error.what(), HasSubstr("connection refused"));
  }
}

TEST(ProbeFaults, AuthenticationFailureSaysHowToFixIt) {
  FakeServer server({.api_key = "sk-right"});
  ProbeOptions options;
  options.smoke = true;
  try {
    run_probes(kvaudit::testing::registry(), {server.url()}, fast_client_options(), options);
    FAIL();
  } catch (const net::RequestError& error) {
    EXPECT_EQ(error.status(), 401);
    EXPECT_THAT(error.what(), HasSubstr("HTTP 401: Invalid API key (pass --api-key"));
  }
  net::ClientOptions client = fast_client_options();
  client.api_key = "sk-right";
  RunResult result = run_probes(kvaudit::testing::registry(), {server.url()}, client, options);
  EXPECT_EQ(result.servers[0].records.size(), 3u);
}

// A server that answers and makes no progress stops the run within its timeout, with one
// line naming the endpoint, and what finished stays in the results file.
// Runs the probes, which must stop with one InputError naming every needle, within
// 15 s (the bound a stalled or lying server may not stretch, even under the sanitizers).
void expect_run_stops(const std::string& url, const ProbeOptions& options,
                      std::initializer_list<const char*> needles) {
  const auto start = std::chrono::steady_clock::now();
  try {
    run_probes(kvaudit::testing::registry(), {url}, fast_client_options(), options);
    FAIL() << "expected the run to stop";
  } catch (const InputError& error) {
    for (const char* needle : needles) EXPECT_THAT(error.what(), HasSubstr(needle));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
}

TEST(ProbeFaults, ZeroTokenCompletionsStopTheRunAndKeepWhatFinished) {
  const std::string results = temp_path("kvaudit-probe-zero");
  FakeServer server({.zero_after = 4});  // the first two recall probes finish (2 requests each)
  ProbeOptions options = small_recall();
  options.results_path = results;
  options.concurrency = 1;
  // It stops at the first empty answer instead of asking on: well inside the client's
  // read timeout (3 s) times the probes left, even under the sanitizers.
  expect_run_stops(server.url(), options,
                   {"/v1/completions", "no progress: the completion has 0 tokens",
                    "stopped after 2 of 6 probes"});
  EXPECT_EQ(load_results(results).records.size(), 2u);
  EXPECT_LE(server.completions(), 6);  // it asked once more, not forever
  std::filesystem::remove(results);
}

TEST(ProbeFaults, TokenizerThatStopsAnsweringTokensStopsTheRun) {
  const std::string results = temp_path("kvaudit-probe-notokens");
  // Detection's sample and the first case's pieces tokenize; then every answer is [].
  FakeServer server({.tokenize_empty_after = 40});
  ProbeOptions options = small_recall();
  options.results_path = results;
  options.concurrency = 1;
  expect_run_stops(server.url(), options, {"/tokenize", "no progress"});
  std::filesystem::remove(results);
}

TEST(ProbeFaults, TokenizerWithNoTokensFromTheStartIsNotUsed) {
  FakeServer server({.tokenize_empty_after = 0});
  ProbeOptions options = small_recall();
  RunResult result =
      run_probes(kvaudit::testing::registry(), {server.url()}, fast_client_options(), options);
  EXPECT_FALSE(result.servers[0].facts.has_tokenize);
  EXPECT_THAT(fmt::format("{}", fmt::join(result.servers[0].facts.notes, "\n")),
              HasSubstr("no progress"));
  EXPECT_THAT(result.token_counting, HasSubstr("approximation"));
  EXPECT_EQ(result.servers[0].records.size(), 6u);
}

// Keep-alive: a run reuses its connections instead of opening one per request.
TEST(ProbeRun, ConnectionsAreReused) {
  FakeServer server({});
  RunResult result = run_probes(kvaudit::testing::registry(), {server.url()}, fast_client_options(),
                                small_recall());
  const net::ClientStats& stats = result.servers[0].client_stats;
  EXPECT_GT(stats.requests, 20);
  EXPECT_LE(stats.connections, 2);  // --concurrency 2
}

TEST(ProbeCompare, KlFromTopK) {
  std::vector<TopEntry> p = {{"a", std::log(0.7)}, {"b", std::log(0.2)}};
  EXPECT_EQ(kl_from_top(p, p), 0.0);
  // Same lists, different values: KL over {a, b, rest} exactly.
  std::vector<TopEntry> q = {{"a", std::log(0.5)}, {"b", std::log(0.4)}};
  double expected =
      0.7 * std::log(0.7 / 0.5) + 0.2 * std::log(0.2 / 0.4) + 0.1 * std::log(0.1 / 0.1);
  EXPECT_NEAR(kl_from_top(p, q), expected, 1e-12);
  // A token only q lists: p gives it a share of its unlisted mass (0.1 / 2, capped at 0.2).
  std::vector<TopEntry> r = {{"a", std::log(0.7)}, {"c", std::log(0.2)}};
  double with_missing = kl_from_top(p, r);
  EXPECT_GT(with_missing, 0.0);
  EXPECT_TRUE(std::isfinite(with_missing));
  EXPECT_GT(kl_from_top(p, {{"z", std::log(0.99)}}), 1.0);  // disjoint: large
}

}  // namespace
}  // namespace kvaudit::probe
