// Acceptance gates for CI: `--gate kl<=0.01,mrcr_drop<=2pt` parsed, and each gate judged on
// the comparison's metrics: the metric's excess over the control against its limit, settled
// when the whole interval lies on one side of it.
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <map>

#include "probe/internal.h"
#include "util/util.h"

namespace kvaudit::probe {

std::vector<Gate> parse_gates(const std::string& text) {
  static const std::map<std::string, bool> kMetrics = {
      // metric -> limit in points
      {"kl", false},       {"logprob_drop", false}, {"recall_drop", true},
      {"mrcr_drop", true}, {"toolcall_drop", true}, {"smoke_drop", true}};
  std::vector<Gate> gates;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string part =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    start = comma == std::string::npos ? text.size() + 1 : comma + 1;
    part.erase(0, part.find_first_not_of(" \t"));
    part.erase(part.find_last_not_of(" \t") + 1);
    if (part.empty()) continue;
    const size_t op = part.find("<=");
    if (op == std::string::npos)
      throw InputError("--gate", fmt::format("'{}': expected METRIC<=LIMIT, e.g. kl<=0.01 or "
                                             "mrcr_drop<=2pt",
                                             part));
    Gate gate;
    gate.text = part;
    gate.metric = part.substr(0, op);
    auto known = kMetrics.find(gate.metric);
    if (known == kMetrics.end())
      throw InputError("--gate", fmt::format("'{}': unknown metric '{}' (kl, logprob_drop, "
                                             "recall_drop, mrcr_drop, toolcall_drop, smoke_drop)",
                                             part, gate.metric));
    std::string number = part.substr(op + 2);
    bool points = false;
    for (const char* suffix : {"pt", "%"})
      if (number.size() > std::strlen(suffix) &&
          number.compare(number.size() - std::strlen(suffix), std::string::npos, suffix) == 0) {
        number.resize(number.size() - std::strlen(suffix));
        points = true;
      }
    if (points != known->second)
      throw InputError("--gate",
                       fmt::format("'{}': {} limits are {}", part, gate.metric,
                                   known->second ? "in points, e.g. 2pt" : "in nats, e.g. 0.01"));
    size_t used = 0;
    try {
      gate.limit = std::stod(number, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != number.size() || number.empty() || !std::isfinite(gate.limit) || gate.limit < 0)
      throw InputError("--gate", fmt::format("'{}': the limit must be a number >= 0", part));
    if (points) gate.limit /= 100.0;
    gates.push_back(gate);
  }
  if (gates.empty()) throw InputError("--gate", "no gate given");
  return gates;
}

GateResult evaluate_gate(const Gate& gate, const std::vector<MetricTest>& metrics) {
  GateResult g;
  g.gate = gate;
  const std::string metric = gate.metric == "kl" ? "kl"
                             : gate.metric == "logprob_drop"
                                 ? "logprob"
                                 : gate.metric.substr(0, gate.metric.find("_drop"));
  const MetricTest* m = nullptr;
  for (const auto& candidate : metrics)
    if (candidate.metric == metric) m = &candidate;
  if (m == nullptr) {
    g.status = "failed";
    g.message = fmt::format("{}: no data (no probe measured {}); run the probes it needs",
                            gate.text, metric);
    return g;
  }
  const bool drop = gate.metric != "kl";
  g.value = drop ? -m->excess : m->excess;
  g.interval = drop ? stats::Interval{-m->excess_interval.high, -m->excess_interval.low}
                    : m->excess_interval;
  const bool within = *g.value <= gate.limit;
  g.status = within ? "passed" : "failed";
  g.settled = within ? g.interval.high <= gate.limit : g.interval.low > gate.limit;
  const double scale = m->unit == "points" ? 100.0 : 1.0;
  const char* unit = m->unit == "points" ? " points" : m->unit == "nats" ? " nats" : " nats/token";
  g.message =
      fmt::format("{}: {:.4g}{} (interval [{:.4g}, {:.4g}]) {} the limit {:.4g}{}{}", gate.text,
                  scale * *g.value, unit, scale * g.interval.low, scale * g.interval.high,
                  within ? "within" : "exceeds", scale * gate.limit, unit,
                  g.settled ? ""
                            : fmt::format("; the interval straddles the limit: {} "
                                          "paired probes would settle it",
                                          m->probes_needed));
  return g;
}

}  // namespace kvaudit::probe
