#include "tierswap/thread_pool.hpp"

#include <fmt/format.h>
#include <numa.h>
#include <numaif.h>
#include <sched.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "tierswap/log.hpp"

namespace tierswap {

namespace {
// Pieces per thread: enough that a thread woken late leaves the rest to the others, few enough
// that each is a long stream for the kernels (and their non-temporal stores' alignment prologue
// is noise).
constexpr std::size_t kPiecesPerThread = 4;

// Range of piece `i` of `k` over n elements, boundaries multiples of grain.
std::pair<std::size_t, std::size_t> range_of(std::size_t i, std::size_t k, std::size_t n,
                                             std::size_t grain) {
  const std::size_t units = (n + grain - 1) / grain;
  const std::size_t b = units * i / k * grain, e = units * (i + 1) / k * grain;
  return {std::min(b, n), std::min(e, n)};
}
}  // namespace

ThreadPool::ThreadPool(unsigned threads) : ThreadPool(threads, -1) {}

ThreadPool::ThreadPool(unsigned threads, int numa_node) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  if (threads > 1024) throw std::invalid_argument("ThreadPool: threads > 1024");
  if (numa_node < -1)
    throw std::invalid_argument(fmt::format("ThreadPool: numa_node={} (must be >= -1)", numa_node));
  if (numa_node >= 0) {
    if (numa_available() < 0)
      throw std::invalid_argument(fmt::format(
          "ThreadPool: numa_node={}: this system has no NUMA support (numa_available)", numa_node));
    if (numa_node > numa_max_node() || !numa_bitmask_isbitset(numa_all_nodes_ptr, numa_node))
      throw std::invalid_argument(
          fmt::format("ThreadPool: numa_node={}: no such NUMA node on this machine (nodes 0..{})",
                      numa_node, numa_max_node()));
    first_worker_ = 0;
    // The node's CPUs, read here once: libnuma's lazily built caches are not safe to fill from
    // several workers at once.
    bitmask* cpus = numa_allocate_cpumask();
    if (numa_node_to_cpus(numa_node, cpus) != 0) {
      numa_free_cpumask(cpus);
      throw std::invalid_argument(
          fmt::format("ThreadPool: numa_node={}: its CPUs could not be read: {}", numa_node,
                      std::strerror(errno)));
    }
    for (unsigned c = 0; c < cpus->size; ++c)
      if (numa_bitmask_isbitset(cpus, c)) node_cpus_.push_back(static_cast<int>(c));
    numa_free_cpumask(cpus);
    if (node_cpus_.empty())
      throw std::invalid_argument(
          fmt::format("ThreadPool: numa_node={}: the node has no CPUs to run on", numa_node));
  }
  size_ = threads;
  numa_node_ = numa_node;
  for (unsigned i = first_worker_; i < threads; ++i)
    threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::parallel_for(std::size_t n, std::size_t grain,
                              const std::function<void(std::size_t, std::size_t)>& fn) {
  if (n == 0) return;
  if (grain == 0) grain = 1;
  if (first_worker_ == 1 && (size_ == 1 || n <= grain)) {
    fn(0, n);
    return;
  }
  std::lock_guard run(run_mu_);
  const std::size_t units = (n + grain - 1) / grain;
  const std::size_t pieces = std::min<std::size_t>(units, std::size_t{size_} * kPiecesPerThread);
  {
    std::lock_guard lock(mu_);
    fn_ = &fn;
    n_ = n;
    grain_ = grain;
    pieces_ = pieces;
    next_.store(0, std::memory_order_relaxed);
    failed_.store(false, std::memory_order_relaxed);
    pending_ = size_ - first_worker_;
    error_ = nullptr;
    ++generation_;
  }
  start_cv_.notify_all();
  std::exception_ptr mine;
  if (first_worker_ == 1) mine = run_pieces(fn, n, grain, pieces);
  std::unique_lock lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  fn_ = nullptr;
  if (mine) std::rethrow_exception(mine);
  if (error_) std::rethrow_exception(error_);
}

std::exception_ptr ThreadPool::run_pieces(const std::function<void(std::size_t, std::size_t)>& fn,
                                          std::size_t n, std::size_t grain, std::size_t pieces) {
  for (;;) {
    if (failed_.load(std::memory_order_relaxed)) return nullptr;
    const std::size_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= pieces) return nullptr;
    try {
      const auto [b, e] = range_of(i, pieces, n, grain);
      if (b < e) fn(b, e);
    } catch (...) {
      failed_.store(true, std::memory_order_relaxed);
      return std::current_exception();
    }
  }
}

void ThreadPool::worker(unsigned index) {
  if (numa_node_ >= 0) {
    // Run on the node's CPUs and allocate from its memory first (a failure leaves the worker
    // unbound: slower, still correct).
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : node_cpus_)
      if (c < CPU_SETSIZE) CPU_SET(c, &set);
    if (::sched_setaffinity(0, sizeof(set), &set) != 0)
      log(LogLevel::warn, fmt::format("ThreadPool: binding worker {} to NUMA node {} failed: {}",
                                      index, numa_node_, std::strerror(errno)));
    unsigned long nodemask[16] = {};  // 1024 nodes
    if (numa_node_ < 1024) {
      nodemask[numa_node_ / 64] = 1ul << (numa_node_ % 64);
      if (::set_mempolicy(MPOL_PREFERRED, nodemask, 1024) != 0)
        log(LogLevel::warn, fmt::format("ThreadPool: preferring NUMA node {} for worker {}'s "
                                        "memory failed: {}",
                                        numa_node_, index, std::strerror(errno)));
    }
  }
  std::size_t seen = 0;
  for (;;) {
    const std::function<void(std::size_t, std::size_t)>* fn;
    std::size_t n, grain, pieces;
    {
      std::unique_lock lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      fn = fn_;
      n = n_;
      grain = grain_;
      pieces = pieces_;
    }
    const std::exception_ptr err = run_pieces(*fn, n, grain, pieces);
    {
      std::lock_guard lock(mu_);
      if (err && !error_) error_ = err;
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }
}

}  // namespace tierswap
