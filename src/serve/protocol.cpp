// The OpenAI protocol: request bodies of /v1/completions and /v1/chat/completions parsed into
// GenerationRequests (every field checked and bounded), and results written back in the
// legacy completion log-prob format ({tokens, token_logprobs, top_logprobs, text_offset}) or
// the chat format ({content: [{token, logprob, bytes, top_logprobs}]}), as vLLM and SGLang
// return them. Unknown fields are ignored, as those servers do.
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cmath>

#include "serve/internal.h"
#include "util/json.h"
#include "util/util.h"

namespace kvaudit::serve {

namespace {

using nlohmann::json;

constexpr int kMaxLogprobs = 20;
constexpr size_t kMaxStopStrings = 16;

[[noreturn]] void bad(const std::string& message) {
  throw HttpError(400, message);
}

bool present(const json& body, const char* key) {
  return body.contains(key) && !body[key].is_null();
}

// Typed fields go through util's JsonReader, the one policy for every JSON kvaudit reads; its
// InputError (the key and what was wrong with it) becomes the 400 the client sees. The
// ranges are the API's own.
template <class Read>
auto read_field(const json& body, Read read) {
  try {
    JsonReader fields(body, "request body");
    return read(fields);
  } catch (const InputError& error) {
    bad(error.problem());
  }
}

double number_field(const json& body, const char* key, double fallback, double lo, double hi) {
  const double value =
      read_field(body, [&](JsonReader& fields) { return fields.number_or(key, fallback); });
  if (!(value >= lo && value <= hi)) bad(fmt::format("'{}' must be in [{}, {}]", key, lo, hi));
  return value;
}

int64_t int_field(const json& body, const char* key, int64_t fallback, int64_t lo, int64_t hi) {
  const int64_t value =
      read_field(body, [&](JsonReader& fields) { return fields.integer_or(key, fallback); });
  if (value < lo || value > hi) bad(fmt::format("'{}' must be in [{}, {}]", key, lo, hi));
  return value;
}

bool bool_field(const json& body, const char* key, bool fallback) {
  return read_field(body, [&](JsonReader& fields) { return fields.boolean_or(key, fallback); });
}

void check_model(const json& body, const ServedModel& served) {
  if (!present(body, "model")) return;
  if (!body["model"].is_string()) bad("'model' must be a string");
  if (body["model"].get<std::string>() != served.id)
    throw HttpError(
        404, fmt::format("The model `{}` does not exist.", body["model"].get<std::string>()));
}

// Fields both endpoints share: sampling, stop, n, stream, seed.
Streaming common_fields(const json& body, const ServedModel& served, GenerationRequest& request) {
  Streaming streaming;
  streaming.enabled = bool_field(body, "stream", false);
  if (present(body, "stream_options")) {
    if (!body["stream_options"].is_object()) bad("'stream_options' must be an object");
    if (!streaming.enabled) bad("'stream_options' needs 'stream': true");
    streaming.include_usage = bool_field(body["stream_options"], "include_usage", false);
  }
  if (int_field(body, "n", 1, 1, 1) != 1) bad("only n=1 is supported");
  if (int_field(body, "best_of", 1, 1, 1) != 1) bad("only best_of=1 is supported");
  request.temperature = number_field(body, "temperature", 1.0, 0.0, 2.0);
  request.top_p = number_field(body, "top_p", 1.0, 0.0, 1.0);
  if (request.top_p <= 0.0) bad("'top_p' must be in (0, 1]");
  if (present(body, "seed")) {
    if (!body["seed"].is_number_integer()) bad("'seed' must be an integer");
    request.seed = body["seed"].is_number_unsigned()
                       ? body["seed"].get<uint64_t>()
                       : static_cast<uint64_t>(body["seed"].get<int64_t>());
  }
  if (present(body, "stop")) {
    const json& stop = body["stop"];
    if (stop.is_string()) {
      request.stop.push_back(stop.get<std::string>());
    } else if (stop.is_array() && stop.size() <= kMaxStopStrings) {
      for (const auto& item : stop) {
        if (!item.is_string()) bad("'stop' must be a string or a list of strings");
        request.stop.push_back(item.get<std::string>());
      }
    } else {
      bad(fmt::format("'stop' must be a string or a list of at most {} strings", kMaxStopStrings));
    }
  }
  if (!bool_field(body, "ignore_eos", false)) request.stop_token_ids = served.eos_token_ids;
  if (present(body, "stop_token_ids")) {
    if (!body["stop_token_ids"].is_array()) bad("'stop_token_ids' must be a list of token ids");
    for (const auto& id : body["stop_token_ids"]) {
      if (!id.is_number_integer()) bad("'stop_token_ids' must be a list of token ids");
      request.stop_token_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  }
  return streaming;
}

// Context and pool bounds, with SGLang's wording for the first.
void check_lengths(const GenerationRequest& request, const ServedModel& served) {
  const int64_t prompt = static_cast<int64_t>(request.prompt.size());
  if (prompt == 0) bad("The prompt is empty: it must contain at least one token.");
  if (request.max_tokens > served.max_tokens_limit)
    bad(fmt::format("max_tokens {} exceeds this server's limit of {} (--max-tokens-limit)",
                    request.max_tokens, served.max_tokens_limit));
  const int64_t total = prompt + request.max_tokens;
  if (total > served.max_model_len)
    bad(
        fmt::format("Requested token count exceeds the model's maximum context length of {} "
                    "tokens. You requested a total of {} tokens: {} tokens from the input "
                    "messages and {} tokens for the completion. Please reduce the number of "
                    "tokens in the input messages or the completion to fit within the limit.",
                    served.max_model_len, total, prompt, request.max_tokens));
  if (total > served.max_total_num_tokens)
    bad(
        fmt::format("The request needs {} KV cache tokens but the pool holds {} "
                    "(max_total_num_tokens).",
                    total, served.max_total_num_tokens));
}

std::vector<int32_t> token_ids(const json& array, const ServedModel& served) {
  std::vector<int32_t> ids;
  for (const auto& item : array) {
    if (!item.is_number_integer()) bad("a token-id prompt must hold integers only");
    int64_t id = item.get<int64_t>();
    if (id < 0 || id >= served.vocab_size)
      bad(fmt::format("token id {} is outside the vocabulary [0, {})", id, served.vocab_size));
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

std::string new_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  auto now = std::chrono::system_clock::now().time_since_epoch();
  return fmt::format("{}-{:x}{:06x}", prefix,
                     std::chrono::duration_cast<std::chrono::microseconds>(now).count(),
                     counter++ & 0xffffff);
}

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Python's len() of the text these bytes decode to: UTF-8 lead bytes.
int64_t code_points(std::string_view bytes) {
  int64_t count = 0;
  for (unsigned char c : bytes) count += (c & 0xC0) != 0x80;
  return count;
}

// With --enable-cache-report, the prompt tokens the prefix cache served, as SGLang and
// vLLM report them (prompt_tokens_details.cached_tokens).
json usage(int64_t prompt, const GenerationResult& result, const ServedModel& served) {
  const int64_t completion = static_cast<int64_t>(result.output.size());
  json out = {{"prompt_tokens", prompt},
              {"completion_tokens", completion},
              {"total_tokens", prompt + completion}};
  if (served.cache_report) out["prompt_tokens_details"] = {{"cached_tokens", result.cached_tokens}};
  return out;
}

// The raw bytes of a token (a piece of a UTF-8 character stays a piece), as a list.
json byte_list(const tokenizer::Tokenizer& tokenizer, int32_t token) {
  json bytes = json::array();
  for (unsigned char c : tokenizer.token_bytes(token).value_or("")) bytes.push_back(int{c});
  return bytes;
}

}  // namespace

std::string token_text(const tokenizer::Tokenizer& tokenizer, int32_t token) {
  auto bytes = tokenizer.token_bytes(token);
  return bytes ? to_valid_utf8(*bytes) : std::string();
}

json error_body(int status, const std::string& message) {
  const char* type = status == 401   ? "AuthenticationError"
                     : status == 404 ? "NotFoundError"
                     : status == 413 ? "RequestTooLargeError"
                     : status == 429 ? "RateLimitError"
                     : status == 503 ? "ServiceUnavailableError"
                     : status >= 500 ? "InternalServerError"
                                     : "BadRequestError";
  return {{"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", status}}}};
}

std::string render_chat(const json& messages) {
  if (!messages.is_array() || messages.empty()) bad("'messages' must be a non-empty list");
  std::string text;
  for (const auto& message : messages) {
    if (!message.is_object() || !message.contains("role") || !message["role"].is_string())
      bad("each message needs a string 'role'");
    std::string role = message["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool" &&
        role != "developer")
      bad(fmt::format("unknown message role '{}'", role));
    std::string content;
    const json& c = message.value("content", json());
    if (c.is_string()) {
      content = c.get<std::string>();
    } else if (c.is_array()) {
      for (const auto& part : c) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string())
          bad("only text content parts are supported");
        content += part["text"].get<std::string>();
      }
    } else if (!c.is_null()) {
      bad("message 'content' must be a string or a list of text parts");
    } else if (role != "assistant") {
      // Only an assistant turn (one that made tool calls) may leave it out, as OpenAI's API
      // and the engines' request models have it.
      bad(fmt::format("a {} message needs 'content'", role));
    }
    text.append("<|im_start|>").append(role).append("\n").append(content).append("<|im_end|>\n");
  }
  return text + "<|im_start|>assistant\n";
}

CompletionCall parse_completion(const json& body, const ServedModel& served,
                                const tokenizer::Tokenizer& tokenizer) {
  if (!body.is_object()) bad("the request body must be a JSON object");
  check_model(body, served);
  CompletionCall call;
  GenerationRequest& request = call.request;
  if (!present(body, "prompt")) bad("'prompt' is required");
  json prompt = body["prompt"];
  if (prompt.is_array() && prompt.size() == 1 && (prompt[0].is_string() || prompt[0].is_array()))
    prompt = json(prompt[0]);
  if (prompt.is_string()) {
    call.prompt_text = prompt.get<std::string>();
    request.prompt = tokenizer.encode(call.prompt_text, {.add_special_tokens = true});
  } else if (prompt.is_array()) {
    for (const auto& item : prompt)
      if (item.is_string() || item.is_array()) bad("batched prompts are not supported (n=1 only)");
    request.prompt = token_ids(prompt, served);
    call.prompt_text = tokenizer.decode(request.prompt);
  } else {
    bad("'prompt' must be a string or a list of token ids");
  }
  call.streaming = common_fields(body, served, request);
  request.max_tokens = int_field(body, "max_tokens", 16, 0, int64_t{1} << 40);
  call.echo = bool_field(body, "echo", false);
  if (present(body, "logprobs")) {
    if (body["logprobs"].is_boolean()) bad("'logprobs' must be an integer (legacy completions)");
    request.top_logprobs = static_cast<int>(int_field(body, "logprobs", -1, 0, kMaxLogprobs));
  }
  if (call.streaming.enabled && (call.echo || request.top_logprobs >= 0))
    bad("stream=true carries text only here: drop 'echo' and 'logprobs', or stream=false");
  request.prompt_logprobs = call.echo && request.top_logprobs >= 0;
  check_lengths(request, served);
  return call;
}

json completion_response(const CompletionCall& call, const GenerationResult& result,
                         const ServedModel& served, const tokenizer::Tokenizer& tokenizer) {
  json choice = {{"index", 0},
                 {"text", (call.echo ? call.prompt_text : std::string()) + result.text},
                 {"logprobs", nullptr},
                 {"finish_reason", result.finish_reason},
                 {"stop_reason", nullptr}};
  if (call.request.top_logprobs >= 0) {
    json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
         offsets = json::array();
    int64_t offset = 0;
    auto add = [&](const TokenLogprobs& entry) {
      std::string text = token_text(tokenizer, entry.token);
      tokens.push_back(text);
      offsets.push_back(offset);
      offset += code_points(text);
      if (!entry.logprob) {
        token_logprobs.push_back(nullptr);
        top.push_back(nullptr);
        return;
      }
      token_logprobs.push_back(*entry.logprob);
      json alternatives = json::object();
      for (const auto& alt : entry.top) {
        std::string key = token_text(tokenizer, alt.token);
        if (!alternatives.contains(key)) alternatives[key] = alt.logprob;
      }
      if (!alternatives.contains(text)) alternatives[text] = *entry.logprob;
      top.push_back(alternatives);
    };
    for (const auto& entry : result.prompt_logprobs) add(entry);
    for (const auto& entry : result.output_logprobs) add(entry);
    choice["logprobs"] = {{"tokens", tokens},
                          {"token_logprobs", token_logprobs},
                          {"top_logprobs", top},
                          {"text_offset", offsets}};
  }
  return {{"id", new_id("cmpl")},
          {"object", "text_completion"},
          {"created", unix_seconds()},
          {"model", served.id},
          {"choices", json::array({choice})},
          {"usage", usage(static_cast<int64_t>(call.request.prompt.size()), result, served)}};
}

ChatCall parse_chat(const json& body, const ServedModel& served,
                    const tokenizer::Tokenizer& tokenizer) {
  if (!body.is_object()) bad("the request body must be a JSON object");
  check_model(body, served);
  if (!present(body, "messages")) bad("'messages' is required");
  ChatCall call;
  GenerationRequest& request = call.request;
  request.prompt = tokenizer.encode(render_chat(body["messages"]), {.add_special_tokens = true});
  call.streaming = common_fields(body, served, request);
  // <|im_end|> ends the assistant turn: a token when the vocabulary has it, else text.
  if (auto im_end = tokenizer.token_to_id("<|im_end|>"))
    request.stop_token_ids.push_back(*im_end);
  else
    request.stop.push_back("<|im_end|>");
  const int64_t room =
      std::max<int64_t>(0, std::min(served.max_model_len, served.max_total_num_tokens) -
                               static_cast<int64_t>(request.prompt.size()));
  int64_t fallback = std::min(room, served.max_tokens_limit);
  request.max_tokens = int_field(body, "max_completion_tokens", fallback, 0, int64_t{1} << 40);
  request.max_tokens = int_field(body, "max_tokens", request.max_tokens, 0, int64_t{1} << 40);
  const bool logprobs = bool_field(body, "logprobs", false);
  if (present(body, "top_logprobs") && !logprobs) bad("'top_logprobs' needs 'logprobs': true");
  if (logprobs)
    request.top_logprobs = static_cast<int>(int_field(body, "top_logprobs", 0, 0, kMaxLogprobs));
  if (call.streaming.enabled && logprobs)
    bad("stream=true carries text only here: drop 'logprobs', or stream=false");
  check_lengths(request, served);
  return call;
}

json chat_response(const ChatCall& call, const GenerationResult& result, const ServedModel& served,
                   const tokenizer::Tokenizer& tokenizer) {
  json choice = {{"index", 0},
                 {"message", {{"role", "assistant"}, {"content", result.text}}},
                 {"logprobs", nullptr},
                 {"finish_reason", result.finish_reason}};
  if (call.request.top_logprobs >= 0) {
    json content = json::array();
    for (const auto& entry : result.output_logprobs) {
      std::string text = token_text(tokenizer, entry.token);
      json top = json::array();
      for (const auto& alt : entry.top) {
        std::string alt_text = token_text(tokenizer, alt.token);
        top.push_back({{"token", alt_text},
                       {"logprob", alt.logprob},
                       {"bytes", byte_list(tokenizer, alt.token)}});
      }
      content.push_back({{"token", text},
                         {"logprob", entry.logprob.value_or(NAN)},
                         {"bytes", byte_list(tokenizer, entry.token)},
                         {"top_logprobs", top}});
    }
    choice["logprobs"] = {{"content", content}};
  }
  return {{"id", new_id("chatcmpl")},
          {"object", "chat.completion"},
          {"created", unix_seconds()},
          {"model", served.id},
          {"choices", json::array({choice})},
          {"usage", usage(static_cast<int64_t>(call.request.prompt.size()), result, served)}};
}

StreamIds new_stream_ids(bool chat) {
  return {new_id(chat ? "chatcmpl" : "cmpl"), unix_seconds(), chat};
}

std::string sse_event(const json& data) {
  return "data: " + data.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

namespace {
json chunk_head(const StreamIds& ids, const ServedModel& served) {
  return {{"id", ids.id},
          {"object", ids.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", ids.created},
          {"model", served.id}};
}
}  // namespace

json role_chunk(const StreamIds& ids, const ServedModel& served) {
  json chunk = chunk_head(ids, served);
  chunk["choices"] = json::array({{{"index", 0},
                                   {"delta", {{"role", "assistant"}, {"content", ""}}},
                                   {"logprobs", nullptr},
                                   {"finish_reason", nullptr}}});
  return chunk;
}

json text_chunk(const StreamIds& ids, const ServedModel& served, const std::string& text,
                const json& finish_reason) {
  json chunk = chunk_head(ids, served);
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_reason}};
  if (ids.chat)
    choice["delta"] = text.empty() ? json::object() : json{{"content", text}};
  else
    choice["text"] = text, choice["stop_reason"] = nullptr;
  chunk["choices"] = json::array({choice});
  return chunk;
}

json usage_chunk(const StreamIds& ids, const ServedModel& served, int64_t prompt_tokens,
                 const GenerationResult& result) {
  json chunk = chunk_head(ids, served);
  chunk["choices"] = json::array();
  chunk["usage"] = usage(prompt_tokens, result, served);
  return chunk;
}

}  // namespace kvaudit::serve
