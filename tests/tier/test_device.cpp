#include <gtest/gtest.h>

#include <string>

#include "tierswap/communicator.hpp"
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

// Without a GPU, asking for NCCL says so and what to use instead (not a CUDA runtime message).
TEST(Device, AnNcclCommunicatorWithoutAGpuSaysWhatToUse) {
  const auto& d = tierswap::device_info();
  if (d.available) GTEST_SKIP() << "a GPU is usable here: NCCL may start";
  try {
    (void)tierswap::make_communicator("nccl");
    FAIL() << "an NCCL communicator started without a GPU";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    if (!d.compiled_with_cuda) {
      EXPECT_NE(what.find("this build has no NCCL"), std::string::npos) << what;
    } else {
      EXPECT_NE(what.find("no usable GPU here"), std::string::npos) << what;
      EXPECT_NE(what.find("use \"mpi\" or \"single\""), std::string::npos) << what;
    }
  }
}
