// hub fetch: open_hub_checkpoint, and the remote fetch behind it that lays out sparse
// stand-in shards in kvaudit's cache: the shard list (from the hub's file listing, else the
// index), each shard's header and KV-scale bytes at their offsets, and a scratch folder
// renamed into the cache. The HTTP side is remote.cpp's.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "hub/internal.h"
#include "hub/remote.h"
#include "util/json.h"
#include "util/util.h"

namespace kvaudit::hub {

namespace fs = std::filesystem;

namespace {

using nlohmann::json;

constexpr const char* kManifest = ".kvaudit-hub.json";

// The shards to read: each with the tensor names the index gives it (none without an index)
// and the size the hub's file listing gives it (0: not listed).
struct ShardPlan {
  std::vector<std::string> index_names;
  uint64_t listed_bytes = 0;
};
using ShardPlans = std::map<std::string, ShardPlan>;

struct ShardResult {
  std::string name;
  uint64_t total = 0;
  uint64_t header_bytes = 0;
  int scale_tensors = 0;
  int norm_tensors = 0;  // per-head key norms (their bytes bound the cached keys)
  uint64_t weight_bytes_read = 0;
  std::exception_ptr error;
};

// Writes `bytes` at `offset` of an open file, or throws.
void write_at(int fd, uint64_t offset, std::string_view bytes, const fs::path& file) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n =
        ::pwrite(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw InputError(file.string(), fmt::format("cannot write: {}", std::strerror(errno)));
    done += static_cast<size_t>(n);
  }
}

// One shard: its length prefix and header (one range inside the header, then the rest),
// the bytes of its KV-scale tensors, laid out as a sparse file of the shard's real size.
void fetch_shard(const Remote& remote, const std::string& name, const ShardPlan& plan,
                 const fs::path& dir, ShardResult& out) {
  out.name = name;
  const std::string label = remote.label(name);
  // Inside the header for certain: from the index's names when there is one, else the
  // 8-byte prefix alone (the listing names no tensors, and a guess past the header would
  // read weight bytes).
  uint64_t first_bytes = 8;
  if (!plan.index_names.empty()) {
    std::vector<std::string_view> names(plan.index_names.begin(), plan.index_names.end());
    first_bytes = std::max<uint64_t>(8, header_lower_bound(names));
  }
  RangeAnswer head = remote.range(name, ByteRange{0, first_bytes - 1});
  if (plan.listed_bytes != 0 && head.total != plan.listed_bytes)
    throw InputError(label, fmt::format("the hub's file listing gives {} bytes, the file has {} "
                                        "(Content-Range): the listing and the file disagree",
                                        plan.listed_bytes, head.total));
  out.total = head.total;
  const uint64_t header_length = safetensors_header_length(head.bytes, head.total, label);
  std::string prefix_and_header =
      head.bytes.substr(0, std::min<uint64_t>(head.bytes.size(), 8 + header_length));
  out.weight_bytes_read += head.bytes.size() - prefix_and_header.size();
  if (prefix_and_header.size() < 8 + header_length) {
    RangeAnswer rest =
        remote.range(name, ByteRange{prefix_and_header.size(), 8 + header_length - 1});
    prefix_and_header += rest.bytes;
  }
  out.header_bytes = header_length;
  checkpoint::SafetensorsHeader header = checkpoint::parse_safetensors_header(
      std::string_view(prefix_and_header).substr(8), head.total - 8 - header_length, label);

  const fs::path file = dir / name;
  int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0)
    throw InputError(file.string(), fmt::format("cannot create: {}", std::strerror(errno)));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  write_at(fd, 0, prefix_and_header, file);
  // The bytes of the small tensors the reader reads (KV scales, per-head key norms), each
  // its own range (adjacent ones merged: k_scale and v_scale usually sit side by side);
  // only tensors of at most 64K elements.
  std::vector<ByteRange> spans;
  for (const auto& tensor : header.tensors) {
    if (!checkpoint::reads_tensor_values(tensor.name) || tensor.data_end <= tensor.data_begin ||
        tensor.element_count() > (1u << 16))
      continue;
    if (checkpoint::classify_k_norm_tensor(tensor.name))
      ++out.norm_tensors;
    else
      ++out.scale_tensors;
    ByteRange span{8 + header_length + tensor.data_begin, 8 + header_length + tensor.data_end - 1};
    if (!spans.empty() && spans.back().last + 1 == span.first)
      spans.back().last = span.last;
    else
      spans.push_back(span);
  }
  std::sort(spans.begin(), spans.end(),
            [](const ByteRange& a, const ByteRange& b) { return a.first < b.first; });
  for (const ByteRange& span : spans) {
    RangeAnswer bytes = remote.range(name, span);
    if (bytes.bytes.size() != span.size())
      throw InputError(label, fmt::format("bytes {}-{} came back as {} bytes", span.first,
                                          span.last, bytes.bytes.size()));
    write_at(fd, span.first, bytes.bytes, file);
  }
  // The weights stay holes: the file has the shard's size and reads as zeros there.
  if (::ftruncate(fd, static_cast<off_t>(head.total)) != 0)
    throw InputError(file.string(), fmt::format("cannot size: {}", std::strerror(errno)));
}

// ---------------------------------------------------------------- the passes of open

// Remembers which commit a branch or tag named (for --offline); a sha needs no note.
void remember_revision(const fs::path& repo_cache, const HubRef& ref, const std::string& commit) {
  if (is_commit_sha(ref.revision)) return;
  std::error_code ec;
  fs::create_directories(repo_cache / "refs", ec);
  write_file_atomically(repo_cache / "refs" / encode_revision(ref.revision), commit);
}

// The commit `ref` names: the revision itself when it is a sha, the one remembered in the
// kvaudit cache (--offline), or the X-Repo-Commit of one request for the revision.
std::string resolve_commit(const HubRef& ref, const HubOptions& options, Fetcher& fetcher,
                           const fs::path& repo_cache, const std::string& endpoint,
                           bool has_token) {
  if (is_commit_sha(ref.revision)) return ref.revision;
  if (options.offline) {
    try {
      return trimmed(read_text_file(repo_cache / "refs" / encode_revision(ref.revision), 256));
    } catch (const InputError&) {
      throw InputError(ref.text(), "--offline: not in the kvaudit cache (audit it once online)");
    }
  }
  // resolve/REVISION/config.json answers with the commit in X-Repo-Commit, redirect or not.
  Fetcher::Answer answer = fetcher.get(
      fmt::format("/{}/resolve/{}/config.json", ref.repo, encode_revision(ref.revision)),
      {.range = ByteRange{0, 0}, .max_body_bytes = 0, .json = false, .follow = false});
  if (answer.response.status >= 400) hub_refusal(answer, ref, endpoint, has_token);
  if (!is_commit_sha(answer.commit))
    throw InputError(answer.url, fmt::format("the answer names no commit (X-Repo-Commit '{}'): "
                                             "is {} a Hugging Face hub?",
                                             answer.commit, endpoint));
  return answer.commit;
}

// kvaudit's cache of out.commit, when a finished fetch left it (its manifest is written
// last): fills out.dir, stats and source and returns true.
bool open_cached_commit(const fs::path& repo_cache, const fs::path& final_dir,
                        const Fetcher& fetcher, HubCheckpoint& out) {
  std::error_code ec;
  if (!fs::exists(final_dir / kManifest, ec)) return false;
  out.dir = final_dir;
  out.stats.requests = fetcher.requests();
  out.stats.bytes = fetcher.bytes();
  out.source = fmt::format("{} @ {} from the kvaudit cache {} ({} request{} this run)",
                           out.ref.repo, out.commit, final_dir.string(), out.stats.requests,
                           out.stats.requests == 1 ? "" : "s");
  remember_revision(repo_cache, out.ref, out.commit);
  return true;
}

// A fresh scratch folder for this run's fetch of `commit`, beside the commit's final folder.
fs::path create_scratch(const fs::path& repo_cache, const std::string& commit) {
  fs::path scratch =
      repo_cache / fmt::format(".{}.partial-{}", commit, static_cast<long>(::getpid()));
  std::error_code ec;
  fs::remove_all(scratch, ec);
  fs::create_directories(scratch, ec);
  if (ec) throw InputError(scratch.string(), "cannot create the cache folder: " + ec.message());
  return scratch;
}

// Removes the scratch folder unless `dir` was cleared (it became the cache).
struct ScratchCleanup {
  fs::path dir;
  ~ScratchCleanup() {
    std::error_code e;
    if (!dir.empty()) fs::remove_all(dir, e);
  }
};

// Writes one fetched file into the scratch folder and lists it in the manifest.
void keep_file(const fs::path& scratch, const std::string& name, const std::string& bytes,
               json& manifest, FetchStats& stats) {
  write_file_atomically(scratch / name, bytes);
  manifest["files"].push_back({{"path", name}, {"bytes", bytes.size()}});
  ++stats.files_fetched;
}

// The shards the hub's file listing shows (ListedShards), or nullopt with a note saying why
// the index is read instead.
std::optional<ShardPlans> listed_shard_plans(const Remote& remote, const HubOptions& options,
                                             json& manifest, std::vector<std::string>& notes) {
  ListingLimits limits;
  limits.max_entries = options.max_listing_entries;
  std::string why_not;
  std::optional<Listing> listing = remote.listing(limits, why_not);
  if (listing) {
    manifest["listing"] = {{"url", listing->url}, {"pages", listing->pages}};
    ListedShards listed = shards_from_listing(listing->files, listing->url);
    if (listed.shards.size() > options.max_shards)
      throw InputError(listing->url, fmt::format("lists {} shards, more than the {} kvaudit reads",
                                                 listed.shards.size(), options.max_shards));
    if (listed.why_not.empty()) {
      ShardPlans plans;
      for (const ListedFile& shard : listed.shards) plans[shard.path].listed_bytes = shard.bytes;
      return plans;
    }
    why_not = listed.why_not;
  }
  notes.push_back(
      fmt::format("hub file listing not used ({}): the shard list was read from "
                  "model.safetensors.index.json instead",
                  why_not));
  return std::nullopt;
}

// The small files an audit reads (config.json, hf_quant_config.json when there is one), kept
// in the scratch folder, and the shards to read: from the hub's file listing, else from the
// index (kept too, as a download has it), else the single file model.safetensors.
ShardPlans fetch_small_files(const Remote& remote, const HubOptions& options,
                             const fs::path& scratch, json& manifest, HubCheckpoint& out) {
  keep_file(scratch, "config.json",
            *remote.file("config.json", options.max_small_file_bytes, false), manifest, out.stats);
  if (auto quant = remote.file("hf_quant_config.json", options.max_small_file_bytes, true))
    keep_file(scratch, "hf_quant_config.json", *quant, manifest, out.stats);
  if (auto plans = listed_shard_plans(remote, options, manifest, out.notes)) {
    manifest["shards_from"] = "listing";
    return *plans;
  }
  manifest["shards_from"] = "index";
  ShardPlans plans;
  if (auto index = remote.file("model.safetensors.index.json", options.max_index_bytes, true)) {
    keep_file(scratch, "model.safetensors.index.json", *index, manifest, out.stats);
    for (auto& [shard, names] : index_shards(*index, remote.label("model.safetensors.index.json")))
      plans[shard].index_names = std::move(names);
  } else {
    plans["model.safetensors"];  // a single-file checkpoint (its header says what it holds)
  }
  if (plans.size() > options.max_shards)
    throw InputError(remote.label("model.safetensors.index.json"),
                     fmt::format("names {} shards, more than the {} kvaudit reads", plans.size(),
                                 options.max_shards));
  return plans;
}

// Every shard through fetch_shard into the scratch folder, options.concurrency at a time;
// one result per shard, in shard order. The first failure stops the shards not yet started.
std::vector<ShardResult> fetch_shards(const Remote& remote, const ShardPlans& shards,
                                      const fs::path& scratch, const HubOptions& options) {
  std::vector<std::pair<std::string, const ShardPlan*>> work;
  for (const auto& [name, plan] : shards) work.push_back({name, &plan});
  std::vector<ShardResult> results(work.size());
  std::atomic<int64_t> done{0};
  std::mutex progress_mutex;
  // The shard's failure is kept in its result (record_shards rethrows the first, in shard
  // order) and stops the shards not yet started.
  run_on_threads(work.size(), std::clamp(options.concurrency, 1, 64), [&](size_t i) {
    bool fetched = true;
    try {
      fetch_shard(remote, work[i].first, *work[i].second, scratch, results[i]);
    } catch (...) {
      results[i].error = std::current_exception();
      fetched = false;
    }
    const int64_t finished = ++done;
    if (options.on_progress) {
      std::lock_guard lock(progress_mutex);
      options.on_progress(finished, static_cast<int64_t>(work.size()));
    }
    return fetched;
  });
  return results;
}

// What the shards' headers held, summed for the report.
struct ShardTotals {
  uint64_t header_bytes = 0;
  int scale_tensors = 0;
  int norm_tensors = 0;
};

// Lists the fetched shards in the manifest and the stats, in shard order; rethrows the
// failure of the first shard that failed.
ShardTotals record_shards(const std::vector<ShardResult>& results, json& manifest,
                          FetchStats& stats) {
  ShardTotals totals;
  for (const auto& result : results) {
    if (result.error) std::rethrow_exception(result.error);
    manifest["files"].push_back({{"path", result.name},
                                 {"bytes", result.total},
                                 {"header_bytes", result.header_bytes},
                                 {"scale_tensors", result.scale_tensors},
                                 {"norm_tensors", result.norm_tensors}});
    totals.header_bytes += result.header_bytes;
    totals.scale_tensors += result.scale_tensors;
    totals.norm_tensors += result.norm_tensors;
    stats.weight_bytes_read += result.weight_bytes_read;
    ++stats.files_fetched;
  }
  return totals;
}

// Writes the manifest (last, so a folder without one is unfinished) and renames the scratch
// folder to the commit's; when another run finished first, its folder is kept and ours is
// left to `cleanup`.
void publish_scratch(json& manifest, const FetchStats& stats, const fs::path& final_dir,
                     ScratchCleanup& cleanup) {
  const fs::path scratch = cleanup.dir;
  manifest["requests"] = stats.requests;
  manifest["bytes"] = stats.bytes;
  write_file_atomically(scratch / kManifest, manifest.dump(1));
  std::error_code ec;
  fs::rename(scratch, final_dir, ec);
  if (ec && !fs::exists(final_dir / kManifest))  // another run may have finished first
    throw InputError(final_dir.string(),
                     "cannot move the fetched files into the cache: " + ec.message());
  cleanup.dir = ec ? scratch : fs::path();
}

}  // namespace

// ---------------------------------------------------------------- open

HubCheckpoint open_hub_checkpoint(const HubRef& ref, const HubOptions& options) {
  HubCheckpoint out;
  out.ref = ref;
  out.endpoint = resolve_endpoint(options.endpoint);
  const std::string token = resolve_token(options.token);

  // 1. The user's own Hugging Face cache, when it holds the revision whole.
  if (auto snapshot = hf_cache_snapshot(ref, options, out.commit, out.notes)) {
    out.dir = *snapshot;
    out.label = fmt::format("hf://{}@{}", ref.repo, out.commit.substr(0, 12));
    out.source = fmt::format("{} @ {} from the local Hugging Face cache {}", ref.repo, out.commit,
                             snapshot->string());
    return out;
  }

  const fs::path repo_cache = kvaudit_cache_root(options) / repo_folder(ref.repo);
  Fetcher fetcher(options, out.endpoint, token, ref.repo);
  // 2. The commit: given, remembered (offline), or one request for the revision.
  out.commit = resolve_commit(ref, options, fetcher, repo_cache, out.endpoint, !token.empty());
  out.label = fmt::format("hf://{}@{}", ref.repo, out.commit.substr(0, 12));
  const fs::path final_dir = repo_cache / out.commit;

  // 3. kvaudit's cache of that commit.
  if (open_cached_commit(repo_cache, final_dir, fetcher, out)) return out;
  if (options.offline)
    throw InputError(ref.text(), fmt::format("--offline: commit {} is not in the kvaudit cache {}",
                                             out.commit, repo_cache.string()));

  // 4. Fetch into a scratch folder, then rename: a killed run leaves no half cache.
  ScratchCleanup cleanup{create_scratch(repo_cache, out.commit)};
  const fs::path scratch = cleanup.dir;
  Remote remote{fetcher, ref, out.endpoint, !token.empty(), out.commit, {}, {}};
  json manifest = {{"repo", ref.repo},
                   {"revision", ref.revision},
                   {"commit", out.commit},
                   {"endpoint", out.endpoint},
                   {"files", json::array()}};
  const ShardPlans shards = fetch_small_files(remote, options, scratch, manifest, out);
  const ShardTotals totals =
      record_shards(fetch_shards(remote, shards, scratch, options), manifest, out.stats);
  out.stats.requests = fetcher.requests();
  out.stats.bytes = fetcher.bytes();
  publish_scratch(manifest, out.stats, final_dir, cleanup);
  remember_revision(repo_cache, ref, out.commit);
  out.dir = final_dir;
  out.source = fmt::format(
      "{} @ {} from {}: {} requests, {} bytes ({} shard header bytes, {} KV-scale and {} key-norm "
      "tensors read; shards from the {}; no weights)",
      ref.repo, out.commit, out.endpoint, out.stats.requests, with_thousands(out.stats.bytes),
      with_thousands(totals.header_bytes), totals.scale_tensors, totals.norm_tensors,
      manifest["shards_from"] == "listing" ? "hub's file listing" : "index");
  return out;
}

}  // namespace kvaudit::hub
