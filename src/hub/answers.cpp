// hub answers: what a range response must look like before its bytes are trusted, the
// safetensors length prefix, and the hub's file listing (its pages, their Link to the next,
// and the shards it shows). Pure functions: the fuzz target drives them directly.
#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <charconv>
#include <map>
#include <set>

#include "hub/hub.h"
#include "util/util.h"

namespace kvaudit::hub {

namespace {

// The safetensors format caps the header at 100 MB (MAX_HEADER_SIZE in the reference crate).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

std::optional<uint64_t> parse_u64(std::string_view text) {
  uint64_t value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

// "bytes 0-99/12345" -> {0, 99, 12345}; "*" totals and malformed values are refused.
struct ContentRange {
  uint64_t first = 0, last = 0, total = 0;
};
std::optional<ContentRange> parse_content_range(std::string_view value) {
  if (value.rfind("bytes ", 0) != 0) return std::nullopt;
  value.remove_prefix(6);
  size_t dash = value.find('-'), slash = value.find('/');
  if (dash == std::string_view::npos || slash == std::string_view::npos || dash > slash)
    return std::nullopt;
  auto first = parse_u64(value.substr(0, dash));
  auto last = parse_u64(value.substr(dash + 1, slash - dash - 1));
  auto total = parse_u64(value.substr(slash + 1));
  if (!first || !last || !total || *first > *last || *last >= *total) return std::nullopt;
  return ContentRange{*first, *last, *total};
}

}  // namespace

RangeAnswer check_range_answer(const net::HttpResponse& response, ByteRange wanted,
                               const std::string& where, uint64_t max_total) {
  const std::string encoding = response.header("content-encoding");
  if (!encoding.empty() && encoding != "identity")
    throw InputError(where, fmt::format("the range answer is content-encoded ({}): its bytes are "
                                        "not the file's",
                                        encoding));
  RangeAnswer out;
  if (response.status == 206) {
    auto range = parse_content_range(response.header("content-range"));
    if (!range)
      throw InputError(where, fmt::format("206 without a valid Content-Range ('{}')",
                                          response.header("content-range")));
    const uint64_t expected_last = std::min(wanted.last, range->total - 1);
    if (range->first != wanted.first || range->last != expected_last)
      throw InputError(
          where, fmt::format("asked for bytes {}-{}, the server sent {}-{} of {}", wanted.first,
                             wanted.last, range->first, range->last, range->total));
    if (range->total > max_total)
      throw InputError(
          where, fmt::format("claims a file of {} bytes, more than kvaudit accepts", range->total));
    if (response.body.size() != range->last - range->first + 1)
      throw InputError(where, fmt::format("truncated answer: Content-Range promises {} bytes, "
                                          "{} arrived",
                                          range->last - range->first + 1, response.body.size()));
    out.bytes = response.body;
    out.total = range->total;
    return out;
  }
  if (response.status == 200) {
    // The server ignored Range and sends the whole file: the client stopped reading after
    // the bytes it needs (stop_after_bytes), and the size is the Content-Length.
    auto length = parse_u64(response.header("content-length"));
    if (!length)
      throw InputError(where,
                       "ignored Range and sent no Content-Length: the file's size is "
                       "unknown");
    if (*length > max_total)
      throw InputError(
          where, fmt::format("claims a file of {} bytes, more than kvaudit accepts", *length));
    if (wanted.first >= *length)
      throw InputError(where,
                       fmt::format("asked for byte {} of a {}-byte file", wanted.first, *length));
    const uint64_t end = std::min<uint64_t>(wanted.last + 1, *length);
    if (response.body.size() < end)
      throw InputError(where, fmt::format("truncated answer: {} of the first {} bytes arrived",
                                          response.body.size(), end));
    out.bytes = response.body.substr(wanted.first, end - wanted.first);
    out.total = *length;
    return out;
  }
  throw InputError(where, fmt::format("HTTP {} to a range request: {}", response.status,
                                      net::error_message_of(response.body)));
}

uint64_t safetensors_header_length(std::string_view first8, uint64_t file_bytes,
                                   const std::string& where) {
  if (first8.size() < 8)
    throw InputError(where, fmt::format("truncated: {} bytes, a safetensors file starts with an "
                                        "8-byte header length",
                                        first8.size()));
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | static_cast<unsigned char>(first8[i]);
  if (length == 0) throw InputError(where, "safetensors header length is 0");
  if (length > kMaxHeaderBytes)
    throw InputError(where, fmt::format("safetensors header length {} exceeds the format's 100 MB "
                                        "limit (not a safetensors file?)",
                                        length));
  if (file_bytes < 8 || length > file_bytes - 8)
    throw InputError(where, fmt::format("header length {} runs past the end of the {}-byte file",
                                        length, file_bytes));
  return length;
}

uint64_t header_lower_bound(const std::vector<std::string_view>& tensor_names) {
  // Each entry is at least "NAME":{"dtype":"F8","shape":[],"data_offsets":[0,0]} plus a
  // separator: 45 bytes beyond the name. The braces of the object add 2.
  uint64_t bytes = 8 + 2;
  for (std::string_view name : tensor_names) bytes += name.size() + 45;
  return bytes;
}

// ---------------------------------------------------------------- the file listing

namespace {

// What kvaudit accepts as a file's size, as for range answers (check_range_answer).
constexpr uint64_t kMaxListedBytes = uint64_t{1} << 50;

// A repository path kvaudit may use as a file name below its cache folder: relative, no
// empty, "." or ".." part, no control characters.
bool safe_repo_path(std::string_view path) {
  if (path.empty() || path.size() > 1024 || path.front() == '/') return false;
  for (char c : path)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f || c == '\\') return false;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = std::min(path.find('/', start), path.size());
    std::string_view part = path.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return true;
}

// "model-00003-of-00032.safetensors" -> {"model", 3, 32}: the names sharded saves write
// (huggingface.js parse-safetensors-metadata.ts matches -(\d{5,6})-of-(\d{5,6}).safetensors).
struct ShardNumber {
  std::string stem;
  uint64_t index = 0, count = 0;
};
std::optional<ShardNumber> shard_number(std::string_view name) {
  constexpr std::string_view kSuffix = ".safetensors";
  if (!name.ends_with(kSuffix)) return std::nullopt;
  name.remove_suffix(kSuffix.size());
  const size_t of = name.rfind("-of-");
  if (of == std::string_view::npos) return std::nullopt;
  const size_t dash = name.rfind('-', of == 0 ? 0 : of - 1);
  if (dash == std::string_view::npos || dash >= of) return std::nullopt;
  std::string_view index = name.substr(dash + 1, of - dash - 1), count = name.substr(of + 4);
  auto digits = [](std::string_view text) {
    return text.size() >= 5 && text.size() <= 6 &&
           std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (!digits(index) || !digits(count)) return std::nullopt;
  return ShardNumber{std::string(name.substr(0, dash)), *parse_u64(index), *parse_u64(count)};
}

// Where the path of an absolute URL starts (npos without one).
size_t path_start(std::string_view url) {
  const size_t scheme_end = url.find("://");
  return scheme_end == std::string_view::npos ? std::string_view::npos
                                              : url.find('/', scheme_end + 3);
}

// `url` with its scheme and host in lower case and the scheme's default port dropped:
// "https://huggingface.co:443/api" and "https://HuggingFace.co/api" name one place.
std::string same_origin_form(std::string_view url) {
  const size_t path_at = std::min(path_start(url), url.size());
  std::string origin(url.substr(0, path_at));
  std::transform(origin.begin(), origin.end(), origin.begin(),
                 [](char c) { return static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c); });
  if (origin.starts_with("https://") && origin.ends_with(":443")) origin.resize(origin.size() - 4);
  if (origin.starts_with("http://") && origin.ends_with(":80")) origin.resize(origin.size() - 3);
  return origin + std::string(url.substr(path_at));
}

}  // namespace

void parse_listing_page(std::string_view body, const std::string& where,
                        const ListingLimits& limits, size_t& entries_seen,
                        std::vector<ListedFile>& files) {
  if (body.size() > limits.max_page_bytes)
    throw InputError(where, fmt::format("a file listing page of {} bytes, more than the {} "
                                        "kvaudit reads",
                                        body.size(), limits.max_page_bytes));
  simdjson::dom::parser parser;
  const simdjson::padded_string padded(body);
  simdjson::dom::element doc;
  if (auto error = parser.parse(padded).get(doc))
    throw InputError(where, fmt::format("the file listing is not valid JSON ({})",
                                        simdjson::error_message(error)));
  simdjson::dom::array entries;
  if (doc.get_array().get(entries) != simdjson::SUCCESS)
    throw InputError(where, "the file listing is not a JSON array of entries");
  size_t at = 0;
  for (simdjson::dom::element entry : entries) {
    if (++entries_seen > limits.max_entries)
      throw InputError(
          where, fmt::format("the file listing has more than {} entries", limits.max_entries));
    simdjson::dom::object object;
    std::string_view type, path;
    if (entry.get_object().get(object) != simdjson::SUCCESS ||
        object["type"].get_string().get(type) != simdjson::SUCCESS ||
        object["path"].get_string().get(path) != simdjson::SUCCESS)
      throw InputError(where, fmt::format("file listing entry {} is not an object with a "
                                          "\"type\" and a \"path\" string",
                                          at));
    ++at;
    if (type != "file") continue;  // folders; "unknown" entries (huggingface.js ListFileEntry)
    if (!safe_repo_path(path))
      throw InputError(where, fmt::format("the file listing names an unusable path '{}'",
                                          path.substr(0, std::min<size_t>(path.size(), 200))));
    // An LFS file's "size" is its real size on the hub (huggingface.js list-files.spec.ts:
    // pytorch_model.bin size 440473133 = lfs.size); lfs.size is the LFS object's own record of
    // it, so it is the one taken when both are there.
    uint64_t bytes = 0;
    simdjson::dom::element lfs;
    const bool has_lfs = object["lfs"].get(lfs) == simdjson::SUCCESS && !lfs.is_null();
    const bool sized = has_lfs ? lfs["size"].get_uint64().get(bytes) == simdjson::SUCCESS
                               : object["size"].get_uint64().get(bytes) == simdjson::SUCCESS;
    if (!sized)
      throw InputError(where, fmt::format("the file listing gives '{}' no byte count{}", path,
                                          has_lfs ? " in lfs.size" : ""));
    if (bytes > kMaxListedBytes)
      throw InputError(where, fmt::format("the file listing claims '{}' has {} bytes, more than "
                                          "kvaudit accepts",
                                          path, bytes));
    files.push_back({std::string(path), bytes});
  }
}

std::optional<std::string> listing_next_page(std::string_view link_header,
                                             std::string_view listing_url,
                                             const std::string& where) {
  // Link: <URL>; rel="next", <URL>; rel="prev" (RFC 8288; huggingface.js parseLinkHeader.ts).
  std::optional<std::string> next;
  for (size_t open = link_header.find('<'); open != std::string_view::npos;) {
    const size_t close = link_header.find('>', open);
    if (close == std::string_view::npos) break;
    const size_t following = link_header.find('<', close);
    std::string_view params = link_header.substr(close + 1, following - close - 1);
    if (params.find("rel=\"next\"") != std::string_view::npos ||
        params.find("rel=next") != std::string_view::npos) {
      next = std::string(link_header.substr(open + 1, close - open - 1));
      break;
    }
    open = following;
  }
  if (!next) return std::nullopt;
  const size_t path_at = path_start(listing_url);
  if (!next->empty() && next->front() == '/' && path_at != std::string_view::npos)
    next = std::string(listing_url.substr(0, path_at)) + *next;
  // The same listing: the same origin (kvaudit names ports the hub leaves out) and path.
  const std::string base = same_origin_form(listing_url.substr(0, listing_url.find('?')));
  const std::string asked = same_origin_form(*next);
  const bool printable = std::all_of(next->begin(), next->end(), [](char c) {
    return static_cast<unsigned char>(c) > 0x20 && c != 0x7f;
  });
  if (!printable || !asked.starts_with(base) ||
      (asked.size() > base.size() && asked[base.size()] != '?'))
    throw InputError(where,
                     fmt::format("the file listing's next page '{}' is not a page of {}",
                                 next->substr(0, std::min<size_t>(next->size(), 200)), base));
  // Asked on the listing's own spelling of its origin ("HUB.example:443" is the same host):
  // what the fetcher compares to decide where Authorization may go stays one string.
  const size_t next_path_at = path_start(*next);
  if (path_at != std::string_view::npos && next_path_at != std::string_view::npos)
    return std::string(listing_url.substr(0, path_at)) + next->substr(next_path_at);
  return next;
}

ListedShards shards_from_listing(const std::vector<ListedFile>& files, const std::string& where) {
  ListedShards out;
  bool has_index = false;
  std::set<std::string_view> seen;
  std::vector<ListedFile> safetensors;
  for (const ListedFile& file : files) {
    if (!seen.insert(file.path).second)
      throw InputError(where, fmt::format("the file listing names '{}' twice", file.path));
    // Files in folders (original/, a diffusers pipeline's transformer/) are not read: the
    // local reader reads the checkpoint folder's own files.
    if (file.path.find('/') != std::string::npos) continue;
    if (file.path == "model.safetensors.index.json")
      has_index = true;
    else if (file.path.ends_with(".safetensors"))
      safetensors.push_back(file);
  }
  std::sort(safetensors.begin(), safetensors.end(),
            [](const ListedFile& a, const ListedFile& b) { return a.path < b.path; });
  if (!has_index) {
    if (safetensors.empty())
      out.why_not = "the file listing shows no .safetensors file and no index";
    out.shards = std::move(safetensors);
    return out;
  }
  // Beside an index (and maybe a consolidated.safetensors of the same weights, as Mistral's
  // repositories ship), the shards are the set the index's names number: complete when it
  // holds each of 1..n once.
  std::map<std::pair<std::string, uint64_t>, std::vector<const ListedFile*>> sets;
  for (const ListedFile& file : safetensors)
    if (auto number = shard_number(file.path)) sets[{number->stem, number->count}].push_back(&file);
  std::vector<const std::vector<const ListedFile*>*> complete;
  for (const auto& [key, members] : sets) {
    std::set<uint64_t> indices;
    for (const ListedFile* file : members) indices.insert(shard_number(file->path)->index);
    if (members.size() == key.second && indices.size() == key.second && *indices.begin() == 1 &&
        *indices.rbegin() == key.second)
      complete.push_back(&members);
  }
  if (complete.size() != 1) {
    out.why_not = fmt::format(
        "beside model.safetensors.index.json the file listing shows {} .safetensors file(s) and "
        "{} complete NAME-0000k-of-0000n set(s), so it cannot tell the index's shards",
        safetensors.size(), complete.size());
    return out;
  }
  for (const ListedFile* file : *complete.front()) out.shards.push_back(*file);
  return out;
}

}  // namespace kvaudit::hub
