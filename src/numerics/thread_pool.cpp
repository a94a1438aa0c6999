// A small fixed thread pool. Work is split into a caller-chosen number of contiguous tasks,
// so the split (and any per-task reduction the caller does in task order) is the same for
// every thread count. Workers pick tasks from a shared counter; the caller works too.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "numerics/numerics.h"

namespace kvaudit::numerics {

struct ThreadPool::State {
  std::mutex mutex;
  std::condition_variable work_ready;
  std::condition_variable work_done;
  std::vector<std::thread> workers;
  bool stopping = false;
  uint64_t generation = 0;  // bumped for every parallel_for
  // The current job.
  const std::function<void(int, int64_t, int64_t)>* body = nullptr;
  int64_t count = 0;
  int tasks = 0;
  std::atomic<int> next_task{0};
  int busy_workers = 0;
  std::exception_ptr error;

  void run_tasks() {
    for (;;) {
      int task = next_task.fetch_add(1);
      if (task >= tasks) return;
      int64_t begin = count * task / tasks;
      int64_t end = count * (task + 1) / tasks;
      try {
        (*body)(task, begin, end);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!error) error = std::current_exception();
      }
    }
  }

  void worker_loop() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex);
        work_ready.wait(lock, [&] { return stopping || generation != seen; });
        if (stopping) return;
        seen = generation;
        ++busy_workers;
      }
      run_tasks();
      {
        std::lock_guard<std::mutex> lock(mutex);
        --busy_workers;
      }
      work_done.notify_all();
    }
  }
};

ThreadPool::ThreadPool(int threads) : thread_count_(std::max(1, threads)) {
  state_ = std::make_unique<State>();
  for (int i = 1; i < thread_count_; ++i) {
    state_->workers.emplace_back([this] { state_->worker_loop(); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stopping = true;
  }
  state_->work_ready.notify_all();
  for (std::thread& worker : state_->workers) worker.join();
}

void ThreadPool::parallel_for(int64_t count, int tasks,
                              const std::function<void(int, int64_t, int64_t)>& body) {
  if (count <= 0) return;
  tasks = int(std::clamp<int64_t>(tasks, 1, count));
  State& s = *state_;
  if (s.workers.empty() || tasks == 1) {
    for (int task = 0; task < tasks; ++task)
      body(task, count * task / tasks, count * (task + 1) / tasks);
    return;
  }
  {
    // A worker that woke late for the previous job may still be leaving run_tasks.
    std::unique_lock<std::mutex> lock(s.mutex);
    s.work_done.wait(lock, [&] { return s.busy_workers == 0; });
    s.body = &body;
    s.count = count;
    s.tasks = tasks;
    s.next_task.store(0);
    s.error = nullptr;
    ++s.generation;
  }
  s.work_ready.notify_all();
  s.run_tasks();
  {
    // Wait until every task ran and no worker is still inside run_tasks for this job.
    std::unique_lock<std::mutex> lock(s.mutex);
    s.work_done.wait(lock, [&] { return s.busy_workers == 0; });
    s.body = nullptr;
    if (s.error) std::rethrow_exception(s.error);
  }
}

}  // namespace kvaudit::numerics
