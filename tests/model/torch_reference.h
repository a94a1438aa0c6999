// The tiny models' reference outputs (tools/torch_reference*.py) and how the model tests
// compare with them.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "util/util.h"

namespace kvaudit::model::test_support {

struct Reference {
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // [tokens, vocab]
};

// A little-endian F32 logits file, whole.
inline std::vector<float> read_logits(const std::filesystem::path& file) {
  std::vector<float> logits;
  std::ifstream in(file, std::ios::binary);
  in.seekg(0, std::ios::end);
  logits.resize(static_cast<size_t>(in.tellg()) / sizeof(float));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(logits.data()),
          static_cast<std::streamsize>(logits.size() * sizeof(float)));
  return logits;
}

inline Reference load_reference(const std::filesystem::path& dir) {
  Reference ref;
  auto json = nlohmann::json::parse(read_text_file(dir / "reference.json"));
  for (int id : json["tokens"]) ref.tokens.push_back(id);
  ref.logits = read_logits(dir / "logits.f32");
  return ref;
}

// max |ours - reference| / max |reference| over all logits (infinite if ours holds NaN/inf).
inline double relative_error(const std::vector<float>& ours, const std::vector<float>& reference) {
  EXPECT_EQ(ours.size(), reference.size());
  double max_diff = 0.0, max_ref = 0.0;
  for (size_t i = 0; i < ours.size() && i < reference.size(); ++i) {
    if (!std::isfinite(ours[i])) return INFINITY;
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(ours[i]) - reference[i]));
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(reference[i])));
  }
  return max_diff / max_ref;
}

}  // namespace kvaudit::model::test_support
