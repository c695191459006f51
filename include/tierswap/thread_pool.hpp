// ThreadPool: a fixed set of workers for data-parallel kernels.
//
// parallel_for() splits [0, n) into contiguous pieces (boundaries rounded to `grain`), a few per
// thread, which the threads claim in order as they come (the calling thread starts at once, a
// worker joins when it wakes: no thread waits at the end for one that started late), and
// returns when all are done. Kernels built on it compute each output element (or each
// fixed-size reduction chunk) independently of the split, so results are bit-identical for any
// thread count. Not reentrant: one parallel_for at a time per pool (concurrent callers are
// serialized).
//
// NUMA: a pool made for a NUMA node runs every range on its own workers, each bound to that node's
// CPUs and preferring its memory (libnuma), so the step's kernels run next to the pinned slabs
// the tier manager binds to the same node (TierConfig::numa_node); the calling thread only waits.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tierswap {

class ThreadPool {
 public:
  /// `threads` >= 1 workers in all (the calling thread is one of them). 0 means
  /// std::thread::hardware_concurrency(). Throws std::invalid_argument above 1024.
  explicit ThreadPool(unsigned threads = 0);
  /// `threads` workers bound to NUMA node `numa_node` (-1: unbound, as above). Throws
  /// std::invalid_argument naming the node when the system has no NUMA support or no such node.
  ThreadPool(unsigned threads, int numa_node);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  unsigned size() const noexcept { return size_; }
  /// The NUMA node the workers are bound to, -1 when unbound.
  int numa_node() const noexcept { return numa_node_; }

  /// Calls fn(begin, end) on disjoint ranges covering [0, n). The first exception thrown by a
  /// range is rethrown here after every range finished (once it is caught, no thread claims
  /// another piece).
  void parallel_for(std::size_t n, std::size_t grain,
                    const std::function<void(std::size_t, std::size_t)>& fn);

 private:
  void worker(unsigned index);
  /// Claims and runs pieces of the current parallel_for until none is left; the first exception
  /// of a piece is returned (and no more pieces are claimed).
  std::exception_ptr run_pieces(const std::function<void(std::size_t, std::size_t)>& fn,
                                std::size_t n, std::size_t grain, std::size_t pieces);

  unsigned size_;
  int numa_node_ = -1;
  unsigned first_worker_ = 1;
  std::vector<int> node_cpus_;  // the CPUs of numa_node_  // 0 when the caller does not run a range
                                // (bound pools)
  std::vector<std::thread> threads_;
  std::mutex run_mu_;  // one parallel_for at a time
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(std::size_t, std::size_t)>* fn_ = nullptr;
  std::size_t n_ = 0, grain_ = 1, pieces_ = 0;
  std::atomic<std::size_t> next_{0};  // the next piece to claim
  std::atomic<bool> failed_{false};   // a piece threw: claim no more
  std::size_t generation_ = 0;
  unsigned pending_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace tierswap
