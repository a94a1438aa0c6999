// The OpenAI-style protocol as SGLang, vLLM and `kvaudit serve` speak it: request
// bodies, strict answer parsing (every missing or mistyped field is named by its JSON
// path), and the calls probe/ makes.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "net/net.h"

namespace kvaudit::net {

using nlohmann::json;

namespace {

std::string type_of(const json& value) {
  if (value.is_null()) return "null";
  if (value.is_boolean()) return "a boolean";
  if (value.is_number()) return "a number";
  if (value.is_string()) return "a string";
  if (value.is_array()) return "an array";
  return "an object";
}

[[noreturn]] void malformed(const std::string& where, const std::string& path,
                            const std::string& problem) {
  throw RequestError(where, fmt::format("malformed answer: {}: {}", path, problem),
                     FailureKind::malformed);
}

// The member `key` of object `parent` (at `path`), which must exist.
const json& member(const json& parent, const char* key, const std::string& path,
                   const std::string& where) {
  if (!parent.is_object()) malformed(where, path, "expected an object, got " + type_of(parent));
  auto it = parent.find(key);
  if (it == parent.end()) malformed(where, path + "." + key, "missing");
  return *it;
}

std::string string_at(const json& value, const std::string& path, const std::string& where) {
  if (!value.is_string()) malformed(where, path, "expected a string, got " + type_of(value));
  return value.get<std::string>();
}

double number_at(const json& value, const std::string& path, const std::string& where) {
  if (!value.is_number()) malformed(where, path, "expected a number, got " + type_of(value));
  return value.get<double>();
}

int64_t integer_at(const json& value, const std::string& path, const std::string& where) {
  if (!value.is_number_integer())
    malformed(where, path, "expected an integer, got " + type_of(value));
  return value.get<int64_t>();
}

const json& array_at(const json& value, const std::string& path, const std::string& where) {
  if (!value.is_array()) malformed(where, path, "expected an array, got " + type_of(value));
  return value;
}

// A log-prob: a finite number <= 0 (tiny positive rounding allowed), or -inf spelled as
// a very negative number. NaN or positive values mean a broken server.
double logprob_at(const json& value, const std::string& path, const std::string& where) {
  double logprob = number_at(value, path, where);
  if (std::isnan(logprob) || logprob > 1e-3)
    malformed(where, path, fmt::format("log-prob {} is not <= 0", logprob));
  return std::min(logprob, 0.0);
}

const json& first_choice(const json& body, const std::string& where) {
  if (!body.is_object()) malformed(where, "$", "expected an object, got " + type_of(body));
  if (body.contains("error") && !body["error"].is_null())
    throw RequestError(where, "server error: " + error_message_of(body.dump()), FailureKind::http);
  const json& choices = array_at(member(body, "choices", "$", where), "$.choices", where);
  if (choices.empty()) malformed(where, "$.choices", "empty");
  if (!choices[0].is_object())
    malformed(where, "$.choices[0]", "expected an object, got " + type_of(choices[0]));
  return choices[0];
}

void read_usage_and_model(const json& body, Completion& out, const std::string& where) {
  if (auto it = body.find("model"); it != body.end() && it->is_string()) out.model = *it;
  // llama-server: timings.cache_n, the prompt tokens its slot or prompt cache reused.
  if (auto timings = body.find("timings"); timings != body.end() && timings->is_object())
    if (auto n = timings->find("cache_n"); n != timings->end() && !n->is_null()) {
      out.cached_tokens = integer_at(*n, "$.timings.cache_n", where);
      out.cached_tokens_field = "timings.cache_n";
    }
  auto usage = body.find("usage");
  if (usage == body.end() || usage->is_null()) return;
  if (auto p = usage->find("prompt_tokens"); p != usage->end() && !p->is_null())
    out.prompt_tokens = integer_at(*p, "$.usage.prompt_tokens", where);
  if (auto c = usage->find("completion_tokens"); c != usage->end() && !c->is_null())
    out.completion_tokens = integer_at(*c, "$.usage.completion_tokens", where);
  // vLLM (--enable-prompt-tokens-details), SGLang (--enable-cache-report), OpenAI.
  if (auto d = usage->find("prompt_tokens_details"); d != usage->end() && d->is_object())
    if (auto n = d->find("cached_tokens"); n != d->end() && !n->is_null()) {
      out.cached_tokens = integer_at(*n, "$.usage.prompt_tokens_details.cached_tokens", where);
      out.cached_tokens_field = "usage.prompt_tokens_details.cached_tokens";
    }
}

std::string finish_reason_of(const json& choice, const std::string& where) {
  auto it = choice.find("finish_reason");
  if (it == choice.end() || it->is_null()) return "";
  // SGLang may report {"type": "stop", ...} in older versions; accept both.
  if (it->is_object() && it->contains("type") && (*it)["type"].is_string())
    return (*it)["type"].get<std::string>();
  return string_at(*it, "$.choices[0].finish_reason", where);
}

void sort_top(std::vector<TopLogprob>& top) {
  std::stable_sort(top.begin(), top.end(),
                   [](const TopLogprob& a, const TopLogprob& b) { return a.logprob > b.logprob; });
}

// Chat-shaped log-probs, logprobs.content[]: {token, logprob, top_logprobs[{token,
// logprob}]} (OpenAI chat; llama.cpp's llama-server also answers /v1/completions so).
void read_content_logprobs(const json& items, const std::string& base, const std::string& where,
                           Completion& out) {
  array_at(items, base, where);
  out.has_logprobs = true;
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string path = fmt::format("{}[{}]", base, i);
    TokenLogprob token;
    token.token = string_at(member(items[i], "token", path, where), path + ".token", where);
    token.logprob = logprob_at(member(items[i], "logprob", path, where), path + ".logprob", where);
    if (auto top = items[i].find("top_logprobs"); top != items[i].end() && !top->is_null()) {
      array_at(*top, path + ".top_logprobs", where);
      for (size_t j = 0; j < top->size(); ++j) {
        const std::string top_path = fmt::format("{}.top_logprobs[{}]", path, j);
        const json& alt = (*top)[j];
        token.top.push_back(
            {string_at(member(alt, "token", top_path, where), top_path + ".token", where),
             logprob_at(member(alt, "logprob", top_path, where), top_path + ".logprob", where)});
      }
      sort_top(token.top);
    }
    out.tokens.push_back(std::move(token));
  }
}

}  // namespace

json to_json(const CompletionRequest& request) {
  json body = json::object();
  if (!request.model.empty()) body["model"] = request.model;
  if (request.prompt_ids.empty())
    body["prompt"] = request.prompt;
  else
    body["prompt"] = request.prompt_ids;
  body["max_tokens"] = request.max_tokens;
  body["temperature"] = request.temperature;
  if (request.seed) body["seed"] = *request.seed;
  if (!request.stop.empty()) body["stop"] = request.stop;
  if (request.echo) body["echo"] = true;
  if (request.logprobs > 0) body["logprobs"] = request.logprobs;
  body["stream"] = false;
  return body;
}

json to_json(const ChatRequest& request) {
  json body = json::object();
  if (!request.model.empty()) body["model"] = request.model;
  json messages = json::array();
  for (const auto& message : request.messages)
    messages.push_back({{"role", message.role}, {"content", message.content}});
  body["messages"] = std::move(messages);
  body["max_tokens"] = request.max_tokens;
  body["temperature"] = request.temperature;
  if (request.seed) body["seed"] = *request.seed;
  if (!request.stop.empty()) body["stop"] = request.stop;
  if (request.top_logprobs > 0) {
    body["logprobs"] = true;
    body["top_logprobs"] = request.top_logprobs;
  }
  body["stream"] = false;
  return body;
}

Completion parse_completion(const json& body, const std::string& where) {
  const json& choice = first_choice(body, where);
  Completion out;
  out.text = string_at(member(choice, "text", "$.choices[0]", where), "$.choices[0].text", where);
  out.finish_reason = finish_reason_of(choice, where);
  read_usage_and_model(body, out, where);
  auto logprobs = choice.find("logprobs");
  if (logprobs == choice.end() || logprobs->is_null()) return out;
  const std::string base = "$.choices[0].logprobs";
  // Two dialects: the legacy completions shape (tokens / token_logprobs / top_logprobs /
  // text_offset: vLLM, SGLang) and the chat shape (content[]: llama-server).
  if (logprobs->is_object() && !logprobs->contains("tokens") && logprobs->contains("content")) {
    const json& items = (*logprobs)["content"];
    if (!items.is_null()) read_content_logprobs(items, base + ".content", where, out);
    return out;
  }
  if (logprobs->is_object() && !logprobs->contains("tokens"))
    malformed(where, base, "neither tokens[] (completions) nor content[] (chat) log-probs");
  const json& tokens = array_at(member(*logprobs, "tokens", base, where), base + ".tokens", where);
  const json& token_logprobs =
      array_at(member(*logprobs, "token_logprobs", base, where), base + ".token_logprobs", where);
  if (token_logprobs.size() != tokens.size())
    malformed(where, base,
              fmt::format("{} tokens but {} token_logprobs", tokens.size(), token_logprobs.size()));
  const json* top = nullptr;
  if (auto it = logprobs->find("top_logprobs"); it != logprobs->end() && !it->is_null()) {
    top = &array_at(*it, base + ".top_logprobs", where);
    if (top->size() != tokens.size())
      malformed(where, base,
                fmt::format("{} tokens but {} top_logprobs", tokens.size(), top->size()));
  }
  const json* offsets = nullptr;
  if (auto it = logprobs->find("text_offset"); it != logprobs->end() && !it->is_null()) {
    offsets = &array_at(*it, base + ".text_offset", where);
    if (offsets->size() != tokens.size())
      malformed(where, base,
                fmt::format("{} tokens but {} text_offset", tokens.size(), offsets->size()));
  }
  out.has_logprobs = true;
  out.tokens.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    TokenLogprob token;
    token.token = string_at(tokens[i], fmt::format("{}.tokens[{}]", base, i), where);
    if (!token_logprobs[i].is_null())
      token.logprob =
          logprob_at(token_logprobs[i], fmt::format("{}.token_logprobs[{}]", base, i), where);
    if (top && !(*top)[i].is_null()) {
      const json& entry = (*top)[i];
      const std::string path = fmt::format("{}.top_logprobs[{}]", base, i);
      if (!entry.is_object()) malformed(where, path, "expected an object, got " + type_of(entry));
      for (const auto& [text, value] : entry.items())
        token.top.push_back({text, logprob_at(value, fmt::format("{}.{}", path, text), where)});
      sort_top(token.top);
    }
    if (offsets)
      token.text_offset =
          integer_at((*offsets)[i], fmt::format("{}.text_offset[{}]", base, i), where);
    out.tokens.push_back(std::move(token));
  }
  return out;
}

Completion parse_chat_completion(const json& body, const std::string& where) {
  const json& choice = first_choice(body, where);
  Completion out;
  const json& message = member(choice, "message", "$.choices[0]", where);
  const json& content = member(message, "content", "$.choices[0].message", where);
  if (!content.is_null()) out.text = string_at(content, "$.choices[0].message.content", where);
  out.finish_reason = finish_reason_of(choice, where);
  read_usage_and_model(body, out, where);
  auto logprobs = choice.find("logprobs");
  if (logprobs == choice.end() || logprobs->is_null()) return out;
  const json& items = member(*logprobs, "content", "$.choices[0].logprobs", where);
  if (items.is_null()) return out;
  read_content_logprobs(items, "$.choices[0].logprobs.content", where, out);
  return out;
}

std::vector<ModelCard> parse_model_list(const json& body, const std::string& where) {
  const json& data = array_at(member(body, "data", "$", where), "$.data", where);
  std::vector<ModelCard> cards;
  for (size_t i = 0; i < data.size(); ++i) {
    const std::string path = fmt::format("$.data[{}]", i);
    ModelCard card;
    card.id = string_at(member(data[i], "id", path, where), path + ".id", where);
    if (auto it = data[i].find("owned_by"); it != data[i].end() && it->is_string())
      card.owned_by = *it;
    if (auto it = data[i].find("root"); it != data[i].end() && it->is_string()) card.root = *it;
    if (auto it = data[i].find("max_model_len"); it != data[i].end() && !it->is_null())
      card.max_model_len = integer_at(*it, path + ".max_model_len", where);
    cards.push_back(std::move(card));
  }
  return cards;
}

Tokenized parse_tokenize(const json& body, const std::string& where) {
  const json& tokens = array_at(member(body, "tokens", "$", where), "$.tokens", where);
  Tokenized out;
  out.ids.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string path = fmt::format("$.tokens[{}]", i);
    int64_t id = tokens[i].is_object()  // llama-server with_pieces: {"id", "piece"}
                     ? integer_at(member(tokens[i], "id", path, where), path + ".id", where)
                     : integer_at(tokens[i], path, where);
    if (id < 0 || id > INT32_MAX)
      malformed(where, fmt::format("$.tokens[{}]", i), fmt::format("token id {} out of range", id));
    out.ids.push_back(static_cast<int32_t>(id));
  }
  if (auto it = body.find("count"); it != body.end() && it->is_number_integer() &&
                                    it->get<int64_t>() != static_cast<int64_t>(out.ids.size()))
    malformed(where, "$.count",
              fmt::format("says {} but {} tokens came back", it->get<int64_t>(), out.ids.size()));
  // Hugging Face tokenizers without a limit report model_max_length = 1e30: not a length.
  if (auto it = body.find("max_model_len"); it != body.end() && it->is_number_integer()) {
    int64_t length = it->get<int64_t>();
    if (length > 0 && length < (int64_t{1} << 40)) out.max_model_len = length;
  }
  return out;
}

Completion complete(Client& client, const CompletionRequest& request) {
  const std::string path = "/v1/completions";
  return parse_completion(client.post_json_checked(path, to_json(request)), client.where(path));
}

Completion chat(Client& client, const ChatRequest& request) {
  const std::string path = "/v1/chat/completions";
  return parse_chat_completion(client.post_json_checked(path, to_json(request)),
                               client.where(path));
}

std::vector<ModelCard> list_models(Client& client) {
  const std::string path = "/v1/models";
  return parse_model_list(client.get_json(path), client.where(path));
}

namespace {

struct TokenizeForm {
  const char* path;
  const char* key;              // the text's key in the request
  const char* detokenized_key;  // the text's key in the /detokenize answer
};
constexpr TokenizeForm kTokenizeForms[] = {{"/tokenize", "prompt", "prompt"},
                                           {"/tokenize", "content", "content"},
                                           {"/tokenize", "text", "text"},
                                           {"/v1/tokenize", "prompt", "prompt"}};

bool no_such_endpoint(int status) {
  return status == 404 || status == 405 || status == 400 || status == 422;
}

json parsed_body(const HttpResponse& response, const std::string& where) {
  if (response.status < 200 || response.status >= 300)
    throw RequestError(where,
                       fmt::format("HTTP {}: {}", response.status, error_message_of(response.body)),
                       FailureKind::http, response.status);
  auto doc = json::parse(response.body, nullptr, false);
  if (doc.is_discarded())
    throw RequestError(where, "malformed answer: not JSON", FailureKind::malformed);
  return doc;
}

}  // namespace

Tokenizer::Tokenizer(Client& client, std::string model)
    : client_(client), model_(std::move(model)) {}

std::string Tokenizer::dialect() const {
  std::lock_guard lock(mutex_);
  if (form_ < 0) return "";
  return fmt::format("POST {} {{\"{}\"}}", kTokenizeForms[form_].path, kTokenizeForms[form_].key);
}

std::optional<Tokenized> Tokenizer::tokenize(std::string_view text) {
  int known;
  {
    std::lock_guard lock(mutex_);
    known = form_;
  }
  auto ask = [&](const TokenizeForm& form) {
    json body = {{form.key, std::string(text)}, {"add_special_tokens", false}};
    if (!model_.empty()) body["model"] = model_;
    return client_.post_json(form.path, body);
  };
  if (known >= 0) {
    const TokenizeForm& form = kTokenizeForms[known];
    const std::string where = client_.where(form.path);
    Tokenized out = parse_tokenize(parsed_body(ask(form), where), where);
    if (out.ids.empty() && !text.empty())
      throw RequestError(
          where, fmt::format("no progress: {} bytes of text came back as no tokens", text.size()),
          FailureKind::no_progress);
    return out;
  }
  std::vector<std::string> empty_forms;
  for (size_t i = 0; i < std::size(kTokenizeForms); ++i) {
    const TokenizeForm& form = kTokenizeForms[i];
    HttpResponse response = ask(form);
    if (no_such_endpoint(response.status)) continue;
    const std::string where = client_.where(form.path);
    Tokenized out = parse_tokenize(parsed_body(response, where), where);
    if (out.ids.empty() && !text.empty()) {
      empty_forms.push_back(fmt::format("{{\"{}\"}}", form.key));
      continue;  // llama-server answers {"tokens": []} to a key it does not read
    }
    std::lock_guard lock(mutex_);
    form_ = static_cast<int>(i);
    return out;
  }
  if (!empty_forms.empty())
    throw RequestError(client_.where("/tokenize"),
                       fmt::format("no progress: {} bytes of text came back as no tokens with "
                                   "every request form ({})",
                                   text.size(), fmt::join(empty_forms, ", ")),
                       FailureKind::no_progress);
  return std::nullopt;
}

std::optional<std::string> Tokenizer::detokenize(const std::vector<int32_t>& ids) {
  int known;
  {
    std::lock_guard lock(mutex_);
    known = form_;
  }
  const std::string path =
      known >= 0 && std::string_view(kTokenizeForms[known].path) == "/v1/tokenize"
          ? "/v1/detokenize"
          : "/detokenize";
  json body = {{"tokens", ids}};
  if (!model_.empty()) body["model"] = model_;
  HttpResponse response = client_.post_json(path, body);
  if (no_such_endpoint(response.status)) return std::nullopt;
  const std::string where = client_.where(path);
  return parse_detokenize(parsed_body(response, where), where);
}

std::string parse_detokenize(const json& body, const std::string& where) {
  if (!body.is_object()) malformed(where, "$", "expected an object, got " + type_of(body));
  for (const TokenizeForm& form : kTokenizeForms)
    if (auto it = body.find(form.detokenized_key); it != body.end())
      return string_at(*it, fmt::format("$.{}", form.detokenized_key), where);
  malformed(where, "$", "no prompt, content or text in the answer");
}

std::optional<Tokenized> tokenize(Client& client, std::string_view text, const std::string& model) {
  return Tokenizer(client, model).tokenize(text);
}

SseParser::SseParser(std::string where, std::function<void(std::string_view)> on_data,
                     size_t max_line_bytes)
    : where_(std::move(where)), on_data_(std::move(on_data)), max_line_bytes_(max_line_bytes) {}

void SseParser::feed(std::string_view piece) {
  while (!piece.empty()) {
    const size_t end = piece.find('\n');
    const std::string_view part = piece.substr(0, end);
    if (line_.size() + part.size() > max_line_bytes_)
      throw RequestError(
          where_, fmt::format("a streamed line exceeds {} bytes without ending", max_line_bytes_),
          FailureKind::malformed);
    line_.append(part);
    if (end == std::string_view::npos) return;
    piece.remove_prefix(end + 1);
    std::string_view line(line_);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.substr(0, 5) == "data:") {
      line.remove_prefix(5);
      while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
      on_data_(line);
    }
    line_.clear();
  }
}

}  // namespace kvaudit::net
