// The 16-bit overlay for engines with no 16-bit KV value (TensorRT-LLM): written next to the
// original, config files rewritten with the KV quantization null, the rest linked, the
// original untouched, and refused where it would be wrong or unsafe.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "calibrate/calibrate.h"
#include "common/fixtures.h"
#include "common/registry.h"
#include "util/json.h"
#include "util/util.h"

namespace kvaudit::calibrate {
namespace {

namespace fs = std::filesystem;

TEST(SixteenBitOverlay, WrittenBesideTheOriginalAndResolvedUnderAuto) {
  const fs::path original = kvaudit::testing::fixture_checkpoint("llama-modelopt-kv-no-scales");
  const std::string before = read_text_file(original / "hf_quant_config.json");
  const checkpoint::ModelFacts model = checkpoint::read_checkpoint(original);
  const fs::path out = fs::temp_directory_path() / "kvaudit-16bit-overlay-test";
  fs::remove_all(out);
  engines::LaunchFlags flags;
  flags.engine = "trtllm";
  const auto& trtllm = kvaudit::testing::engine("trtllm");
  SixteenBitOverlayResult result = write_sixteen_bit_overlay(trtllm, flags, model, out);
  EXPECT_EQ(result.resolved.kv_cache_dtype, "bf16");
  EXPECT_FALSE(result.resolved.quantized);
  ASSERT_EQ(result.edited.size(), 1u);
  const nlohmann::json written = read_json_file(out / "hf_quant_config.json");
  EXPECT_TRUE(written["quantization"]["kv_cache_quant_algo"].is_null());
  EXPECT_EQ(written["quantization"]["quant_algo"], "FP8") << "only the KV key changes";
  EXPECT_TRUE(fs::is_symlink(out / "config.json"));
  EXPECT_FALSE(fs::is_symlink(out / "hf_quant_config.json"));
  EXPECT_EQ(read_text_file(original / "hf_quant_config.json"), before) << "original untouched";
  // Written again over its own earlier output: allowed.
  EXPECT_NO_THROW(write_sixteen_bit_overlay(trtllm, flags, model, out));
  fs::remove_all(out);
}

TEST(SixteenBitOverlay, RefusedWhereItWouldBeWrongOrUnsafe) {
  const fs::path original = kvaudit::testing::fixture_checkpoint("llama-modelopt-kv-no-scales");
  const checkpoint::ModelFacts model = checkpoint::read_checkpoint(original);
  engines::LaunchFlags flags;
  const auto& trtllm = kvaudit::testing::engine("trtllm");
  // The checkpoint folder itself.
  EXPECT_THROW(write_sixteen_bit_overlay(trtllm, flags, model, original), InputError);
  // A folder with someone else's files.
  const fs::path foreign = fs::temp_directory_path() / "kvaudit-16bit-foreign";
  fs::create_directories(foreign);
  std::ofstream(foreign / "notes.txt") << "mine";
  EXPECT_THROW(write_sixteen_bit_overlay(trtllm, flags, model, foreign), InputError);
  EXPECT_TRUE(fs::exists(foreign / "notes.txt"));
  fs::remove_all(foreign);
  // A folder that cannot be created (below a file): bad input, not an internal error.
  EXPECT_THROW(write_sixteen_bit_overlay(trtllm, flags, model, "/dev/null/overlay"), InputError);
  // An engine whose flag gives a 16-bit cache needs none.
  EXPECT_THROW(write_sixteen_bit_overlay(kvaudit::testing::engine("sglang"), flags, model,
                                         fs::temp_directory_path() / "kvaudit-16bit-sglang"),
               InputError);
  // A checkpoint that declares no KV quantization: nothing to remove.
  const checkpoint::ModelFacts plain =
      checkpoint::read_checkpoint(kvaudit::testing::fixture_checkpoint("llama-bf16-plain"));
  EXPECT_THROW(write_sixteen_bit_overlay(trtllm, flags, plain,
                                         fs::temp_directory_path() / "kvaudit-16bit-plain"),
               InputError);
}

}  // namespace
}  // namespace kvaudit::calibrate
