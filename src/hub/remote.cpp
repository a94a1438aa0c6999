// hub remote: GETs with the hub's redirect rules and token policy, the hub's refusals as
// one-line errors, and one repository read at a pinned commit: small files, byte ranges and
// the file listing (remote.h).
#include "hub/remote.h"

#include <fmt/format.h>

#include <algorithm>

#include "util/util.h"

namespace kvaudit::hub {

namespace {

std::string origin_of(const net::Url& url) {
  const std::string host =
      url.host.find(':') != std::string::npos ? "[" + url.host + "]" : url.host;
  return fmt::format("{}://{}:{}", url.scheme, host, url.port);
}

}  // namespace

// ---------------------------------------------------------------- the fetcher

Fetcher::Fetcher(const HubOptions& options, const std::string& endpoint, std::string token,
                 std::string repo)
    : options_(options),
      endpoint_(net::parse_url(endpoint)),
      token_(std::move(token)),
      user_agent_(fmt::format("kvaudit/1; model_id={}", repo)) {}

Fetcher::Answer Fetcher::get(const std::string& path, const Ask& ask) {
  return get_from(origin_of(endpoint_), endpoint_.base_path + path, ask);
}

Fetcher::Answer Fetcher::get_url(const std::string& url, const Ask& ask) {
  const size_t path_at = url.find('/', url.find("://") + 3);
  if (path_at == std::string::npos) return get_from(origin_of(net::parse_url(url)), "/", ask);
  return get_from(origin_of(net::parse_url(url.substr(0, path_at))), url.substr(path_at), ask);
}

Fetcher::Answer Fetcher::get_from(std::string origin, std::string request_path, const Ask& ask) {
  Answer answer;
  for (int hop = 0;; ++hop) {
    net::GetRequest request;
    request.path = request_path;
    request.headers = {{"User-Agent", user_agent_},
                       {"Accept", ask.json ? "application/json" : "*/*"},
                       {"Accept-Encoding", "identity"}};
    if (ask.range) {
      request.headers.emplace_back("Range",
                                   fmt::format("bytes={}-{}", ask.range->first, ask.range->last));
      // A server that ignores Range sends the whole file: stop once the bytes are in.
      request.stop_after_bytes = ask.range->last + 1;
    } else {
      request.stop_after_bytes = ask.max_body_bytes;
    }
    answer.url = origin + request_path;
    answer.response = client(origin).get(request);
    requests_++;
    bytes_ += answer.response.body.size();
    if (std::string commit = answer.response.header("x-repo-commit"); !commit.empty())
      answer.commit = commit;
    const int status = answer.response.status;
    if (!ask.follow || status < 300 || status >= 400 || status == 304) return answer;
    const std::string location = answer.response.header("location");
    if (location.empty())
      throw InputError(answer.url, fmt::format("HTTP {} without a Location", status));
    if (hop + 1 >= options_.max_redirects)
      throw InputError(answer.url, fmt::format("more than {} redirects (a redirect loop?)",
                                               options_.max_redirects));
    if (location.find("://") != std::string::npos) {  // absolute: maybe another host
      size_t path_at = location.find('/', location.find("://") + 3);
      std::string target_origin =
          path_at == std::string::npos ? location : location.substr(0, path_at);
      origin = origin_of(net::parse_url(target_origin));
      request_path = path_at == std::string::npos ? "/" : location.substr(path_at);
    } else if (!location.empty() && location[0] == '/') {  // host-relative
      request_path = location;
    } else {  // relative to the current path's folder
      std::string base = request_path.substr(0, request_path.find('?'));
      request_path = base.substr(0, base.rfind('/') + 1) + location;
    }
  }
}

net::Client& Fetcher::client(const std::string& origin) {
  std::lock_guard lock(mutex_);
  auto it = clients_.find(origin);
  if (it != clients_.end()) return *it->second;
  net::ClientOptions options = options_.client;
  options.max_concurrency = std::max(1, options_.concurrency);
  // The token goes to the endpoint's own origin only: never to a CDN or another host a
  // mirror redirects to.
  options.api_key = origin == origin_of(endpoint_) ? token_ : "";
  auto made = std::make_unique<net::Client>(net::parse_url(origin), options);
  net::Client& out = *made;
  clients_.emplace(origin, std::move(made));
  return out;
}

[[noreturn]] void hub_refusal(const Fetcher::Answer& answer, const HubRef& ref,
                              const std::string& endpoint, bool has_token) {
  const int status = answer.response.status;
  const std::string code = answer.response.header("x-error-code");
  const std::string message = net::error_message_of(answer.response.body);
  if (status == 401 || status == 403) {
    if (code == "GatedRepo" || message.find("gated") != std::string::npos || has_token)
      throw InputError(answer.url,
                       fmt::format("HTTP {}: {} is gated or you lack access ({}): accept its terms "
                                   "at {}/{} and pass --hf-token or set HF_TOKEN",
                                   status, ref.repo, message, endpoint, ref.repo));
    throw InputError(answer.url,
                     fmt::format("HTTP {}: {} is private or gated ({}): pass --hf-token or set "
                                 "HF_TOKEN",
                                 status, ref.repo, message));
  }
  if (status == 404 && code == "RevisionNotFound")
    throw InputError(answer.url, fmt::format("no revision '{}' in {}", ref.revision, ref.repo));
  if (status == 404 && (code == "RepoNotFound" || code.empty()))
    throw InputError(answer.url,
                     fmt::format("no repository {} on {} (or it is private: pass --hf-token)",
                                 ref.repo, endpoint));
  throw InputError(answer.url, fmt::format("HTTP {}: {}", status, message));
}

// ---------------------------------------------------------------- one repository

std::string Remote::path(const std::string& file) const {
  return fmt::format("/{}/resolve/{}/{}", ref.repo, commit, file);
}

std::string Remote::label(const std::string& file) const {
  return fmt::format("hf://{}@{}/{}", ref.repo, commit.substr(0, 12), file);
}

std::optional<std::string> Remote::file(const std::string& name, uint64_t max_bytes,
                                        bool optional) const {
  Fetcher::Answer answer = fetcher.get(path(name), {.range = ByteRange{0, max_bytes}});
  const int status = answer.response.status;
  if (status == 404 && (optional || answer.response.header("x-error-code") == "EntryNotFound")) {
    if (optional && answer.response.header("x-error-code") != "RepoNotFound") return std::nullopt;
    throw InputError(answer.url, fmt::format("{} has no {} at {}", ref.repo, name, commit));
  }
  if (status != 200 && status != 206) hub_refusal(answer, ref, endpoint, has_token);
  RangeAnswer bytes = check_range_answer(answer.response, ByteRange{0, max_bytes}, answer.url);
  if (bytes.total > max_bytes)
    throw InputError(answer.url, fmt::format("{} bytes, more than the {} kvaudit reads for {}",
                                             bytes.total, max_bytes, name));
  return bytes.bytes;
}

RangeAnswer Remote::range(const std::string& name, ByteRange wanted) const {
  std::string known;
  {
    std::lock_guard lock(mutex);
    if (auto it = final_urls.find(name); it != final_urls.end()) known = it->second;
  }
  if (!known.empty()) {
    Fetcher::Answer answer = fetcher.get_url(known, {.range = wanted});
    if (answer.response.status == 200 || answer.response.status == 206)
      return check_range_answer(answer.response, wanted, answer.url);
    // An expired or refused signed URL: ask the hub again.
  }
  Fetcher::Answer answer = fetcher.get(path(name), {.range = wanted});
  // A file the listing or the index names that the hub does not have.
  if (answer.response.status == 404 && answer.response.header("x-error-code") == "EntryNotFound")
    throw InputError(answer.url, fmt::format("{} has no {} at {}", ref.repo, name, commit));
  if (answer.response.status != 200 && answer.response.status != 206)
    hub_refusal(answer, ref, endpoint, has_token);
  RangeAnswer out = check_range_answer(answer.response, wanted, answer.url);
  std::lock_guard lock(mutex);
  final_urls[name] = answer.url;
  return out;
}

std::optional<Listing> Remote::listing(const ListingLimits& limits, std::string& why_not) const {
  // The top level only (no ?recursive=true): the local reader reads the checkpoint folder's
  // own files, and a recursive listing of a repository with folders is more pages for nothing.
  const Fetcher::Ask ask{
      .range = std::nullopt, .max_body_bytes = limits.max_page_bytes + 1, .json = true};
  Fetcher::Answer answer =
      fetcher.get(fmt::format("/api/models/{}/tree/{}", ref.repo, commit), ask);
  Listing out;
  out.url = answer.url;
  size_t entries_seen = 0;
  std::vector<std::string> asked = {answer.url};
  for (;;) {
    const auto& body = answer.response.body;
    const size_t first = body.find_first_not_of(" \t\r\n");
    if (answer.response.status != 200 || first == std::string::npos || body[first] != '[') {
      // Not a listing at all: some mirrors serve /resolve/ but not /api/.
      why_not = answer.response.status != 200
                    ? fmt::format("{} answered HTTP {}", answer.url, answer.response.status)
                    : fmt::format("{} answered with something other than a JSON array", answer.url);
      return std::nullopt;
    }
    if (answer.response.body_cut)
      throw InputError(answer.url, fmt::format("a file listing page of more than {} bytes",
                                               limits.max_page_bytes));
    parse_listing_page(body, answer.url, limits, entries_seen, out.files);
    ++out.pages;
    auto next = listing_next_page(answer.response.header("link"), out.url, answer.url);
    if (!next) return out;
    if (out.pages >= limits.max_pages)
      throw InputError(answer.url,
                       fmt::format("the file listing runs past {} pages", limits.max_pages));
    if (std::find(asked.begin(), asked.end(), *next) != asked.end())
      throw InputError(answer.url, fmt::format("the file listing's next page {} was already "
                                               "read (a loop)",
                                               *next));
    asked.push_back(*next);
    answer = fetcher.get_url(*next, ask);
  }
}

}  // namespace kvaudit::hub
