// A small fixed thread pool. Work is split into a caller-chosen number of contiguous tasks,
// so the split (and any per-task reduction the caller does in task order) is the same for
// every thread count. Workers and the caller claim tasks from one atomic word.
//
// Why workers spin before they sleep: a forward pass issues hundreds of parallel_for calls
// of 20-200 us each (one per projection), and waking a sleeping thread through the kernel
// takes tens of microseconds, long enough for the caller to run every task itself. Workers
// therefore poll for a short while after each job and only then block on the condition
// variable; a pool with more threads than cores never polls.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "util/util.h"

namespace kvaudit {
namespace {

// The job word: generation (24 bits) | task count (20 bits) | next unclaimed task (20 bits).
// A task is claimed by a compare-exchange on the whole word, so a worker that saw an old
// generation can never claim a task of the next job, and the job's fields (body, count) are
// only read after a successful claim, while the caller is still waiting for that task.
constexpr int kFieldBits = 20;
constexpr uint64_t kFieldMask = (uint64_t{1} << kFieldBits) - 1;
constexpr uint64_t kGenerationMask = (uint64_t{1} << (64 - 2 * kFieldBits)) - 1;
constexpr int kMaxTasks = static_cast<int>(kFieldMask);
// run_on_threads' ceiling: a mistaken thread count must not start thousands of threads.
constexpr int kMaxIoThreads = 1024;

uint64_t generation_of(uint64_t word) {
  return word >> (2 * kFieldBits);
}
int64_t tasks_of(uint64_t word) {
  return static_cast<int64_t>((word >> kFieldBits) & kFieldMask);
}
int64_t next_of(uint64_t word) {
  return static_cast<int64_t>(word & kFieldMask);
}

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// Polls `ready` for up to `budget`; true as soon as it holds.
template <class Ready>
bool poll_for(const Ready& ready, std::chrono::microseconds budget) {
  if (budget.count() <= 0) return ready();
  const auto start = std::chrono::steady_clock::now();
  for (uint32_t i = 0;; ++i) {
    if (ready()) return true;
    cpu_relax();
    if ((i & 255u) == 255u && std::chrono::steady_clock::now() - start > budget) return false;
  }
}

}  // namespace

struct ThreadPool::State {
  std::mutex mutex;
  std::condition_variable work_ready;
  std::condition_variable work_done;
  std::vector<std::thread> workers;
  std::atomic<bool> stopping{false};
  std::chrono::microseconds poll_budget{0};

  std::atomic<uint64_t> word{0};
  std::atomic<int64_t> done_tasks{0};
  // The current job; written by the caller before it publishes the job's word.
  const std::function<void(int, int64_t, int64_t)>* body = nullptr;
  int64_t count = 0;
  std::exception_ptr error;  // guarded by mutex

  // Claims and runs tasks of generation `generation` until none is left.
  void run_tasks(uint64_t generation) {
    uint64_t current = word.load(std::memory_order_acquire);
    for (;;) {
      if (generation_of(current) != generation || next_of(current) >= tasks_of(current)) return;
      if (!word.compare_exchange_weak(current, current + 1, std::memory_order_acq_rel,
                                      std::memory_order_acquire))
        continue;
      const int64_t tasks = tasks_of(current);
      const int64_t task = next_of(current);
      try {
        (*body)(static_cast<int>(task), count * task / tasks, count * (task + 1) / tasks);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!error) error = std::current_exception();
      }
      if (done_tasks.fetch_add(1, std::memory_order_acq_rel) + 1 == tasks) {
        // Under the mutex, so a caller between its check and its wait cannot miss this.
        std::lock_guard<std::mutex> lock(mutex);
        work_done.notify_all();
      }
      current = word.load(std::memory_order_acquire);
    }
  }

  void worker_loop() {
    uint64_t seen = 0;
    for (;;) {
      auto has_news = [&] {
        return stopping.load(std::memory_order_acquire) ||
               generation_of(word.load(std::memory_order_acquire)) != seen;
      };
      if (!poll_for(has_news, poll_budget)) {
        std::unique_lock<std::mutex> lock(mutex);
        work_ready.wait(lock, has_news);
      }
      if (stopping.load(std::memory_order_acquire)) return;
      seen = generation_of(word.load(std::memory_order_acquire));
      run_tasks(seen);
    }
  }
};

ThreadPool::ThreadPool(int threads) : thread_count_(std::max(1, threads)) {
  state_ = std::make_unique<State>();
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  if (static_cast<unsigned>(thread_count_) <= cores)
    state_->poll_budget = std::chrono::microseconds(500);
  for (int i = 1; i < thread_count_; ++i) {
    state_->workers.emplace_back([this] { state_->worker_loop(); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stopping.store(true, std::memory_order_release);
  }
  state_->work_ready.notify_all();
  for (std::thread& worker : state_->workers) worker.join();
}

void ThreadPool::parallel_for(int64_t count, int tasks,
                              const std::function<void(int, int64_t, int64_t)>& body) {
  if (count <= 0) return;
  tasks = static_cast<int>(std::clamp<int64_t>(tasks, 1, std::min<int64_t>(count, kMaxTasks)));
  State& s = *state_;
  if (s.workers.empty() || tasks == 1) {
    for (int task = 0; task < tasks; ++task)
      body(task, count * task / tasks, count * (task + 1) / tasks);
    return;
  }
  uint64_t generation;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.body = &body;
    s.count = count;
    s.error = nullptr;
    s.done_tasks.store(0, std::memory_order_relaxed);
    generation = (generation_of(s.word.load(std::memory_order_relaxed)) + 1) & kGenerationMask;
    s.word.store(generation << (2 * kFieldBits) | static_cast<uint64_t>(tasks) << kFieldBits,
                 std::memory_order_release);
  }
  s.work_ready.notify_all();
  s.run_tasks(generation);
  auto all_done = [&] { return s.done_tasks.load(std::memory_order_acquire) == tasks; };
  if (!poll_for(all_done, s.poll_budget)) {
    std::unique_lock<std::mutex> lock(s.mutex);
    s.work_done.wait(lock, all_done);
  }
  std::lock_guard<std::mutex> lock(s.mutex);
  s.body = nullptr;
  if (s.error) std::rethrow_exception(s.error);
}

void run_on_threads(size_t count, int threads, const std::function<bool(size_t index)>& body) {
  std::atomic<size_t> next{0};
  std::mutex error_mutex;
  std::exception_ptr first_error;
  auto worker = [&] {
    for (size_t index; (index = next++) < count;) {
      bool go_on = false;
      try {
        go_on = body(index);
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!first_error) first_error = std::current_exception();
      }
      if (!go_on) next = count;  // ends the hand-out; indices taken after are >= count
    }
  };
  const size_t thread_count =
      std::min(count, static_cast<size_t>(std::clamp(threads, 1, kMaxIoThreads)));
  std::vector<std::thread> started;
  for (size_t t = 1; t < thread_count; ++t) started.emplace_back(worker);
  worker();
  for (auto& thread : started) thread.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace kvaudit
