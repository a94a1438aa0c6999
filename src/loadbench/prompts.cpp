// The load bench's prompts: long code contexts (eval's recall generator, or the user's own
// files) cut to the ladder's prompt lengths, as sessions of growing turns, and random-token
// controls of the same lengths; every request cut to fit the servers' context.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <set>

#include "eval/eval.h"
#include "loadbench/internal.h"
#include "util/util.h"

namespace kvaudit::loadbench {

using nlohmann::json;

// Requests of a level: whole sessions, at least one per concurrency slot.
int64_t requests_per_level(const LoadOptions& options, int concurrency) {
  const int64_t asked =
      options.requests_per_level > 0 ? options.requests_per_level : std::max(8, 2 * concurrency);
  const int64_t turns = std::max(1, options.turns);
  const int64_t sessions =
      std::max<int64_t>((asked + turns - 1) / turns, turns > 1 ? concurrency : 1);
  return sessions * turns;
}

namespace {

// Turn t of `turns` of a session whose last prompt has `length` tokens: equal steps.
int64_t turn_length(int64_t length, int turn, int turns) {
  return std::max<int64_t>(1, length * (turn + 1) / turns);
}

// A (prompt, max_tokens) pair cut to fit `limit` tokens per request, prompt first: the
// output lengths are what decode speed is measured on.
std::pair<int64_t, int64_t> fit_request(int64_t prompt, int64_t output, int64_t limit) {
  if (prompt + output <= limit) return {prompt, output};
  output = std::min(output, std::max<int64_t>(1, limit / 4));
  return {std::max<int64_t>(1, limit - output), output};
}

// The user's files (sorted, text only, at most max_bytes in all), each under a header line.
std::string read_corpus(const std::string& dir, size_t max_bytes) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InputError(dir, "--load-corpus expects a folder");
  std::vector<fs::path> files;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec))
    if (it->is_regular_file(ec) && it->file_size(ec) < (4u << 20)) files.push_back(it->path());
  std::sort(files.begin(), files.end());
  std::string text;
  for (const fs::path& file : files) {
    if (text.size() >= max_bytes) break;
    std::string content = read_text_file(file);
    if (content.find('\0') != std::string::npos) continue;  // binary
    text += fmt::format("\n# file: {}\n", fs::relative(file, dir, ec).string());
    text += to_valid_utf8(content);
  }
  if (text.size() < 1024) throw InputError(dir, "--load-corpus holds under 1 KiB of text files");
  if (text.size() > max_bytes) text.resize(max_bytes);
  return to_valid_utf8(text);
}

// Long synthetic Python files from eval's recall generator: many functions defined and
// called, the kind of context a coding agent sends.
std::string synthetic_corpus(size_t want_bytes, uint64_t seed) {
  std::string text;
  auto bytes_over_four = [](std::string_view t) { return static_cast<int64_t>(t.size() / 4); };
  for (uint64_t i = 0; text.size() < want_bytes; ++i) {
    eval::RecallCaseOptions options;
    options.ctx_tokens = 4096;
    options.depth_tokens = 1024;
    options.seed = seed * 1000 + i;
    eval::RecallCase recall = eval::make_recall_case(options, bytes_over_four);
    text += recall.prompt + recall.expected + "\n\n";
  }
  return text;
}

}  // namespace

// `request_limit`: the most tokens (prompt + output) one request may hold on every server.
PromptSet make_prompts(net::Client& client, const std::string& model, const LoadOptions& options,
                       int64_t count, std::optional<int64_t> request_limit) {
  PromptSet set;
  const int64_t longest =
      *std::max_element(options.prompt_tokens.begin(), options.prompt_tokens.end());
  const size_t want_bytes = static_cast<size_t>(std::min<int64_t>(longest * 4 * 8, 8 << 20));
  const std::string text = options.corpus_dir.empty() ? synthetic_corpus(want_bytes, options.seed)
                                                      : read_corpus(options.corpus_dir, want_bytes);
  std::mt19937_64 rng(options.seed);
  net::Tokenizer tokenizer(client, model);
  std::optional<net::Tokenized> ids = tokenizer.tokenize(text);
  const std::string what = options.corpus_dir.empty()
                               ? "synthetic Python files (eval's recall generator)"
                               : "files of " + options.corpus_dir;
  // Without /tokenize the lengths are estimates (4 bytes a token): keep an eighth in hand.
  // 0: no limit known.
  const int64_t limit = !request_limit ? 0 : ids ? *request_limit : *request_limit * 7 / 8;
  std::set<std::string> cuts;
  const int turns = std::max(1, options.turns);
  size_t session_start = 0;  // where the session's window begins (ids or bytes)
  // Sessions start at distinct places, so no two share a prefix (what a prompt cache reuses).
  std::set<size_t> used_starts;
  auto draw_start = [&](size_t span) {
    size_t start = span > 0 ? rng() % span : 0;
    for (int retry = 0; retry < 16 && span > 0 && used_starts.count(start); ++retry)
      start = rng() % span;
    used_starts.insert(start);
    return start;
  };
  for (int64_t i = 0; i < count; ++i) {
    const int turn = static_cast<int>(i % turns);
    const int64_t session = i / turns;
    int64_t length = options.prompt_tokens[session % options.prompt_tokens.size()];
    int64_t max_tokens = options.output_tokens[i % options.output_tokens.size()];
    if (limit > 0) {
      auto [fitted_length, fitted_output] = fit_request(length, max_tokens, limit);
      if (fitted_length != length || fitted_output != max_tokens)
        cuts.insert(
            fmt::format("{}+{} -> {}+{}", length, max_tokens, fitted_length, fitted_output));
      length = fitted_length;
      max_tokens = fitted_output;
    }
    // A session's turns share its window's start; each is a longer prefix of it.
    const int64_t full = length;
    length = turn_length(full, turn, turns);
    if (ids && static_cast<int64_t>(ids->ids.size()) > full) {
      if (turn == 0) session_start = draw_start(ids->ids.size() - static_cast<size_t>(full));
      std::vector<int32_t> real(ids->ids.begin() + session_start,
                                ids->ids.begin() + session_start + length);
      set.real.push_back({json(real), length, max_tokens, turn, full});
    } else {
      const size_t bytes = static_cast<size_t>(full) * 4;
      if (turn == 0) session_start = draw_start(text.size() > bytes ? text.size() - bytes : 0);
      set.real.push_back({json(to_valid_utf8(text.substr(session_start, length * 4))), length,
                          max_tokens, turn, full});
    }
  }
  if (!cuts.empty()) {
    std::string list;
    for (const std::string& cut : cuts) list += (list.empty() ? "" : ", ") + cut;
    set.fitted =
        fmt::format("prompt+output tokens cut to fit the servers' {} tokens per request{}: {}",
                    *request_limit, ids ? "" : " (less an eighth: lengths are estimated)", list);
  }
  if (ids && !ids->ids.empty()) {
    // Uniform over [0, the largest id the text uses]: ordinary tokens of this vocabulary
    // (special tokens sit above them), no structure: what a random-token benchmark sends.
    const int32_t largest = *std::max_element(ids->ids.begin(), ids->ids.end());
    // The same sessions: a random sequence per session, each turn a longer prefix of it.
    std::vector<int32_t> session_ids;
    for (const LoadPrompt& real : set.real) {
      if (real.turn == 0) {
        session_ids.resize(static_cast<size_t>(real.session_tokens));
        for (int32_t& id : session_ids) id = static_cast<int32_t>(rng() % (uint64_t(largest) + 1));
      }
      std::vector<int32_t> random(session_ids.begin(), session_ids.begin() + real.tokens);
      set.random.push_back(
          {json(random), real.tokens, real.max_tokens, real.turn, real.session_tokens});
    }
    set.source = fmt::format(
        "{}, cut to exact token counts with {}'s /tokenize; random controls draw ids uniformly "
        "from [0, {}] (the largest id the text uses)",
        what, client.url().text(), largest);
  } else {
    std::vector<std::string> words;
    for (size_t at = 0; at < text.size();) {
      size_t end = text.find_first_of(" \n\t", at);
      if (end == std::string::npos) end = text.size();
      if (end > at) words.push_back(text.substr(at, end - at));
      at = end + 1;
    }
    std::string session_text;
    for (const LoadPrompt& real : set.real) {
      if (real.turn == 0) {
        session_text.clear();
        while (session_text.size() < static_cast<size_t>(real.session_tokens) * 4)
          session_text += words[rng() % words.size()] + " ";
      }
      set.random.push_back({json(session_text.substr(0, static_cast<size_t>(real.tokens) * 4)),
                            real.tokens, real.max_tokens, real.turn, real.session_tokens});
    }
    set.source = fmt::format(
        "{}, lengths approximated as 4 bytes per token (the server has no /tokenize); random "
        "controls are the text's words in random order",
        what);
  }
  return set;
}

}  // namespace kvaudit::loadbench
