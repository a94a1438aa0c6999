// The checkpoint argument of check and plan: a local path, or a hub reference read
// through hub/ (progress on a terminal).
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "hub/hub.h"
#include "util/util.h"

namespace kvaudit::cli {

void add_checkpoint_source_options(CLI::App& command, CheckpointSource& source) {
  command.add_option("--hf-token", source.hf_token,
                     "Hugging Face token for a hub reference (default: $HF_TOKEN, "
                     "$HF_TOKEN_PATH, $HF_HOME/token)");
  command.add_option("--hf-endpoint", source.hf_endpoint,
                     "Hub or mirror to read org/model from (default: $HF_ENDPOINT, else "
                     "https://huggingface.co)");
  command.add_flag("--offline", source.offline,
                   "With org/model: use only the kvaudit and Hugging Face caches, no request");
}

checkpoint::ModelFacts read_checkpoint_argument(const std::string& argument,
                                                const CheckpointSource& source,
                                                const checkpoint::ReadOptions& read) {
  // A local folder of that name wins; anything else that reads as org/model is the hub's.
  std::error_code ec;
  const bool forced = argument.rfind("hf://", 0) == 0;
  if (!forced && std::filesystem::exists(argument, ec))
    return checkpoint::read_checkpoint(argument, read);
  auto ref = hub::parse_hub_ref(argument);
  if (!ref) {
    if (forced)
      throw InputError(argument, "not a hub reference (expected hf://org/model[@revision])");
    return checkpoint::read_checkpoint(argument, read);  // says "no such file or folder"
  }
  hub::HubOptions options;
  options.token = source.hf_token;
  options.endpoint = source.hf_endpoint;
  options.offline = source.offline;
  const bool terminal = isatty(STDERR_FILENO) == 1;
  if (terminal)
    options.on_progress = [](int64_t done, int64_t total) {
      std::fprintf(stderr, "\rkvaudit: shard headers %lld/%lld", static_cast<long long>(done),
                   static_cast<long long>(total));
      if (done == total) std::fprintf(stderr, "\n");
    };
  hub::HubCheckpoint checkpoint = hub::open_hub_checkpoint(*ref, options);
  return hub::read_hub_checkpoint(checkpoint, read);
}

}  // namespace kvaudit::cli
