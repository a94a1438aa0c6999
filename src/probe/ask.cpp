// One probe on one server: the smoke prompts (chat, else plain completion), recall and the
// multi-round tasks asked greedily with top-k log-probs, teacher-forced scoring of the
// expected text or a whole fixed sequence (echo + logprobs), and the errors that stop a run
// against those that only fail the probe.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "eval/eval.h"
#include "probe/internal.h"

namespace kvaudit::probe {

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

namespace {

constexpr int64_t kForcedWindow = 64;  // prompt positions kept before the expected text

bool fatal(const net::RequestError& error) {
  return error.server_unavailable() || error.kind() == net::FailureKind::malformed ||
         error.kind() == net::FailureKind::too_large ||
         error.kind() == net::FailureKind::no_progress || error.status() == 401 ||
         error.status() == 403 || error.status() == 404;
}

// Scores `prompt` as the server sees it: one token generated, the prompt echoed with top_k
// log-probs per position. False (with `refusal` set) when the server refuses echo or
// log-probs; an error that stops the run is rethrown.
bool echo_logprobs(net::Client& client, const std::string& model, const std::string& prompt,
                   int top_k, net::Completion& answer, std::string& refusal) {
  net::CompletionRequest request;
  request.model = model;
  request.prompt = prompt;
  request.max_tokens = 1;
  request.echo = true;
  request.logprobs = std::max(1, top_k);
  try {
    answer = net::complete(client, request);
  } catch (const net::RequestError& error) {
    if (fatal(error)) throw;
    refusal = fmt::format("echo + logprobs refused: {}", error.problem());
    return false;
  }
  return true;
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
  const std::string full = prepared.prompt + prepared.expected;
  net::Completion answer;
  if (!echo_logprobs(client, model, full, top_k, answer, record.error)) return;
  if (!answer.has_logprobs) return;
  const size_t prompt_bytes = prepared.prompt.size();
  const size_t full_bytes = full.size();
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
  net::Completion answer;
  if (!echo_logprobs(client, model, text, top_k, answer, record.forced_note)) return;
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

}  // namespace

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
    static const Regex forty_two("(^|[^0-9])42([^0-9]|$)");
    record.passed = forty_two.search(answer.text).has_value();
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

}  // namespace kvaudit::probe
