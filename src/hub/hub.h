// hub: a checkpoint on the Hugging Face hub (or a mirror, HF_ENDPOINT) read without its
// weights. What check and plan read locally (config.json, hf_quant_config.json, each
// shard's 8-byte length and header, and the bytes of every KV-scale tensor) is fetched with
// HTTP range requests at one pinned commit and laid out in a cache folder as sparse
// stand-ins: each shard file has its real size, its real header, its real scale bytes and
// holes for the weights. The shards are the ones the hub's file listing shows (their sizes
// checked against the files); the safetensors index, which only repeats the tensor-to-shard
// map the headers hold (tens of MB for a large model), is read only where the listing
// cannot be had (a mirror without /api/). checkpoint::read_checkpoint then reads that folder
// exactly as it reads a download, so a remote audit and a local one cannot disagree. A
// second audit of the same commit fetches nothing; the user's Hugging Face cache is used
// directly when it holds the files. Hub conventions (token sources, Authorization only to
// the endpoint's host, redirects, X-Repo-Commit, X-Error-Code, Retry-After) follow
// huggingface_hub's (docs/source/en/guides/manage-cache.md, huggingface_hub#4739 on
// redirects) and huggingface.js (file-download-info.ts); the cache layout is
// https://huggingface.co/docs/hub/local-cache.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "net/net.h"

namespace kvaudit::hub {

// "org/model", "org/model@revision", "hf://org/model[@revision]".
struct HubRef {
  std::string repo;          // "nvidia/Qwen3.5-397B-A17B-NVFP4"
  std::string revision;      // "main", a branch, a tag, "refs/pr/4" or a commit sha
  std::string text() const;  // "org/model@revision"
};
// nullopt for anything that is not a hub reference (a path with more parts, bad names).
std::optional<HubRef> parse_hub_ref(std::string_view text);

struct HubOptions {
  std::string endpoint;  // "": $HF_ENDPOINT, else https://huggingface.co
  std::string token;     // "": $HF_TOKEN, $HF_TOKEN_PATH, $HF_HOME/token (~/.cache/huggingface)
  std::filesystem::path cache_dir;  // "": $KVAUDIT_CACHE_DIR, $XDG_CACHE_HOME/kvaudit/hub, ~/.cache
  std::filesystem::path hf_cache;   // "": $HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/huggingface/hub
  bool offline = false;             // only the caches; no request at all
  int concurrency = 8;              // shards fetched at once
  net::ClientOptions client;        // timeouts, retries (429/5xx honour Retry-After)
  // Limits on what a remote file may claim, as for local files.
  uint64_t max_small_file_bytes = 16u << 20;  // config.json, hf_quant_config.json
  uint64_t max_index_bytes = 256u << 20;      // a 500K-tensor index is ~60 MB
  uint64_t max_shards = 100'000;
  size_t max_listing_entries = 100'000;  // files and folders the hub's file listing may name
  int max_redirects = 10;
  // Called as shards finish (from worker threads, serialised): done, total.
  std::function<void(int64_t done, int64_t total)> on_progress;
};

// What a remote audit cost.
struct FetchStats {
  int64_t requests = 0;            // HTTP requests, redirects included
  uint64_t bytes = 0;              // body bytes received
  int64_t files_fetched = 0;       // files read from the hub this run
  uint64_t weight_bytes_read = 0;  // bytes of tensor data other than KV scales (should be 0)
};

struct HubCheckpoint {
  std::filesystem::path dir;  // the folder to read (kvaudit's cache, or the HF cache snapshot)
  HubRef ref;
  std::string commit;    // the 40-hex sha the revision resolved to
  std::string endpoint;  // the hub or mirror read
  std::string source;    // one line for the report: what was read, from where
  std::string label;     // "hf://org/model@sha": the name findings use for files
  FetchStats stats;
  std::vector<std::string> notes;
};

// Resolves `ref` to its commit and returns a folder holding what an audit reads, fetching
// only what the caches lack. Throws InputError naming the URL and the problem (gated or
// private repository, no such repository or revision, a lying or broken server).
HubCheckpoint open_hub_checkpoint(const HubRef& ref, const HubOptions& options);

// Reads the checkpoint `hub` points at and names its files hf://org/model@sha/... and
// records where it came from (ModelFacts.source, notes) so reports say what was audited.
checkpoint::ModelFacts read_hub_checkpoint(const HubCheckpoint& hub,
                                           const checkpoint::ReadOptions& options = {});

// The endpoint and token as HubOptions would resolve them (flag, then environment).
std::string resolve_endpoint(const std::string& flag);
std::string resolve_token(const std::string& flag);

// ---------------------------------------------------------------- answers (pure; fuzzed)

struct ByteRange {
  uint64_t first = 0;
  uint64_t last = 0;  // inclusive
  uint64_t size() const { return last - first + 1; }
};

struct RangeAnswer {
  std::string bytes;   // exactly the bytes asked for (fewer only at the end of the file)
  uint64_t total = 0;  // the file's size
};

// Checks an answer to "Range: bytes=first-last": a 206 whose Content-Range matches what was
// asked and whose body has that many bytes, or a 200 that ignored Range (its first bytes are
// kept, its size is Content-Length). Refuses content-encoded ranges, sizes past `max_total`
// and mismatches: InputError(where, problem).
RangeAnswer check_range_answer(const net::HttpResponse& response, ByteRange wanted,
                               const std::string& where, uint64_t max_total = uint64_t{1} << 50);

// The header length a shard's first 8 bytes give, checked against the format's 100 MB cap
// and the file's size.
uint64_t safetensors_header_length(std::string_view first8, uint64_t file_bytes,
                                   const std::string& where);

// A lower bound of a shard's 8 + header length from the tensor names the index gives it,
// so the first range read stops inside the header (never a weight byte).
uint64_t header_lower_bound(const std::vector<std::string_view>& tensor_names);

// The hub's file listing, GET {ENDPOINT}/api/models/{repo}/tree/{sha}: a JSON array of
// {"type":"file"|"directory","oid":...,"size":N,"path":...} per page, LFS files with
// "lfs":{"oid":...,"size":N,"pointerSize":...}; further pages are named by a
// `Link: <URL>; rel="next"` header (huggingface_hub utils/_pagination.py, huggingface.js
// list-files.ts; huggingface_hub#3329: "results are indeed paginated").
struct ListedFile {
  std::string path;    // "model-00001-of-00032.safetensors", "original/params.json"
  uint64_t bytes = 0;  // the file's size: lfs.size for an LFS file, else size
};
struct ListingLimits {
  size_t max_entries = 100'000;         // files and folders over all pages
  uint64_t max_page_bytes = 16u << 20;  // one page's body
  int max_pages = 200;
};
// Appends the files of one page to `files` (folders are counted, not kept); `entries_seen`
// counts entries over the pages read so far. Refuses a page that is not a JSON array of
// such entries, or past the limits: InputError(where, problem).
void parse_listing_page(std::string_view body, const std::string& where,
                        const ListingLimits& limits, size_t& entries_seen,
                        std::vector<ListedFile>& files);
// The next page's URL from a Link header (absolute, or host-relative to `listing_url`'s
// origin), nullopt when there is none. A next page of another listing (another origin,
// repository or commit) is refused: InputError(where, problem).
std::optional<std::string> listing_next_page(std::string_view link_header,
                                             std::string_view listing_url,
                                             const std::string& where);
// The shards a local read of the whole download reads (checkpoint::list_shards: the
// index's shards, else every top-level *.safetensors), from the listing's top-level files.
// With an index, its shards are taken to be the one complete NAME-0000k-of-0000n set beside
// it; when the listing does not show one, `shards` is empty and `why_not` says why (the
// caller reads the index instead). A path listed twice is refused: InputError(where, ...).
struct ListedShards {
  std::vector<ListedFile> shards;  // sorted by name, as list_shards sorts them
  std::string why_not;
};
ListedShards shards_from_listing(const std::vector<ListedFile>& files, const std::string& where);

}  // namespace kvaudit::hub
