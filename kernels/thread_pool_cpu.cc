// ThreadPool of thread_pool_cpu.h: workers sleep on a condition variable between
// jobs and pull task indices from one atomic counter while a job runs.
#include "kernels/thread_pool_cpu.h"

#include <algorithm>

namespace keel {

ThreadPool::ThreadPool(int threads) : threads_(std::max(1, threads)) {
  for (int t = 1; t < threads_; ++t) workers_.emplace_back([this, t] { WorkerLoop(t); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void ThreadPool::Drain(int thread) {
  for (;;) {
    int64_t index = next_.fetch_add(1, std::memory_order_relaxed);
    if (index >= count_) return;
    (*task_)(index, thread);
  }
}

void ThreadPool::WorkerLoop(int thread) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    Drain(thread);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (--busy_workers_ == 0) done_.notify_one();
    }
  }
}

void ThreadPool::ParallelFor(int64_t count, const std::function<void(int64_t, int)>& task) {
  if (count <= 0) return;
  std::lock_guard<std::mutex> run_lock(run_mutex_);
  if (workers_.empty() || count == 1) {
    for (int64_t i = 0; i < count; ++i) task(i, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    task_ = &task;
    count_ = count;
    next_.store(0, std::memory_order_relaxed);
    busy_workers_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  wake_.notify_all();
  Drain(0);
  // Every worker passes through Drain once per generation, so the job (and
  // `task`, which lives in the caller's frame) stays valid until all are back.
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return busy_workers_ == 0; });
  task_ = nullptr;
}

void ThreadPool::ParallelRange(int64_t count, int64_t min_grain,
                               const std::function<void(int64_t, int64_t)>& body) {
  if (count <= 0) return;
  // A fixed number of pieces (not the thread count): 64 gives the dynamic
  // scheduler room to balance while each piece stays large.
  const int64_t grain = std::max<int64_t>(std::max<int64_t>(min_grain, 1), (count + 63) / 64);
  const int64_t pieces = (count + grain - 1) / grain;
  ParallelFor(pieces, [&](int64_t piece, int) {
    int64_t begin = piece * grain;
    body(begin, std::min(count, begin + grain));
  });
}

}  // namespace keel
