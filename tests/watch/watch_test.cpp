// kvaudit watch: the metric flips on the line that shows a reverted launch, an endless log
// keeps memory flat, files are followed through rotation and truncation, and a server that
// goes away and returns is a new launch.
#include "watch/watch.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <unistd.h>

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/loopback_server.h"
#include "common/registry.h"
#include "util/util.h"

namespace kvaudit::watch {
namespace {

namespace fs = std::filesystem;
using kvaudit::testing::registry;

const fs::path kJournal =
    fs::path(KVAUDIT_TEST_DIR) / "fixtures/logs/journal_qwen35_fp8_bf16_fp8.log";

std::vector<std::string> lines_of(const fs::path& file) {
  std::ifstream in(file);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

WatchOptions expecting_bf16() {
  WatchOptions options;
  options.expectations = {logs::parse_expectation("kv_cache_dtype=bf16")};
  return options;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Watch, TheMetricFlipsOnTheLineThatShowsTheThirdLaunchsFp8Cache) {
  const std::vector<std::string> lines = lines_of(kJournal);
  ASSERT_EQ(lines.size(), 166u);
  // Where launch 3 starts, and the first of its lines that names an FP8 cache.
  size_t third_start = 0, third_fp8 = 0;
  for (size_t i = 0, starts = 0; i < lines.size(); ++i) {
    if (contains(lines[i], "Started sglang.service") && ++starts == 3) third_start = i + 1;
    if (third_start && !third_fp8 &&
        (contains(lines[i], "FP8 KV cache") || contains(lines[i], "float8")))
      third_fp8 = i + 1;
  }
  ASSERT_EQ(third_start, 111u);
  ASSERT_GT(third_fp8, third_start);

  LogWatcher watcher(registry(), "journal", expecting_bf16());
  size_t flipped_at = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    watcher.add_line(lines[i], 1.0);
    const std::string metrics = render_metrics(watcher.state());
    const int64_t line = static_cast<int64_t>(i + 1);
    if (line == 110) {  // launch 2, fixed and ready
      EXPECT_TRUE(contains(metrics, "resolved=\"bf16\"")) << metrics;
      EXPECT_TRUE(
          contains(metrics, "kvaudit_expectation_failures{source=\"journal\",launch=\"2\"} 0"));
    }
    if (line == 111) {  // launch 3 opened: nothing shown yet, so pending, not failed
      EXPECT_TRUE(
          contains(metrics, "kvaudit_kv_cache_resolved{source=\"journal\",launch=\"3\"} 0"));
      EXPECT_TRUE(
          contains(metrics, "kvaudit_expectation_failures{source=\"journal\",launch=\"3\"} 0"));
      EXPECT_TRUE(contains(metrics,
                           "kvaudit_expectation_pending{source=\"journal\",launch=\"3\","
                           "key=\"kv_cache_dtype\",expected=\"bf16\",actual=\"\"} 1"));
    }
    if (!flipped_at &&
        contains(metrics, "kvaudit_expectation_failures{source=\"journal\",launch=\"3\"} 1"))
      flipped_at = i + 1;
  }
  EXPECT_EQ(flipped_at, third_fp8);
  const WatchState& state = watcher.state();
  EXPECT_EQ(state.launches, 3);
  EXPECT_EQ(state.lines, 166);
  ASSERT_TRUE(state.latest);
  EXPECT_EQ(state.latest->kv_resolved, "fp8_e4m3");
  EXPECT_EQ(state.latest->capacity_tokens, 3147708);
  EXPECT_TRUE(state.latest->ready);
  EXPECT_EQ(state.latest->expectation_failures, 1);
  EXPECT_TRUE(contains(describe(*state.latest),
                       "EXPECTATION FAILED: kv_cache_dtype=bf16 "
                       "(shows fp8_e4m3)"));
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kUnderAsan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kUnderAsan = true;
#else
constexpr bool kUnderAsan = false;
#endif
#else
constexpr bool kUnderAsan = false;
#endif

int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * 4096;
}

// An endless journal: the three launches again and again, each followed by request lines
// that carry no fact. Neither the kept state nor the process grows with it.
TEST(Watch, AnEndlessLogKeepsItsMemoryFlat) {
  const std::vector<std::string> journal = lines_of(kJournal);
  LogWatcher watcher(registry(), "endless", expecting_bf16());
  int64_t fed = 0, rss_warm = 0;
  // Under ASan a tenth (its quarantine makes RSS meaningless, and 2M lines take 26 s there).
  const int64_t total = kUnderAsan ? 200'000 : 2'000'000;
  int64_t round = 0;
  while (fed < total) {
    for (const auto& line : journal) watcher.add_line(line, 1.0), ++fed;
    for (int i = 0; i < 20'000; ++i, ++fed)
      watcher.add_line(
          fmt::format("Mar 07 18:20:{:02d} gpu-node-3 python3[102385]: INFO:     "
                      "10.0.0.{}:5{:04d} - \"POST /v1/chat/completions HTTP/1.1\" 200 OK",
                      i % 60, i % 250, i % 10000),
          1.0);
    if (++round == 2) rss_warm = resident_bytes();
  }
  const WatchState& state = watcher.state();
  EXPECT_EQ(state.lines, fed);
  EXPECT_EQ(state.launches, 3 * round);  // every launch seen, none kept beyond the window
  ASSERT_TRUE(state.latest);
  EXPECT_EQ(state.latest->kv_resolved, "fp8_e4m3");
  const int64_t growth = resident_bytes() - rss_warm;
  RecordProperty("rss_growth_bytes", std::to_string(growth));
  std::printf("RSS growth over %lld lines after warm-up: %.2f MiB\n", static_cast<long long>(fed),
              static_cast<double>(growth) / (1 << 20));
  // (ASan keeps freed blocks in quarantine, so RSS means nothing there.)
  if (!kUnderAsan) {
    EXPECT_LT(growth, 4 << 20);
  }
}

TEST(Watch, LinesAreJoinedAcrossReadsAndCutAtTheCap) {
  LineSplitter splitter(8);
  std::vector<std::string> got;
  auto take = [&](std::string_view line) { got.emplace_back(line); };
  splitter.feed("ab", take);
  splitter.feed("c\nde", take);
  splitter.feed("f\n0123456789abc", take);
  splitter.feed("def\nxy\n", take);
  splitter.feed("tail", take);
  splitter.flush(take);
  EXPECT_EQ(got, (std::vector<std::string>{"abc", "def", "01234567", "xy", "tail"}));
}

struct Scratch {
  fs::path dir =
      fs::temp_directory_path() / ("kvaudit-watch-" + std::to_string(::getpid()) + "-" +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  Scratch() { fs::create_directories(dir); }
  ~Scratch() { fs::remove_all(dir); }
};

void append(const fs::path& file, const std::string& text) {
  std::ofstream(file, std::ios::app) << text;
}

TEST(Watch, AFileIsFollowedThroughRenameRotationTruncationAndAbsence) {
  Scratch scratch;
  const fs::path log = scratch.dir / "sglang.log";
  FileFollower follower(log, 1 << 20);
  std::vector<std::string> got;
  auto take = [&](std::string_view line) { got.emplace_back(line); };

  FileFollower::Poll poll = follower.poll(take);
  EXPECT_FALSE(poll.present);  // not there yet

  append(log, "one\ntw");
  poll = follower.poll(take);
  EXPECT_TRUE(poll.present);
  EXPECT_EQ(got, (std::vector<std::string>{"one"}));

  // logrotate's default: the file is renamed, the writer finishes its line there, and a new
  // file takes the path.
  append(log, "o\nthree\n");
  fs::rename(log, scratch.dir / "sglang.log.1");
  append(log, "four\n");
  poll = follower.poll(take);
  EXPECT_TRUE(poll.rotated);
  EXPECT_EQ(got, (std::vector<std::string>{"one", "two", "three", "four"}));

  // copytruncate: the same file, emptied, then written again. (Seen because it is shorter
  // than what was read, as tail -F sees it: a truncation overtaken by as many new bytes
  // before the next poll reads as an append.)
  fs::resize_file(log, 0);
  append(log, "5\n");
  poll = follower.poll(take);
  EXPECT_TRUE(poll.truncated);
  EXPECT_EQ(got.back(), "5");

  // Deleted: the path is absent until the service writes it again.
  fs::remove(log);
  poll = follower.poll(take);
  EXPECT_FALSE(poll.present);
  append(log, "six\n");
  poll = follower.poll(take);
  EXPECT_TRUE(poll.present);
  EXPECT_TRUE(poll.rotated);
  EXPECT_EQ(got.back(), "six");
  EXPECT_EQ(got.size(), 6u);
}

TEST(Watch, AJournalFollowedAsAFileGivesTheSameVerdictAsAnyOtherRead) {
  Scratch scratch;
  const fs::path log = scratch.dir / "journal.log";
  const std::vector<std::string> lines = lines_of(kJournal);
  RunOptions options;
  options.source = log.string();
  options.watch = expecting_bf16();
  options.interval_s = 0.05;
  options.for_s = 30;  // bound: the writer below stops it long before
  // The journal arrives in three pieces, with a rotation between the second and third.
  std::thread writer([&] {
    auto write = [&](size_t from, size_t to) {
      std::string text;
      for (size_t i = from; i < to; ++i) text += lines[i] + "\n";
      append(log, text);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    };
    write(0, 59);
    write(59, 110);
    fs::rename(log, scratch.dir / "journal.log.1");
    write(110, lines.size());
  });
  std::vector<int64_t> launches_seen;
  std::atomic<bool> done{false};
  const WatchState state = run(
      registry(), options, [&] { return done.load(); },
      [&](const WatchState& s) {
        if (launches_seen.empty() || launches_seen.back() != s.launches)
          launches_seen.push_back(s.launches);
        if (s.latest && s.latest->number == 3 && s.latest->ready) done = true;
      },
      [](const std::string&) {});
  writer.join();
  EXPECT_EQ(launches_seen, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(state.rotations, 1);
  EXPECT_EQ(state.lines, 166);
  ASSERT_TRUE(state.latest);
  EXPECT_EQ(state.latest->expectation_failures, 1);
}

TEST(Watch, PendingExpectationsFailOnceTheLaunchIsReadyWithoutShowingThem) {
  logs::Launch launch;
  launch.engine = "vllm";
  launch.kv_cache_dtype_requested = "auto";
  const std::vector<logs::Expectation> expect = {logs::parse_expectation("kv_cache_dtype=bf16"),
                                                 logs::parse_expectation("ready=true"),
                                                 logs::parse_expectation("engine=sglang")};
  LaunchState state;
  judge(registry(), launch, expect, state);
  EXPECT_EQ(state.expectation_pending, (std::vector<bool>{true, true, false}));
  EXPECT_EQ(state.expectation_failures, 1);  // the engine is known and wrong now
  launch.ready = true;
  judge(registry(), launch, expect, state);
  EXPECT_EQ(state.expectation_pending, (std::vector<bool>{false, false, false}));
  EXPECT_EQ(state.expectation_failures, 2);  // never showed its cache: not an all-clear
}

TEST(Watch, ExpectationsComeFromChecksJsonOrItsFileIsNamed) {
  Scratch scratch;
  const fs::path json = scratch.dir / "check.json";
  std::ofstream(json) << R"({"command": "check", "decision": {"recommended": "bf16", "options": [
      {"id": "as-launched", "expect": ["kv_cache_dtype=fp8_e4m3"]},
      {"id": "bf16", "expect": ["kv_cache_dtype=bf16", "scale_fallback=false"]}]}})";
  const auto expectations = expectations_from_check_json(json);
  ASSERT_EQ(expectations.size(), 2u);
  EXPECT_EQ(expectations[0].key, "kv_cache_dtype");
  EXPECT_EQ(expectations[0].value, "bf16");
  EXPECT_EQ(expectations[1].key, "scale_fallback");
  std::ofstream(json, std::ios::trunc) << R"({"command": "logs"})";
  try {
    expectations_from_check_json(json);
    FAIL() << "accepted";
  } catch (const InputError& error) {
    EXPECT_TRUE(contains(error.what(), json.string())) << error.what();
    EXPECT_TRUE(contains(error.what(), "kvaudit check --json")) << error.what();
  }
}

TEST(Watch, MetricsEscapeLabelValuesAndGroupEachFamily) {
  WatchState state;
  state.source = "C:\\logs\\\"x\"\nlog";
  state.latest = LaunchState{};
  state.latest->number = 1;
  state.latest->expectations = {{logs::parse_expectation("kv_cache_dtype=bf16"), "", false},
                                {logs::parse_expectation("tp=8"), "4", false}};
  state.latest->expectation_pending = {true, false};
  const std::string metrics = render_metrics(state);
  EXPECT_TRUE(contains(metrics, "source=\"C:\\\\logs\\\\\\\"x\\\"\\nlog\"")) << metrics;
  // Each family's samples follow its own TYPE line, none after another family's.
  std::istringstream in(metrics);
  std::string family, line;
  std::set<std::string> closed;
  while (std::getline(in, line)) {
    if (line.rfind("# TYPE ", 0) == 0) {
      if (!family.empty()) closed.insert(family);
      family = line.substr(7, line.find(' ', 7) - 7);
      EXPECT_FALSE(closed.count(family)) << family;
    } else if (line[0] != '#') {
      const std::string name = line.substr(0, line.find_first_of("{ "));
      EXPECT_EQ(name, family) << line;
    }
  }
}

// A loopback SGLang that answers /get_server_info with a real 0.5.6 answer, its KV dtype set.
class FakeSglang {
 public:
  FakeSglang(int port, const std::string& kv_cache_dtype) {
    nlohmann::json info = nlohmann::json::parse(read_text_file(
        fs::path(KVAUDIT_TEST_DIR) / "fixtures/servers/sglang/get_server_info-0.5.6.json"));
    info["kv_cache_dtype"] = kv_cache_dtype;
    body_ = info.dump();
    server_.http.Get("/get_server_info",
                     [this](const httplib::Request&, httplib::Response& response) {
                       response.set_content(body_, "application/json");
                     });
    server_.start(port);
  }
  int port() const { return server_.port; }

 private:
  std::string body_;
  kvaudit::testing::LoopbackServer server_;
};

TEST(Watch, AServerThatGoesAwayAndReturnsIsANewLaunch) {
  net::ClientOptions client;
  client.connect_timeout = std::chrono::milliseconds(500);
  client.read_timeout = std::chrono::milliseconds(2000);
  client.max_retries = 0;
  int port = 0;
  std::string url;
  std::optional<ServerWatcher> watcher;
  {
    FakeSglang server(0, "bf16");
    port = server.port();
    ASSERT_GT(port, 0);
    url = "http://127.0.0.1:" + std::to_string(port);
    watcher.emplace(registry(), url, expecting_bf16(), client);
    EXPECT_TRUE(watcher->poll(1.0));
    EXPECT_TRUE(watcher->state().source_up);
    ASSERT_TRUE(watcher->state().latest);
    EXPECT_EQ(watcher->state().latest->kv_resolved, "bf16");
    EXPECT_EQ(watcher->state().latest->expectation_failures, 0);
    EXPECT_EQ(watcher->state().latest->capacity_tokens, 20480);
    EXPECT_FALSE(watcher->poll(2.0));  // the same answer: nothing changed
  }
  EXPECT_TRUE(watcher->poll(3.0));  // gone
  EXPECT_FALSE(watcher->state().source_up);
  EXPECT_EQ(watcher->state().polls_failed, 1);
  EXPECT_TRUE(contains(render_metrics(watcher->state()),
                       "kvaudit_watch_source_up{source=\"" + url + "\"} 0"));
  FakeSglang back(port, "fp8_e4m3");  // restarted on the old FP8 setting
  if (back.port() != port) GTEST_SKIP() << "port " << port << " was taken meanwhile";
  EXPECT_TRUE(watcher->poll(4.0));
  EXPECT_TRUE(watcher->state().source_up);
  EXPECT_EQ(watcher->state().launches, 2);
  EXPECT_EQ(watcher->state().latest->kv_resolved, "fp8_e4m3");
  EXPECT_EQ(watcher->state().latest->expectation_failures, 1);
}

}  // namespace
}  // namespace kvaudit::watch
