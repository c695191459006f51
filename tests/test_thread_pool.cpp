#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
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

TEST(ThreadPool, RethrowsAfterEveryRangeFinished) {
  ThreadPool pool(4);
  std::atomic<int> ran{0};
  EXPECT_THROW(pool.parallel_for(4000, 1,
                                 [&](std::size_t b, std::size_t) {
                                   ran++;
                                   if (b == 0) throw std::runtime_error("boom");
                                 }),
               std::runtime_error);
  EXPECT_EQ(ran.load(), 4);
  // Still usable.
  std::atomic<std::size_t> sum{0};
  pool.parallel_for(1000, 1, [&](std::size_t b, std::size_t e) { sum += e - b; });
  EXPECT_EQ(sum.load(), 1000u);
}
