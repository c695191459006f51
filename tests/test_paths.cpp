// Hostile paths: swap and checkpoint directories that are symbolic links, owned by another user,
// or world-writable without the sticky bit are refused with an error naming the directory and
// the reason, before anything is written there; /var/tmp-like directories (1777) are accepted.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "test_util.hpp"
#include "tierswap/detail/paths.hpp"
#include "tierswap/swap_space.hpp"
#include "tierswap/tiered_optimizer.hpp"

using namespace tierswap;
using tierswap::test::TempDir;

namespace {

TieredOptions options(const std::filesystem::path& dir) {
  return test::tiered_options(dir, 4ull << 20, 1);
}

// The error of finalizing a one-parameter TieredOptimizer on `dir` ("" when it succeeded).
std::string finalize_error(const std::filesystem::path& dir) {
  try {
    TieredOptimizer t(options(dir));
    t.add_param(t.add_group(GroupConfig{}), {"w", {1000}, Dtype::bf16});
    t.finalize();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

std::string create_space_error(const std::filesystem::path& dir) {
  try {
    SwapSpaceConfig c;
    c.dirs = {dir};
    c.capacity = 1 << 20;
    SwapSpace::create(c).remove_files();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

}  // namespace

TEST(HostilePaths, SymlinkedSwapDirectoriesAreRefused) {
  TempDir d;
  const auto real = d.path() / "real", link = d.path() / "link";
  std::filesystem::create_directory(real);
  std::filesystem::create_directory_symlink(real, link);
  for (const std::string& e : {finalize_error(link), create_space_error(link)}) {
    EXPECT_TRUE(has(e, link.string()) && has(e, "symbolic link")) << e;
  }
  EXPECT_TRUE(std::filesystem::is_empty(real));  // nothing was written through the link
  EXPECT_EQ(finalize_error(real), "");
}

// A missing swap directory is not created (a drive not mounted would be filled through its
// mount point): the refusal says how to create it.
TEST(HostilePaths, AMissingSwapDirectoryIsRefusedSayingHowToCreateIt) {
  TempDir d;
  const auto missing = d.path() / "nvme0" / "ts";
  const std::string e = finalize_error(missing);
  EXPECT_TRUE(has(e, "swap_dirs: " + missing.string() + ": is missing (refused): create it") &&
              has(e, "(mkdir -p " + missing.string() + ")"))
      << e;
  EXPECT_FALSE(std::filesystem::exists(missing.parent_path()));
}

TEST(HostilePaths, WorldWritableWithoutStickyBitIsRefusedWithItAccepted) {
  TempDir d;
  const auto open = d.path() / "open";
  std::filesystem::create_directory(open);
  ::chmod(open.c_str(), 0777);
  for (const std::string& e : {finalize_error(open), create_space_error(open)})
    EXPECT_TRUE(has(e, open.string()) && has(e, "sticky")) << e;
  EXPECT_TRUE(std::filesystem::is_empty(open));
  ::chmod(open.c_str(), 01777);  // as /var/tmp
  EXPECT_EQ(finalize_error(open), "");
}

TEST(HostilePaths, ARankDirectoryOthersCanWriteIsRefused) {
  TempDir d;
  const auto sub = d.path() / "tierswap-rank0";
  std::filesystem::create_directory(sub);
  ::chmod(sub.c_str(), 0770);
  const std::string e = finalize_error(d.path());
  EXPECT_TRUE(has(e, sub.string()) && has(e, "writable by group or others")) << e;
}

TEST(HostilePaths, DirectoriesOfAnotherUserAreRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a directory to another user";
  TempDir d;
  const auto theirs = d.path() / "theirs";
  std::filesystem::create_directory(theirs);
  ASSERT_EQ(::chown(theirs.c_str(), 65534, 65534), 0);
  for (const std::string& e : {finalize_error(theirs), create_space_error(theirs)})
    EXPECT_TRUE(has(e, theirs.string()) && has(e, "owned by uid 65534")) << e;
  EXPECT_THROW(detail::check_trusted_dir(theirs, "checkpoint directory"), std::invalid_argument);
}

TEST(HostilePaths, CheckpointDirectoriesAreCheckedOnSaveAndLoad) {
  TempDir swap, d;
  TieredOptimizer t(options(swap.path()));
  t.add_param(t.add_group(GroupConfig{}), {"w", {1000}, Dtype::bf16});
  t.finalize();
  ShardedOptimizer& opt = t.optimizer();
  opt.initialize(
      [](ParamId, std::uint64_t, float* o, std::uint64_t n) { std::fill(o, o + n, 0.5f); });
  const auto real = d.path() / "ckpt", link = d.path() / "ckpt-link";
  opt.save(real);
  std::filesystem::create_directory_symlink(real, link);
  for (auto f : {+[](ShardedOptimizer&o, const std::filesystem::path&p) { o.save(p); },
                 +[](ShardedOptimizer&o, const std::filesystem::path&p) { o.load(p); }}) {
    try {
      f(opt, link);
      ADD_FAILURE() << "a symlinked checkpoint directory was used";
    } catch (const std::invalid_argument& e) {
      EXPECT_TRUE(has(e.what(), link.string()) && has(e.what(), "symbolic link")) << e.what();
    }
  }
  ::chmod(real.c_str(), 0777);
  EXPECT_THROW(opt.load(real), std::invalid_argument);
  ::chmod(real.c_str(), 0700);
  EXPECT_NO_THROW(opt.load(real));
}

// The block device a directory lives on: /proc has none (an anonymous device), a missing path
// cannot be stat'ed; a directory on a disk resolves to its sysfs entry (where the test tree is
// on one).
TEST(BlockDeviceSysfs, NamesTheDeviceOrSaysWhyThereIsNone) {
  std::string why;
  EXPECT_TRUE(detail::block_device_sysfs("/proc", &why).empty());
  EXPECT_TRUE(has(why, "/proc is not on a block device (/sys/dev/block/0:")) << why;
  TempDir d;
  EXPECT_TRUE(detail::block_device_sysfs(d.path() / "missing", &why).empty());
  EXPECT_TRUE(has(why, "missing: cannot stat it")) << why;
  why.clear();
  const auto dev = detail::block_device_sysfs(d.path(), &why);
  if (dev.empty()) GTEST_SKIP() << "the test directory is not on a block device: " << why;
  EXPECT_TRUE(why.empty()) << why;
  EXPECT_TRUE(std::filesystem::exists(dev / "dev")) << dev;  // "MAJ:MIN", as every block device
}

// The tests' own temporary directories: a run killed mid-test leaves its directory and a free
// lock beside it; the next TempDir made in that root removes them, and leaves a live one alone.
TEST(TestTempDir, RemovesWhatAKilledTestRunLeftAndNothingLive) {
  TempDir root;
  const auto leftover = [&](const std::string& name) {
    std::filesystem::create_directory(root.path() / name);
    std::ofstream(root.path() / name / "tierswap.swap") << "state";
    std::ofstream(root.path() / (name + ".lock")) << "";
  };
  leftover("tierswap-test-dead01");
  leftover("tierswap-test-live01");
  const int held = ::open((root.path() / "tierswap-test-live01.lock").c_str(), O_RDONLY);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX), 0);  // its test still runs
  std::filesystem::create_directory(root.path() / "tierswap-test-nolock");
  {
    TempDir fresh(root.path().c_str());
    EXPECT_TRUE(std::filesystem::exists(fresh.path().string() + ".lock"));
    EXPECT_FALSE(std::filesystem::exists(root.path() / "tierswap-test-dead01"));
    EXPECT_FALSE(std::filesystem::exists(root.path() / "tierswap-test-dead01.lock"));
    EXPECT_TRUE(std::filesystem::exists(root.path() / "tierswap-test-live01" / "tierswap.swap"));
    EXPECT_TRUE(std::filesystem::exists(root.path() / "tierswap-test-nolock"));
    TempDir other(root.path().c_str());  // the first one's lock is held: it stays
    EXPECT_TRUE(std::filesystem::exists(fresh.path()));
  }
  ::close(held);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(root.path()),
                          std::filesystem::directory_iterator()),
            3);  // live01, its lock, nolock: each TempDir removed itself and its lock
}
