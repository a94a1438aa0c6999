// watch: the state a watch keeps, how a launch is judged against its expectations, the
// log and server watchers, and the Prometheus rendering.
#include "watch/watch.h"

#include <fmt/format.h>

#include <cmath>

#include "probe/probe.h"
#include "report/report.h"
#include "util/json.h"
#include "util/util.h"

namespace kvaudit::watch {

namespace {

bool unknown(const std::string& actual) {
  return actual.empty() || actual == "null";
}

// What a launch of the log shows, in the watch's terms.
LaunchState state_of(const engines::Registry& registry, const logs::Launch& launch,
                     const std::vector<logs::Expectation>& expectations, int64_t number) {
  LaunchState s;
  s.number = number;
  s.first_line = launch.first_line;
  s.engine = launch.engine;
  s.engine_version = launch.engine_version;
  s.model = launch.model_path;
  s.kv_requested = launch.kv_cache_dtype_requested;
  s.kv_resolved = launch.kv_cache_dtype_resolved;
  s.kv_decided_by = launch.resolved_evidence;
  s.scale_fallback = launch.scale_fallback;
  s.capacity_tokens = launch.max_total_tokens;
  s.ready = launch.ready;
  s.failed = !launch.failures.empty();
  for (const auto& finding : launch.findings)
    ++s.findings_by_severity[std::string(report::severity_name(finding.severity))];
  judge(registry, launch, expectations, s);
  return s;
}

// Everything /metrics shows of a launch, to tell a change from a repeat.
std::string fingerprint(const LaunchState& s) {
  std::string text = fmt::format(
      "{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", s.number, s.engine, s.engine_version, s.model,
      s.kv_requested, s.kv_resolved, s.scale_fallback ? (*s.scale_fallback ? 1 : 0) : -1,
      s.capacity_tokens.value_or(-1), s.ready, s.failed, s.expectation_failures, s.kv_decided_by);
  for (const auto& [severity, count] : s.findings_by_severity)
    text += fmt::format("|{}={}", severity, count);
  for (size_t i = 0; i < s.expectations.size(); ++i)
    text += fmt::format("|{}:{}:{}", s.expectations[i].actual, s.expectations[i].met,
                        static_cast<bool>(s.expectation_pending[i]));
  return text;
}

// A Prometheus label value: backslash, double quote and newline escaped.
std::string label(std::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

class Families {
 public:
  void family(std::string_view name, std::string_view type, std::string_view help) {
    text_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  void sample(std::string_view name, const std::vector<std::pair<std::string, std::string>>& labels,
              double value) {
    text_ += name;
    if (!labels.empty()) {
      text_ += '{';
      for (size_t i = 0; i < labels.size(); ++i)
        text_ += fmt::format("{}{}=\"{}\"", i ? "," : "", labels[i].first, label(labels[i].second));
      text_ += '}';
    }
    if (value == std::floor(value) && std::fabs(value) < 1e15)
      text_ += fmt::format(" {}\n", static_cast<int64_t>(value));
    else
      text_ += fmt::format(" {:.3f}\n", value);
  }
  std::string take() { return std::move(text_); }

 private:
  std::string text_;
};

// Speculative acceptance (once seen) and the round trip (once run), on a server source.
void render_drift_metrics(const WatchState& state, Families& m) {
  const std::vector<std::pair<std::string, std::string>> source = {{"source", state.source}};
  const AcceptanceState& a = state.acceptance;
  if (!a.source.empty()) {
    m.family("kvaudit_spec_acceptance_rate", "gauge",
             "Speculative acceptance: the launch's baseline and the recent window (from the "
             "server's counters, or SGLang's gauge)");
    if (a.rate_baseline)
      m.sample("kvaudit_spec_acceptance_rate",
               {{"source", state.source}, {"window", "baseline"}, {"from", a.source}},
               *a.rate_baseline);
    if (a.rate_recent)
      m.sample("kvaudit_spec_acceptance_rate",
               {{"source", state.source}, {"window", "recent"}, {"from", a.source}},
               *a.rate_recent);
    m.family("kvaudit_spec_acceptance_drift", "gauge",
             "1 while acceptance is down from the baseline by the set drop, significantly");
    m.sample("kvaudit_spec_acceptance_drift", source, a.drift ? 1 : 0);
    m.family("kvaudit_spec_acceptance_drifts_total", "counter", "Times acceptance went into drift");
    m.sample("kvaudit_spec_acceptance_drifts_total", source, double(a.drifts));
  }
  const RoundTripWatch& r = state.roundtrip;
  if (r.runs > 0) {
    m.family("kvaudit_roundtrip_runs_total", "counter", "Round trips run (probe --roundtrip)");
    m.sample("kvaudit_roundtrip_runs_total", source, double(r.runs));
    m.family("kvaudit_roundtrip_failed_runs_total", "counter",
             "Round trips that could not run (the server refused or went away)");
    m.sample("kvaudit_roundtrip_failed_runs_total", source, double(r.failed_runs));
    m.family("kvaudit_roundtrip_changed_total", "counter",
             "Round trips in which a tier changed the answers");
    m.sample("kvaudit_roundtrip_changed_total", source, double(r.changed));
    m.family("kvaudit_roundtrip_last_info", "gauge", "The last round trip's verdict (value 1)");
    m.sample("kvaudit_roundtrip_last_info", {{"source", state.source}, {"verdict", r.last_verdict}},
             1);
    m.family("kvaudit_roundtrip_kl_excess_nats", "gauge",
             "The last round trip's KL excess over the floor per tier, nats per position");
    for (const auto& [tier, excess] : r.excess_by_tier)
      m.sample("kvaudit_roundtrip_kl_excess_nats", {{"source", state.source}, {"tier", tier}},
               excess);
    m.family("kvaudit_roundtrip_last_timestamp_seconds", "gauge",
             "Unix time of the last round trip");
    m.sample("kvaudit_roundtrip_last_timestamp_seconds", source, r.last_unix_s);
  }
}

}  // namespace

void judge(const engines::Registry& registry, const logs::Launch& launch,
           const std::vector<logs::Expectation>& expectations, LaunchState& state) {
  state.expectations = logs::check_expectations(registry, launch, expectations);
  state.expectation_pending.assign(state.expectations.size(), false);
  state.expectation_failures = 0;
  const bool settled = launch.ready || !launch.failures.empty();
  for (size_t i = 0; i < state.expectations.size(); ++i) {
    const logs::ExpectationResult& r = state.expectations[i];
    if (r.met) continue;
    // Not shown yet (or not ready yet): the launch may still show it. A value the launch
    // contradicts fails now: that is the line the alert must fire on.
    const bool waiting = unknown(r.actual) || r.expected.key == "ready";
    if (waiting && !settled) {
      state.expectation_pending[i] = true;
      continue;
    }
    ++state.expectation_failures;
  }
}

std::vector<logs::Expectation> expectations_from_check_json(const std::filesystem::path& path) {
  const std::string where = path.string();
  const nlohmann::json doc = read_json_file(path, 64 << 20);
  // check's payload sits at the top level of its report (docs/json-schema.md, check).
  const nlohmann::json* decision =
      doc.is_object() && doc.contains("decision") ? &doc["decision"] : nullptr;
  if (!decision || !decision->is_object() || !decision->contains("options") ||
      !(*decision)["options"].is_array())
    throw InputError(where, "no decision in it: expected the output of kvaudit check --json");
  std::string wanted = decision->value("recommended", "");
  if (wanted.empty()) wanted = "as-launched";
  for (const auto& option : (*decision)["options"]) {
    if (!option.is_object() || option.value("id", "") != wanted) continue;
    if (!option.contains("expect") || !option["expect"].is_array())
      throw InputError(where, fmt::format("option '{}' has no expect list", wanted));
    std::vector<logs::Expectation> out;
    for (const auto& text : option["expect"]) {
      if (!text.is_string()) throw InputError(where, "an expect entry is not a string");
      out.push_back(logs::parse_expectation(text.get<std::string>()));
    }
    if (out.empty()) throw InputError(where, fmt::format("option '{}' expects nothing", wanted));
    return out;
  }
  throw InputError(where,
                   fmt::format("the decision names option '{}' but lists no such option", wanted));
}

std::string describe(const LaunchState& launch) {
  std::string text = fmt::format("launch {}", launch.number);
  if (launch.first_line > 0) text += fmt::format(" (line {})", launch.first_line);
  if (!launch.engine.empty())
    text += fmt::format(": {}{}", launch.engine,
                        launch.engine_version.empty() ? "" : " " + launch.engine_version);
  text += fmt::format(", KV cache {}",
                      launch.kv_resolved.empty() ? "not known yet" : launch.kv_resolved);
  if (!launch.kv_requested.empty()) text += fmt::format(" (requested {})", launch.kv_requested);
  if (launch.scale_fallback && *launch.scale_fallback) text += ", scales fall back to 1.0";
  if (launch.capacity_tokens) text += fmt::format(", {} KV tokens", *launch.capacity_tokens);
  text += launch.failed ? ", failed" : launch.ready ? ", ready" : ", starting";
  std::vector<std::string> failing, pending;
  for (size_t i = 0; i < launch.expectations.size(); ++i) {
    const auto& r = launch.expectations[i];
    const std::string what = r.expected.key + "=" + r.expected.value;
    if (launch.expectation_pending[i])
      pending.push_back(what);
    else if (!r.met)
      failing.push_back(
          fmt::format("{} (shows {})", what, unknown(r.actual) ? "nothing" : r.actual));
  }
  if (!failing.empty()) text += fmt::format("; EXPECTATION FAILED: {}", fmt::join(failing, ", "));
  if (!pending.empty()) text += fmt::format("; waiting to see {}", fmt::join(pending, ", "));
  if (failing.empty() && pending.empty() && !launch.expectations.empty())
    text += "; expectations met";
  return text;
}

std::string render_metrics(const WatchState& state) {
  Families m;
  const std::vector<std::pair<std::string, std::string>> source = {{"source", state.source}};
  m.family("kvaudit_watch_source_up", "gauge",
           "1 when the followed file exists or the server answered its last poll");
  m.sample("kvaudit_watch_source_up", source, state.source_up ? 1 : 0);
  m.family("kvaudit_watch_lines_read_total", "counter", "Lines read from the followed log");
  m.sample("kvaudit_watch_lines_read_total", source, static_cast<double>(state.lines));
  m.family("kvaudit_watch_launches_total", "counter", "Launches seen since the watch started");
  m.sample("kvaudit_watch_launches_total", source, static_cast<double>(state.launches));
  m.family("kvaudit_watch_rotations_total", "counter",
           "Times the followed path named a new file (rotation)");
  m.sample("kvaudit_watch_rotations_total", source, static_cast<double>(state.rotations));
  m.family("kvaudit_watch_truncations_total", "counter",
           "Times the followed file shrank and was read again from its start");
  m.sample("kvaudit_watch_truncations_total", source, static_cast<double>(state.truncations));
  m.family("kvaudit_watch_polls_failed_total", "counter", "Server polls that got no answer");
  m.sample("kvaudit_watch_polls_failed_total", source, static_cast<double>(state.polls_failed));
  m.family("kvaudit_watch_last_check_timestamp_seconds", "gauge",
           "Unix time of the last line read or server poll");
  m.sample("kvaudit_watch_last_check_timestamp_seconds", source, state.last_check_unix_s);
  render_drift_metrics(state, m);
  if (state.latest) {
    const LaunchState& s = *state.latest;
    auto with = [&](std::vector<std::pair<std::string, std::string>> extra) {
      std::vector<std::pair<std::string, std::string>> labels = {
          {"source", state.source}, {"launch", std::to_string(s.number)}};
      for (auto& e : extra) labels.push_back(std::move(e));
      return labels;
    };
    m.family("kvaudit_kv_cache_info", "gauge",
             "The latest launch's KV cache (value 1): resolved is the dtype the cache holds, "
             "empty until a line or rule decides it");
    m.sample("kvaudit_kv_cache_info",
             with({{"engine", s.engine},
                   {"engine_version", s.engine_version},
                   {"model", s.model},
                   {"requested", s.kv_requested},
                   {"resolved", s.kv_resolved},
                   {"decided_by", s.kv_decided_by}}),
             1);
    m.family("kvaudit_kv_cache_resolved", "gauge",
             "1 once the latest launch's KV cache dtype is known");
    m.sample("kvaudit_kv_cache_resolved", with({}), s.kv_resolved.empty() ? 0 : 1);
    if (s.scale_fallback) {
      m.family("kvaudit_kv_scale_fallback", "gauge",
               "1 when the latest launch runs its quantized KV cache at scale 1.0 (absent while "
               "the log cannot tell)");
      m.sample("kvaudit_kv_scale_fallback", with({}), *s.scale_fallback ? 1 : 0);
    }
    if (s.capacity_tokens) {
      m.family("kvaudit_kv_capacity_tokens", "gauge",
               "KV cache capacity of the latest launch in tokens (per GPU pool)");
      m.sample("kvaudit_kv_capacity_tokens", with({}), static_cast<double>(*s.capacity_tokens));
    }
    m.family("kvaudit_launch_ready", "gauge", "1 once the latest launch is serving");
    m.sample("kvaudit_launch_ready", with({}), s.ready ? 1 : 0);
    m.family("kvaudit_launch_failed", "gauge",
             "1 when the latest launch logged a traceback, OOM or exit");
    m.sample("kvaudit_launch_failed", with({}), s.failed ? 1 : 0);
    m.family("kvaudit_findings", "gauge", "kvaudit's findings on the latest launch, by severity");
    for (const char* severity : {"critical", "warning", "info"}) {
      auto it = s.findings_by_severity.find(severity);
      m.sample("kvaudit_findings", with({{"severity", severity}}),
               it == s.findings_by_severity.end() ? 0 : static_cast<double>(it->second));
    }
    if (!s.expectations.empty()) {
      auto labels_of = [&](const logs::ExpectationResult& r) {
        return with({{"key", r.expected.key},
                     {"expected", r.expected.value},
                     {"actual", unknown(r.actual) ? "" : r.actual}});
      };
      m.family("kvaudit_expectation_failed", "gauge",
               "1 when the latest launch fails this expectation (0 while it may still show it)");
      for (size_t i = 0; i < s.expectations.size(); ++i)
        m.sample("kvaudit_expectation_failed", labels_of(s.expectations[i]),
                 !s.expectations[i].met && !s.expectation_pending[i] ? 1 : 0);
      m.family("kvaudit_expectation_pending", "gauge",
               "1 while the latest launch has not shown the value this expectation checks");
      for (size_t i = 0; i < s.expectations.size(); ++i)
        m.sample("kvaudit_expectation_pending", labels_of(s.expectations[i]),
                 s.expectation_pending[i] ? 1 : 0);
      m.family("kvaudit_expectation_failures", "gauge",
               "Expectations the latest launch fails (alert on > 0)");
      m.sample("kvaudit_expectation_failures", with({}),
               static_cast<double>(s.expectation_failures));
    }
  }
  return m.take();
}

LogWatcher::LogWatcher(const engines::Registry& registry, std::string source, WatchOptions options)
    : registry_(registry),
      options_(std::move(options)),
      stream_(
          registry, source,
          logs::ScanOptions{options_.max_line_bytes, options_.max_launches, options_.kv_policy}) {
  state_.source = std::move(source);
  state_.source_up = true;
}

bool LogWatcher::add_line(std::string_view line, double now_unix_s) {
  state_.last_check_unix_s = now_unix_s;
  const bool matched = stream_.add_line(line);
  state_.lines = stream_.lines();
  if (!matched) return false;
  const std::optional<logs::Launch> latest = stream_.latest();
  if (!latest) return false;
  const logs::Launch& launch = *latest;
  // Launch indices count every launch the stream opened, dropped ones included.
  const int64_t number = launch.index + 1;
  LaunchState next = state_of(registry_, launch, options_.expectations, number);
  if (state_.latest && fingerprint(*state_.latest) == fingerprint(next)) return false;
  state_.launches = number;
  state_.latest = std::move(next);
  ++state_.changes;
  return true;
}

ServerWatcher::ServerWatcher(const engines::Registry& registry, std::string url,
                             WatchOptions options, net::ClientOptions client)
    : registry_(registry), options_(std::move(options)), client_options_(std::move(client)) {
  state_.source = std::move(url);
}

bool ServerWatcher::poll(double now_unix_s) {
  state_.last_check_unix_s = now_unix_s;
  probe::ServerFacts facts;
  probe::ServerCounters counters;
  try {
    // A fresh client per poll: a server that restarted must not be read through a dead
    // keep-alive connection.
    net::Client client(net::parse_url(state_.source), client_options_);
    facts = probe::detect_server(registry_, client);
    counters =
        probe::read_server_counters(client, probe::load_counter_names(registry_, facts.engine));
  } catch (const net::RequestError&) {
    ++state_.polls_failed;
    const bool changed = state_.source_up;
    state_.source_up = false;
    return changed;
  }
  const bool was_down = !state_.source_up;
  state_.source_up = true;
  // The server's own report, as a launch: what it says is what the log would have said.
  logs::Launch launch;
  launch.engine = registry_.find(facts.engine) ? facts.engine : "";
  launch.engine_version = facts.engine_version;
  launch.model_path = facts.model_path.empty() ? facts.model_id : facts.model_path;
  launch.kv_cache_dtype_requested = facts.kv_cache_dtype;
  const std::string normalised = registry_.dtypes().normalise(facts.kv_cache_dtype);
  // "auto" names no dtype: the server does not say what it resolved to, so it stays unknown
  // (an expectation on it fails once the server answers: never a silent all-clear).
  if (!normalised.empty() && normalised != "auto" && registry_.dtypes().find(normalised)) {
    launch.kv_cache_dtype_resolved = normalised;
    launch.resolved_evidence = facts.kv_cache_dtype_source;
  }
  launch.max_total_tokens = facts.capacity_tokens;
  launch.tp = facts.tp;
  launch.ready = true;  // it answered
  const std::string key =
      fmt::format("{}|{}|{}|{}|{}", launch.engine, launch.engine_version, launch.model_path,
                  facts.kv_cache_dtype, facts.capacity_tokens.value_or(-1));
  const bool new_launch = was_down || key != fingerprint_;
  fingerprint_ = key;
  if (new_launch) ++state_.launches;
  const bool was_drift = state_.acceptance.drift;
  add_acceptance_sample(counters, new_launch, options_.acceptance, state_.acceptance);
  const bool drift_changed = was_drift != state_.acceptance.drift;
  LaunchState next = state_of(registry_, launch, options_.expectations, state_.launches);
  next.kv_requested = facts.kv_cache_dtype;
  if (!new_launch && state_.latest && fingerprint(*state_.latest) == fingerprint(next))
    return drift_changed;
  state_.latest = std::move(next);
  ++state_.changes;
  return true;
}

}  // namespace kvaudit::watch
