// Directories removed when a signal ends the process (tierswap/signal_cleanup.hpp): the tree goes,
// the process still dies of the signal, a forgotten directory and a program's own handler are
// left alone, and slots are reused (a Python process builds many optimizers).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "test_util.hpp"
#include "tierswap/signal_cleanup.hpp"

using namespace tierswap;
using tierswap::test::TempDir;
namespace fs = std::filesystem;

namespace {

// dir/sub/deeper/file and dir/file: what a swap directory holds (rank dir, files).
fs::path make_tree(const fs::path& root, const char* name) {
  const fs::path dir = root / name;
  fs::create_directories(dir / "sub" / "deeper");
  std::ofstream(dir / "sub" / "deeper" / "file") << "state";
  std::ofstream(dir / "file") << "state";
  return dir;
}

void own_handler(int) {
  ::_exit(7);
}

}  // namespace

TEST(SignalCleanup, ASignalRemovesTheRegisteredTreesAndStillEndsTheProcess) {
  TempDir root;
  const fs::path mine = make_tree(root.path(), "mine");
  const fs::path forgotten = make_tree(root.path(), "forgotten");
  const fs::path other = make_tree(root.path(), "other");
  for (int sig : {SIGTERM, SIGHUP, SIGINT}) {
    EXPECT_EXIT(
        {
          struct sigaction was {};  // ignored when run under nohup: default, as in a terminal
          if (::sigaction(sig, nullptr, &was) == 0 && was.sa_handler == SIG_IGN)
            ::signal(sig, SIG_DFL);
          if (remove_on_signal(mine) < 0) ::_exit(1);
          forget_on_signal(remove_on_signal(forgotten));
          ::raise(sig);
          ::_exit(2);  // not reached: the signal ends the process
        },
        ::testing::KilledBySignal(sig), "")
        << strsignal(sig);
    EXPECT_FALSE(fs::exists(mine)) << strsignal(sig);
    EXPECT_TRUE(fs::exists(forgotten / "sub" / "deeper" / "file")) << strsignal(sig);
    EXPECT_TRUE(fs::exists(other / "file")) << strsignal(sig);
    make_tree(root.path(), "mine");
  }
}

TEST(SignalCleanup, AProgramsOwnHandlerIsKept) {
  TempDir root;
  const fs::path mine = make_tree(root.path(), "mine");
  EXPECT_EXIT(
      {
        ::signal(SIGTERM, own_handler);  // installed before: the program's way out
        if (remove_on_signal(mine) < 0) ::_exit(1);
        ::raise(SIGTERM);
        ::_exit(2);
      },
      ::testing::ExitedWithCode(7), "");
  EXPECT_TRUE(fs::exists(mine / "sub" / "deeper" / "file"));
}

TEST(SignalCleanup, AForkedChildEndedByASignalLeavesItsParentsDirectories) {
  TempDir root;
  const fs::path mine = make_tree(root.path(), "mine");
  EXPECT_EXIT(
      {
        if (remove_on_signal(mine) < 0) ::_exit(1);
        const pid_t worker = ::fork();  // a data loader's worker: the handler and slots inherited
        if (worker == 0) {
          ::raise(SIGTERM);  // its parent stops it
          ::_exit(2);
        }
        int status = 0;
        if (::waitpid(worker, &status, 0) != worker || !WIFSIGNALED(status)) ::_exit(3);
        ::_exit(fs::exists(mine / "sub" / "deeper" / "file") ? 0 : 4);  // still the parent's
      },
      ::testing::ExitedWithCode(0), "");
  EXPECT_TRUE(fs::exists(mine / "file"));
}

TEST(SignalCleanup, SlotsAreReusedAfterForgetAndACoveredSetIsBounded) {
  TempDir root;
  for (int i = 0; i < 500; ++i) {  // many optimizers, one after another
    const int h = remove_on_signal(root.path() / "x");
    ASSERT_GE(h, 0) << "registration " << i;
    forget_on_signal(h);
  }
  std::vector<int> held;
  for (int h; (h = remove_on_signal(root.path() / "y")) >= 0;) held.push_back(h);
  EXPECT_EQ(held.size(), 64u);  // all slots taken: the next is not covered (-1), not an error
  forget_on_signal(held.back());
  held.back() = remove_on_signal(root.path() / "z");
  EXPECT_GE(held.back(), 0);
  for (int h : held) forget_on_signal(h);
  forget_on_signal(-1);                                     // ignored
  EXPECT_EQ(remove_on_signal(std::string(2000, 'a')), -1);  // too long to copy: not covered
}
