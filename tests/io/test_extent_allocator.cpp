#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <thread>
#include <vector>

#include "tierswap/extent_allocator.hpp"

using namespace tierswap;

TEST(ExtentAllocator, AlignsAndRoundsUp) {
  ExtentAllocator a(1 << 20, 4096);
  Extent e = a.allocate(1);
  EXPECT_EQ(e.offset % 4096, 0u);
  EXPECT_EQ(e.length, 4096u);
  Extent f = a.allocate(4097);
  EXPECT_EQ(f.length, 8192u);
  EXPECT_EQ(a.stats().used, 12288u);
}

TEST(ExtentAllocator, FullSpaceIsAClearError) {
  ExtentAllocator a(64 * 1024, 4096);
  a.allocate(60 * 1024);
  try {
    a.allocate(8192);
    FAIL();
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code().value(), ENOSPC);
    std::string w = e.what();
    EXPECT_NE(w.find("asked 8.00 KiB"), std::string::npos) << w;
    EXPECT_NE(w.find("largest free extent 4.00 KiB"), std::string::npos) << w;
  }
  EXPECT_FALSE(a.try_allocate(8192).has_value());
  EXPECT_TRUE(a.try_allocate(4096).has_value());
}

TEST(ExtentAllocator, CoalescesOnFree) {
  ExtentAllocator a(16 * 4096, 4096);
  std::vector<Extent> es;
  for (int i = 0; i < 16; ++i) es.push_back(a.allocate(4096));
  EXPECT_EQ(a.stats().free, 0u);
  // Free in an order that needs both left and right merges.
  for (int i : {1, 3, 2, 0, 5, 4, 15, 7, 6, 8, 10, 9, 11, 13, 14, 12}) a.free(es[i]);
  auto st = a.stats();
  EXPECT_EQ(st.free, 16u * 4096);
  EXPECT_EQ(st.free_fragments, 1u);
  EXPECT_EQ(st.largest_free, 16u * 4096);
  EXPECT_EQ(a.allocate(16 * 4096).offset, 0u);
}

TEST(ExtentAllocator, BestFitKeepsLargeHolesWhole) {
  ExtentAllocator a(100 * 4096, 4096);
  Extent small_hole_left = a.allocate(2 * 4096);
  Extent sep1 = a.allocate(4096);
  Extent big_hole = a.allocate(50 * 4096);
  Extent sep2 = a.allocate(4096);
  (void)sep1;
  (void)sep2;
  a.free(big_hole);
  a.free(small_hole_left);
  // A 2-page request goes into the 2-page hole, not the 50-page one.
  Extent e = a.allocate(2 * 4096);
  EXPECT_EQ(e.offset, small_hole_left.offset);
  EXPECT_EQ(a.allocate(50 * 4096).offset, big_hole.offset);
}

TEST(ExtentAllocator, DoubleFreeAndForeignExtentsAreRejected) {
  ExtentAllocator a(1 << 20, 4096);
  Extent e = a.allocate(8192);
  a.free(e);
  auto before = a.stats();
  EXPECT_THROW(a.free(e), std::invalid_argument);
  EXPECT_THROW(a.free(Extent{4096, 4096}), std::invalid_argument);
  EXPECT_THROW(a.free(Extent{1 << 30, 4096}), std::invalid_argument);
  auto after = a.stats();
  EXPECT_EQ(before.free, after.free);
  EXPECT_EQ(before.free_fragments, after.free_fragments);
  EXPECT_THROW(a.allocate(0), std::invalid_argument);
  EXPECT_THROW(ExtentAllocator(1 << 20, 3000), std::invalid_argument);
}

TEST(ExtentAllocator, ReserveRebuildsState) {
  ExtentAllocator a(64 * 4096, 4096);
  a.reserve({8 * 4096, 4 * 4096});
  EXPECT_THROW(a.reserve({10 * 4096, 4 * 4096}), std::invalid_argument);  // overlaps
  EXPECT_THROW(a.reserve({100, 4096}), std::invalid_argument);            // unaligned
  EXPECT_EQ(a.stats().used, 4u * 4096);
  EXPECT_EQ(a.stats().free_fragments, 2u);
  a.free({8 * 4096, 4 * 4096});
  EXPECT_EQ(a.stats().free_fragments, 1u);
}

TEST(ExtentAllocator, ConcurrentAllocFreeNeverOverlaps) {
  ExtentAllocator a(64ull << 20, 4096);
  std::vector<std::vector<Extent>> held(4);
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < 5000; ++i) {
        if (!held[t].empty() && rng() % 3 == 0) {
          std::size_t k = rng() % held[t].size();
          a.free(held[t][k]);
          held[t].erase(held[t].begin() + static_cast<long>(k));
        } else if (auto e = a.try_allocate(4096 * (1 + rng() % 64))) {
          held[t].push_back(*e);
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  std::vector<Extent> all;
  std::uint64_t used = 0;
  for (auto& h : held)
    for (auto& e : h) {
      all.push_back(e);
      used += e.length;
    }
  std::sort(all.begin(), all.end(), [](auto& x, auto& y) { return x.offset < y.offset; });
  for (std::size_t i = 1; i < all.size(); ++i)
    ASSERT_LE(all[i - 1].offset + all[i - 1].length, all[i].offset) << "overlapping extents";
  EXPECT_EQ(a.stats().used, used);
}
