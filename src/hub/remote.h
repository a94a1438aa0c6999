// hub remote: the HTTP side of a hub fetch, private to src/hub/. Fetcher makes GETs with the
// hub's redirect rules; Remote reads one repository at one pinned commit (whole small files,
// byte ranges, the file listing) and turns refusals into one-line errors that say what to do.
// What to do with the bytes (sparse stand-ins, the cache) is fetch.cpp's.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "hub/hub.h"

namespace kvaudit::hub {

// GETs with the hub's redirect rules: relative and absolute Locations, a bounded count, and
// Authorization only to the endpoint's own origin (a CDN URL carries its own signature).
class Fetcher {
 public:
  Fetcher(const HubOptions& options, const std::string& endpoint, std::string token,
          std::string repo);

  struct Answer {
    net::HttpResponse response;
    std::string url;     // the last URL asked
    std::string commit;  // X-Repo-Commit, from any answer of the chain
  };
  // What one GET asks for besides its URL.
  struct Ask {
    std::optional<ByteRange> range;
    uint64_t max_body_bytes = 0;  // without a range: stop reading after this many (0: no cap)
    bool json = false;            // Accept: application/json (the /api/ routes)
    bool follow = true;           // follow redirects
  };

  // `path` is below the endpoint ("/org/model/resolve/sha/config.json").
  Answer get(const std::string& path, const Ask& ask);
  // An absolute URL an earlier answer gave (a signed CDN URL reused for a file's further
  // ranges, a listing's next page).
  Answer get_url(const std::string& url, const Ask& ask);

  int64_t requests() const { return requests_; }
  uint64_t bytes() const { return bytes_; }

 private:
  Answer get_from(std::string origin, std::string request_path, const Ask& ask);
  net::Client& client(const std::string& origin);

  const HubOptions& options_;
  net::Url endpoint_;
  std::string token_;
  std::string user_agent_;
  std::mutex mutex_;
  std::map<std::string, std::unique_ptr<net::Client>> clients_;
  std::atomic<int64_t> requests_{0};
  std::atomic<uint64_t> bytes_{0};
};

// What a refused answer means on the hub, as one line that says what to do.
[[noreturn]] void hub_refusal(const Fetcher::Answer& answer, const HubRef& ref,
                              const std::string& endpoint, bool has_token);

// The hub's file listing of a commit's top level, every page of it.
struct Listing {
  std::vector<ListedFile> files;
  std::string url;  // the first page's
  int pages = 0;
};

// One repository at one commit.
struct Remote {
  Fetcher& fetcher;
  const HubRef& ref;
  const std::string& endpoint;
  bool has_token;
  std::string commit;

  std::string path(const std::string& file) const;   // "/org/model/resolve/SHA/FILE"
  std::string label(const std::string& file) const;  // "hf://org/model@SHA12/FILE"
  // A whole small file, or nullopt when `optional` and the hub says it does not exist.
  std::optional<std::string> file(const std::string& name, uint64_t max_bytes, bool optional) const;
  // Bytes of a file, checked against what was asked (check_range_answer).
  RangeAnswer range(const std::string& name, ByteRange wanted) const;
  // The top-level files the hub lists at the commit, or nullopt with `why_not` when the
  // listing cannot be had (an answer other than 200, or one that is not a JSON array: a
  // mirror that does not serve /api/). A listing that answers and is malformed, lies about
  // its next page or runs past `limits` is an InputError.
  std::optional<Listing> listing(const ListingLimits& limits, std::string& why_not) const;

  mutable std::mutex mutex;
  mutable std::map<std::string, std::string> final_urls;  // file -> the URL that answered
};

}  // namespace kvaudit::hub
