// Tests for the Python repr reader behind server_args=ServerArgs(...).
#include <gtest/gtest.h>

#include "logs/logs.h"

namespace kvaudit::logs {
namespace {

TEST(Repr, ServerArgsWithEveryValueKind) {
  auto r = parse_python_repr(
      "ServerArgs(model_path='/m/Qwen', tp_size=8, mem_fraction_static=0.851, "
      "kv_cache_dtype='auto', quantization=None, trust_remote_code=True, enable_dp=False, "
      "cuda_graph_bs=[1, 2, 4], json_model_override_args='{}', lora={'a': (1, 2.5e-3)}, "
      "load=<LoadFormat.AUTO: 'auto'>, dtype=torch.bfloat16, esc='it\\'s \\\\ \\n \\x41', neg=-3, "
      "big=inf)");
  ASSERT_TRUE(r.complete) << r.error;
  const auto& v = r.value;
  EXPECT_EQ(v["model_path"], "/m/Qwen");
  EXPECT_EQ(v["tp_size"], 8);
  EXPECT_DOUBLE_EQ(v["mem_fraction_static"].get<double>(), 0.851);
  EXPECT_TRUE(v["quantization"].is_null());
  EXPECT_EQ(v["trust_remote_code"], true);
  EXPECT_EQ(v["enable_dp"], false);
  EXPECT_EQ(v["cuda_graph_bs"].size(), 3u);
  EXPECT_EQ(v["json_model_override_args"], "{}");
  EXPECT_DOUBLE_EQ(v["lora"]["a"][1].get<double>(), 2.5e-3);
  EXPECT_EQ(v["load"], "<LoadFormat.AUTO: 'auto'>");
  EXPECT_EQ(v["dtype"], "torch.bfloat16");
  EXPECT_EQ(v["esc"], "it's \\ \n A");
  EXPECT_EQ(v["neg"], -3);
}

TEST(Repr, TruncatedInputKeepsCompleteFieldsAndNeverThrows) {
  std::string full =
      "ServerArgs(model_path='/m', tp_size=8, kv_cache_dtype='fp8_e4m3', lists=[[1, 2], {'k': "
      "'v'}], "
      "tail='abc')";
  for (size_t cut = 11; cut <= full.size(); ++cut) {
    auto r = parse_python_repr(std::string_view(full).substr(0, cut));
    if (cut < full.size()) {
      EXPECT_FALSE(r.complete) << cut;
    }
    if (cut >= 64) {
      EXPECT_EQ(r.value["kv_cache_dtype"], "fp8_e4m3") << cut;
    } else {
      EXPECT_FALSE(r.value.contains("kv_cache_dtype")) << cut;  // never a half value
    }
  }
  EXPECT_TRUE(parse_python_repr(full).complete);
}

TEST(Repr, HostileInputStaysBounded) {
  std::string deep(100000, '[');
  auto r = parse_python_repr(deep);
  EXPECT_FALSE(r.complete);
  auto g = parse_python_repr("\x01\x02 ServerArgs(=)");
  EXPECT_FALSE(g.complete);
  auto e = parse_python_repr("ServerArgs(s='\\x4')");
  EXPECT_FALSE(e.error.empty() && !e.complete);
}

TEST(Repr, VllmNonDefaultArgsDict) {
  auto r = parse_python_repr(
      "{'model_tag': '~/m', 'kv_cache_dtype': 'fp8', 'max_model_len': 131072, "
      "'override_generation_config': {'temperature': 0.6}, 'served_model_name': ['a', 'b']}");
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.value["kv_cache_dtype"], "fp8");
  EXPECT_EQ(r.value["max_model_len"], 131072);
}

TEST(Lines, PrefixesAnsiAndCrlfAreRemoved) {
  auto j = normalise_line(
      "Mar 07 14:14:22 gpu01 sglang[4242]: [2026-03-07 14:14:22 TP3] Load weight begin. avail "
      "mem=93.12 GB\r");
  EXPECT_EQ(j.timestamp, "Mar 07 14:14:22");
  EXPECT_EQ(j.journal_ident, "sglang");
  EXPECT_EQ(j.rank, "TP3");
  EXPECT_EQ(j.message, "Load weight begin. avail mem=93.12 GB");
  auto v = normalise_line(
      "\x1b[1;36m(EngineCore_DP0 pid=15098)\x1b[0;0m INFO 02-12 08:34:25 [gpu_worker.py:360] "
      "Available KV cache memory: 12.57 GiB");
  EXPECT_EQ(v.message, "Available KV cache memory: 12.57 GiB");
  EXPECT_EQ(v.timestamp, "02-12 08:34:25");
  auto d = normalise_line(
      "qwen3-1  | (VllmWorker rank=3 pid=108) INFO 04-29 01:07:40 [loader.py:458] Loading weights "
      "took 558.63 seconds");
  EXPECT_EQ(d.rank, "rank=3");
  EXPECT_EQ(d.message, "Loading weights took 558.63 seconds");
  auto t = normalise_line("[rank0]:   File \"x.py\", line 1");
  EXPECT_EQ(t.rank, "rank=0");
}

}  // namespace
}  // namespace kvaudit::logs
