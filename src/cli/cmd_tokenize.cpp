// kvaudit tokenize: text on stdin -> token ids, with a Hugging Face tokenizer folder. A
// data command: it prints the ids themselves (space-separated, or {"ids": [...]} with
// --json), not a report.
#include <iostream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "tokenizer/tokenizer.h"

namespace kvaudit::cli {

namespace {

struct TokenizeOptions {
  std::string tokenizer_dir;
  bool json = false;
  bool add_special_tokens = false;
};

int run_tokenize_command(const TokenizeOptions& options) {
  tokenizer::Tokenizer tokenizer = tokenizer::Tokenizer::load(options.tokenizer_dir);
  std::string text{std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
  std::vector<tokenizer::TokenId> ids =
      tokenizer.encode(text, {.add_special_tokens = options.add_special_tokens});
  if (options.json) {
    std::cout << nlohmann::json{{"ids", ids}}.dump() << '\n';
  } else {
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) line += ' ';
      line += std::to_string(ids[i]);
    }
    std::cout << line << '\n';
  }
  return kExitOk;
}

}  // namespace

void add_tokenize_command(CLI::App& app, Runner& run) {
  auto options = std::make_shared<TokenizeOptions>();
  CLI::App* command = app.add_subcommand(
      "tokenize", "Print the token ids of the text on stdin (invalid UTF-8 becomes U+FFFD first)");
  command
      ->add_option("--tokenizer", options->tokenizer_dir,
                   "Folder with tokenizer.json (and tokenizer_config.json), or the file")
      ->required();
  command->add_flag("--json", options->json, "Print {\"ids\": [...]} instead of plain ids");
  command->add_flag("--add-special-tokens", options->add_special_tokens,
                    "Apply the tokenizer's post-processor (e.g. a BOS token)");
  command->callback(
      [&run, options] { run = [options] { return run_tokenize_command(*options); }; });
}

}  // namespace kvaudit::cli
