#include <gtest/gtest.h>

#include "tierswap/device.hpp"

TEST(Device, ProbeAnswersWithAReason) {
  const auto& d = tierswap::device_info();
  if (d.available) {
    EXPECT_GT(d.device_count, 0);
    EXPECT_FALSE(d.name.empty());
  } else {
    EXPECT_FALSE(d.reason.empty());
    EXPECT_EQ(d.device_count, 0);
  }
  EXPECT_EQ(&d, &tierswap::device_info()) << "the probe runs once";
}

TEST(Device, GpuPresentWhenBuiltWithCuda) {
  const auto& d = tierswap::device_info();
  if (!d.available) GTEST_SKIP() << "no GPU: " << d.reason;
  EXPECT_TRUE(d.compiled_with_cuda);
}
