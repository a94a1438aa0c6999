// hub answers: what a range response must look like before its bytes are trusted, and the
// safetensors length prefix. Pure functions: the fuzz target drives them directly.
#include <fmt/format.h>

#include <charconv>

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

}  // namespace kvaudit::hub
