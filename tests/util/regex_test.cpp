// util's Regex: PCRE2 in byte mode, the one regex engine every module matches with.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "util/util.h"

namespace kvaudit {
namespace {

TEST(Regex, SearchGivesEachGroupAndNulloptForAGroupThatTookNoPart) {
  const Regex scale(R"(layers\.(\d+)\.self_attn\.(?:(k_scale)|(v_scale))$)");
  EXPECT_EQ(scale.group_count(), 3u);
  auto match = scale.search("model.layers.12.self_attn.v_scale");
  ASSERT_TRUE(match);
  EXPECT_EQ(match->at(0), "layers.12.self_attn.v_scale");
  EXPECT_EQ(match->at(1), "12");
  EXPECT_FALSE(match->at(2).has_value());
  EXPECT_EQ(match->at(3), "v_scale");
  EXPECT_FALSE(scale.search("model.layers.12.mlp.down_proj.weight"));
}

TEST(Regex, FullMatchNeedsTheWholeSubject) {
  const Regex k_proj(R"((.*\.layers\.(\d+)\.self_attn\.)k_proj\.weight)");
  EXPECT_TRUE(k_proj.full_match("model.layers.3.self_attn.k_proj.weight"));
  EXPECT_FALSE(k_proj.full_match("model.layers.3.self_attn.k_proj.weight_scale"));
  EXPECT_FALSE(k_proj.full_match("x model.layers.3.self_attn.k_proj.weight\n"));
  EXPECT_TRUE(k_proj.search("x model.layers.3.self_attn.k_proj.weight_scale"));
}

// As std::regex did (and unlike PCRE2's default and Python's re): `$` is the end of the
// subject, so a name with a trailing newline is not a scale tensor.
TEST(Regex, DollarIsTheEndOfTheSubjectOnly) {
  const Regex scale(R"(self_attn\.(k_scale)$)");
  EXPECT_TRUE(scale.search("layers.0.self_attn.k_scale"));
  EXPECT_FALSE(scale.search("layers.0.self_attn.k_scale\n"));
}

TEST(Regex, BytesThatAreNotUtf8AreMatchedAsBytes) {
  const Regex any_text("avail mem=([0-9.]+) GB");
  const std::string line = std::string("\xff\xfe avail mem=94.57 GB \xc3", 24);
  auto match = any_text.search(line);
  ASSERT_TRUE(match);
  EXPECT_EQ(match->at(1), "94.57");
  EXPECT_TRUE(Regex("^$").full_match(std::string_view()));
}

TEST(Regex, APatternThatDoesNotCompileIsRefusedWithPcre2sReason) {
  try {
    Regex broken("layers\\.(\\d+");
    FAIL() << "an unclosed group compiled";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("missing closing parenthesis"), std::string::npos)
        << error.what();
  }
}

// Compiled once and shared: the first matches race to JIT-compile it.
TEST(Regex, OneRegexMatchesFromManyThreads) {
  const Regex number(R"(#tokens: ([0-9]+))");
  std::atomic<int> matched{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const std::string line = "KV Cache is allocated. #tokens: " + std::to_string(t * 1000 + i);
        auto match = number.search(line);
        if (match && match->at(1) == std::to_string(t * 1000 + i)) ++matched;
      }
    });
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(matched, 1600);
}

}  // namespace
}  // namespace kvaudit
