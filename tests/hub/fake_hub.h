// A fake Hugging Face hub on loopback with the hub's URL shapes and behaviours: the
// resolve/REV/PATH route answering X-Repo-Commit, a relative 307 to /api/resolve-cache/...
// for small files, a 302 to a separate CDN origin for LFS files (.safetensors), 206 range
// answers read from a local folder (sparse shards included), X-Error-Code on 404s, a gated
// mode (401 without the right token) and a rate-limit mode (429 with Retry-After first). The
// file listing /api/models/ORG/NAME/tree/REV lists the folder's top level as the hub does
// (folders first, LFS entries for .safetensors), in pages linked by `Link: <...>; rel="next"`,
// and can be refused or made to lie. The hub logs every request; the CDN records every
// Authorization header it receives. Both run on RawServer (raw bytes on a
// socket): httplib's server rewrites Content-Range to its own reading of the request, and
// the faults (a reset mid-header, Range ignored, short bodies) need the bytes as written.
#pragma once

#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace kvaudit::hub::testing {

inline const std::string kCommit = "0123456789abcdef0123456789abcdef01234567";

struct FakeHubConfig {
  std::map<std::string, std::filesystem::path> repos;  // "org/model" -> local folder
  std::string commit = kCommit;
  std::string token;         // non-empty: the repository is gated behind this token
  int rate_limit_first = 0;  // the first N requests answer 429 (Retry-After: 0)
  bool redirect_loop = false;
  bool gzip_ranges = false;             // range answers carry Content-Encoding: gzip
  bool wrong_content_range = false;     // Content-Range names other bytes than asked
  uint64_t header_length_override = 0;  // non-zero: shards start with this length prefix
  // The file listing: entries per page (0: all on one), an answer other than the listing
  // (a status other than 200, or this body for every page), sizes that lie by a delta, and
  // entries added as they are (JSON objects: a shard the server does not have, padding).
  size_t listing_page_entries = 0;
  int listing_status = 200;
  std::string listing_body;
  int64_t listing_size_delta = 0;
  std::vector<std::string> listing_extra;
};

// One parsed request, as RawServer hands it over.
struct HttpRequest {
  std::string method, path, query;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? "" : it->second;
  }
};

inline HttpRequest parse_request(const std::string& raw) {
  HttpRequest r;
  size_t line_end = raw.find("\r\n");
  std::string line = raw.substr(0, line_end);
  size_t a = line.find(' '), b = line.rfind(' ');
  r.method = line.substr(0, a);
  std::string target = line.substr(a + 1, b - a - 1);
  size_t q = target.find('?');
  r.path = target.substr(0, q);
  if (q != std::string::npos) r.query = target.substr(q + 1);
  size_t pos = line_end + 2;
  while (pos < raw.size()) {
    size_t end = raw.find("\r\n", pos);
    if (end == std::string::npos || end == pos) break;
    std::string header = raw.substr(pos, end - pos);
    size_t colon = header.find(':');
    if (colon != std::string::npos) {
      std::string name = header.substr(0, colon);
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      size_t v = colon + 1;
      while (v < header.size() && header[v] == ' ') ++v;
      r.headers[name] = header.substr(v);
    }
    pos = end + 2;
  }
  return r;
}

inline std::string http_answer(int status,
                               const std::vector<std::pair<std::string, std::string>>& headers,
                               const std::string& body) {
  std::string out = "HTTP/1.1 " + std::to_string(status) + " X\r\n";
  for (const auto& [name, value] : headers) out += name + ": " + value + "\r\n";
  out += "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
  return out + body;
}

// A loopback server that answers each request with bytes the test writes (and may close
// the connection after `cut_after` of them: a reset mid-answer).
class RawServer {
 public:
  struct Reply {
    std::string bytes;
    size_t cut_after = std::string::npos;
  };
  explicit RawServer(std::function<Reply(const std::string& request)> handler)
      : handler_(std::move(handler)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    socklen_t length = sizeof(address);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    ::listen(fd_, 16);
    thread_ = std::thread([this] { loop(); });
  }
  ~RawServer() {
    stopping_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int requests() const { return requests_; }

 private:
  void loop() {
    while (!stopping_) {
      int client = ::accept(fd_, nullptr, nullptr);
      if (client < 0) return;
      std::string request;
      char buffer[4096];
      while (request.find("\r\n\r\n") == std::string::npos) {
        ssize_t n = ::recv(client, buffer, sizeof(buffer), 0);
        if (n <= 0) break;
        request.append(buffer, static_cast<size_t>(n));
      }
      ++requests_;
      Reply reply = handler_(request);
      const size_t n = std::min(reply.cut_after, reply.bytes.size());
      ::send(client, reply.bytes.data(), n, MSG_NOSIGNAL);
      if (reply.cut_after != std::string::npos) {
        linger off{1, 0};  // an RST, as a reset connection looks
        ::setsockopt(client, SOL_SOCKET, SO_LINGER, &off, sizeof(off));
      }
      ::close(client);
    }
  }
  std::function<Reply(const std::string&)> handler_;
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> requests_{0};
};

// The hub and its CDN: two RawServers (two origins), each answering what the real ones do.
class FakeHub {
 public:
  explicit FakeHub(FakeHubConfig config)
      : config_(std::move(config)),
        cdn_([this](const std::string& raw) { return cdn(parse_request(raw)); }),
        hub_([this](const std::string& raw) { return hub(parse_request(raw)); }) {}
  std::string endpoint() const { return hub_.endpoint(); }
  int hub_requests() const { return hub_.requests(); }
  int cdn_requests() const { return cdn_.requests(); }
  std::vector<std::string> cdn_authorization() const {
    std::lock_guard lock(mutex_);
    return cdn_authorization_;
  }
  // Every request the hub got, as "PATH" or "PATH?QUERY", in order.
  std::vector<std::string> hub_log() const {
    std::lock_guard lock(mutex_);
    return hub_log_;
  }
  // How many requests asked for paths ending in `suffix`.
  int requested(const std::string& suffix) const {
    int n = 0;
    for (const auto& entry : hub_log())
      if (entry.substr(0, entry.find('?')).ends_with(suffix)) ++n;
    return n;
  }

 private:
  using Reply = RawServer::Reply;

  Reply hub(const HttpRequest& req) {
    int n = ++resolve_requests_;
    {
      std::lock_guard lock(mutex_);
      hub_log_.push_back(req.query.empty() ? req.path : req.path + "?" + req.query);
    }
    static const std::regex resolve(R"(/([^/]+)/([^/]+)/resolve/([^/]+)/(.+))");
    static const std::regex cache(R"(/api/resolve-cache/models/([^/]+)/([^/]+)/([0-9a-f]+)/(.+))");
    static const std::regex tree(R"(/api/models/([^/]+)/([^/]+)/tree/([^/]+))");
    std::smatch m;
    if (std::regex_match(req.path, m, cache))
      return {serve_file(config_.repos.at(m[1].str() + "/" + m[2].str()) / m[4].str(), req)};
    const bool listing = std::regex_match(req.path, m, tree);
    if (!listing && !std::regex_match(req.path, m, resolve)) return {http_answer(404, {}, "")};
    if (n <= config_.rate_limit_first)
      return {http_answer(429, {{"Retry-After", "0"}}, R"({"error":"rate limit"})")};
    const std::string repo = m[1].str() + "/" + m[2].str();
    const std::string revision = m[3].str();
    const std::string path = m[4].str();
    if (!config_.token.empty() && req.header("authorization") != "Bearer " + config_.token)
      return {http_answer(401, {{"X-Error-Code", "GatedRepo"}},
                          R"({"error":"Access to model )" + repo + R"( is restricted."})")};
    auto it = config_.repos.find(repo);
    if (it == config_.repos.end())
      return {http_answer(404, {{"X-Error-Code", "RepoNotFound"}},
                          R"({"error":"Repository not found"})")};
    if (revision != "main" && revision != config_.commit)
      return {http_answer(404, {{"X-Error-Code", "RevisionNotFound"}},
                          R"({"error":"Invalid rev id"})")};
    if (listing) return {list_files(req, repo, revision, it->second)};
    const std::pair<std::string, std::string> commit{"X-Repo-Commit", config_.commit};
    std::error_code ec;
    if (!std::filesystem::exists(it->second / path, ec))
      return {http_answer(404, {commit, {"X-Error-Code", "EntryNotFound"}},
                          R"({"error":"Entry not found"})")};
    if (config_.redirect_loop) return {http_answer(307, {commit, {"Location", req.path}}, "")};
    if (path.ends_with(".safetensors"))  // LFS: an absolute redirect to the CDN host
      return {http_answer(
          302,
          {commit,
           {"Location", cdn_.endpoint() + "/xet-bridge-us/" + repo + "/" + config_.commit + "/" +
                            path + "?X-Amz-Expires=3600&X-Amz-Signature=abc"}},
          "")};
    return {http_answer(307,  // a small file: a relative redirect
                        {commit,
                         {"Location", "/api/resolve-cache/models/" + repo + "/" + config_.commit +
                                          "/" + path + "?etag=%22x%22"}},
                        "")};
  }

  Reply cdn(const HttpRequest& req) {
    {
      std::lock_guard lock(mutex_);
      cdn_authorization_.push_back(req.header("authorization"));
    }
    static const std::regex route(R"(/xet-bridge-us/([^/]+)/([^/]+)/([0-9a-f]+)/(.+))");
    std::smatch m;
    if (!std::regex_match(req.path, m, route)) return {http_answer(404, {}, "")};
    if (req.query.find("X-Amz-Expires=3600") == std::string::npos)
      return {http_answer(403, {}, "")};  // the signed URL was mangled on the way
    return {serve_file(config_.repos.at(m[1].str() + "/" + m[2].str()) / m[4].str(), req)};
  }

  // The folder's top level as the hub lists it: folders, then files by name; .safetensors
  // files as LFS entries. Pages of listing_page_entries, `?cursor=N` starting at entry N.
  std::string list_files(const HttpRequest& req, const std::string& repo,
                         const std::string& revision, const std::filesystem::path& folder) {
    if (config_.listing_status != 200)
      return http_answer(config_.listing_status, {}, R"({"error":"Not Found"})");
    if (!config_.listing_body.empty())
      return http_answer(200, {{"Content-Type", "text/html"}}, config_.listing_body);
    std::set<std::string> folders, files;
    for (const auto& entry : std::filesystem::directory_iterator(folder))
      (entry.is_directory() ? folders : files).insert(entry.path().filename().string());
    std::vector<std::string> entries;
    const std::string oid = "8ea6b5b5c49a1e6e9b9c16e2b7b1d4f0f3c7c2e1";
    for (const auto& name : folders)
      entries.push_back(R"({"type":"directory","oid":")" + oid + R"(","size":0,"path":")" + name +
                        R"("})");
    for (const auto& name : files) {
      if (name.starts_with(".")) continue;  // the fixtures' own stamps
      const int64_t listed = static_cast<int64_t>(std::filesystem::file_size(folder / name)) +
                             (name.ends_with(".safetensors") ? config_.listing_size_delta : 0);
      std::string entry =
          R"({"type":"file","oid":")" + oid + R"(","size":)" + std::to_string(listed);
      if (name.ends_with(".safetensors"))
        entry += R"(,"lfs":{"oid":")" + std::string(64, 'a') + R"(","size":)" +
                 std::to_string(listed) + R"(,"pointerSize":135})";
      entries.push_back(entry + R"(,"path":")" + name + R"("})");
    }
    for (const auto& extra : config_.listing_extra) entries.push_back(extra);
    size_t first = 0;
    if (req.query.starts_with("cursor=")) first = std::stoul(req.query.substr(7));
    const size_t per_page =
        config_.listing_page_entries ? config_.listing_page_entries : entries.size() + 1;
    const size_t end = std::min(entries.size(), first + per_page);
    std::string body = "[";
    for (size_t i = first; i < end; ++i) body += (i > first ? "," : "") + entries[i];
    body += "]";
    std::vector<std::pair<std::string, std::string>> headers = {
        {"Content-Type", "application/json; charset=utf-8"}};
    if (end < entries.size())
      headers.push_back({"Link", "<" + hub_.endpoint() + "/api/models/" + repo + "/tree/" +
                                     revision + "?cursor=" + std::to_string(end) +
                                     ">; rel=\"next\""});
    return http_answer(200, headers, body);
  }

  std::string serve_file(const std::filesystem::path& file, const HttpRequest& req) {
    std::error_code ec;
    const uint64_t total = std::filesystem::file_size(file, ec);
    if (ec) return http_answer(404, {}, "");
    static const std::regex range("bytes=([0-9]+)-([0-9]+)");
    std::smatch m;
    const std::string header = req.header("range");
    if (!std::regex_match(header, m, range))
      return http_answer(416, {}, "");  // the fake never sends a whole sparse shard
    const uint64_t first = std::stoull(m[1].str());
    const uint64_t last = std::min<uint64_t>(std::stoull(m[2].str()), total - 1);
    if (first >= total)
      return http_answer(416, {{"Content-Range", "bytes */" + std::to_string(total)}}, "");
    std::string bytes(last - first + 1, '\0');
    int fd = ::open(file.c_str(), O_RDONLY);
    ssize_t got = ::pread(fd, bytes.data(), bytes.size(), static_cast<off_t>(first));
    ::close(fd);
    bytes.resize(got < 0 ? 0 : static_cast<size_t>(got));
    if (config_.header_length_override && file.extension() == ".safetensors")
      for (size_t i = 0; i < bytes.size() && first + i < 8; ++i)  // a lying length prefix
        bytes[i] = static_cast<char>((config_.header_length_override >> (8 * (first + i))) & 0xff);
    std::vector<std::pair<std::string, std::string>> headers = {
        {"Content-Range", "bytes " +
                              std::to_string(config_.wrong_content_range ? first + 1 : first) +
                              "-" + std::to_string(last) + "/" + std::to_string(total)}};
    if (config_.gzip_ranges) headers.push_back({"Content-Encoding", "gzip"});
    return http_answer(206, headers, bytes);
  }

  FakeHubConfig config_;
  std::atomic<int> resolve_requests_{0};
  mutable std::mutex mutex_;
  std::vector<std::string> cdn_authorization_;
  std::vector<std::string> hub_log_;
  RawServer cdn_;
  RawServer hub_;
};

}  // namespace kvaudit::hub::testing
