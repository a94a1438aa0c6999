// Fuzzes how kvaudit takes a hub's answers apart before trusting their bytes: a range
// answer (status, headers, body) checked against the range asked for, the 8-byte
// safetensors length prefix of a remote shard, hub references, and the hub's file listing
// (the body as a listing page, each header value as a Link header, and the shards the page
// shows). Input: byte 0 picks the status, bytes 1-4 the range asked for, then "Name: value"
// header lines, a blank line, the body. Invariants: accepted bytes never exceed what was
// asked; a header length never exceeds the file; a listing keeps at most its entry limit,
// only usable paths, and shards that are among its files; a next page stays on the listing's
// path; bad input is an InputError, never a crash or an allocation it claims.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "hub/hub.h"
#include "util/util.h"

namespace {

constexpr std::string_view kListing = "https://hub.example/api/models/org/m/tree/sha";

void fuzz_listing(const kvaudit::net::HttpResponse& response) {
  kvaudit::hub::ListingLimits limits;
  limits.max_entries = 64;
  limits.max_page_bytes = 1 << 16;
  std::vector<kvaudit::hub::ListedFile> files;
  size_t seen = 0;
  try {
    kvaudit::hub::parse_listing_page(response.body, "fuzz", limits, seen, files);
    if (files.size() > limits.max_entries || seen > limits.max_entries) __builtin_trap();
    for (const auto& file : files) {
      const std::string wrapped = "/" + file.path + "/";
      if (file.path.empty() || file.path.front() == '/' ||
          wrapped.find("/../") != std::string::npos || wrapped.find("//") != std::string::npos)
        __builtin_trap();
    }
    kvaudit::hub::ListedShards shards = kvaudit::hub::shards_from_listing(files, "fuzz");
    for (const auto& shard : shards.shards) {
      if (shard.path.find('/') != std::string::npos) __builtin_trap();
      if (std::none_of(files.begin(), files.end(),
                       [&](const auto& file) { return file.path == shard.path; }))
        __builtin_trap();
    }
    if (!shards.shards.empty() && !shards.why_not.empty()) __builtin_trap();
  } catch (const kvaudit::InputError&) {
  }
  for (const auto& [name, value] : response.headers) {
    try {
      auto next = kvaudit::hub::listing_next_page(value, kListing, "fuzz");
      if (next && !next->starts_with(kListing)) __builtin_trap();
    } catch (const kvaudit::InputError&) {
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 5) return 0;
  static const int kStatus[] = {200, 206, 206, 302, 404, 416};
  kvaudit::net::HttpResponse response;
  response.status = kStatus[data[0] % 6];
  kvaudit::hub::ByteRange wanted;
  wanted.first = data[1] | (data[2] << 8);
  wanted.last = wanted.first + (data[3] | (data[4] << 8));
  std::string_view rest(reinterpret_cast<const char*>(data + 5), size - 5);
  while (!rest.empty()) {
    size_t end = rest.find('\n');
    std::string_view line = rest.substr(0, end);
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
    if (line.empty()) break;
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    std::string name(line.substr(0, colon));
    for (char& c : name) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c);
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    response.headers[name] = std::string(value);
  }
  response.body = std::string(rest);
  fuzz_listing(response);
  try {
    kvaudit::hub::RangeAnswer answer =
        kvaudit::hub::check_range_answer(response, wanted, "fuzz", uint64_t{1} << 40);
    if (answer.bytes.size() > wanted.size()) __builtin_trap();
    if (answer.total > (uint64_t{1} << 40)) __builtin_trap();
    uint64_t length = kvaudit::hub::safetensors_header_length(answer.bytes, answer.total, "fuzz");
    if (length + 8 > answer.total) __builtin_trap();
  } catch (const kvaudit::InputError&) {
  }
  (void)kvaudit::hub::parse_hub_ref(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
