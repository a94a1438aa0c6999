// The probes' prompts: the smoke set, recall cases and the long-context tasks from eval's
// generators, the teacher-forced sequences (synthetic code or prose), each measured with the
// first server's tokenizer (else bytes / 4) and built options.concurrency at a time.
#include <fmt/format.h>

#include <algorithm>

#include "eval/eval.h"
#include "probe/internal.h"
#include "util/util.h"

namespace kvaudit::probe {

namespace {

// A smoke probe's prompt and the answer that passes: "short" (any text), "arithmetic" (42),
// "medium" (an inventory code looked up in a list that fits half the context).
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

}  // namespace

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

}  // namespace kvaudit::probe
