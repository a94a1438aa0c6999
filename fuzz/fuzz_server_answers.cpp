// Fuzzes the parsers of what a live server answers (net/): Prometheus text (vLLM
// /metrics), legacy completions with logprobs, chat completions, /v1/models, /tokenize
// error bodies and server-sent events (first byte >= 240). The first byte picks the parser. A
// malformed answer must end in InputError (RequestError is one), never a crash, hang or other
// exception.
#include <cstddef>
#include <cstdint>
#include <string>

#include "net/net.h"
#include "util/util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::string where = "http://127.0.0.1:1/fuzz";
  try {
    if (data[0] >= 240) {  // a streamed body, fed in pieces the next byte sizes
      kvaudit::net::SseParser parser(
          where, [](std::string_view event) { (void)nlohmann::json::parse(event, nullptr, false); },
          4096);
      const size_t step = size > 1 ? 1 + data[1] % 17 : 1;
      for (size_t at = 0; at < text.size(); at += step)
        parser.feed(std::string_view(text).substr(at, step));
      return 0;
    }
    switch (data[0] % 6) {
      case 0:
        kvaudit::net::parse_prometheus(text, where);
        break;
      case 5:
        kvaudit::net::error_message_of(text);
        break;
      default: {
        auto doc = nlohmann::json::parse(text, nullptr, false);
        if (doc.is_discarded()) return 0;
        if (data[0] % 6 == 1) kvaudit::net::parse_completion(doc, where);
        if (data[0] % 6 == 2) kvaudit::net::parse_chat_completion(doc, where);
        if (data[0] % 6 == 3) kvaudit::net::parse_model_list(doc, where);
        if (data[0] % 6 == 4) kvaudit::net::parse_tokenize(doc, where);
        break;
      }
    }
  } catch (const kvaudit::InputError&) {
  }
  return 0;
}
