#include <gtest/gtest.h>
#include <numa.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tierswap/thread_pool.hpp"

using tierswap::ThreadPool;

TEST(ThreadPool, CoversTheRangeExactlyOnce) {
  for (unsigned t : {1u, 2u, 3u, 8u}) {
    ThreadPool pool(t);
    EXPECT_EQ(pool.size(), t);
    for (std::size_t n : {0ul, 1ul, 63ul, 64ul, 65ul, 100000ul}) {
      std::vector<std::atomic<int>> hits(n);
      pool.parallel_for(n, 64, [&](std::size_t b, std::size_t e) {
        EXPECT_EQ(b % 64, 0u);
        for (std::size_t i = b; i < e; ++i) hits[i]++;
      });
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << i;
    }
  }
}

// A range that throws: the exception comes back once every range in progress has finished, and
// the pool stays usable.
TEST(ThreadPool, RethrowsAfterEveryRangeFinished) {
  ThreadPool pool(4);
  std::atomic<int> ran{0}, running{0};
  EXPECT_THROW(pool.parallel_for(4000, 1,
                                 [&](std::size_t b, std::size_t) {
                                   ran++;
                                   running++;
                                   std::this_thread::yield();
                                   running--;
                                   if (b == 0) throw std::runtime_error("boom");
                                 }),
               std::runtime_error);
  EXPECT_EQ(running.load(), 0);  // every range that started has finished
  EXPECT_GE(ran.load(), 1);
  EXPECT_LE(ran.load(), 16);  // at most the 4 pieces of each of the 4 threads
  // Still usable.
  std::atomic<std::size_t> sum{0};
  pool.parallel_for(1000, 1, [&](std::size_t b, std::size_t e) { sum += e - b; });
  EXPECT_EQ(sum.load(), 1000u);
}

// Each thread takes a few pieces as it comes: ranges are disjoint, grain-aligned, cover [0, n),
// and there are more of them than threads when n allows.
TEST(ThreadPool, SplitsIntoAFewGrainAlignedPiecesPerThread) {
  ThreadPool pool(2);
  std::mutex mu;
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  pool.parallel_for(1 << 20, 64, [&](std::size_t b, std::size_t e) {
    std::lock_guard lk(mu);
    ranges.emplace_back(b, e);
  });
  std::sort(ranges.begin(), ranges.end());
  ASSERT_EQ(ranges.size(), 8u);
  std::size_t at = 0;
  for (const auto& [b, e] : ranges) {
    EXPECT_EQ(b, at);
    EXPECT_EQ(b % 64, 0u);
    EXPECT_LT(b, e);
    at = e;
  }
  EXPECT_EQ(at, std::size_t{1} << 20);
}

TEST(ThreadPool, NumaBoundWorkersRunEveryRangeOnTheirNode) {
  if (numa_available() < 0) GTEST_SKIP() << "no NUMA support on this system (numa_available < 0)";
  for (unsigned t : {1u, 2u, 3u}) {
    ThreadPool pool(t, 0);
    EXPECT_EQ(pool.size(), t);
    EXPECT_EQ(pool.numa_node(), 0);
    const auto caller = std::this_thread::get_id();
    for (std::size_t n : {1ul, 65ul, 100000ul}) {
      std::vector<std::atomic<int>> hits(n);
      std::atomic<int> on_caller{0}, off_node{0};
      pool.parallel_for(n, 64, [&](std::size_t b, std::size_t e) {
        if (std::this_thread::get_id() == caller) on_caller++;
        const int cpu = sched_getcpu();
        if (cpu >= 0 && numa_node_of_cpu(cpu) != 0) off_node++;
        for (std::size_t i = b; i < e; ++i) hits[i]++;
      });
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << i;
      EXPECT_EQ(on_caller.load(), 0) << "a bound pool runs nothing on the calling thread";
      EXPECT_EQ(off_node.load(), 0);
    }
  }
}

TEST(ThreadPool, BadNumaNodesAreRefusedByName) {
  try {
    ThreadPool pool(2, 4095);
    FAIL() << "node 4095 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("numa_node=4095"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ThreadPool(2, -2), std::invalid_argument);
  EXPECT_EQ(ThreadPool(2, -1).numa_node(), -1);
}
