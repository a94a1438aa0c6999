// Fuzzes what kvaudit serve parses from its clients: /v1/completions and
// /v1/chat/completions bodies (every field checked and bounded, token-id prompts, stop
// strings, stream options), the chat template over `messages`, and what a stream may send of
// the prompt's decoded text. The first byte picks the endpoint. A bad body must end in
// HttpError (the 400/404 the client gets), never a crash, a hang or another exception.
#include <cstddef>
#include <cstdint>
#include <string>

#include "serve/internal.h"

namespace {

const kvaudit::tokenizer::Tokenizer& fixture_tokenizer() {
  static const auto tokenizer = kvaudit::tokenizer::Tokenizer::load(KVAUDIT_FUZZ_MODEL_DIR);
  return tokenizer;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvaudit::serve;
  if (size < 1) return 0;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  const nlohmann::json body = nlohmann::json::parse(text, nullptr, false);
  if (body.is_discarded()) return 0;
  const auto& tokenizer = fixture_tokenizer();
  // The fixture's shape, with a small context so the length bounds are reached.
  ServedModel served;
  served.id = "qwen3-pystd";
  served.max_model_len = 256;
  served.eos_token_ids = {2047};
  served.vocab_size = static_cast<int64_t>(tokenizer.vocab_size());
  served.max_tokens_limit = 128;
  served.max_total_num_tokens = 200;
  try {
    GenerationRequest request;
    if (data[0] % 2 == 0)
      request = parse_completion(body, served, tokenizer).request;
    else
      request = parse_chat(body, served, tokenizer).request;
    const std::string decoded = tokenizer.decode(request.prompt, {.skip_special_tokens = true});
    if (streamable_prefix(decoded, request.stop) > decoded.size()) __builtin_trap();
  } catch (const HttpError&) {
  }
  return 0;
}
