// kvaudit watch: keeps checking the launch after the restart. Follows a journal on stdin
// (journalctl -f -o short-iso -u UNIT | kvaudit watch -), a log file through rotation, or a
// live server, checks each new launch against the expectations check printed, and serves
// Prometheus metrics on /metrics.

#include <fmt/format.h>

#include <atomic>
#include <cstdio>
#include <iostream>
#include <thread>

#include "cli/commands.h"
#include "engines/engines.h"
#include "logs/logs.h"
#include "net/net.h"
#include "util/util.h"
#include "watch/watch.h"

namespace kvaudit::cli {

namespace {

struct WatchFlags {
  std::string source;
  std::vector<std::string> expect;
  std::string expect_from;
  std::string listen = "127.0.0.1:9477";
  double interval_s = 0;  // 0: 1 s for a file, 15 s for a server
  double roundtrip_every_s = 0;
  double acceptance_drop = 0.05;
  double acceptance_tokens = 4000;
  bool once = false;
  double for_s = 0;
  std::string kv_policy = "evidence";
  bool quiet = false;
};

// "HOST:PORT" or ":PORT" (all addresses) or "" (no endpoint).
std::pair<std::string, int> parse_listen(const std::string& text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos)
    throw InputError("--listen", "expects HOST:PORT such as 127.0.0.1:9477, got '" + text + "'");
  std::string host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (host.empty()) host = "0.0.0.0";
  int port = -1;
  try {
    size_t used = 0;
    port = std::stoi(text.substr(colon + 1), &used);
    if (used != text.size() - colon - 1) port = -1;
  } catch (const std::exception&) {
  }
  if (port < 0 || port > 65535)
    throw InputError("--listen", "the port must be 0..65535, got '" + text.substr(colon + 1) + "'");
  return {host, port};
}

int run_watch(const engines::Registry& registry, const WatchFlags& f) {
  watch::RunOptions options;
  options.source = f.source;
  for (const auto& e : f.expect) options.watch.expectations.push_back(logs::parse_expectation(e));
  if (!f.expect_from.empty())
    for (auto& e : watch::expectations_from_check_json(f.expect_from))
      options.watch.expectations.push_back(std::move(e));
  options.watch.kv_policy = *audit::parse_kv_policy(f.kv_policy);  // CLI11 checked it
  const bool server = watch::source_kind(f.source) == watch::SourceKind::server;
  if (server) net::parse_url(f.source);  // a bad URL is bad input now, not a failed poll
  options.interval_s = f.interval_s > 0 ? f.interval_s : server ? 15.0 : 1.0;
  options.once = f.once;
  options.for_s = f.for_s;
  if (f.roundtrip_every_s > 0 && !server)
    throw InputError("--roundtrip-every", "needs a server URL to watch");
  options.roundtrip_every_s = f.roundtrip_every_s;
  options.roundtrip.time_limit_seconds = std::min(900.0, std::max(30.0, f.roundtrip_every_s));
  options.watch.acceptance.drop = f.acceptance_drop;
  options.watch.acceptance.baseline_drafted = f.acceptance_tokens;
  options.watch.acceptance.window_drafted = f.acceptance_tokens;
  // A poll must not outlast the interval by much: short timeouts, one retry.
  options.client.api_key = net::api_key_from_environment();
  options.client.connect_timeout = std::chrono::milliseconds(3000);
  options.client.read_timeout = std::chrono::milliseconds(10000);
  options.client.max_retries = 1;
  options.client.max_response_bytes = 16 << 20;

  block_stop_signals();  // before the metrics endpoint starts its threads
  std::atomic<bool> stop{false};
  StopSignalWaiter waiter([&stop] { stop = true; });

  std::unique_ptr<watch::MetricsServer> endpoint;
  if (!f.once && !f.listen.empty()) {
    auto [host, port] = parse_listen(f.listen);
    endpoint = std::make_unique<watch::MetricsServer>(host, port);
    std::fprintf(stderr, "kvaudit watch: following %s; metrics on http://%s:%d/metrics\n",
                 f.source == "-" ? "stdin" : f.source.c_str(), host.c_str(), endpoint->port());
    std::fflush(stderr);
  }
  std::string last_metrics, last_line;
  const watch::WatchState state = watch::run(
      registry, options, [&stop] { return stop.load(); },
      [&](const watch::WatchState& s) {
        if (f.quiet || !s.latest) return;
        // One line per change people can see (the evidence line may move without one).
        std::string line = watch::describe(*s.latest);
        if (!s.acceptance.sentence.empty()) line += "; " + s.acceptance.sentence;
        if (s.roundtrip.runs > 0)
          line += fmt::format("; round trip {}: {}: {}", s.roundtrip.runs, s.roundtrip.last_verdict,
                              s.roundtrip.last_reason);
        if (line == last_line) return;
        last_line = std::move(line);
        std::fprintf(stderr, "kvaudit watch: %s: %s\n", s.source.c_str(), last_line.c_str());
        std::fflush(stderr);
      },
      [&](const std::string& metrics) {
        if (endpoint) endpoint->set(metrics);
        last_metrics = metrics;
      });
  // --once over input with no launch in it judged nothing: that is not a pass.
  if (f.once && !state.latest)
    throw InputError(state.source, fmt::format("no start-up lines of a known engine ({}) in {} "
                                               "lines",
                                               fmt::join(registry.names(), ", "), state.lines));
  if (f.once) std::fwrite(last_metrics.data(), 1, last_metrics.size(), stdout);
  // Only --once gates: a watch that ends (a signal, its input closed) did its job, and the
  // failures are in the metrics it served.
  // So do a tier that changed a round trip's answers and acceptance in drift.
  const bool failing = (state.latest && state.latest->expectation_failures > 0) ||
                       state.roundtrip.changed > 0 || state.acceptance.drift;
  return f.once && failing ? kExitGateFailed : kExitOk;
}

}  // namespace

void add_watch_command(CLI::App& app, Runner& run, EngineData& engines) {
  auto flags = std::make_shared<WatchFlags>();
  CLI::App* cmd = app.add_subcommand(
      "watch",
      "Keep checking launches after the restart: follow a journal, log file or server, check "
      "each launch against expectations, serve Prometheus metrics");
  cmd->add_option("source", flags->source,
                  "'-' (journalctl -f output on stdin), a log file (followed through rotation), "
                  "or a server URL (polled)")
      ->required();
  cmd->add_option("--expect", flags->expect,
                  "KEY=VALUE each launch must show (as kvaudit logs --expect)");
  cmd->add_option("--expect-from", flags->expect_from,
                  "kvaudit check --json output: the expectations of its fix (or of the launch "
                  "as it is, when it needs none)");
  cmd->add_option("--listen", flags->listen,
                  "HOST:PORT for GET /metrics (port 0: any free port; '' for none)")
      ->capture_default_str();
  cmd->add_option("--interval", flags->interval_s,
                  "Seconds between polls (default: 1 for a file, 15 for a server)")
      ->check(CLI::Range(0.05, 86400.0));
  cmd->add_option("--roundtrip-every", flags->roundtrip_every_s,
                  "A server: run probe --roundtrip every this many seconds (its filler evicts "
                  "the server's prefix cache; off by default)")
      ->check(CLI::Range(10.0, 7 * 86400.0));
  cmd->add_option("--acceptance-drop", flags->acceptance_drop,
                  "A server: the fall in speculative acceptance (a fraction) that flags a drift")
      ->check(CLI::Range(0.001, 1.0))
      ->capture_default_str();
  cmd->add_option("--acceptance-tokens", flags->acceptance_tokens,
                  "A server: drafted tokens in the acceptance baseline and in the recent window")
      ->check(CLI::Range(10.0, 1e12))
      ->capture_default_str();
  cmd->add_flag("--once", flags->once,
                "Read what there is (stdin to its end), print the metrics and exit: 1 when an "
                "expectation fails");
  cmd->add_option("--for", flags->for_s, "Stop after this many seconds")
      ->check(CLI::Range(0.0, 1e9));
  cmd->add_option("--kv-policy", flags->kv_policy,
                  "How scale findings are judged: lossless, evidence (default) or permissive")
      ->check(CLI::IsMember({"lossless", "evidence", "permissive"}));
  cmd->add_flag("--quiet", flags->quiet, "No line on stderr per change");
  cmd->callback([flags, &run, &engines] {
    run = [flags, &engines] { return run_watch(engines.registry(), *flags); };
  });
}

}  // namespace kvaudit::cli
