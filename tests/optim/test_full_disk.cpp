// A real full disk: the swap directory and the checkpoint directory on a small tmpfs that the test
// mounts (in a child process with a private mount namespace, so nothing outlives the test), then
// fills. A step whose commit rewrites its manifest into the file the previous commit replaced
// needs no room; one whose commit finds no room (no such file to recycle) fails with an error
// naming the file, the previous generation stays valid (resume() reopens it), and once space is
// freed the same step succeeds;
// a save() into a full filesystem fails before writing (or, out of room part-way, removes what it
// wrote), naming the directory, and the previous checkpoint still loads.
// Skipped, with the reason, where no mount namespace can be made (not root, no user namespaces).
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>

#include "test_util.hpp"
#include "tierswap/tiered_optimizer.hpp"

using namespace tierswap;
using tierswap::test::names_in;
using tierswap::test::TempDir;

namespace {

// Runs `body` in a child whose private mount namespace has a tmpfs of `mib` MiB at `dir`.
// Returns "" when the child passed, else what failed (or "skip: why").
std::string with_small_filesystem(const std::filesystem::path& dir, int mib,
                                  const std::function<void()>& body) {
  int pipefd[2];
  if (::pipe(pipefd) != 0) return "pipe failed";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(pipefd[0]);
    auto report = [&](const std::string& s) {
      (void)!::write(pipefd[1], s.data(), s.size());
      ::_exit(s.empty() ? 0 : 1);
    };
    const int flags = ::getuid() == 0 ? CLONE_NEWNS : CLONE_NEWUSER | CLONE_NEWNS;
    if (::unshare(flags) != 0)
      report(std::string("skip: no private mount namespace (unshare: ") + std::strerror(errno) +
             ")");
    ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr);
    const std::string opts = "size=" + std::to_string(mib) + "m";
    if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, opts.c_str()) != 0)
      report(std::string("skip: cannot mount a tmpfs (") + std::strerror(errno) + ")");
    try {
      body();
    } catch (const std::exception& e) {
      report(e.what());
    }
    report("");
  }
  ::close(pipefd[1]);
  std::string out;
  char buf[512];
  for (ssize_t r; (r = ::read(pipefd[0], buf, sizeof buf)) > 0;) out.append(buf, r);
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (out.empty() && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
    out = "the child died (status " + std::to_string(status) + ")";
  return out;
}

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("check failed: " + what);
}

// Fills the filesystem of `dir` with a file until writing fails; returns its path.
std::filesystem::path fill(const std::filesystem::path& dir, const char* name = "filler") {
  const auto p = dir / name;
  std::ofstream f(p, std::ios::binary);
  const std::string chunk(1 << 16, 'x');
  while (f.write(chunk.data(), chunk.size()) && f.flush()) {
  }
  return p;
}

TieredOptions options(const std::filesystem::path& dir, bool pipelined = false) {
  TieredOptions o = test::tiered_options(dir, 2ull << 20, 1);
  o.optimizer.pipelined_commit = pipelined;
  o.tiers.durable = true;  // the fsyncs of a commit meet the full disk too
  o.optimizer.subgroup_size = 16384;
  o.optimizer.state_tier = OptimizerConfig::StateTier::nvme;
  o.keep_swap_files = true;
  o.resume = true;
  return o;
}

struct Model {
  TieredOptimizer t;
  ParamId w;
  explicit Model(const std::filesystem::path& dir, bool pipelined = false)
      : t(options(dir, pipelined)) {
    w = t.add_param(t.add_group(GroupConfig::defaults(OptimizerKind::adamw)),
                    {"w", {123, 457}, Dtype::bf16});
    t.finalize();
    if (!t.resumed())
      t.optimizer().initialize([](ParamId, std::uint64_t off, float* o, std::uint64_t n) {
        for (std::uint64_t i = 0; i < n; ++i) o[i] = 1e-3f * static_cast<float>((off + i) % 71);
      });
  }
  void step() {
    ShardedOptimizer& opt = t.optimizer();
    opt.begin_backward();
    std::vector<std::uint16_t> g(opt.param(w).numel(), float_to_bf16(0.01f));
    opt.add_grad(w, g.data(), Dtype::bf16);
    opt.end_backward();
    opt.step();
  }
};

using test::error_of;

}  // namespace

TEST(FullDisk, AStepWithoutRoomFailsNamingTheFileAndTheNextOneAfterFreeingSucceeds) {
  TempDir mnt;
  const std::string r = with_small_filesystem(mnt.path(), 24, [&] {
    const auto swap = mnt.path() / "swap";
    std::filesystem::create_directories(swap);
    std::vector<float> before;
    {
      Model m(swap);
      m.step();
      const auto filler = fill(mnt.path());
      m.step();  // its manifest goes into the file the last commit replaced: no room needed
      check(m.t.optimizer().step_count() == 2, "a step with a manifest to recycle needs no room");
      before = m.t.optimizer().gather(m.w);
      std::filesystem::remove(swap / "tierswap-rank0" / "tierswap.manifest.tmp");
      const auto filler2 = fill(mnt.path(), "filler2");  // and the room it held is taken too
      const std::string e = error_of([&] { m.step(); });
      check(!e.empty(), "a step on a full filesystem succeeded");
      check(e.find("tierswap.manifest") != std::string::npos, "the error names the file: " + e);
      check(e.find("No space left") != std::string::npos, "the error says ENOSPC: " + e);
      check(m.t.optimizer().step_count() == 2, "the failed step was rolled back");
      check(m.t.optimizer().gather(m.w) == before, "the committed state is unchanged");
      std::filesystem::remove(filler);
      std::filesystem::remove(filler2);
      m.step();  // room again: the same step succeeds
      check(m.t.optimizer().step_count() == 3, "the step after freeing space succeeded");
    }
    Model again(swap);  // what is on disk is the committed generation of step 3
    check(again.t.resumed() && again.t.optimizer().step_count() == 3, "resumed at step 3");
  });
  if (r.rfind("skip:", 0) == 0) GTEST_SKIP() << r;
  EXPECT_EQ(r, "");
}

// The same with the commit left running (pipelined_commit): the step returns, and its failure is
// the next call's, which finds step 2's state, parameters and count put back.
TEST(FullDisk, APipelinedCommitWithoutRoomFailsAtTheNextCallRolledBack) {
  TempDir mnt;
  const std::string r = with_small_filesystem(mnt.path(), 24, [&] {
    const auto swap = mnt.path() / "swap";
    std::filesystem::create_directories(swap);
    {
      Model m(swap, true);
      m.step();
      m.step();
      const std::vector<float> before = m.t.optimizer().gather(m.w);  // step 2 landed first
      const auto filler = fill(mnt.path());
      std::filesystem::remove(swap / "tierswap-rank0" / "tierswap.manifest.tmp");
      const auto filler2 = fill(mnt.path(), "filler2");
      m.step();  // returns: its commit runs on
      check(m.t.optimizer().step_count() == 3, "the step returned before its commit landed");
      const std::string e = error_of([&] { (void)m.t.optimizer().gather(m.w); });
      check(e.find("step 3's commit") != std::string::npos, "the error names the step: " + e);
      check(e.find("No space left") != std::string::npos, "the error says ENOSPC: " + e);
      check(m.t.optimizer().step_count() == 2, "step 3 was rolled back");
      check(m.t.optimizer().gather(m.w) == before, "the state is step 2's");
      std::filesystem::remove(filler);
      std::filesystem::remove(filler2);
      m.step();
      check(m.t.optimizer().step_count() == 3, "the step after freeing space succeeded");
    }  // closing waits for its commit
    Model again(swap);
    check(again.t.resumed() && again.t.optimizer().step_count() == 3, "resumed at step 3");
  });
  if (r.rfind("skip:", 0) == 0) GTEST_SKIP() << r;
  EXPECT_EQ(r, "");
}

// Room for the data file but not for the index after it: the save fails with ENOSPC part-way and
// removes what it wrote. No room for the data: it fails before writing, saying what it needs.
// Either way the previous checkpoint still loads, and with room again a save succeeds.
TEST(FullDisk, ASaveWithoutRoomFailsLeavingThePreviousCheckpointAsItWas) {
  TempDir mnt, swap;
  const std::string r = with_small_filesystem(mnt.path(), 8, [&] {
    const auto ckpt = mnt.path() / "ckpt";
    Model m(swap.path());
    m.step();
    m.t.optimizer().save(ckpt);
    const auto saved = m.t.optimizer().gather(m.w);
    const auto files = names_in(ckpt);
    m.step();
    const auto filler = fill(mnt.path());
    const std::uint64_t page = 4096, need = m.t.optimizer().state_bytes();
    std::filesystem::resize_file(
        filler, std::filesystem::file_size(filler) / page * page - (need + page - 1) / page * page);
    std::string e = error_of([&] { m.t.optimizer().save(ckpt); });
    check(!e.empty(), "a save with room for its data file only succeeded");
    check(e.find("No space left") != std::string::npos, "the error says ENOSPC: " + e);
    check(e.find(ckpt.string()) != std::string::npos, "the error names the file: " + e);
    check(names_in(ckpt) == files, "the partial save's files are removed");
    const auto filler2 = fill(mnt.path(), "filler2");
    e = error_of([&] { m.t.optimizer().save(ckpt); });
    check(e.find("save to " + ckpt.string() + " failed") != std::string::npos,
          "the error names the directory: " + e);
    check(e.find("needs 658.72 KiB (674532 B)") != std::string::npos,
          "the error says what the state needs: " + e);
    check(e.find("is kept") != std::string::npos, "the error says the old one is kept: " + e);
    check(names_in(ckpt) == files, "nothing was written beside the previous checkpoint");
    std::filesystem::remove(filler);
    std::filesystem::remove(filler2);
    m.t.optimizer().load(ckpt);  // the previous checkpoint, intact
    check(m.t.optimizer().gather(m.w) == saved, "the previous checkpoint loads bit for bit");
    check(m.t.optimizer().step_count() == 1, "at its step");
    m.t.optimizer().save(ckpt);  // and with room a save succeeds
  });
  if (r.rfind("skip:", 0) == 0) GTEST_SKIP() << r;
  EXPECT_EQ(r, "");
}
