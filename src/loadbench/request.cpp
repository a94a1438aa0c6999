// One timed completion of the load bench, as each server answers it: server-sent events read
// as they arrive (first token, gaps between chunks) or one JSON body; the usage counts, cached
// prompt tokens and speculative counts in each server's dialect (OpenAI usage, llama-server's
// timings, SGLang's meta_info); the run's deadline and interrupt honoured mid-answer.
#include <fmt/format.h>

#include <chrono>

#include "loadbench/internal.h"

namespace kvaudit::loadbench {

using nlohmann::json;

namespace {

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

}  // namespace

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
      timing.cancelled = true;
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

}  // namespace kvaudit::loadbench
