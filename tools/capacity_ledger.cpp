// Writes docs/capacity-ledger.md: kvaudit's capacity model on every real start-up log of the
// corpus (see src/ledger/ledger.h). Usage: kvaudit_ledger [OUT.md] (default: stdout).
#include <fmt/format.h>

#include <filesystem>
#include <iostream>

#include "engines/engines.h"
#include "ledger/ledger.h"
#include "util/util.h"

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  try {
    const fs::path root = fs::path(KVAUDIT_SOURCE_DIR);
    const kvaudit::engines::Registry registry =
        kvaudit::engines::Registry::load(kvaudit::data_dir());
    const kvaudit::ledger::Ledger ledger =
        kvaudit::ledger::build_ledger(registry, root / "tests" / "fixtures" / "logs" / "real",
                                      root / "tests" / "fixtures" / "configs");
    const std::string text = kvaudit::ledger::ledger_markdown(ledger);
    if (argc > 1)
      kvaudit::write_file_atomically(argv[1], text);
    else
      std::cout << text;
  } catch (const kvaudit::InputError& error) {
    std::cerr << "kvaudit_ledger: " << error.what() << "\n";
    return 2;
  }
  return 0;
}
