// Remote audits against the fake hub (fake_hub.h): the same facts, findings, resolved dtype,
// scale table and capacity as the local folder; what it costs; the cache; and the faults a
// real hub, mirror or CDN can produce, each a one-line error or a correct retry.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "audit/audit.h"
#include "common/fixtures.h"
#include "common/registry.h"
#include "engines/engines.h"
#include "fake_hub.h"
#include "hub/hub.h"
#include "plan/plan.h"
#include "util/util.h"

namespace kvaudit::hub {
namespace {

namespace fs = std::filesystem;
using testing::FakeHub;
using ::testing::HasSubstr;
using testing::kCommit;
using testing::RawServer;

fs::path fresh_cache(const std::string& name) {
  fs::path dir =
      fs::temp_directory_path() / ("kvaudit-hub-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir;
}

fs::path demo_dir() {
  return kvaudit::testing::demo_checkpoint();
}

HubOptions options_for(const std::string& endpoint, const fs::path& cache) {
  HubOptions options;
  options.endpoint = endpoint;
  options.cache_dir = cache;
  options.hf_cache = cache / "no-hf-cache";
  options.token = "-";  // no token from the environment; "-" is never sent (no gated repo)
  options.client.max_retries = 3;
  options.client.backoff_initial = std::chrono::milliseconds(5);
  options.client.backoff_max = std::chrono::milliseconds(20);
  options.client.connect_timeout = std::chrono::milliseconds(1000);
  options.client.read_timeout = std::chrono::milliseconds(5000);
  return options;
}

audit::CheckResult check(const checkpoint::ModelFacts& model, const std::string& engine,
                         const std::string& version) {
  audit::CheckInput input;
  input.model = model;
  input.flags.engine = engine;
  input.flags.engine_version = version;
  input.flags.kv_cache_dtype = "auto";
  input.flags.tp = 8;
  input.engine = &kvaudit::testing::engine(engine);
  input.version_given = true;
  return audit::run_check(input);
}

std::string finding_ids(const audit::CheckResult& r) {
  std::string out;
  for (const auto& f : r.findings)
    out += f.id + "/" + std::string(report::severity_name(f.severity)) + " ";
  return out;
}

// Everything an audit reads, local against remote.
void expect_same_audit(const checkpoint::ModelFacts& local, const checkpoint::ModelFacts& remote) {
  EXPECT_EQ(remote.architecture, local.architecture);
  EXPECT_EQ(remote.num_layers, local.num_layers);
  EXPECT_EQ(remote.tensor_count, local.tensor_count);
  EXPECT_EQ(remote.weight_bytes, local.weight_bytes);
  EXPECT_EQ(remote.shard_files, local.shard_files);
  EXPECT_EQ(remote.kv_projection_weights, local.kv_projection_weights);
  ASSERT_EQ(remote.kv_scales.size(), local.kv_scales.size());
  for (size_t i = 0; i < local.kv_scales.size(); ++i) {
    EXPECT_EQ(remote.kv_scales[i].name, local.kv_scales[i].name);
    EXPECT_EQ(remote.kv_scales[i].values, local.kv_scales[i].values) << local.kv_scales[i].name;
  }
  ASSERT_EQ(remote.quant.has_value(), local.quant.has_value());
  if (local.quant) {
    EXPECT_EQ(remote.quant->kv_declared(), local.quant->kv_declared());
  }
  for (const char* engine : {"sglang", "vllm"}) {
    const std::string version = engine == std::string("sglang") ? "0.5.15" : "0.33.0";
    audit::CheckResult a = check(local, engine, version), b = check(remote, engine, version);
    EXPECT_EQ(finding_ids(b), finding_ids(a)) << engine;
    EXPECT_EQ(b.resolved.kv_cache_dtype, a.resolved.kv_cache_dtype);
    EXPECT_EQ(b.resolved.scale_source, a.resolved.scale_source);
    EXPECT_EQ(b.resolved.loaded_scale_names, a.resolved.loaded_scale_names);
    plan::PlanOptions options;
    options.engine = engine;
    options.parallel.tp = 8;
    options.gpu_memory_bytes = int64_t{97871} << 20;
    plan::CapacityPlan pa = plan::plan_capacity(kvaudit::testing::registry(), local, options),
                       pb = plan::plan_capacity(kvaudit::testing::registry(), remote, options);
    ASSERT_EQ(pb.rows.size(), pa.rows.size());
    for (size_t i = 0; i < pa.rows.size(); ++i) {
      EXPECT_EQ(pb.rows[i].cell_bytes_per_token_per_gpu, pa.rows[i].cell_bytes_per_token_per_gpu);
      EXPECT_EQ(pb.rows[i].max_total_tokens, pa.rows[i].max_total_tokens);
    }
  }
}

TEST(Refs, ParseAndRefuse) {
  auto a = parse_hub_ref("nvidia/Qwen3.5-397B-A17B-NVFP4");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->repo, "nvidia/Qwen3.5-397B-A17B-NVFP4");
  EXPECT_EQ(a->revision, "main");
  auto b = parse_hub_ref("hf://org/model@refs/pr/4");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->revision, "refs/pr/4");
  for (const char* bad : {"model", "a/b/c", "/abs/path", "./org/model", "org/", "org/mo del",
                          "org/model@", "../x/y", "org/.."})
    EXPECT_FALSE(parse_hub_ref(bad)) << bad;
}

// What the demo's audit must read: its shards' 8-byte length prefixes and headers, and the
// key-norm vectors of its 15 attention layers (256 bf16 values each), read by range like
// scale values because their weights bound the cached keys (the demo ships no KV scales).
struct DemoNeeds {
  uint64_t header_bytes = 0;  // the JSON headers, without their 8-byte prefixes
  uint64_t prefix_and_header_bytes = 0;
  uint64_t norm_bytes = 15 * 256 * 2;
  uint64_t configs = 0;  // config.json + hf_quant_config.json
  uint64_t index = 0;    // model.safetensors.index.json
};
DemoNeeds demo_needs(const checkpoint::ModelFacts& local) {
  DemoNeeds out;
  for (const auto& shard : local.shard_files)
    out.header_bytes += checkpoint::read_safetensors_header(demo_dir() / shard).header_bytes;
  out.prefix_and_header_bytes = out.header_bytes + 8 * local.shard_files.size();
  out.configs = fs::file_size(demo_dir() / "config.json") +
                fs::file_size(demo_dir() / "hf_quant_config.json");
  out.index = fs::file_size(demo_dir() / "model.safetensors.index.json");
  return out;
}

// The measurement the issue asks for, one line per run (re-run it with
// `build/test_hub --gtest_filter='HubAudit.Demo*'`).
void print_demo_cost(const char* how, const HubCheckpoint& opened, const DemoNeeds& needs) {
  const uint64_t needed = needs.prefix_and_header_bytes + needs.norm_bytes;
  std::cout << "  [hub] demo, " << how << ": " << opened.stats.requests << " requests, "
            << opened.stats.bytes << " bytes read; headers with their prefixes "
            << needs.prefix_and_header_bytes << " + key-norm values " << needs.norm_bytes << " = "
            << needed << "; read/needed = " << static_cast<double>(opened.stats.bytes) / needed
            << "\n";
}

// The motivating demo (371,444 tensors in 32 shards): the same audit, what it cost (the
// headers, not the 40 MB index: the shards come from the hub's file listing), and a second
// run of the same revision that fetches no file.
TEST(HubAudit, DemoCheckpointReadsAsTheLocalFolderAndCachesByCommit) {
  const fs::path cache = fresh_cache("demo");
  FakeHub hub({.repos = {{"nvidia/demo", demo_dir()}}});
  HubOptions options = options_for(hub.endpoint(), cache);
  HubCheckpoint first = open_hub_checkpoint(*parse_hub_ref("nvidia/demo"), options);
  EXPECT_EQ(first.commit, kCommit);
  EXPECT_EQ(first.stats.weight_bytes_read, 0u);
  checkpoint::ModelFacts remote = read_hub_checkpoint(first);
  checkpoint::ModelFacts local = checkpoint::read_checkpoint(demo_dir());
  expect_same_audit(local, remote);
  EXPECT_EQ(remote.dir.string(), "hf://nvidia/demo@0123456789ab");
  EXPECT_THAT(remote.source, HasSubstr(kCommit));
  EXPECT_THAT(remote.source, HasSubstr("shards from the hub's file listing"));
  EXPECT_TRUE(first.notes.empty());
  // The index was never asked for; the listing once, pinned to the commit.
  EXPECT_EQ(hub.requested("model.safetensors.index.json"), 0);
  EXPECT_EQ(hub.requested("/api/models/nvidia/demo/tree/" + kCommit), 1);
  EXPECT_FALSE(fs::exists(first.dir / "model.safetensors.index.json"));
  ASSERT_EQ(local.k_norms.size(), 15u);
  const DemoNeeds needs = demo_needs(local);
  print_demo_cost("shards from the file listing", first, needs);
  // What an audit needs and nothing else: the prefixes and headers, the key norms, the two
  // configs and the listing (one page of 35 entries, about 5 KB); the resolve is a bodiless
  // 307.
  const uint64_t needed = needs.prefix_and_header_bytes + needs.norm_bytes;
  ASSERT_GE(first.stats.bytes, needed + needs.configs);
  EXPECT_LT(first.stats.bytes - needed - needs.configs, 8u << 10);
  EXPECT_LE(static_cast<double>(first.stats.bytes), 1.05 * static_cast<double>(needed));
  // The resolve, two files (redirect + answer), the listing, per shard a redirect, its
  // 8-byte prefix and its header from the CDN URL the redirect gave, and one range per
  // key-norm vector.
  EXPECT_EQ(first.stats.requests, 1 + 2 * 2 + 1 + 32 * 3 + 15);
  // The stand-in shards are sparse: their real size, almost nothing on disk.
  EXPECT_EQ(fs::file_size(first.dir / local.shard_files[0]),
            fs::file_size(demo_dir() / local.shard_files[0]));

  const int before = hub.hub_requests() + hub.cdn_requests();
  HubCheckpoint again = open_hub_checkpoint(*parse_hub_ref("nvidia/demo"), options);
  EXPECT_EQ(again.stats.files_fetched, 0);
  EXPECT_EQ(again.stats.requests, 1);  // main -> its commit
  EXPECT_EQ(hub.hub_requests() + hub.cdn_requests() - before, 1);
  HubCheckpoint pinned = open_hub_checkpoint(*parse_hub_ref("nvidia/demo@" + kCommit), options);
  EXPECT_EQ(pinned.stats.requests, 0);
  options.offline = true;
  EXPECT_EQ(open_hub_checkpoint(*parse_hub_ref("nvidia/demo"), options).commit, kCommit);
  fs::remove_all(cache);
}

// The same demo from a mirror that does not serve the listing (/api/ answers 404): the index
// is read as before the listing was used, with a note saying why; the same audit. This is
// also the "before" of the measurement: the index costs 40 MB.
TEST(HubAudit, DemoWithoutTheListingReadsTheIndex) {
  const fs::path cache = fresh_cache("demo-index");
  FakeHub hub({.repos = {{"nvidia/demo", demo_dir()}}, .listing_status = 404});
  HubCheckpoint opened =
      open_hub_checkpoint(*parse_hub_ref("nvidia/demo"), options_for(hub.endpoint(), cache));
  EXPECT_EQ(opened.stats.weight_bytes_read, 0u);
  checkpoint::ModelFacts local = checkpoint::read_checkpoint(demo_dir());
  checkpoint::ModelFacts remote = read_hub_checkpoint(opened);
  expect_same_audit(local, remote);
  EXPECT_THAT(remote.source, HasSubstr("shards from the index"));
  ASSERT_EQ(opened.notes.size(), 1u);
  EXPECT_THAT(opened.notes[0], HasSubstr("answered HTTP 404"));
  EXPECT_THAT(opened.notes[0], HasSubstr("model.safetensors.index.json"));
  EXPECT_THAT(remote.notes, ::testing::Contains(opened.notes[0]));
  EXPECT_EQ(hub.requested("model.safetensors.index.json"), 2);  // the redirect and the file
  const DemoNeeds needs = demo_needs(local);
  print_demo_cost("shards from the index (the listing refused)", opened, needs);
  // As before: the index's names put the first range inside the header, then the rest; the
  // refused listing adds one request and its 21-byte error body.
  EXPECT_EQ(opened.stats.bytes,
            needs.prefix_and_header_bytes + needs.norm_bytes + needs.configs + needs.index + 21);
  EXPECT_EQ(opened.stats.requests, 1 + 3 * 2 + 1 + 32 * 3 + 15);
  fs::remove_all(cache);
}

TEST(HubAudit, SingleFileCheckpointsWithScalesReadAsLocal) {
  const fs::path cache = fresh_cache("fixtures");
  std::map<std::string, fs::path> repos;
  const std::vector<std::string> names = {"qwen35-modelopt-fp8-kv-scales",
                                          "llama-modelopt-unit-scales",
                                          "llama-ct-fp8-per-head",
                                          "llama-bf16-plain",
                                          "deepseek-v3-mla",
                                          "llama-modelopt-zero-kv"};
  for (const auto& name : names) repos["org/" + name] = kvaudit::testing::fixture_checkpoint(name);
  FakeHub hub({.repos = repos});
  HubOptions options = options_for(hub.endpoint(), cache);
  for (const auto& name : names) {
    SCOPED_TRACE(name);
    HubCheckpoint remote = open_hub_checkpoint(*parse_hub_ref("org/" + name), options);
    EXPECT_EQ(remote.stats.weight_bytes_read, 0u);
    expect_same_audit(checkpoint::read_checkpoint(repos["org/" + name]),
                      read_hub_checkpoint(remote));
  }
  fs::remove_all(cache);
}

TEST(HubAudit, TokenGoesToTheHubNeverToTheCdn) {
  const fs::path cache = fresh_cache("gated");
  FakeHub hub(
      {.repos = {{"org/gated", kvaudit::testing::fixture_checkpoint("llama-modelopt-unit-scales")}},
       .token = "hf_secret"});
  HubOptions options = options_for(hub.endpoint(), cache);
  options.token = "";
  try {
    open_hub_checkpoint(*parse_hub_ref("org/gated"), options);
    FAIL() << "a gated repository opened without a token";
  } catch (const InputError& error) {
    EXPECT_THAT(error.what(), HasSubstr("gated"));
    EXPECT_THAT(error.what(), HasSubstr("--hf-token"));
  }
  options.token = "hf_secret";
  HubCheckpoint opened = open_hub_checkpoint(*parse_hub_ref("org/gated"), options);
  EXPECT_GT(hub.cdn_requests(), 0);
  for (const auto& authorization : hub.cdn_authorization()) EXPECT_EQ(authorization, "");
  fs::remove_all(cache);
}

TEST(HubAudit, MissingRepositoryRevisionAndOptionalFiles) {
  const fs::path cache = fresh_cache("missing");
  FakeHub hub({.repos = {{"org/plain", kvaudit::testing::fixture_checkpoint("llama-bf16-plain")}}});
  HubOptions options = options_for(hub.endpoint(), cache);
  EXPECT_THAT([&] { open_hub_checkpoint(*parse_hub_ref("org/nothing"), options); },
              ::testing::ThrowsMessage<InputError>(HasSubstr("no repository org/nothing")));
  EXPECT_THAT([&] { open_hub_checkpoint(*parse_hub_ref("org/plain@v9"), options); },
              ::testing::ThrowsMessage<InputError>(HasSubstr("no revision 'v9'")));
  // No hf_quant_config.json and no index (EntryNotFound): a plain single-file checkpoint.
  HubCheckpoint plain = open_hub_checkpoint(*parse_hub_ref("org/plain"), options);
  EXPECT_FALSE(fs::exists(plain.dir / "hf_quant_config.json"));
  EXPECT_EQ(read_hub_checkpoint(plain).shard_files, std::vector<std::string>{"model.safetensors"});
  options.offline = true;
  options.cache_dir = fresh_cache("offline-empty");
  EXPECT_THAT([&] { open_hub_checkpoint(*parse_hub_ref("org/plain"), options); },
              ::testing::ThrowsMessage<InputError>(HasSubstr("--offline")));
  fs::remove_all(cache);
}

TEST(HubFaults, RateLimitThenSuccess) {
  const fs::path cache = fresh_cache("429");
  FakeHub hub({.repos = {{"org/m", kvaudit::testing::fixture_checkpoint("llama-bf16-plain")}},
               .rate_limit_first = 2});
  HubCheckpoint opened =
      open_hub_checkpoint(*parse_hub_ref("org/m"), options_for(hub.endpoint(), cache));
  EXPECT_EQ(opened.commit, kCommit);
  fs::remove_all(cache);
}

// An audit the hub's answers make impossible: one line naming the problem, and nothing
// half-fetched left in the cache.
void expect_refused_and_nothing_cached(const HubOptions& options, const fs::path& cache,
                                       const std::string& expected) {
  try {
    open_hub_checkpoint(*parse_hub_ref("org/m"), options);
    ADD_FAILURE() << "no error";
  } catch (const InputError& error) {
    EXPECT_THAT(error.what(), HasSubstr(expected));
    EXPECT_EQ(std::string(error.what()).find('\n'), std::string::npos);
  }
  EXPECT_FALSE(fs::exists(cache / "models--org--m" / kCommit));
  fs::remove_all(cache);
}

TEST(HubFaults, LyingOrBrokenServersAreOneLineErrors) {
  const fs::path model = kvaudit::testing::fixture_checkpoint("llama-bf16-plain");
  struct Case {
    testing::FakeHubConfig config;
    std::string expected;
  };
  std::vector<Case> cases;
  cases.push_back({{.repos = {{"org/m", model}}, .redirect_loop = true}, "redirect loop"});
  cases.push_back({{.repos = {{"org/m", model}}, .gzip_ranges = true}, "content-encoded (gzip)"});
  cases.push_back({{.repos = {{"org/m", model}}, .wrong_content_range = true}, "the server sent"});
  cases.push_back({{.repos = {{"org/m", model}}, .header_length_override = uint64_t{1} << 60},
                   "exceeds the format's 100 MB limit"});
  for (auto& c : cases) {
    SCOPED_TRACE(c.expected);
    const fs::path cache = fresh_cache("fault");
    FakeHub hub(c.config);
    expect_refused_and_nothing_cached(options_for(hub.endpoint(), cache), cache, c.expected);
  }
}

// The file listing in pages (one entry each): every page is read, the shards are the
// listed ones, the index is never asked for, and the audit is the local one.
TEST(HubListingAudit, PagesAreFollowedAndTheIndexIsNotRead) {
  const fs::path model = kvaudit::testing::fixture_checkpoint("qwen3-moe-modelopt-fp8");
  ASSERT_TRUE(fs::exists(model / "model.safetensors.index.json"));
  const fs::path cache = fresh_cache("pages");
  FakeHub hub({.repos = {{"org/moe", model}}, .listing_page_entries = 1});
  HubCheckpoint opened =
      open_hub_checkpoint(*parse_hub_ref("org/moe"), options_for(hub.endpoint(), cache));
  const checkpoint::ModelFacts local = checkpoint::read_checkpoint(model);
  ASSERT_EQ(local.shard_files.size(), 2u);
  expect_same_audit(local, read_hub_checkpoint(opened));
  EXPECT_EQ(opened.stats.weight_bytes_read, 0u);
  EXPECT_EQ(hub.requested("model.safetensors.index.json"), 0);
  // config.json, hf_quant_config.json, the index and two shards: five pages.
  EXPECT_EQ(hub.requested("/tree/" + kCommit), 5);
  EXPECT_THAT(hub.hub_log(),
              ::testing::Contains("/api/models/org/moe/tree/" + kCommit + "?cursor=4"));
  fs::remove_all(cache);
}

// A listing that cannot be had (refused, or a page that is not JSON, as from a mirror that
// serves an HTML page for /api/): the index is read, with a note that says why.
TEST(HubListingAudit, RefusedOrNotJsonFallsBackToTheIndex) {
  const fs::path model = kvaudit::testing::fixture_checkpoint("qwen3-moe-modelopt-fp8");
  const checkpoint::ModelFacts local = checkpoint::read_checkpoint(model);
  struct Case {
    testing::FakeHubConfig config;
    std::string note;
  };
  std::vector<Case> cases;
  cases.push_back({{.repos = {{"org/moe", model}}, .listing_status = 403}, "answered HTTP 403"});
  cases.push_back({{.repos = {{"org/moe", model}}, .listing_status = 404}, "answered HTTP 404"});
  cases.push_back({{.repos = {{"org/moe", model}}, .listing_body = "<!doctype html><p>mirror"},
                   "something other than a JSON array"});
  for (auto& c : cases) {
    SCOPED_TRACE(c.note);
    const fs::path cache = fresh_cache("fallback");
    FakeHub hub(c.config);
    HubCheckpoint opened =
        open_hub_checkpoint(*parse_hub_ref("org/moe"), options_for(hub.endpoint(), cache));
    expect_same_audit(local, read_hub_checkpoint(opened));
    EXPECT_EQ(hub.requested("model.safetensors.index.json"), 2);
    ASSERT_EQ(opened.notes.size(), 1u);
    EXPECT_THAT(opened.notes[0], HasSubstr(c.note));
    EXPECT_THAT(opened.source, HasSubstr("shards from the index"));
    fs::remove_all(cache);
  }
}

// A listing that lies: one line naming the URL and the problem, and nothing half-fetched
// left in the cache.
TEST(HubListingAudit, LyingListingsAreOneLineErrors) {
  const fs::path model = kvaudit::testing::fixture_checkpoint("llama-modelopt-unit-scales");
  struct Case {
    testing::FakeHubConfig config;
    size_t max_entries = 100'000;
    std::string expected;
  };
  std::vector<Case> cases;
  cases.push_back({{.repos = {{"org/m", model}}, .listing_size_delta = 4096},
                   100'000,
                   "the hub's file listing gives"});
  cases.push_back(
      {{.repos = {{"org/m", model}},
        .listing_extra = {R"({"type":"file","oid":"x","size":4096,"lfs":{"oid":"y","size":4096,)"
                          R"("pointerSize":134},"path":"extra.safetensors"})"}},
       100'000,
       "has no extra.safetensors at " + kCommit});
  cases.push_back({{.repos = {{"org/m", model}},
                    .listing_extra = std::vector<std::string>(
                        8, R"({"type":"directory","oid":"x","size":0,"path":"d"})")},
                   6,
                   "more than 6 entries"});
  cases.push_back({{.repos = {{"org/m", model}},
                    .listing_extra = {R"({"type":"file","oid":"x","size":-1,"path":"a.bin"})"}},
                   100'000,
                   "gives 'a.bin' no byte count"});
  cases.push_back({{.repos = {{"org/m", model}},
                    .listing_extra = {R"({"type":"file","oid":"x","size":1,"path":"../x"})"}},
                   100'000,
                   "unusable path '../x'"});
  for (auto& c : cases) {
    SCOPED_TRACE(c.expected);
    const fs::path cache = fresh_cache("lying");
    FakeHub hub(c.config);
    HubOptions options = options_for(hub.endpoint(), cache);
    options.max_listing_entries = c.max_entries;
    expect_refused_and_nothing_cached(options, cache, c.expected);
  }
}

// A minimal hub on a raw socket, for what httplib will not do: Range ignored (the client
// stops reading once it has its bytes), a truncated body, a reset in the middle of the
// headers.
struct RawHub {
  fs::path model;
  enum class Fault { none, ignore_range, truncate, reset_once } fault = Fault::none;
  std::atomic<int> resets{0};
  std::atomic<uint64_t> offered{0};  // body bytes sent (ignore_range)
  RawServer::Reply operator()(const std::string& request) {
    std::smatch m;
    static const std::regex line(R"(GET /org/m/resolve/([^/]+)/(\S+) HTTP)");
    static const std::regex range(R"(Range: bytes=([0-9]+)-([0-9]+))");
    if (!std::regex_search(request, m, line))
      return {"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"};
    const fs::path file = model / m[2].str();
    std::error_code ec;
    if (!fs::exists(file, ec))
      return {"HTTP/1.1 404 Not Found\r\nX-Error-Code: EntryNotFound\r\nX-Repo-Commit: " + kCommit +
              "\r\nContent-Length: 0\r\n\r\n"};
    const uint64_t total = fs::file_size(file);
    uint64_t first = 0, last = total - 1;
    if (std::regex_search(request, m, range))
      first = std::stoull(m[1]), last = std::min<uint64_t>(std::stoull(m[2]), total - 1);
    if (fault == Fault::reset_once && resets++ == 0)
      return {"HTTP/1.1 206 Partial Content\r\nContent-Ra", 36};
    std::ifstream in(file, std::ios::binary);
    auto read = [&](uint64_t from, uint64_t n) {
      std::string bytes(n, '\0');
      in.seekg(static_cast<std::streamoff>(from));
      in.read(bytes.data(), static_cast<std::streamsize>(n));
      return bytes;
    };
    std::string head = "X-Repo-Commit: " + kCommit + "\r\nConnection: close\r\n";
    if (fault == Fault::ignore_range) {
      // The whole file's length, and as many bytes as the client will read before it stops
      // (then the connection closes, as when a client hangs up on a large body).
      const uint64_t sent = std::min<uint64_t>(total, last + 1 + 4096);
      offered += sent;
      return {"HTTP/1.1 200 OK\r\n" + head + "Content-Length: " + std::to_string(total) +
              "\r\n\r\n" + read(0, sent)};
    }
    std::string body = read(first, last - first + 1);
    if (fault == Fault::truncate && body.size() > 4) body.resize(body.size() / 2);
    return {"HTTP/1.1 206 Partial Content\r\n" + head + "Content-Range: bytes " +
            std::to_string(first) + "-" + std::to_string(last) + "/" + std::to_string(total) +
            "\r\nContent-Length: " + std::to_string(last - first + 1) + "\r\n\r\n" + body};
  }
};

TEST(HubFaults, RangeIgnoredTruncatedAndResetAnswers) {
  const fs::path model = kvaudit::testing::fixture_checkpoint("llama-modelopt-unit-scales");
  const checkpoint::ModelFacts local = checkpoint::read_checkpoint(model);
  {
    RawHub raw{model, RawHub::Fault::ignore_range};
    RawServer server([&](const std::string& r) { return raw(r); });
    const fs::path cache = fresh_cache("ignore-range");
    HubCheckpoint opened =
        open_hub_checkpoint(*parse_hub_ref("org/m"), options_for(server.endpoint(), cache));
    // Each answer was read up to the bytes asked for and no further (the server offered up
    // to 4 KiB more each time); the audit is the local one.
    expect_same_audit(local, read_hub_checkpoint(opened));
    EXPECT_LT(opened.stats.bytes, raw.offered.load());
    fs::remove_all(cache);
  }
  {
    RawHub raw{model, RawHub::Fault::truncate};
    RawServer server([&](const std::string& r) { return raw(r); });
    const fs::path cache = fresh_cache("truncate");
    HubOptions options = options_for(server.endpoint(), cache);
    options.client.max_retries = 1;
    EXPECT_THAT([&] { open_hub_checkpoint(*parse_hub_ref("org/m"), options); },
                ::testing::ThrowsMessage<InputError>(HasSubstr("before a complete answer")));
    fs::remove_all(cache);
  }
  {
    RawHub raw{model, RawHub::Fault::reset_once};
    RawServer server([&](const std::string& r) { return raw(r); });
    const fs::path cache = fresh_cache("reset");
    HubCheckpoint opened =
        open_hub_checkpoint(*parse_hub_ref("org/m"), options_for(server.endpoint(), cache));
    expect_same_audit(local, read_hub_checkpoint(opened));  // the retry got it right
    EXPECT_EQ(raw.resets.load() > 1, true);
    fs::remove_all(cache);
  }
}

TEST(HubCache, TheUsersHuggingFaceCacheIsReadDirectly) {
  const fs::path root = fresh_cache("hfcache");
  const fs::path model = kvaudit::testing::fixture_checkpoint("llama-modelopt-unit-scales");
  const fs::path repo = root / "hf" / "models--org--cached";
  fs::create_directories(repo / "refs");
  fs::create_directories(repo / "snapshots" / kCommit);
  std::ofstream(repo / "refs" / "main") << kCommit;
  for (const char* file : {"config.json", "hf_quant_config.json", "model.safetensors"})
    fs::create_symlink(model / file, repo / "snapshots" / kCommit / file);
  HubOptions options = options_for("http://127.0.0.1:1", root / "kvaudit");  // nothing answers
  options.hf_cache = root / "hf";
  options.offline = true;
  HubCheckpoint opened = open_hub_checkpoint(*parse_hub_ref("org/cached"), options);
  EXPECT_EQ(opened.commit, kCommit);
  EXPECT_THAT(opened.source, HasSubstr("local Hugging Face cache"));
  expect_same_audit(checkpoint::read_checkpoint(model), read_hub_checkpoint(opened));
  // A snapshot missing a shard is not used.
  fs::remove(repo / "snapshots" / kCommit / "model.safetensors");
  EXPECT_THROW(open_hub_checkpoint(*parse_hub_ref("org/cached"), options), InputError);
  fs::remove_all(root);
}

TEST(HubAnswers, RangeChecks) {
  net::HttpResponse ok;
  ok.status = 206;
  ok.headers["content-range"] = "bytes 0-3/10";
  ok.body = "abcd";
  EXPECT_EQ(check_range_answer(ok, {0, 3}, "u").total, 10u);
  net::HttpResponse shifted = ok;
  shifted.headers["content-range"] = "bytes 1-4/10";
  EXPECT_THROW(check_range_answer(shifted, {0, 3}, "u"), InputError);
  net::HttpResponse star = ok;
  star.headers["content-range"] = "bytes 0-3/*";
  EXPECT_THROW(check_range_answer(star, {0, 3}, "u"), InputError);
  net::HttpResponse whole;
  whole.status = 200;
  whole.headers["content-length"] = "10";
  whole.body = "0123456789";
  EXPECT_EQ(check_range_answer(whole, {2, 4}, "u").bytes, "234");
  EXPECT_THROW(
      safetensors_header_length(std::string("\xff\xff\xff\xff\xff\xff\xff\x0f", 8), 100, "u"),
      InputError);
  EXPECT_EQ(header_lower_bound({"a", "bc"}), 8u + 2 + 46 + 47);
}

}  // namespace
}  // namespace kvaudit::hub
