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

// Found by the fuzz_logs campaign: a keyword named _args, then a positional argument, threw
// nlohmann's type_error (push_back on a number) out of `kvaudit logs` (the input is in
// fuzz/corpus/logs/repr_keyword_named_args).
TEST(Repr, AKeywordNamedArgsThenAPositionalOneIsNotACrash) {
  ReprResult r = parse_python_repr("ServerArgs(_args=1, 2, tp_size=4)");
  EXPECT_EQ(r.value.value("tp_size", 0), 4);
  EXPECT_EQ(r.value.value("_args", 0), 1);
  r = parse_python_repr("ServerArgs(3, _args={'a': 1}, 2, tp_size=2)");
  EXPECT_EQ(r.value.value("tp_size", 0), 2);
}

TEST(Repr, VllmNonDefaultArgsDict) {
  auto r = parse_python_repr(
      "{'model_tag': '~/m', 'kv_cache_dtype': 'fp8', 'max_model_len': 131072, "
      "'override_generation_config': {'temperature': 0.6}, 'served_model_name': ['a', 'b']}");
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.value["kv_cache_dtype"], "fp8");
  EXPECT_EQ(r.value["max_model_len"], 131072);
}

// Lines as they reach users: journalctl's ellipsis at the end, a pasted "..." between
// fields, an elision inside a value, a quote lost in the middle. Every field before and
// after a cut is read; the damaged one is not; a number the input ends in is not known.
TEST(Repr, CutAndElidedServerArgsAreReadFieldByField) {
  auto end_cut = parse_python_repr(
      "ServerArgs(model_path='/m', tp_size=8, kv_cache_dtype='fp8_e4m3', "
      "mem_fraction_static=0.8\xE2\x80\xA6");
  EXPECT_FALSE(end_cut.complete);
  EXPECT_GE(end_cut.cuts, 1);
  EXPECT_EQ(end_cut.value["tp_size"], 8);
  EXPECT_EQ(end_cut.value["kv_cache_dtype"], "fp8_e4m3");
  EXPECT_FALSE(end_cut.value.contains("mem_fraction_static"));  // 0.8 of 0.85?

  auto pasted = parse_python_repr(
      "ServerArgs(model_path='/m', tokenizer_path='/m', ..., tp_size=8, kv_cache_dtype='auto', "
      "mem_fraction_static=0.85, port=30000)");
  EXPECT_FALSE(pasted.complete);
  EXPECT_EQ(pasted.cuts, 1);
  EXPECT_EQ(pasted.value["model_path"], "/m");
  EXPECT_EQ(pasted.value["tp_size"], 8);
  EXPECT_EQ(pasted.value["kv_cache_dtype"], "auto");
  EXPECT_DOUBLE_EQ(pasted.value["mem_fraction_static"].get<double>(), 0.85);
  EXPECT_EQ(pasted.value["port"], 30000);

  auto in_value = parse_python_repr(
      "ServerArgs(model_path='/models/Qw\xE2\x80\xA6"
      "en3', tp_size=16, dtype='auto', "
      "kv_cache_dtype='bf16')");
  EXPECT_FALSE(in_value.value.contains("model_path"));
  EXPECT_EQ(in_value.value["tp_size"], 16);
  EXPECT_EQ(in_value.value["kv_cache_dtype"], "bf16");

  auto lost_quote = parse_python_repr(
      "ServerArgs(model_path='/m', kv_cache_dtype='fp8_e4m3, mem_fraction_static=0.85, "
      "tp_size=4)");
  EXPECT_FALSE(lost_quote.complete);
  EXPECT_FALSE(lost_quote.value.contains("kv_cache_dtype"));
  EXPECT_EQ(lost_quote.value["tp_size"], 4);
  EXPECT_DOUBLE_EQ(lost_quote.value["mem_fraction_static"].get<double>(), 0.85);

  auto cut_number = parse_python_repr("ServerArgs(model_path='/m', tp_size=1");
  EXPECT_FALSE(cut_number.value.contains("tp_size"));  // tp_size=16 cut after the 1
  EXPECT_EQ(cut_number.value["model_path"], "/m");

  auto whole = parse_python_repr("ServerArgs(model_path='/m', tp_size=16)");
  EXPECT_TRUE(whole.complete);
  EXPECT_EQ(whole.cuts, 0);
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
