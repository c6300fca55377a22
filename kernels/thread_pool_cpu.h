// ThreadPool: the CPU backend's persistent worker threads. One ParallelFor runs
// at a time; it hands out task indices to the caller and the workers and returns
// when every task has finished. Tasks must write disjoint outputs and must not
// call ParallelFor themselves (that would wait on the pool from inside it).
//
// Which thread runs which task varies from run to run, so a task's result must
// not depend on the runner: the `thread` argument exists only to pick a
// per-thread scratch buffer.
#ifndef KEEL_KERNELS_THREAD_POOL_CPU_H_
#define KEEL_KERNELS_THREAD_POOL_CPU_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace keel {

class ThreadPool {
 public:
  // threads >= 1: the calling thread plus threads - 1 workers.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return threads_; }

  // Runs task(index, thread) for every index in [0, count), thread in
  // [0, threads()). Returns after all of them are done.
  void ParallelFor(int64_t count, const std::function<void(int64_t, int)>& task);

  // Splits [0, count) into at most `pieces` contiguous ranges of at least
  // `min_grain` elements and runs body(begin, end) on each. The split depends on
  // the arguments only (never on the thread count), so a body whose result per
  // element does not depend on its range gives the same bits for any pool.
  void ParallelRange(int64_t count, int64_t min_grain,
                     const std::function<void(int64_t, int64_t)>& body);

 private:
  void WorkerLoop(int thread);
  void Drain(int thread);

  const int threads_;
  std::vector<std::thread> workers_;

  std::mutex run_mutex_;  // serialises ParallelFor callers

  // Guarded by mutex_: the current job and the workers' bookkeeping.
  std::mutex mutex_;
  std::condition_variable wake_;  // a new job or shutdown
  std::condition_variable done_;  // the last worker finished the job
  const std::function<void(int64_t, int)>* task_ = nullptr;
  int64_t count_ = 0;
  uint64_t generation_ = 0;
  int busy_workers_ = 0;
  bool stop_ = false;

  std::atomic<int64_t> next_{0};  // next task index to hand out
};

}  // namespace keel

#endif  // KEEL_KERNELS_THREAD_POOL_CPU_H_
