// probe --roundtrip's judgement: whether the server's cached-token counts can be trusted,
// which tier served each pass, each tier compared with the pass before it against the
// floor (the same path measured twice), and the verdict.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "probe/internal.h"

namespace kvaudit::probe {

namespace {

// A cold prompt may share its first tokens with earlier requests (BOS, a template's head):
// a cache that reports that many cached tokens on first sight is not lying.
constexpr int64_t kColdSharedTokens = 16;

const RoundTripPass* find_pass(const RoundTripResult& result, std::string_view name) {
  for (const auto& pass : result.passes)
    if (pass.name == name) return &pass;
  return nullptr;
}

double delta(const std::map<std::string, double>& rise, const char* kind) {
  auto it = rise.find(kind);
  return it == rise.end() ? -1.0 : it->second;
}
double delta(const RoundTripPass& pass, const char* kind) {
  return delta(pass.counter_delta, kind);
}

const char* const kComputed = "computed";
const char* const kDevice = "device prefix cache";
const char* const kTier = "a tier behind the device pool";
const char* const kUnknown = "unknown";

// The counts are consistent: nothing cached on first sight beyond a shared head, never more
// than the prompt, and (where /metrics counts hits too) the two accounts agree.
void check_counts(RoundTripResult& result) {
  for (const auto& pass : result.passes) {
    for (size_t i = 0; i < pass.records.size(); ++i) {
      const auto& cached = pass.cached_tokens[i];
      if (!cached) continue;
      const int64_t prompt = pass.records[i].prompt_tokens;
      std::string problem;
      if (*cached < 0 || *cached > prompt)
        problem = fmt::format("it reports {} cached tokens for a prompt of {}", *cached, prompt);
      else if (pass.name == "cold" && *cached > kColdSharedTokens)
        problem = fmt::format(
            "it reports {} of {} tokens cached for prompt {} on the cold pass, "
            "whose nonce no earlier request carried",
            *cached, prompt, i);
      if (!problem.empty()) {
        result.counts_trusted = false;
        result.counts_note = fmt::format(
            "The server's cached-token counts ({}) are not "
            "trusted: {}.",
            pass.cached_field, problem);
        return;
      }
    }
    const double device = delta(pass, "prefix_hit_tokens"), tier = delta(pass, "tier_hit_tokens");
    if (device >= 0 && pass.prompt_tokens > 0) {
      const double counted = device + std::max(0.0, tier);
      const double slack =
          0.1 * double(pass.cached) + double(kColdSharedTokens) * double(pass.records.size());
      if (std::abs(counted - double(pass.cached)) > slack) {
        result.counts_trusted = false;
        result.counts_note = fmt::format(
            "The server's two accounts of cached tokens disagree on the {} pass: the answers "
            "say {}, /metrics' hit counters rose by {:.0f}.",
            pass.name, pass.cached, counted);
        return;
      }
    }
  }
}

// Which tier served record `i` of a pass: the tier counters' rise around its request, else
// its cached-token count (a full hit after a forced eviction that the counters do not place
// on the device is inferred to come from a tier behind it).
const char* served_by(const RoundTripResult& result, const RoundTripPass& pass, size_t i) {
  const auto& rise = i < pass.record_counter_delta.size() ? pass.record_counter_delta[i]
                                                          : std::map<std::string, double>{};
  const double tier = delta(rise, "tier_hit_tokens"), device = delta(rise, "prefix_hit_tokens");
  const std::optional<int64_t> cached = pass.cached_tokens[i];
  const int64_t prompt = pass.records[i].prompt_tokens;
  // Fewer than half the prompt's tokens came from any cache: it was computed (a shared
  // head, however served, is not the prompt's KV).
  const bool counted = cached && result.counts_trusted && prompt > 0;
  if (counted && 2 * *cached < prompt) return kComputed;
  if (!counted && 2 * (std::max(0.0, tier) + std::max(0.0, device)) < double(prompt))
    return tier >= 0 || device >= 0 ? kComputed : kUnknown;
  if (tier > 0) return kTier;
  if (!counted) return device > 0 && tier == 0 ? kDevice : kUnknown;
  if (pass.name != "after eviction") return kDevice;
  if (tier == 0 && device > 0) return kDevice;  // the counters place the hit on the device
  return result.eviction.forced ? kTier : kDevice;
}

void attribute(const RoundTripResult& result, RoundTripPass& pass) {
  pass.record_served_by.clear();
  std::map<std::string, int64_t> tally;
  for (size_t i = 0; i < pass.records.size(); ++i) {
    pass.record_served_by.push_back(served_by(result, pass, i));
    ++tally[pass.record_served_by.back()];
  }
  if (pass.records.empty()) return;
  int64_t most = 0;
  std::vector<std::string> parts;
  for (const auto& [name, count] : tally) {
    if (count > most) most = count, pass.served_by = name;
    parts.push_back(fmt::format("{} of {} prompts: {}", count, pass.records.size(), name));
  }
  std::string how;
  const double tier = delta(pass, "tier_hit_tokens");
  if (tier >= 0)
    how = fmt::format("/metrics tier hits rose by {:.0f}, device hits by {:.0f}", tier,
                      std::max(0.0, delta(pass, "prefix_hit_tokens")));
  if (pass.prompt_tokens > 0)
    how += fmt::format("{}{} of {} prompt tokens cached ({}{})", how.empty() ? "" : "; ",
                       pass.cached, pass.prompt_tokens, pass.cached_field,
                       result.counts_trusted ? "" : ", not trusted");
  if (pass.served_by == kTier && tier < 0)
    how += fmt::format(
        "; inferred: {} filler tokens overran the device pool of {} and the "
        "server names no tier counter",
        result.eviction.filler_tokens, result.eviction.pool_tokens.value_or(0));
  if (pass.served_by == kTier && result.facts.engine == "llama.cpp")
    how +=
        "; llama-server keeps evicted slots' prompts in its host-RAM prompt cache "
        "(--cache-ram)";
  pass.served_by_evidence = fmt::format("{}{}{}", fmt::join(parts, "; "), how.empty() ? "" : " (",
                                        how.empty() ? "" : how + ")");
}

// Per prompt KL of `pass` against `reference`, with the floor for the same prompt.
// Only prompts `pass` got from `tier` count: a prompt computed again says nothing about it.
TierCheck compare_pass(const std::string& name, const char* tier, const RoundTripPass& reference,
                       const RoundTripPass& pass, const RoundTripPass& floor_a,
                       const RoundTripPass& floor_b) {
  TierCheck check;
  check.name = name;
  check.pass = pass.name;
  check.against = reference.name;
  std::vector<double> excess;
  const size_t n = std::min({reference.records.size(), pass.records.size(), floor_a.records.size(),
                             floor_b.records.size()});
  for (size_t i = 0; i < n; ++i) {
    if (i >= pass.record_served_by.size() || pass.record_served_by[i] != tier) continue;
    const PairKl kl = pair_kl(reference.records[i], pass.records[i], false);
    const PairKl floor = pair_kl(floor_a.records[i], floor_b.records[i], false);
    if (!kl.kl || !floor.kl) continue;
    check.kl.push_back(*kl.kl);
    check.floor.push_back(*floor.kl);
    excess.push_back(*kl.kl - *floor.kl);
    const size_t diverge = first_divergence(reference.records[i], pass.records[i]);
    const auto& a = reference.records[i].generated;
    const auto& b = pass.records[i].generated;
    if (diverge < std::min(a.size(), b.size())) {
      ++check.diverged;
      if (check.first_token < 0 || int64_t(diverge) < check.first_token) {
        check.first_prompt = int64_t(i);
        check.first_token = int64_t(diverge);
        check.first_position = reference.records[i].prompt_tokens + int64_t(diverge);
        check.token_expected = a[diverge].token;
        check.token_served = b[diverge].token;
      }
    }
  }
  check.prompts = int64_t(excess.size());
  if (!excess.empty()) {
    double sum = 0.0;
    for (double e : excess) sum += e;
    check.excess = sum / double(excess.size());
    check.excess_interval = stats::bootstrap_mean_interval(excess, 0.95);
    check.test = stats::sign_flip_test(excess, stats::Alternative::greater);
  }
  return check;
}

void judge_check(TierCheck& check, const RoundTripOptions& options) {
  const double tol = options.tolerance_kl;
  check.prompts_needed = stats::min_samples_for(options.alpha, stats::Alternative::greater);
  if (check.prompts == 0) {
    check.verdict = "not exercised";
    check.sentence = fmt::format("{} vs {}: not exercised (no prompt came back from the {})",
                                 check.pass, check.against, check.name);
    return;
  }
  const std::string where =
      check.first_token < 0
          ? "the greedy text never diverged"
          : fmt::format(
                "prompt {} first diverges at generated token {} (position {}): {} "
                "expected, {} served",
                check.first_prompt, check.first_token, check.first_position,
                excerpt(check.token_expected, 20), excerpt(check.token_served, 20));
  const std::string figures = fmt::format(
      "KL excess over the floor {:.4g} nats/position (95% CI {:.4g} to {:.4g}), p = {:.3g} "
      "(Holm), {} of {} prompts' greedy text changed; {}",
      check.excess, check.excess_interval.low, check.excess_interval.high, check.p_adjusted,
      check.diverged, check.prompts, where);
  // Changed: significant and larger than the tolerance. Agrees: the whole interval of the
  // excess lies within the tolerance. Anything between needs more prompts.
  // A floor of exactly 0 on every prompt: the server repeats this path bit for bit, so a
  // difference is no noise and needs no test to be real; only its size is judged.
  const bool deterministic =
      std::all_of(check.floor.begin(), check.floor.end(), [](double f) { return f == 0.0; });
  // Otherwise either verdict needs as many prompts as the test needs to reach alpha at all.
  std::string short_of;
  if (check.p_adjusted <= options.alpha && check.excess > tol)
    check.verdict = "changed";
  else if (deterministic && check.excess > tol) {
    check.verdict = "changed";
    short_of =
        "; the floor is exactly 0 on every prompt (the same path twice gave identical "
        "log-probs), so the difference is the tier's, not noise";
  } else if (check.excess_interval.high <= tol && check.prompts >= check.prompts_needed)
    check.verdict = "agrees";
  else
    check.verdict = "inconclusive";
  if (check.verdict == "inconclusive" && check.prompts < check.prompts_needed)
    short_of = fmt::format("; only {} prompts came back from the {}, a verdict needs {}",
                           check.prompts, check.name, check.prompts_needed);
  check.sentence = fmt::format("{} vs {}: {} ({}{})", check.pass, check.against, check.verdict,
                               figures, short_of);
}

}  // namespace

void judge_roundtrip(const RoundTripOptions& options, RoundTripResult& result) {
  result.counts_trusted = true;
  result.counts_note.clear();
  result.checks.clear();
  check_counts(result);
  for (auto& pass : result.passes) attribute(result, pass);

  const RoundTripPass* cold = find_pass(result, "cold");
  const RoundTripPass* device = find_pass(result, "device");
  const RoundTripPass* again = find_pass(result, "device again");
  const RoundTripPass* after = find_pass(result, "after eviction");
  if (cold && device && again)
    result.checks.push_back(
        compare_pass("device prefix cache", kDevice, *cold, *device, *device, *again));
  if (device && again && after)
    result.checks.push_back(
        compare_pass("tier behind the device pool", kTier, *device, *after, *device, *again));
  std::vector<double> p;
  for (const auto& check : result.checks) p.push_back(check.test.p_value);
  const std::vector<double> adjusted = stats::holm_adjust(p);
  for (size_t i = 0; i < result.checks.size(); ++i) {
    result.checks[i].p_adjusted = adjusted[i];
    judge_check(result.checks[i], options);
  }

  std::vector<std::string> changed, open;
  for (const auto& check : result.checks) {
    if (check.verdict == "changed") changed.push_back(check.name);
    if (check.verdict == "inconclusive") open.push_back(check.name);
  }
  if (!changed.empty()) {
    result.verdict = "a tier changed the answers";
    std::vector<std::string> parts;
    for (const auto& check : result.checks)
      if (check.verdict == "changed")
        parts.push_back(fmt::format(
            "the {} moved the log-probs {:.3g} nats/position beyond the floor and changed {} of "
            "{} prompts' greedy text{}",
            check.name, check.excess, check.diverged, check.prompts,
            check.first_token < 0
                ? ""
                : fmt::format(", first at position {} (prompt {}, generated token {})",
                              check.first_position, check.first_prompt, check.first_token)));
    result.reason = fmt::format("{}", fmt::join(parts, "; "));
    return;
  }
  const bool tier_checked = result.checks.size() == 2 && result.checks[1].verdict == "agrees";
  auto all = [](const RoundTripPass* pass, const char* what) {
    return pass && !pass->records.empty() &&
           std::all_of(pass->record_served_by.begin(), pass->record_served_by.end(),
                       [&](const std::string& by) { return by == what; });
  };
  const bool no_tier =
      all(after, kComputed) && result.eviction.forced &&
      (result.checks.empty() || result.checks[0].verdict == "agrees" || all(device, kComputed));
  const bool no_cache = no_tier && all(device, kComputed);
  if (!result.stopped.empty()) {
    result.verdict = "not established";
    result.reason = "the run stopped early: " + result.stopped;
  } else if (!open.empty()) {
    result.verdict = "not established";
    std::vector<std::string> why;
    for (const auto& check : result.checks)
      if (check.verdict == "inconclusive")
        why.push_back(check.prompts < check.prompts_needed
                          ? fmt::format("only {} of {} prompts came back from the {} (the rest "
                                        "were computed again), a verdict needs {}: a larger "
                                        "tier, or fewer filler tokens (--roundtrip-overrun), "
                                        "keeps more",
                                        check.prompts, options.prompts, check.name,
                                        check.prompts_needed)
                          : fmt::format("the {} could not be told apart from the floor with {} "
                                        "prompts (more: --roundtrip-prompts)",
                                        check.name, check.prompts));
    result.reason = fmt::format("{}", fmt::join(why, "; "));
  } else if (no_cache) {
    result.verdict = "no cache served";
    result.reason =
        "every pass was computed from its start (the server reports no cached "
        "tokens): no cache tier is in play to check";
  } else if (tier_checked || no_tier) {
    result.verdict = "tiers agree";
    result.reason = no_tier ? "the device prefix cache agrees; no tier behind the device pool "
                              "kept the prompts (they were computed again after the eviction)"
                            : "every tier that served the prompts gave back the answers they "
                              "went in with, within the floor";
  } else {
    result.verdict = "not established";
    result.reason = after ? fmt::format(
                                "no tier behind the device pool was shown to serve the prompts: {} "
                                "({}){}",
                                after->served_by, after->served_by_evidence,
                                result.eviction.note.empty() ? "" : "; " + result.eviction.note)
                          : "the pass after eviction did not run";
  }
}

bool roundtrip_failed(const RoundTripResult& result) {
  return result.verdict != "tiers agree" && result.verdict != "no cache served";
}

}  // namespace kvaudit::probe
