// Hostile paths: swap and checkpoint directories that are symbolic links, owned by another user,
// or world-writable without the sticky bit are refused with an error naming the directory and
// the reason, before anything is written there; /var/tmp-like directories (1777) are accepted.
// Also tierswap's own temporary directories: what a killed process left is removed, nothing else.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>

#include "test_util.hpp"
#include "tierswap/detail/paths.hpp"
#include "tierswap/detail/temp_dir.hpp"
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

// Temporary directories of tierswap's own: one whose process died without removing it (no
// destructor, no handler: SIGKILL) is removed by the next one made under that root; one whose
// process lives, one without a lock file, another host's and another user's are left alone.
TEST(OwnedTempDir, RemovesWhatADeadProcessLeftAndNothingElse) {
  TempDir root;
  const auto made_by_child = [&](bool keep) {
    int fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    const pid_t child = ::fork();
    if (child == 0) {  // makes one, writes into it, and ends without running a destructor
      auto* d = new detail::OwnedTempDir(root.path(), "tierswap-bench");
      std::ofstream(d->path() / "tierswap.swap") << std::string(1 << 16, 's');
      const std::string p = keep ? d->keep().string() : d->path().string();
      if (::write(fds[1], p.data(), p.size()) != ssize_t(p.size())) ::_exit(1);
      ::_exit(0);
    }
    ::close(fds[1]);
    char buf[4096] = {};
    const ssize_t n = ::read(fds[0], buf, sizeof buf - 1);
    ::close(fds[0]);
    int status = 0;
    ::waitpid(child, &status, 0);
    EXPECT_TRUE(n > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return std::filesystem::path(std::string(buf, n > 0 ? n : 0));
  };
  const auto kept = made_by_child(true);  // first: the next one made sweeps
  const auto dead = made_by_child(false);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const auto leftover = [&](const std::string& name) {
    std::filesystem::create_directory(root.path() / name);
    std::ofstream(root.path() / name / "tierswap.swap") << "state";
    std::ofstream(root.path() / (name + ".lock")) << "";
    return root.path() / name;
  };
  const auto other_host = leftover("tierswap-elsewhere-a1b2c3");
  // Another user's, where this test can make one (as root); else a second host's stands in.
  const bool root_user = ::geteuid() == 0;
  const auto others =
      leftover(root_user ? std::string("tierswap-") + host + "-others" : "tierswap-far-d4e5f6");
  if (root_user) ASSERT_EQ(::chown((others.string() + ".lock").c_str(), 65534, 65534), 0);
  const auto unlocked = root.path() / (std::string("tierswap-") + host + "-nolock");
  std::filesystem::create_directory(unlocked);
  std::vector<detail::OwnedTempDir::Swept> swept;
  {
    detail::OwnedTempDir live(root.path(), "tierswap", detail::OwnedTempDir::OnSignal::leave,
                              &swept);
    ASSERT_EQ(swept.size(), 1u);
    EXPECT_EQ(swept[0].path, dead);
    EXPECT_GE(swept[0].bytes, 1u << 16);
    EXPECT_TRUE(std::filesystem::exists(live.path().string() + ".lock"));
    detail::OwnedTempDir fresh(root.path(), "tierswap-x", detail::OwnedTempDir::OnSignal::leave,
                               &swept);
    EXPECT_TRUE(swept.empty());
    EXPECT_TRUE(std::filesystem::exists(live.path()));  // its lock is held: left alone
    const pid_t child = ::fork();  // a data loader's worker, whose copy goes at its exit
    if (child == 0) {
      live.remove();
      ::_exit(live.path().empty() ? 0 : 1);
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    EXPECT_TRUE(std::filesystem::exists(live.path().string() + ".lock"));  // still the parent's
    EXPECT_TRUE(detail::OwnedTempDir::sweep(root.path()).empty());         // and still locked
  }
  EXPECT_FALSE(std::filesystem::exists(dead));
  EXPECT_FALSE(std::filesystem::exists(dead.string() + ".lock"));
  for (const auto& p : {kept, other_host, others, unlocked})
    EXPECT_TRUE(std::filesystem::exists(p));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(root.path()),
                          std::filesystem::directory_iterator()),
            6);  // those four and two lock files (another host's, another user's): nothing more
  EXPECT_TRUE(detail::OwnedTempDir::sweep(root.path()).empty());
}

// A process killed after it made its lock file and before its directory leaves a lock with no
// directory, which the next sweep removes; a made directory is private and its lock is the only
// file beside it (no half-made ".new" name).
TEST(OwnedTempDir, SweepsALockWhoseDirectoryWasNeverMade) {
  TempDir root;
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const auto orphan = root.path() / (std::string("tierswap-") + host + "-q7R2xZ.lock");
  std::ofstream(orphan) << "";  // unlocked: its process has ended
  std::vector<detail::OwnedTempDir::Swept> swept;
  detail::OwnedTempDir d(root.path(), "tierswap", detail::OwnedTempDir::OnSignal::leave, &swept);
  EXPECT_TRUE(swept.empty());  // no directory, so nothing to report
  EXPECT_FALSE(std::filesystem::exists(orphan));
  struct stat st {};
  ASSERT_EQ(::stat(d.path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(root.path()))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  const std::string base = d.path().filename().string();
  EXPECT_EQ(names, (std::vector<std::string>{base, base + ".lock"}));
  d.remove();
  EXPECT_TRUE(std::filesystem::is_empty(root.path()));
}

// The named way of making a lock (filesystems without O_TMPFILE): the name is locked before
// anyone can open it free, no `.new` file is left, and a taken name is never replaced.
TEST(OwnedTempDir, TheNamedWayLocksBeforeTheNameAndNeverReplacesOne) {
  TempDir root;
  const auto lock = root.path() / "tierswap-h-abcdef.lock";
  const int fd = detail::lock_by_name(lock);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  EXPECT_TRUE(std::filesystem::exists(lock));
  EXPECT_FALSE(std::filesystem::exists(lock.string() + ".new"));
  const int other = ::open(lock.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(other, 0);
  EXPECT_NE(::flock(other, LOCK_EX | LOCK_NB), 0);  // held by fd
  struct stat before {
  }, after{};
  ASSERT_EQ(::stat(lock.c_str(), &before), 0);
  errno = 0;
  EXPECT_EQ(detail::lock_by_name(lock), -1);
  EXPECT_EQ(errno, EEXIST);
  ASSERT_EQ(::stat(lock.c_str(), &after), 0);
  EXPECT_EQ(before.st_ino, after.st_ino);  // the taken name still names the held lock
  EXPECT_FALSE(std::filesystem::exists(lock.string() + ".new"));
  ::close(fd);
  EXPECT_EQ(::flock(other, LOCK_EX | LOCK_NB), 0);  // free once its holder closed it
  ::close(other);
}

// A `.lock.new` file its process never removed (killed inside the named way) is swept once it is
// free and older than a minute; a younger one, or one still locked, stays.
TEST(OwnedTempDir, SweepsAnOldFreeNewLockFileAndKeepsTheOthers) {
  TempDir root;
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const auto name = [&](const char* r) {
    return root.path() / (std::string("tierswap-") + host + "-" + r + ".lock.new");
  };
  const auto old_free = name("Aa0001"), young_free = name("Aa0002"), old_held = name("Aa0003");
  for (const auto& p : {old_free, young_free, old_held}) std::ofstream(p) << "";
  const struct timespec two_minutes_ago[2] = {{::time(nullptr) - 120, 0},
                                              {::time(nullptr) - 120, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, old_free.c_str(), two_minutes_ago, 0), 0);
  ASSERT_EQ(::utimensat(AT_FDCWD, old_held.c_str(), two_minutes_ago, 0), 0);
  const int held = ::open(old_held.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_EQ(::flock(held, LOCK_EX), 0);  // a live process's
  detail::OwnedTempDir d(root.path(), "tierswap", detail::OwnedTempDir::OnSignal::leave);
  EXPECT_FALSE(std::filesystem::exists(old_free));
  EXPECT_TRUE(std::filesystem::exists(young_free));
  EXPECT_TRUE(std::filesystem::exists(old_held));
  ::close(held);
}
