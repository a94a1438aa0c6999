// The HTTP client: URL parsing, pooled keep-alive connections, retries with exponential
// backoff on 429/5xx and transport failures, and failures turned into RequestError with
// one clear sentence. cpp-httplib does the HTTP and TLS (Debian builds it with OpenSSL;
// see the compile definitions on kv_net in CMakeLists.txt).
#include <fmt/format.h>
#include <httplib.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <mutex>
#include <semaphore>
#include <thread>

#include "net/net.h"

namespace kvaudit::net {

// ---------------------------------------------------------------- URLs

std::string Url::text() const {
  const bool default_port = (scheme == "http" && port == 80) || (scheme == "https" && port == 443);
  std::string host_text = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return default_port ? fmt::format("{}://{}{}", scheme, host_text, base_path)
                      : fmt::format("{}://{}:{}{}", scheme, host_text, port, base_path);
}

Url parse_url(std::string_view text) {
  const std::string label(text);
  auto fail = [&](const std::string& problem) -> Url { throw InputError(label, problem); };
  if (text.empty()) return fail("empty server URL");
  Url url;
  std::string_view rest = text;
  if (auto at = rest.find("://"); at != std::string_view::npos) {
    std::string scheme(rest.substr(0, at));
    std::transform(scheme.begin(), scheme.end(), scheme.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (scheme != "http" && scheme != "https")
      return fail(fmt::format("unsupported scheme '{}' (use http:// or https://)", scheme));
    url.scheme = scheme;
    rest.remove_prefix(at + 3);
  } else {
    url.scheme = "http";
  }
  size_t path_at = rest.find_first_of("/?#");
  std::string_view authority = rest.substr(0, path_at);
  std::string_view path = path_at == std::string_view::npos ? "" : rest.substr(path_at);
  if (authority.find('@') != std::string_view::npos)
    return fail("credentials in the URL are not supported; use --api-key or KVAUDIT_API_KEY");
  std::string_view port_text;
  if (!authority.empty() && authority.front() == '[') {
    size_t close = authority.find(']');
    if (close == std::string_view::npos) return fail("unterminated IPv6 address '['");
    url.host = std::string(authority.substr(1, close - 1));
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return fail("expected ':PORT' after the IPv6 address");
      port_text = after.substr(1);
    }
  } else {
    size_t colon = authority.rfind(':');
    if (colon != std::string_view::npos && authority.find(':') != colon)
      return fail("an IPv6 address must be written in brackets, e.g. http://[::1]:8000");
    url.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) port_text = authority.substr(colon + 1);
  }
  if (url.host.empty()) return fail("no host name");
  for (char c : url.host)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' ||
          c == ':' || c == '%'))
      return fail(fmt::format("invalid character '{}' in the host name", c));
  if (port_text.empty()) {
    url.port = url.scheme == "https" ? 443 : 80;
  } else {
    int port = 0;
    auto [end, error] =
        std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (error != std::errc() || end != port_text.data() + port_text.size() || port < 1 ||
        port > 65535)
      return fail(fmt::format("invalid port '{}' (1-65535)", port_text));
    url.port = port;
  }
  if (path.find_first_of("?#") != std::string_view::npos)
    return fail("a server URL takes no query or fragment");
  std::string base(path);
  while (!base.empty() && base.back() == '/') base.pop_back();
  // Users paste the OpenAI base URL ("http://host:8000/v1"); endpoints add /v1 themselves.
  if (base.size() >= 3 && base.substr(base.size() - 3) == "/v1") base.resize(base.size() - 3);
  url.base_path = base;
  return url;
}

// ---------------------------------------------------------------- errors

RequestError::RequestError(std::string where, std::string problem, FailureKind kind, int status)
    : InputError(std::move(where), std::move(problem)), kind_(kind), status_(status) {}

bool RequestError::server_unavailable() const {
  switch (kind_) {
    case FailureKind::dns:
    case FailureKind::refused:
    case FailureKind::timeout:
    case FailureKind::tls:
      return true;
    case FailureKind::http:
      return status_ == 429 || status_ >= 500;
    default:
      return false;
  }
}

std::string api_key_from_environment() {
  for (const char* name : {"KVAUDIT_API_KEY", "OPENAI_API_KEY"})
    if (const char* value = std::getenv(name); value && *value) return value;
  return "";
}

std::string error_message_of(std::string_view body) {
  auto doc = nlohmann::json::parse(body, nullptr, false);
  if (doc.is_object()) {
    auto it = doc.find("error");
    if (it != doc.end() && it->is_object() && it->contains("message") &&
        (*it)["message"].is_string())
      return (*it)["message"].get<std::string>();
    if (it != doc.end() && it->is_string()) return it->get<std::string>();
    if (doc.contains("message") && doc["message"].is_string())
      return doc["message"].get<std::string>();
    if (doc.contains("detail") && doc["detail"].is_string())
      return doc["detail"].get<std::string>();
  }
  std::string excerpt(body.substr(0, 160));
  for (char& c : excerpt)
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  if (excerpt.empty()) return "(empty body)";
  return body.size() > 160 ? excerpt + "..." : excerpt;
}

std::optional<std::chrono::milliseconds> parse_retry_after(std::string_view value) {
  while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  while (!value.empty() && value.back() == ' ') value.remove_suffix(1);
  if (value.empty()) return std::nullopt;
  int64_t seconds = 0;
  auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), seconds);
  if (error != std::errc() || end != value.data() + value.size() || seconds < 0)
    return std::nullopt;
  return std::chrono::milliseconds(std::min<int64_t>(seconds, 86'400) * 1000);
}

// ---------------------------------------------------------------- client

struct Client::Connection {
  explicit Connection(const std::string& origin) : http(origin) {}
  httplib::Client http;
  bool reused = false;  // taken from the pool: the server may have closed it meanwhile
};

struct Client::State {
  explicit State(int concurrency) : slots(concurrency) {}
  std::counting_semaphore<4096> slots;
  std::atomic<int64_t> requests{0}, attempts{0}, retries{0}, connections{0};
  std::mutex pool_mutex;
  std::vector<std::unique_ptr<Connection>> idle;  // at most max_concurrency
};

Client::Client(Url url, ClientOptions options)
    : url_(std::move(url)), options_(std::move(options)) {
  options_.max_concurrency = std::clamp(options_.max_concurrency, 1, 4096);
  options_.max_retries = std::max(0, options_.max_retries);
  state_ = std::make_unique<State>(options_.max_concurrency);
}

Client::~Client() = default;

ClientStats Client::stats() const {
  return {state_->requests.load(), state_->attempts.load(), state_->retries.load(),
          state_->connections.load()};
}

// An idle connection of the pool, or a new one configured for this server. The socket
// itself opens on first use and stays open (keep-alive) until the server closes it,
// which httplib notices and reconnects.
std::unique_ptr<Client::Connection> Client::take_connection() {
  {
    std::lock_guard lock(state_->pool_mutex);
    if (!state_->idle.empty()) {
      auto connection = std::move(state_->idle.back());
      state_->idle.pop_back();
      connection->reused = true;
      return connection;
    }
  }
  const std::string host_text =
      url_.host.find(':') != std::string::npos ? "[" + url_.host + "]" : url_.host;
  auto connection =
      std::make_unique<Connection>(fmt::format("{}://{}:{}", url_.scheme, host_text, url_.port));
  httplib::Client& http = connection->http;
  http.set_connection_timeout(options_.connect_timeout);
  http.set_read_timeout(options_.read_timeout);
  http.set_write_timeout(options_.connect_timeout + options_.read_timeout);
  http.set_keep_alive(true);
  // Headers and body go out in separate writes; on a reused connection Nagle's algorithm
  // holds the body until the server's delayed ACK (~40 ms a request).
  http.set_tcp_nodelay(true);
  // Bodies are taken as sent: a range answer that is content-encoded must be seen (and
  // refused), not silently inflated into bytes that are not the file's.
  http.set_decompress(false);
  if (!options_.api_key.empty()) http.set_bearer_token_auth(options_.api_key);
  if (url_.scheme == "https") {
    http.enable_server_certificate_verification(options_.verify_tls);
    if (!options_.ca_cert_file.empty()) http.set_ca_cert_path(options_.ca_cert_file);
  }
  state_->connections++;
  return connection;
}

void Client::give_back(std::unique_ptr<Connection> connection) {
  std::lock_guard lock(state_->pool_mutex);
  if (static_cast<int>(state_->idle.size()) < options_.max_concurrency)
    state_->idle.push_back(std::move(connection));
}

std::string Client::where(std::string_view path) const {
  return url_.text() + std::string(path);
}

namespace {

double seconds(std::chrono::milliseconds ms) {
  return static_cast<double>(ms.count()) / 1000.0;
}

bool host_resolves(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &result);
  if (result) freeaddrinfo(result);
  return rc == 0;
}

struct SlotGuard {
  std::counting_semaphore<4096>& slots;
  explicit SlotGuard(std::counting_semaphore<4096>& s) : slots(s) { slots.acquire(); }
  ~SlotGuard() { slots.release(); }
};

// The request as httplib sends it: method, full path, the caller's headers (Accept
// defaults to JSON) and the JSON body when there is one.
void fill_request(httplib::Request& request, const std::string& method, std::string full_path,
                  const std::string* body, const GetRequest* extra) {
  request.method = method;
  request.path = std::move(full_path);
  bool accept_given = false;
  if (extra)
    for (const auto& [name, value] : extra->headers) {
      request.set_header(name, value);
      accept_given |= name == "Accept";
    }
  if (!accept_given) request.set_header("Accept", "application/json");
  if (body) {
    request.body = *body;
    request.set_header("Content-Type", "application/json");
  }
}

// An answer's body as it arrives: a success body is cut at stop_after bytes (when > 0),
// any body beyond max_bytes is refused.
struct BodyReceiver {
  std::string received;
  bool too_large = false, cut = false;
  bool delivered = false;  // a piece went to the caller's on_body_piece
};
void receive_body(httplib::Request& request, const httplib::Response& response, BodyReceiver& body,
                  uint64_t stop_after, uint64_t max_bytes,
                  const std::function<bool(std::string_view)>* on_piece) {
  request.content_receiver = [&response, &body, stop_after, max_bytes, on_piece](
                                 const char* data, size_t length, uint64_t, uint64_t) {
    // Only a success body is cut short or streamed: an error's body is its message.
    const bool success = response.status >= 200 && response.status < 300;
    if (success && on_piece != nullptr && *on_piece) {
      body.delivered = true;
      if (!(*on_piece)(std::string_view(data, length))) {
        body.cut = true;  // the caller has what it needs
        return false;
      }
      return true;
    }
    if (success && stop_after > 0 && body.received.size() + length >= stop_after) {
      body.received.append(data, stop_after - body.received.size());
      body.cut = true;
      return false;  // enough: the rest of the body is not read
    }
    if (body.received.size() + length > max_bytes) {
      body.too_large = true;
      return false;
    }
    body.received.append(data, length);
    return true;
  };
}

// Why an attempt got no complete answer, when a retry may help. Failures no retry fixes
// (DNS, TLS) are thrown as RequestError.
struct AttemptFailure {
  FailureKind kind = FailureKind::refused;
  std::string problem;
};
AttemptFailure attempt_failure(httplib::Error error, std::chrono::milliseconds attempt_ms,
                               const Url& url, const ClientOptions& options,
                               const std::string& where_text) {
  AttemptFailure out;
  switch (error) {
    case httplib::Error::Connection:
      if (!host_resolves(url.host)) {
        throw RequestError(where_text,
                           fmt::format("cannot resolve host '{}' (DNS lookup failed)", url.host),
                           FailureKind::dns);
      }
      out.problem = fmt::format("connection refused: nothing answers at {}:{}", url.host, url.port);
      break;
    case httplib::Error::ConnectionTimeout:
      out.kind = FailureKind::timeout;
      out.problem = fmt::format("could not connect within {:.1f} s (connect timeout)",
                                seconds(options.connect_timeout));
      break;
    case httplib::Error::Read:
      if (attempt_ms + std::chrono::milliseconds(50) >= options.read_timeout) {
        out.kind = FailureKind::timeout;
        out.problem = fmt::format(
            "no answer within {:.1f} s (read timeout; the server stalls or the request is "
            "slower than --timeout)",
            seconds(options.read_timeout));
      } else {
        out.problem = "the server closed the connection before a complete answer";
      }
      break;
    case httplib::Error::Write:
      out.problem = "the server closed the connection while the request was being sent";
      break;
    case httplib::Error::SSLConnection:
    case httplib::Error::SSLLoadingCerts:
    case httplib::Error::SSLServerVerification:
      throw RequestError(
          where_text,
          fmt::format("TLS failure: {} (is it really https? --insecure skips certificate "
                      "checks, --ca-cert adds a CA)",
                      httplib::to_string(error)),
          FailureKind::tls);
    default:
      out.problem = fmt::format("request failed: {}", httplib::to_string(error));
      break;
  }
  return out;
}

// The answer as callers see it: status, the body (what the receiver kept, else httplib's),
// content type, headers by lower-case name, and how many attempts it took.
HttpResponse to_http_response(httplib::Response& response, BodyReceiver& body, int attempt) {
  HttpResponse result;
  result.status = response.status;
  result.body_cut = body.cut;
  result.body = body.received.empty() ? std::move(response.body) : std::move(body.received);
  result.content_type = response.get_header_value("Content-Type");
  for (const auto& [name, value] : response.headers) {
    std::string lower = name;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    result.headers[lower] = value;
  }
  result.attempts = attempt + 1;
  return result;
}

}  // namespace

HttpResponse Client::send(const std::string& method, std::string_view path, const std::string* body,
                          const GetRequest* extra) {
  SlotGuard guard(state_->slots);
  state_->requests++;
  const std::string where_text = where(path);
  auto started = std::chrono::steady_clock::now();
  bool stale_retried = false;
  for (int attempt = 0;; ++attempt) {
    state_->attempts++;
    const bool last = attempt >= options_.max_retries;
    auto backoff = std::min(options_.backoff_initial * (int64_t{1} << std::min(attempt, 20)),
                            options_.backoff_max);
    // A failed attempt drops its connection (the next one starts clean); an answer, even
    // an error status, leaves it reusable.
    std::unique_ptr<Connection> connection = take_connection();
    httplib::Request request;
    fill_request(request, method, url_.base_path + std::string(path), body, extra);
    httplib::Response response;  // filled with the status and headers before the body
    BodyReceiver received;
    receive_body(request, response, received, extra ? extra->stop_after_bytes : 0,
                 options_.max_response_bytes, extra ? &extra->on_body_piece : nullptr);
    httplib::Error error = httplib::Error::Success;
    auto attempt_started = std::chrono::steady_clock::now();
    bool sent = connection->http.send(request, response, error);
    auto attempt_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - attempt_started);
    auto total_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    const std::string tries =
        attempt == 0 ? "" : fmt::format(" (after {} attempts over {:.1f} s)", attempt + 1, total_s);

    // Stopped on purpose (stop_after_bytes): an answer like any other, but its connection
    // has unread bytes and is not reused.
    const bool stopped = received.cut;
    if (stopped) sent = true, error = httplib::Error::Success;
    if (!sent || error != httplib::Error::Success) {
      if (received.too_large)
        throw RequestError(
            where_text,
            fmt::format("answer larger than {} bytes; refused", options_.max_response_bytes),
            FailureKind::too_large);
      // A kept-alive connection the server closed while it sat in the pool fails before any
      // byte of the answer: open a fresh one at once, once, instead of backing off (a
      // load test would otherwise see 0.5 s added to some requests' first token).
      const bool stale = connection->reused && received.received.empty() && !received.delivered &&
                         (error == httplib::Error::Read || error == httplib::Error::Write ||
                          error == httplib::Error::Connection);
      if (stale && !stale_retried) {
        stale_retried = true;
        --attempt;
        continue;
      }
      const AttemptFailure failure = attempt_failure(error, attempt_ms, url_, options_, where_text);
      // Part of a streamed body reached the caller: a retry would deliver it twice.
      if (last || received.delivered)
        throw RequestError(where_text, failure.problem + tries, failure.kind);
      state_->retries++;
      std::this_thread::sleep_for(backoff);
      continue;
    }

    if (!stopped) give_back(std::move(connection));
    HttpResponse result = to_http_response(response, received, attempt);
    const bool retryable = result.status == 429 || result.status >= 500;
    if (!retryable) return result;
    if (last)
      throw RequestError(
          where_text,
          fmt::format("HTTP {}: {}{}", result.status, error_message_of(result.body), tries),
          FailureKind::http, result.status);
    state_->retries++;
    auto delay = backoff;
    if (auto after = parse_retry_after(response.get_header_value("Retry-After")))
      delay = std::min(*after, options_.backoff_max);
    std::this_thread::sleep_for(delay);
  }
}

HttpResponse Client::get(std::string_view path) {
  return send("GET", path, nullptr);
}

HttpResponse Client::get(const GetRequest& request) {
  return send("GET", request.path, nullptr, &request);
}

HttpResponse Client::post_stream(std::string_view path, const nlohmann::json& body,
                                 const std::function<bool(std::string_view)>& on_piece,
                                 std::string_view accept) {
  GetRequest extra;
  extra.headers = {{"Accept", std::string(accept)}};
  extra.on_body_piece = on_piece;
  const std::string text = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return send("POST", path, &text, &extra);
}

HttpResponse Client::post_json(std::string_view path, const nlohmann::json& body) {
  const std::string text = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return send("POST", path, &text);
}

namespace {

nlohmann::json checked_json(const HttpResponse& response, const std::string& where) {
  if (response.status < 200 || response.status >= 300)
    throw RequestError(where,
                       fmt::format("HTTP {}: {}", response.status, error_message_of(response.body)),
                       FailureKind::http, response.status);
  auto doc = nlohmann::json::parse(response.body, nullptr, false);
  if (doc.is_discarded()) {
    std::string excerpt = response.body.substr(0, 80);
    for (char& c : excerpt)
      if (static_cast<unsigned char>(c) < 0x20) c = ' ';
    throw RequestError(where,
                       fmt::format("malformed answer: not JSON ({} bytes, starts '{}')",
                                   response.body.size(), excerpt),
                       FailureKind::malformed);
  }
  return doc;
}

}  // namespace

nlohmann::json Client::get_json(std::string_view path) {
  return checked_json(get(path), where(path));
}

nlohmann::json Client::post_json_checked(std::string_view path, const nlohmann::json& body) {
  return checked_json(post_json(path, body), where(path));
}

}  // namespace kvaudit::net
