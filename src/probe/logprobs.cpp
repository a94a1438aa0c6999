// What log-probs a server grants: a few small echo completions without retries, lowering the
// alternatives asked to the limit its error names (else halving them), and whether the
// prompt's log-probs come back (teacher-forced scoring needs them).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>

#include "probe/probe.h"

namespace kvaudit::probe {

void negotiate_logprobs(net::Client& client, const std::string& model, int wanted,
                        ServerFacts& facts) {
  // One small request per try, without retries: an answer that says no is the answer.
  net::ClientOptions quick = client.options();
  quick.max_retries = 0;
  net::Client probe_client(client.url(), quick);
  static const Regex allowed(R"((?:max allowed|more than)[^0-9]{0,12}([0-9]{1,6}))");
  int asking = std::max(1, wanted);
  std::vector<std::string> said;
  const std::string text = "The quick brown fox jumps over the lazy dog.";
  for (int attempt = 0; attempt < 6 && asking >= 1; ++attempt) {
    net::CompletionRequest request;
    request.model = model;
    request.prompt = text;
    request.max_tokens = 1;
    request.logprobs = asking;
    request.echo = facts.prompt_logprobs.value_or(true);
    try {
      net::Completion answer = net::complete(probe_client, request);
      facts.top_logprobs_granted = asking;
      size_t longest = 0, returned_bytes = 0;
      for (const auto& token : answer.tokens) {
        longest = std::max(longest, token.top.size());
        returned_bytes += token.token.size();
      }
      if (request.echo) {
        const bool offsets = !answer.tokens.empty() && answer.tokens[0].text_offset >= 0;
        facts.prompt_logprobs = answer.has_logprobs && (offsets || returned_bytes >= text.size());
        if (!*facts.prompt_logprobs)
          said.push_back("echo ignored: only generated tokens came back");
      }
      if (answer.has_logprobs && longest > 0 && int(longest) < asking)
        said.push_back(fmt::format("asked {} alternatives, {} came back", asking, longest));
      said.push_back(
          fmt::format("granted {} log-probs per token{}", asking,
                      facts.prompt_logprobs.value_or(false) ? " with the prompt's (echo)" : ""));
      break;
    } catch (const net::RequestError& error) {
      if (error.kind() != net::FailureKind::http || error.status() == 401 ||
          error.status() == 403 || error.status() == 404)
        break;  // not an answer about log-probs: leave it unknown
      const std::string& problem = error.problem();
      said.push_back(fmt::format("asked {}{}: {}", asking, request.echo ? " with echo" : "",
                                 problem.substr(0, 200)));
      std::string lower = problem;
      std::transform(lower.begin(), lower.end(), lower.begin(),
                     [](unsigned char c) { return std::tolower(c); });
      if (request.echo && lower.find("echo") != std::string::npos) {
        // llama-server: "Only no echo is supported" (HTTP 500); ask again without echo.
        facts.prompt_logprobs = false;
        continue;
      }
      if (error.status() >= 500) break;  // overload, not an answer about log-probs
      if (auto match = allowed.search(problem)) {
        const int limit = std::stoi(std::string(*match->at(1)));
        if (limit >= 1 && limit < asking) {
          asking = limit;
          continue;
        }
      }
      asking /= 2;
    }
  }
  facts.logprobs_note = fmt::format("{}", fmt::join(said, "; "));
}

}  // namespace kvaudit::probe
