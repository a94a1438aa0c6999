// Load tests: a ladder of concurrencies against one or two servers, real agentic-coding
// prompts and random-token controls of the same lengths, streamed so time to first token
// and the gaps between tokens are measured per request, speculative decoding's
// acceptance from the servers' counters, all inside a request budget and a time limit.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "eval/eval.h"
#include "loadbench/loadbench.h"
#include "util/json.h"
#include "util/util.h"

namespace kvaudit::loadbench {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

LatencySummary summarize_latency(std::vector<double> seconds) {
  LatencySummary out;
  out.count = static_cast<int64_t>(seconds.size());
  if (seconds.empty()) return out;
  std::sort(seconds.begin(), seconds.end());
  double sum = 0.0;
  for (double s : seconds) sum += s;
  out.mean = sum / static_cast<double>(seconds.size());
  auto rank = [&](double fraction) {
    size_t index = static_cast<size_t>(std::ceil(fraction * static_cast<double>(seconds.size())));
    return seconds[std::clamp<size_t>(index, 1, seconds.size()) - 1];
  };
  out.p50 = rank(0.50);
  out.p90 = rank(0.90);
  out.p99 = rank(0.99);
  return out;
}

namespace {

// ---------------------------------------------------------------- prompts

struct LoadPrompt {
  json prompt;  // token ids, or text when the server has no /tokenize
  int64_t tokens = 0;
  int64_t max_tokens = 0;
  int turn = 0;  // within its session (0: the first; prompts of a session are adjacent)
  int64_t session_tokens = 0;  // the session's last and longest prompt
};

// Requests of a level: whole sessions, at least one per concurrency slot.
int64_t requests_per_level(const LoadOptions& options, int concurrency) {
  const int64_t asked =
      options.requests_per_level > 0 ? options.requests_per_level : std::max(8, 2 * concurrency);
  const int64_t turns = std::max(1, options.turns);
  const int64_t sessions =
      std::max<int64_t>((asked + turns - 1) / turns, turns > 1 ? concurrency : 1);
  return sessions * turns;
}

// Turn t of `turns` of a session whose last prompt has `length` tokens: equal steps.
int64_t turn_length(int64_t length, int turn, int turns) {
  return std::max<int64_t>(1, length * (turn + 1) / turns);
}

struct PromptSet {
  std::vector<LoadPrompt> real, random;
  std::string source;
  std::string fitted;  // how lengths were cut to the servers' context ("" : none were)
};

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

// ---------------------------------------------------------------- one request

struct Timing {
  bool ok = false;
  std::string error;
  bool unavailable = false;  // the server itself is failing: stop the run
  bool streamed = false;
  double ttft = -1.0, total = 0.0;
  std::vector<double> gaps;
  int64_t prompt_tokens = 0, output_tokens = 0, chunks = 0;
  int64_t cached_tokens = -1;  // usage.prompt_tokens_details.cached_tokens, when given
  int64_t draft = -1, accepted = -1, verify_steps = -1;
};

// Reads the events of a server-sent-events body as they arrive: data lines with JSON, the
// first non-empty text is the first token, each later one a gap.
class SseReader {
 public:
  SseReader(Timing& timing, Clock::time_point started, const std::string& where)
      : timing_(timing),
        started_(started),
        parser_(where, [this](std::string_view data) { event(data); }) {}
  // events: parse server-sent events (a streamed request); else only keep the body.
  void feed(std::string_view piece, bool events) {
    // Kept whole too (bounded): a server that ignores "stream" answers one JSON body.
    if (raw_.size() + piece.size() <= (8u << 20)) raw_.append(piece);
    if (events) parser_.feed(piece);
  }
  bool done() const { return done_; }
  const std::string& raw() const { return raw_; }
  bool malformed() const { return malformed_; }

 private:
  void event(std::string_view data) {
    if (data == "[DONE]") {
      done_ = true;
      return;
    }
    json doc = json::parse(data, nullptr, false);
    if (doc.is_discarded() || !doc.is_object()) {
      malformed_ = true;
      return;
    }
    const auto now = Clock::now();
    std::string text;
    if (auto choices = doc.find("choices"); choices != doc.end() && choices->is_array())
      for (const json& choice : *choices) {
        if (choice.contains("text") && choice["text"].is_string()) text += choice["text"];
        if (choice.contains("delta") && choice["delta"].is_object() &&
            choice["delta"].value("content", json()).is_string())
          text += choice["delta"]["content"].get<std::string>();
      }
    if (!text.empty()) {
      const double at = std::chrono::duration<double>(now - started_).count();
      if (timing_.ttft < 0) {
        timing_.ttft = at;
      } else {
        timing_.gaps.push_back(at - last_);
      }
      last_ = at;
      ++timing_.chunks;
    }
    read_counts(doc, timing_);
  }

 public:
  static void read_counts(const json& doc, Timing& timing) {
    if (auto usage = doc.find("usage"); usage != doc.end() && usage->is_object()) {
      if (usage->value("prompt_tokens", json()).is_number_integer())
        timing.prompt_tokens = (*usage)["prompt_tokens"].get<int64_t>();
      if (usage->value("completion_tokens", json()).is_number_integer())
        timing.output_tokens = (*usage)["completion_tokens"].get<int64_t>();
      if (auto details = usage->find("prompt_tokens_details");
          details != usage->end() && details->is_object() &&
          details->value("cached_tokens", json()).is_number_integer())
        timing.cached_tokens = (*details)["cached_tokens"].get<int64_t>();
    }
    // llama-server's per-response speculative counts.
    if (auto timings = doc.find("timings"); timings != doc.end() && timings->is_object()) {
      if (timings->value("draft_n", json()).is_number_integer())
        timing.draft = (*timings)["draft_n"].get<int64_t>();
      if (timings->value("draft_n_accepted", json()).is_number_integer())
        timing.accepted = (*timings)["draft_n_accepted"].get<int64_t>();
    }
    // SGLang's meta_info (asked for with return_meta_info; under each choice on the OpenAI
    // routes, at the top on /generate): drafted, accepted and verify steps of the request.
    auto read_meta = [&](const json& meta) {
      if (!meta.is_object()) return;
      auto count = [&](const char* key, int64_t& target) {
        if (meta.value(key, json()).is_number_integer()) target = meta[key].get<int64_t>();
      };
      count("spec_draft_token_num", timing.draft);
      count("spec_accept_token_num", timing.accepted);
      count("spec_verify_ct", timing.verify_steps);
      if (timing.cached_tokens < 0) count("cached_tokens", timing.cached_tokens);
    };
    if (auto meta = doc.find("meta_info"); meta != doc.end()) read_meta(*meta);
    if (auto choices = doc.find("choices"); choices != doc.end() && choices->is_array())
      for (const json& choice : *choices)
        if (choice.is_object() && choice.contains("meta_info")) read_meta(choice["meta_info"]);
  }

 private:
  Timing& timing_;
  Clock::time_point started_;
  net::SseParser parser_;
  std::string raw_;
  double last_ = 0.0;
  bool done_ = false, malformed_ = false;
};

// One completion, streamed when asked; stops reading (and counts as cut) past `deadline`
// or when interrupted.
Timing run_request(net::Client& client, const std::string& model, const LoadPrompt& prompt,
                   bool stream, Clock::time_point deadline, const std::function<bool()>& stop,
                   const json& extra_fields) {
  Timing timing;
  json body = {{"model", model},
               {"prompt", prompt.prompt},
               {"max_tokens", prompt.max_tokens},
               {"temperature", 0}};
  for (const auto& [key, value] : extra_fields.items()) body[key] = value;
  if (stream) {
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
  }
  const auto started = Clock::now();
  bool cut = false;
  try {
    SseReader reader(timing, started, client.where("/v1/completions"));
    net::HttpResponse response;
    // Streamed or not, the body arrives piece by piece, so the run's deadline and an
    // interrupt stop a slow answer too (a one-piece answer is parsed from reader.raw()).
    response = client.post_stream(
        "/v1/completions", body,
        [&](std::string_view piece) {
          if (Clock::now() >= deadline || (stop && stop())) {
            cut = true;
            return false;
          }
          reader.feed(piece, stream);
          return true;
        },
        stream ? "text/event-stream" : "application/json");
    timing.total = std::chrono::duration<double>(Clock::now() - started).count();
    if (response.status < 200 || response.status >= 300) {
      timing.error =
          fmt::format("HTTP {}: {}", response.status, net::error_message_of(response.body));
      return timing;
    }
    if (cut) {
      timing.error = "stopped at the run's time limit or on interrupt";
      return timing;
    }
    const bool sse = response.content_type.find("text/event-stream") != std::string::npos ||
                     (stream && response.body.empty() && timing.chunks > 0);
    if (sse) {
      timing.streamed = true;
      if (reader.malformed()) {
        timing.error = "a streamed event was not JSON";
        return timing;
      }
    } else {
      // Answered in one piece (no SSE): counts from the JSON, no first-token time.
      json doc = json::parse(reader.raw(), nullptr, false);
      if (doc.is_discarded() || !doc.is_object()) {
        timing.error = "the answer is not JSON";
        return timing;
      }
      SseReader::read_counts(doc, timing);
    }
    if (timing.output_tokens == 0) timing.output_tokens = timing.chunks;
    timing.ok = true;
  } catch (const net::RequestError& error) {
    timing.total = std::chrono::duration<double>(Clock::now() - started).count();
    timing.error = error.what();
    timing.unavailable = error.server_unavailable();
  }
  return timing;
}

// ---------------------------------------------------------------- counters

struct SpecCounters {
  double draft = 0.0, accepted = 0.0, drafts = 0.0;
  bool seen = false;
  // SGLang's gauges (last logging interval), averaged over label sets; -1: absent.
  double accept_rate = -1.0, accept_length = -1.0;
  double cached = 0.0;  // sglang:cached_tokens_total (prompt tokens served from its cache)
  bool cached_seen = false;
  double generated = 0.0;  // the server's own count of generated tokens
  bool generated_seen = false;
};

using CounterNames = std::map<std::string, std::vector<std::string>>;

// The speculative-decoding counters (vLLM's vllm:spec_decode_*, llama-server's
// llamacpp:spec_decode_*: the same suffixes), summed over labels, and the counters the
// engine data names; none when /metrics is absent or has none.
SpecCounters read_spec_counters(net::Client& client, const CounterNames& names) {
  auto named = [&](const char* kind, const std::string& name) {
    auto it = names.find(kind);
    return it != names.end() &&
           std::find(it->second.begin(), it->second.end(), name) != it->second.end();
  };
  SpecCounters out;
  int rate_count = 0, length_count = 0;
  try {
    net::HttpResponse response = client.get("/metrics");
    if (response.status != 200) return out;
    for (const net::MetricSample& sample :
         net::parse_prometheus(response.body, client.where("/metrics"))) {
      // Every figure read here is a count or a rate, finite and >= 0: a NaN, an infinity
      // or a negative value (Prometheus text allows them) is a server misreporting, and
      // is left out rather than spread through the level's deltas and averages.
      if (!std::isfinite(sample.value) || sample.value < 0) continue;
      const std::string& name = sample.name;
      auto ends = [&](std::string_view suffix) {
        return name.size() >= suffix.size() &&
               name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
               name.find("spec_decode_num_") != std::string::npos;
      };
      if (ends("num_draft_tokens_total")) out.draft += sample.value, out.seen = true;
      if (ends("num_accepted_tokens_total")) out.accepted += sample.value, out.seen = true;
      if (ends("num_drafts_total")) out.drafts += sample.value, out.seen = true;
      // SGLang: gauges only (python/sglang/srt/metrics/collector.py,
      // SchedulerMetricsCollector, "mostrecent" over the decode log interval).
      auto average_into = [&](double& target, int& count) {
        target = (std::max(0.0, target) * count + sample.value) / (count + 1);
        ++count;
      };
      if (named("cached_tokens", name)) out.cached += sample.value, out.cached_seen = true;
      if (named("spec_accept_rate", name)) average_into(out.accept_rate, rate_count);
      if (named("spec_accept_length", name)) average_into(out.accept_length, length_count);
      if (named("generated_tokens", name)) out.generated += sample.value, out.generated_seen = true;
    }
  } catch (const InputError&) {
    return SpecCounters{};
  }
  return out;
}

// ---------------------------------------------------------------- one level

std::string level_key(const LoadLevel& level, const LoadOptions& options) {
  std::string key = fmt::format(
      "{}|{}|{}|{}|{}|{}|{}", level.server, level.prompts, level.concurrency, options.seed,
      fmt::join(options.prompt_tokens, ","), fmt::join(options.output_tokens, ","), level.requests);
  if (options.turns > 1) key += fmt::format("|turns={}", options.turns);
  return key;
}

struct Budget {
  std::atomic<int64_t> left;
  Clock::time_point deadline;
  std::function<bool()> interrupted;
  bool stop() const { return interrupted && interrupted(); }
};

// `stream` turns false (for the rest of the run) when the server refuses stream=true with a
// 400 that says so (kvaudit serve, some gateways): the request is sent again in one piece.
// `extra_fields` go into every request body (SGLang: return_meta_info).
LoadLevel run_level(net::Client& client, const std::string& model,
                    const std::vector<LoadPrompt>& prompts, int concurrency,
                    std::atomic<bool>& stream, Budget& budget, std::atomic<bool>& server_failing,
                    const json& extra_fields, const CounterNames& counters) {
  LoadLevel level;
  level.concurrency = concurrency;
  const SpecCounters before = read_spec_counters(client, counters);
  std::vector<Timing> timings(prompts.size());
  // Sessions: runs of adjacent prompts starting at turn 0; a worker sends one session's turns
  // in order, each after the answer to the one before.
  std::vector<size_t> session_starts;
  for (size_t i = 0; i < prompts.size(); ++i)
    if (prompts[i].turn == 0 || i == 0) session_starts.push_back(i);
  session_starts.push_back(prompts.size());
  std::atomic<size_t> next{0};
  const auto started = Clock::now();
  std::vector<std::thread> workers;
  for (int w = 0; w < concurrency; ++w)
    workers.emplace_back([&] {
      for (;;) {
        const size_t session = next++;
        if (session + 1 >= session_starts.size()) return;
        for (size_t index = session_starts[session]; index < session_starts[session + 1]; ++index) {
          if (server_failing || budget.stop() || Clock::now() >= budget.deadline) return;
          if (budget.left.fetch_sub(1) <= 0) return;
          timings[index] = run_request(client, model, prompts[index], stream, budget.deadline,
                                       budget.interrupted, extra_fields);
          if (stream && !timings[index].ok && timings[index].error.rfind("HTTP 400", 0) == 0 &&
              timings[index].error.find("stream") != std::string::npos) {
            stream = false;
            timings[index] = run_request(client, model, prompts[index], false, budget.deadline,
                                         budget.interrupted, extra_fields);
          }
          if (timings[index].unavailable) server_failing = true;
        }
      }
    });
  for (auto& worker : workers) worker.join();
  level.wall_seconds = std::chrono::duration<double>(Clock::now() - started).count();
  const SpecCounters after = read_spec_counters(client, counters);

  std::vector<double> ttft, gaps, e2e, ttft_first, ttft_later;
  int64_t draft = 0, accepted = 0, verify_steps = 0;
  bool per_response = false, any_steps = false;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Timing& t = timings[i];
    if (t.total == 0.0 && t.error.empty() && !t.ok) continue;  // never sent
    ++level.requests;
    if (!t.ok) {
      ++level.failures;
      if (level.errors.size() < 3) level.errors.push_back(t.error);
      continue;
    }
    level.streamed |= t.streamed;
    level.prompt_tokens += t.prompt_tokens;
    level.output_tokens += t.output_tokens;
    if (t.cached_tokens >= 0)
      level.cached_prompt_tokens =
          std::max<int64_t>(0, level.cached_prompt_tokens) + t.cached_tokens;
    e2e.push_back(t.total);
    if (t.ttft >= 0) {
      ttft.push_back(t.ttft);
      (prompts[i].turn == 0 ? ttft_first : ttft_later).push_back(t.ttft);
    }
    gaps.insert(gaps.end(), t.gaps.begin(), t.gaps.end());
    if (t.draft >= 0) {
      per_response = true;
      draft += t.draft;
      accepted += std::max<int64_t>(0, t.accepted);
      if (t.verify_steps >= 0) verify_steps += t.verify_steps, any_steps = true;
    }
  }
  level.ttft = summarize_latency(ttft);
  if (!ttft_later.empty()) {
    level.ttft_first_turn = summarize_latency(ttft_first);
    level.ttft_later_turns = summarize_latency(ttft_later);
  }
  level.itl = summarize_latency(gaps);
  level.e2e = summarize_latency(e2e);
  const int64_t ok = level.requests - level.failures;
  if (level.wall_seconds > 0) {
    level.requests_per_second = static_cast<double>(ok) / level.wall_seconds;
    level.output_tokens_per_second = static_cast<double>(level.output_tokens) / level.wall_seconds;
  }
  if (after.generated_seen && before.generated_seen)
    level.server_output_tokens =
        static_cast<int64_t>(std::llround(after.generated - before.generated));
  // Answers that did not say (SGLang without --enable-cache-report): its counter's delta.
  if (level.cached_prompt_tokens < 0 && after.cached_seen && before.cached_seen &&
      after.cached >= before.cached)
    level.cached_prompt_tokens = static_cast<int64_t>(std::llround(after.cached - before.cached));
  if (after.seen && before.seen && after.draft >= before.draft) {
    level.draft_tokens = static_cast<int64_t>(std::llround(after.draft - before.draft));
    level.accepted_tokens = static_cast<int64_t>(std::llround(after.accepted - before.accepted));
    level.drafts = static_cast<int64_t>(std::llround(after.drafts - before.drafts));
    level.spec_source = "/metrics";
  } else if (per_response) {
    level.draft_tokens = draft;
    level.accepted_tokens = accepted;
    if (any_steps) level.drafts = verify_steps;
    level.spec_source = "responses";
  } else if (after.accept_rate >= 0 || after.accept_length >= 0) {
    level.spec_accept_rate_gauge = after.accept_rate;
    level.spec_accept_length_gauge = after.accept_length;
    level.spec_source = "/metrics gauges";
  }
  return level;
}

}  // namespace

// ---------------------------------------------------------------- results file

json to_json(const LoadLevel& l) {
  auto latency = [](const LatencySummary& s) {
    return json{
        {"count", s.count}, {"mean", s.mean}, {"p50", s.p50}, {"p90", s.p90}, {"p99", s.p99}};
  };
  return {{"kind", "load_level"},
          {"server", l.server},
          {"prompts", l.prompts},
          {"concurrency", l.concurrency},
          {"requests", l.requests},
          {"failures", l.failures},
          {"wall_seconds", l.wall_seconds},
          {"requests_per_second", l.requests_per_second},
          {"output_tokens_per_second", l.output_tokens_per_second},
          {"prompt_tokens", l.prompt_tokens},
          {"output_tokens", l.output_tokens},
          {"cached_prompt_tokens", l.cached_prompt_tokens},
          {"ttft_seconds", latency(l.ttft)},
          {"itl_seconds", latency(l.itl)},
          {"e2e_seconds", latency(l.e2e)},
          {"ttft_first_turn_seconds", latency(l.ttft_first_turn)},
          {"ttft_later_turns_seconds", latency(l.ttft_later_turns)},
          {"streamed", l.streamed},
          {"draft_tokens", l.draft_tokens},
          {"accepted_tokens", l.accepted_tokens},
          {"drafts", l.drafts},
          {"spec_source", l.spec_source},
          {"spec_accept_rate_gauge", l.spec_accept_rate_gauge},
          {"spec_accept_length_gauge", l.spec_accept_length_gauge},
          {"server_output_tokens", l.server_output_tokens},
          {"errors", l.errors}};
}

LoadLevel load_level_from_json(const json& doc, const std::string& where) {
  JsonReader r(doc, where);
  LoadLevel l;
  if (r.string("kind") != "load_level") r.fail("kind", "is not \"load_level\"");
  l.server = r.string("server");
  l.prompts = r.string("prompts");
  l.concurrency = static_cast<int>(r.integer("concurrency"));
  l.requests = r.integer("requests");
  l.failures = r.integer("failures");
  l.wall_seconds = r.number("wall_seconds");
  l.requests_per_second = r.number("requests_per_second");
  l.output_tokens_per_second = r.number("output_tokens_per_second");
  l.prompt_tokens = r.integer("prompt_tokens");
  l.output_tokens = r.integer("output_tokens");
  l.cached_prompt_tokens = r.integer_or("cached_prompt_tokens", -1);
  auto read_latency = [](JsonReader s, LatencySummary& target) {
    target.count = s.integer("count");
    target.mean = s.number("mean");
    target.p50 = s.number("p50");
    target.p90 = s.number("p90");
    target.p99 = s.number("p99");
    s.finish();
  };
  for (auto [key, target] : {std::pair{"ttft_seconds", &l.ttft}, std::pair{"itl_seconds", &l.itl},
                             std::pair{"e2e_seconds", &l.e2e}})
    read_latency(r.object(key), *target);
  // Absent from results files written before sessions existed.
  if (auto s = r.optional_object("ttft_first_turn_seconds")) read_latency(*s, l.ttft_first_turn);
  if (auto s = r.optional_object("ttft_later_turns_seconds")) read_latency(*s, l.ttft_later_turns);
  l.streamed = r.boolean_or("streamed", false);
  l.draft_tokens = r.integer_or("draft_tokens", -1);
  l.accepted_tokens = r.integer_or("accepted_tokens", -1);
  l.drafts = r.integer_or("drafts", -1);
  l.spec_source = r.string_or("spec_source", "");
  l.spec_accept_rate_gauge = r.number_or("spec_accept_rate_gauge", -1.0);
  l.spec_accept_length_gauge = r.number_or("spec_accept_length_gauge", -1.0);
  l.server_output_tokens = r.integer_or("server_output_tokens", -1);
  l.errors = r.strings_or_empty("errors");
  r.allow_descriptive({"key"});
  r.finish();
  l.resumed = true;
  return l;
}

// ---------------------------------------------------------------- the run

LoadResult run_load(const engines::Registry& registry, const std::vector<std::string>& urls,
                    const net::ClientOptions& client_options, const LoadOptions& options) {
  if (urls.empty() || urls.size() > 2) throw InputError("probe --load", "give one or two URLs");
  if (options.concurrency.empty())
    throw InputError("--load-concurrency", "give at least one level");
  for (int c : options.concurrency)
    if (c < 1 || c > 1024) throw InputError("--load-concurrency", "levels must lie in [1, 1024]");
  if (options.prompt_tokens.empty() || options.output_tokens.empty())
    throw InputError("--load-prompt-tokens", "give at least one prompt and one output length");
  if (!(options.max_seconds > 0)) throw InputError("--load-time", "must be positive");
  if (options.turns < 1 || options.turns > 64)
    throw InputError("--load-turns", "must lie in [1, 64]");
  const auto started = Clock::now();
  LoadResult result;
  std::vector<std::unique_ptr<net::Client>> clients;
  std::vector<std::string> models;
  for (const std::string& url : urls) {
    net::ClientOptions per_server = client_options;
    const int widest = *std::max_element(options.concurrency.begin(), options.concurrency.end());
    per_server.max_concurrency = std::max(per_server.max_concurrency, widest);
    clients.push_back(std::make_unique<net::Client>(net::parse_url(url), per_server));
    result.servers.push_back(probe::detect_server(registry, *clients.back()));
    std::string model = options.model.empty() ? result.servers.back().model_id : options.model;
    if (model.empty()) throw InputError(url, "reports no model (/v1/models); pass --model");
    models.push_back(model);
  }

  // Earlier levels of the same run, from the results file.
  std::map<std::string, LoadLevel> previous;
  if (!options.results_path.empty() && std::filesystem::exists(options.results_path)) {
    std::ifstream in(options.results_path);
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
      json doc = json::parse(line, nullptr, false);
      if (doc.is_discarded() || !doc.is_object() || doc.value("kind", "") != "load_level") continue;
      LoadLevel level =
          load_level_from_json(doc, fmt::format("{}:{}", options.results_path, number));
      previous[doc.value("key", "")] = level;
    }
  }
  std::ofstream results_out;
  if (!options.results_path.empty()) {
    results_out.open(options.results_path, std::ios::app);
    if (!results_out)
      throw InputError(options.results_path, "cannot open the results file for appending");
  }

  // Every level gets prompts of its own: a server that caches prompts (SGLang's radix cache,
  // vLLM's prefix caching, llama-server's slots and --cache-ram) would otherwise serve a
  // later level's prompts from an earlier level's work and report a TTFT no cold request
  // sees. (Measured: llama-server's TTFT p50 fell from 153 ms at x1 to 11 ms at x4 when
  // both levels sent the same prompts.)
  int64_t total = 0;
  std::vector<int64_t> level_offsets;
  for (int c : options.concurrency) {
    level_offsets.push_back(total);
    total += requests_per_level(options, c);
  }
  // Every server gets the same prompts, so they must fit the smallest context (for a
  // llama-server, /props' n_ctx is already one slot's: recorded a-get-props.json).
  std::optional<int64_t> request_limit;
  for (const probe::ServerFacts& facts : result.servers)
    if (facts.context_length)
      request_limit =
          std::min(request_limit.value_or(*facts.context_length), *facts.context_length);
  PromptSet prompts = make_prompts(*clients[0], models[0], options, total, request_limit);
  result.prompt_source = prompts.source;
  if (!prompts.fitted.empty()) result.notes.push_back(prompts.fitted);

  Budget budget{
      {options.max_requests},
      started + std::chrono::milliseconds(static_cast<int64_t>(options.max_seconds * 1000)),
      options.interrupted};
  std::atomic<bool> failing{false};
  std::vector<std::unique_ptr<std::atomic<bool>>> streams;
  for (size_t s = 0; s < urls.size(); ++s)
    streams.push_back(std::make_unique<std::atomic<bool>>(options.stream));
  const std::vector<std::string> kinds = options.random_control
                                             ? std::vector<std::string>{"real", "random"}
                                             : std::vector<std::string>{"real"};
  int64_t total_levels =
      static_cast<int64_t>(options.concurrency.size() * kinds.size() * urls.size());
  int64_t done_levels = 0;
  for (size_t ladder_index = 0; ladder_index < options.concurrency.size(); ++ladder_index) {
    const int concurrency = options.concurrency[ladder_index];
    const int64_t count = requests_per_level(options, concurrency);
    const int64_t offset = level_offsets[ladder_index];
    for (const std::string& kind : kinds) {
      const auto& set = kind == "real" ? prompts.real : prompts.random;
      std::vector<LoadPrompt> level_prompts(set.begin() + offset, set.begin() + offset + count);
      for (size_t s = 0; s < urls.size(); ++s) {
        LoadLevel planned;
        planned.server = urls[s];
        planned.prompts = kind;
        planned.concurrency = concurrency;
        planned.requests = static_cast<int64_t>(level_prompts.size());
        const std::string key = level_key(planned, options);
        if (auto it = previous.find(key); it != previous.end()) {
          result.levels.push_back(it->second);
        } else {
          if (failing) break;
          if (budget.stop()) {
            result.stopped = "interrupted";
            break;
          }
          if (Clock::now() >= budget.deadline) {
            result.stopped = fmt::format("time limit of {:.0f} s reached", options.max_seconds);
            break;
          }
          if (budget.left <= 0) {
            result.stopped = fmt::format("request budget of {} spent", options.max_requests);
            break;
          }
          // Per-request counters some engines add only when asked (engine data:
          // server_info.completion_extra; SGLang's speculative counts in meta_info).
          const json extra = probe::completion_extra_fields(registry, result.servers[s].engine);
          LoadLevel level = run_level(
              *clients[s], models[s], level_prompts, concurrency, *streams[s], budget, failing,
              extra, probe::load_counter_names(registry, result.servers[s].engine));
          level.server = urls[s];
          level.prompts = kind;
          result.requests_sent += level.requests;
          // A level the limits cut short is reported but not kept for resume.
          const bool complete = level.requests == planned.requests && !failing;
          if (complete && results_out) {
            json line = to_json(level);
            line["key"] = key;
            results_out << line.dump() << '\n';
            results_out.flush();
          }
          result.levels.push_back(level);
        }
        if (options.on_progress)
          options.on_progress(++done_levels, total_levels,
                              fmt::format("{} x{} {}", kind, concurrency, urls[s]));
      }
      if (!result.stopped.empty() || failing) break;
    }
    if (!result.stopped.empty()) break;
    if (failing) {
      result.stopped = "a server stopped answering (see the errors)";
      break;
    }
  }
  if (result.stopped.empty() && failing)
    result.stopped = "a server stopped answering (see the errors)";
  for (const auto& client : clients) {
    const std::string& host = client->url().host;
    if (host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0) {
      // Measured on a 2-core host: kvaudit serve with 2 compute threads gave real/random
      // ratios of 0.73-1.43 on identical token counts; with 1 thread (a core left for the
      // client) 1.001-1.003.
      result.notes.push_back(fmt::format(
          "{} is on this machine: the load generator competes with it for {} cores, so "
          "levels vary with scheduling; leave the client a core (fewer server threads) or "
          "run the load from another machine before reading small differences",
          client->url().text(), std::max(1u, std::thread::hardware_concurrency())));
      break;
    }
  }
  for (size_t s = 0; s < clients.size(); ++s) {
    if (options.stream && !*streams[s])
      result.notes.push_back(fmt::format(
          "{} refuses stream=true: its requests were sent without streaming, so it has no "
          "first-token or inter-token times",
          urls[s]));
    const net::ClientStats stats = clients[s]->stats();
    result.notes.push_back(
        fmt::format("{}: {} requests, {} HTTP attempts ({} retries), {} connections", urls[s],
                    stats.requests, stats.attempts, stats.retries, stats.connections));
  }
  result.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  return result;
}

}  // namespace kvaudit::loadbench
