// Fuzzes how probe reads what a server says about itself: SGLang's /get_server_info,
// llama-server's /props, TGI's /info, TensorRT-LLM's /metrics iteration stats (JSON) and
// vLLM's /metrics (Prometheus text, through parse_prometheus). The first byte picks the
// reader; the seeds are the real answers in tests/fixtures/servers/. Invariants: bad input
// ends in InputError or a reader's "not this server" (false), never a crash, a hang or
// another exception; no size read (pool tokens, context, page, slots) is negative.
#include <cstddef>
#include <cstdint>
#include <string>

#include "net/net.h"
#include "probe/probe.h"
#include "util/util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  kvaudit::probe::ServerFacts facts;
  try {
    const int reader = data[0] % 5;
    if (reader == 4) {
      const auto samples = kvaudit::net::parse_prometheus(text, "fuzz/metrics");
      (void)kvaudit::probe::read_vllm_metrics(samples, facts);
    } else {
      const nlohmann::json doc = nlohmann::json::parse(text, nullptr, false);
      if (doc.is_discarded()) return 0;
      if (reader == 0) kvaudit::probe::read_sglang_server_info(doc, facts);
      if (reader == 1) (void)kvaudit::probe::read_llamacpp_props(doc, facts);
      if (reader == 2) (void)kvaudit::probe::read_tgi_info(doc, facts);
      if (reader == 3) (void)kvaudit::probe::read_trtllm_iteration_stats(doc, facts, "fuzz");
    }
  } catch (const kvaudit::InputError&) {
    return 0;
  }
  for (const auto& count :
       {facts.capacity_tokens, facts.context_length, facts.page_size, facts.slots})
    if (count && *count < 0) __builtin_trap();
  return 0;
}
