// The thread pool: a split that does not depend on the thread count, many short jobs back to
// back, and a task's exception reaching the caller.
#include <atomic>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

#include "util/util.h"

namespace kvaudit {
namespace {

TEST(ThreadPool, SplitDoesNotDependOnThreadCount) {
  std::vector<double> values(100003);
  for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(double(i)) * 1e-3 + 1.0 / (1 + i);
  auto reduce = [&](int threads) {
    ThreadPool pool(threads);
    std::vector<double> partial(37, 0.0);
    pool.parallel_for(int64_t(values.size()), 37, [&](int task, int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) partial[size_t(task)] += values[size_t(i)];
    });
    return std::accumulate(partial.begin(), partial.end(), 0.0);
  };
  const double one = reduce(1);
  EXPECT_EQ(reduce(2), one);
  EXPECT_EQ(reduce(5), one);
  ThreadPool pool(3);
  for (int repeat = 0; repeat < 200; ++repeat) {  // many short jobs back to back
    std::atomic<int64_t> total{0};
    pool.parallel_for(1000, 8, [&](int, int64_t begin, int64_t end) { total += end - begin; });
    ASSERT_EQ(total.load(), 1000);
  }
  EXPECT_THROW(pool.parallel_for(10, 4,
                                 [](int task, int64_t, int64_t) {
                                   if (task == 2) throw std::runtime_error("task failed");
                                 }),
               std::runtime_error);
}

}  // namespace
}  // namespace kvaudit
