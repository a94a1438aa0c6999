// Reads a JSON array of strings on stdin and prints the kvaudit token ids of each (a JSON
// array of arrays): the C++ side of differential_check.mjs. Build from the repository root:
//   g++ -std=c++20 -O2 -Isrc tools/goldens/encode_batch.cpp build-X/libkv_tokenizer.a \
//       build-X/libkv_util.a -lpcre2-8 -lutf8proc -lsimdjson -lfmt -o /tmp/encode_batch
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: encode_batch TOKENIZER_DIR < texts.json\n";
    return 2;
  }
  auto tokenizer = kvaudit::tokenizer::Tokenizer::load(argv[1]);
  std::string input{std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
  nlohmann::json out = nlohmann::json::array();
  for (const auto& text : nlohmann::json::parse(input)) {
    out.push_back(tokenizer.encode(text.get<std::string>()));
  }
  std::cout << out.dump() << '\n';
}
