// run_on_threads: the one loop for waiting work (requests, downloads) on threads of its own.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "util/util.h"

namespace kvaudit {
namespace {

TEST(RunOnThreads, EveryIndexRunsOnceOnAsManyThreadsAsAsked) {
  std::vector<std::atomic<int>> runs(1000);
  std::mutex mutex;
  std::set<std::thread::id> threads;
  run_on_threads(runs.size(), 4, [&](size_t index) {
    ++runs[index];
    std::lock_guard lock(mutex);
    threads.insert(std::this_thread::get_id());
    // Long enough that every thread takes a turn.
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    return true;
  });
  for (const auto& count : runs) EXPECT_EQ(count, 1);
  EXPECT_EQ(threads.size(), 4u);
  EXPECT_EQ(threads.count(std::this_thread::get_id()), 1u);  // the caller works too
}

TEST(RunOnThreads, FalseStopsTheHandOutAndTheRunningOnesFinish) {
  std::atomic<int> started{0}, finished{0};
  run_on_threads(1000, 3, [&](size_t index) {
    ++started;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ++finished;
    return index != 5;
  });
  EXPECT_EQ(started, finished);
  // Index 5 and at most the two indices the other threads held when it said stop, plus one
  // each may have taken before seeing it.
  EXPECT_LE(started, 12);
}

TEST(RunOnThreads, AnExceptionStopsTheHandOutAndReachesTheCallerAfterAllFinish) {
  std::atomic<int> running{0}, started{0};
  try {
    run_on_threads(500, 4, [&](size_t index) {
      ++running;
      ++started;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      --running;
      if (index == 3) throw std::runtime_error("shard 3 failed");
      return true;
    });
    FAIL() << "the failure did not reach the caller";
  } catch (const std::runtime_error& error) {
    EXPECT_STREQ(error.what(), "shard 3 failed");
  }
  EXPECT_EQ(running, 0);  // nothing still running when the caller sees the failure
  EXPECT_LT(started, 500);
}

TEST(RunOnThreads, NoWorkStartsNoThreadAndAThreadCountIsClamped) {
  int calls = 0;
  run_on_threads(0, 8, [&](size_t) { return ++calls > 0; });
  EXPECT_EQ(calls, 0);
  std::atomic<int> count{0};
  run_on_threads(3, -5, [&](size_t) { return ++count > 0; });  // below 1: the caller alone
  EXPECT_EQ(count, 3);
}

}  // namespace
}  // namespace kvaudit
