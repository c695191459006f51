#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "test_util.hpp"
#include "tierswap/units.hpp"

using namespace tierswap;
using tierswap::test::TempDir;

namespace {

std::string read_file(const std::filesystem::path& p, std::size_t n) {
  std::string s(n, '\0');
  std::ifstream in(p, std::ios::binary);
  in.read(s.data(), static_cast<std::streamsize>(n));
  return s;
}

void poke(const std::filesystem::path& p, off_t off, char value) {
  int fd = ::open(p.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, &value, 1, off), 1);
  ::close(fd);
}

using test::error_of;

}  // namespace

TEST(SwapSpace, CreatesPreallocatedPrivateFilesAndReopens) {
  TempDir a, b;
  std::string uuid;
  {
    SwapSpace s = test::make_space({a.path(), b.path()}, 10 * MiB, 1 * MiB);
    EXPECT_EQ(s.capacity(), 10 * MiB);  // a multiple of stripe x files already
    ASSERT_EQ(s.files().size(), 2u);
    for (const auto& f : s.files()) {
      struct stat st {};
      ASSERT_EQ(::stat(f.path.c_str(), &st), 0);
      EXPECT_EQ(st.st_mode & 0777, 0600u);
      EXPECT_EQ(static_cast<std::uint64_t>(st.st_size), f.data_offset + 5 * MiB);
      EXPECT_GE(static_cast<std::uint64_t>(st.st_blocks) * 512, 5 * MiB) << "not preallocated";
      EXPECT_EQ(f.data_offset % f.offset_align, 0u);
      if (f.direct) {
        EXPECT_GE(f.offset_align, 512u);
        EXPECT_EQ(f.offset_align & (f.offset_align - 1), 0u);
      }
    }
    uuid = s.uuid();
  }
  {
    SwapSpace r = SwapSpace::open({a.path(), b.path()});
    EXPECT_EQ(r.uuid(), uuid);
    EXPECT_EQ(r.capacity(), 10 * MiB);
    EXPECT_EQ(r.stripe_size(), 1 * MiB);
  }  // closed first: one open space per file at a time
  // Directories given in another order: the file indices put them back.
  SwapSpace r = SwapSpace::open({b.path(), a.path()});
  EXPECT_EQ(r.files()[0].path.parent_path(), a.path());
}

// One open space per swap file: a second opener (another process, or another object in this
// one) is refused naming the holder, and the files are left as they were; the lock goes with the
// space that held it, and with a process killed while holding it.
TEST(SwapSpace, ASpaceInUseIsRefusedNamingItsHolder) {
  TempDir a, b;
  {
    SwapSpace s = test::make_space({a.path(), b.path()}, 4 * MiB, 1 * MiB);
    const std::string here = fmt::format("in use by this process ({})", ::getpid());
    EXPECT_NE(error_of([&] {
                SwapSpace::open({a.path(), b.path()});
              }).find(here),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                SwapSpace::open({b.path(), a.path()});
              }).find("is in use"),
              std::string::npos);
    EXPECT_EQ(s.files().size(), 2u);
  }
  EXPECT_NO_THROW(SwapSpace::open({a.path(), b.path()}));  // closed: free again
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // holds the space until killed
    try {
      SwapSpace held = SwapSpace::open({a.path(), b.path()});
      if (::write(ready[1], "x", 1) != 1) ::_exit(3);
      ::pause();
    } catch (...) {
    }
    ::_exit(2);
  }
  ::close(ready[1]);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  EXPECT_NE(error_of([&] {
              SwapSpace::open({a.path(), b.path()});
            }).find(fmt::format("in use by process {}", child)),
            std::string::npos);
  ::kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  std::optional<SwapSpace> again(SwapSpace::open({a.path(), b.path()}));  // a killed holder
  EXPECT_EQ(again->capacity(), 4 * MiB);                                  // frees it
  // A child forked while the space is open (a DataLoader worker) does not keep its lock.
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t worker = ::fork();
  ASSERT_GE(worker, 0);
  if (worker == 0) {  // running: fork's handlers have run in it
    if (::write(ready[1], "x", 1) != 1) ::_exit(3);
    ::pause();
    ::_exit(0);
  }
  ::close(ready[1]);
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  again.reset();  // closed here, the worker still running
  EXPECT_NO_THROW(SwapSpace::open({a.path(), b.path()}));
  ::kill(worker, SIGKILL);
  ASSERT_EQ(::waitpid(worker, &status, 0), worker);
}

TEST(SwapSpace, CapacityRoundsUpToWholeStripes) {
  TempDir a, b, c;
  SwapSpace s = test::make_space({a.path(), b.path(), c.path()}, 1, 64 * KiB);
  EXPECT_EQ(s.capacity(), 3 * 64 * KiB);
}

TEST(SwapSpace, StripesLogicalOffsetsAcrossFiles) {
  TempDir a, b, c;
  SwapSpace s = test::make_space({a.path(), b.path(), c.path()}, 12 * 64 * KiB, 64 * KiB);
  const auto d0 = s.files()[0].data_offset;
  PhysicalSpan p = s.map(0, 1 * MiB);
  EXPECT_EQ(p.file, 0u);
  EXPECT_EQ(p.offset, d0);
  EXPECT_EQ(p.length, 64 * KiB);  // stops at the stripe boundary
  p = s.map(64 * KiB + 100, 10);
  EXPECT_EQ(p.file, 1u);
  EXPECT_EQ(p.offset, s.files()[1].data_offset + 100);
  EXPECT_EQ(p.length, 10u);
  p = s.map(3 * 64 * KiB + 5, 1 * MiB);  // second row of file 0
  EXPECT_EQ(p.file, 0u);
  EXPECT_EQ(p.offset, d0 + 64 * KiB + 5);
  EXPECT_EQ(p.length, 64 * KiB - 5);
  p = s.map(s.capacity() - 1, 100);
  EXPECT_EQ(p.length, 1u);
}

// With one file the stripes are contiguous in it: a span runs across them (so a request larger
// than the stripe is not cut), up to the end of the space.
TEST(SwapSpace, OneFileSpansCrossStripes) {
  TempDir a;
  SwapSpace s = test::make_space({a.path()}, 8 * 64 * KiB, 64 * KiB);
  const auto d0 = s.files()[0].data_offset;
  PhysicalSpan p = s.map(100, 1 * MiB);
  EXPECT_EQ(p.file, 0u);
  EXPECT_EQ(p.offset, d0 + 100);
  EXPECT_EQ(p.length, 8 * 64 * KiB - 100);  // to the end of the space, not of the stripe
  p = s.map(3 * 64 * KiB + 7, 200 * KiB);
  EXPECT_EQ(p.offset, d0 + 3 * 64 * KiB + 7);
  EXPECT_EQ(p.length, 200 * KiB);
}

TEST(SwapSpace, NeverOverwritesAnExistingFile) {
  TempDir a;
  { SwapSpace s = test::make_space({a.path()}, 4 * MiB); }
  auto file = a.path() / "tierswap.swap";
  std::string before = read_file(file, 4096);
  try {
    test::make_space({a.path()}, 8 * MiB);
    FAIL();
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code().value(), EEXIST);
    EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("one is there already"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_file(file, 4096), before);
  EXPECT_EQ(std::filesystem::file_size(file), MiB + 4 * MiB);
}

TEST(SwapSpace, DoesNotFollowSymlinks) {
  TempDir a, b;
  auto target = b.path() / "victim";
  { std::ofstream(target) << "precious"; }
  std::filesystem::create_symlink(target, a.path() / "tierswap.swap");
  EXPECT_THROW(test::make_space({a.path()}, 1 * MiB), std::system_error);
  std::string w = error_of([&] { SwapSpace::open({a.path()}); });
  EXPECT_NE(w.find("tierswap.swap"), std::string::npos) << w;
  EXPECT_EQ(read_file(target, 8), "precious");
}

TEST(SwapSpace, CorruptTruncatedOrForeignFilesGiveClearErrors) {
  TempDir a;
  { SwapSpace s = test::make_space({a.path()}, 4 * MiB); }
  auto file = a.path() / "tierswap.swap";
  poke(file, 40, 0x5a);  // inside the header, covered by the checksum
  EXPECT_NE(error_of([&] { SwapSpace::open({a.path()}); }).find("checksum"), std::string::npos);
  poke(file, 0, 'X');
  EXPECT_NE(error_of([&] { SwapSpace::open({a.path()}); }).find("not a tierswap swap file"),
            std::string::npos);

  TempDir b;
  { SwapSpace s = test::make_space({b.path()}, 4 * MiB); }
  auto file_b = b.path() / "tierswap.swap";
  ASSERT_EQ(::truncate(file_b.c_str(), 2 * MiB), 0);
  EXPECT_NE(error_of([&] { SwapSpace::open({b.path()}); }).find("truncated"), std::string::npos);
  ASSERT_EQ(::truncate(file_b.c_str(), 100), 0);
  EXPECT_NE(error_of([&] { SwapSpace::open({b.path()}); }).find("truncated"), std::string::npos);
}

TEST(SwapSpace, MismatchedSetsAreRejected) {
  TempDir a, b, c;
  { SwapSpace s = test::make_space({a.path(), b.path()}, 4 * MiB); }
  { SwapSpace s = test::make_space({c.path()}, 4 * MiB); }
  EXPECT_NE(
      error_of([&] { SwapSpace::open({a.path()}); }).find("striped over 2 files but 1 directories"),
      std::string::npos);
  EXPECT_NE(error_of([&] {
              SwapSpace::open({a.path(), c.path()});
            }).find("different swap space"),
            std::string::npos);
  TempDir empty;  // a directory of none of its files: named, with where they are
  EXPECT_NE(
      error_of([&] {
        SwapSpace::open({b.path(), empty.path(), a.path()});
      })
          .find(empty.path().string() + " holds no file of the swap space whose files are in " +
                b.path().string() + ", " + a.path().string()),
      std::string::npos);
  SwapSpaceConfig cfg;
  cfg.dirs = {a.path(), b.path()};
  cfg.capacity = 8 * MiB;
  EXPECT_NE(error_of([&] { SwapSpace::open_or_create(cfg); }).find("exists with capacity"),
            std::string::npos);
  cfg.capacity = 4 * MiB;
  bool created = true;
  EXPECT_NO_THROW(SwapSpace::open_or_create(cfg, &created));
  EXPECT_FALSE(created) << "reopened, not created";
  TempDir fresh;
  SwapSpaceConfig fresh_cfg = cfg;
  fresh_cfg.dirs = {fresh.path()};
  EXPECT_NO_THROW(SwapSpace::open_or_create(fresh_cfg, &created));
  EXPECT_TRUE(created);
  TempDir d;
  cfg.dirs = {a.path(), d.path()};
  EXPECT_NE(error_of([&] { SwapSpace::open_or_create(cfg); })
                .find(d.path().string() + " holds no file of the swap space whose files are in " +
                      a.path().string()),
            std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(d.path() / "tierswap.swap"));
}

TEST(SwapSpace, BadConfigNamesTheProblem) {
  TempDir a;
  SwapSpaceConfig c;
  c.dirs = {a.path() / "missing"};
  c.capacity = MiB;
  EXPECT_NE(error_of([&] { SwapSpace::create(c); }).find("not an existing directory"),
            std::string::npos);
  c.dirs = {a.path(), a.path()};
  EXPECT_NE(error_of([&] { SwapSpace::create(c); }).find("same directory"), std::string::npos);
  c.dirs = {a.path()};
  c.stripe_size = 1000;
  EXPECT_NE(error_of([&] { SwapSpace::create(c); }).find("stripe_size"), std::string::npos);
  c.stripe_size = MiB;
  c.capacity = 0;
  EXPECT_NE(error_of([&] { SwapSpace::create(c); }).find("capacity"), std::string::npos);
  c.capacity = 1ull << 60;  // an exbibyte: more than any test disk
  std::string w = error_of([&] { SwapSpace::create(c); });
  EXPECT_NE(w.find("only"), std::string::npos) << w;
  EXPECT_NE(w.find(a.path().string()), std::string::npos) << w;
  EXPECT_FALSE(std::filesystem::exists(a.path() / "tierswap.swap")) << "half-built file left";
}

TEST(SwapSpaceConfig, JsonAndEnv) {
  auto c = SwapSpaceConfig::from_json(
      R"({"dirs": ["/a", "/b"], "capacity": "8GiB", "stripe_size": 262144, "direct": "off"})");
  EXPECT_EQ(c.dirs.size(), 2u);
  EXPECT_EQ(c.capacity, 8 * GiB);
  EXPECT_EQ(c.stripe_size, 256 * KiB);
  EXPECT_EQ(c.direct, DirectIo::off);
  EXPECT_NE(error_of([] { SwapSpaceConfig::from_json(R"({"capasity": 1})"); }).find("capasity"),
            std::string::npos);
  EXPECT_NE(error_of([] { SwapSpaceConfig::from_json(R"({"direct": "maybe"})"); }).find("direct"),
            std::string::npos);
  EXPECT_THROW(SwapSpaceConfig::from_json("{"), std::invalid_argument);

  const test::ScopedEnv dirs("TIERSWAP_SWAP_DIRS", "/x:/y:/z");
  const test::ScopedEnv capacity("TIERSWAP_SWAP_CAPACITY", "3GiB");
  const auto e = SwapSpaceConfig::from_env();
  EXPECT_EQ(e.dirs.size(), 3u);
  EXPECT_EQ(e.capacity, 3 * GiB);
}

TEST(SwapSpace, TmpfsFallsBackToBufferedOrDirect) {
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  TempDir a("/dev/shm");
  SwapSpace s = test::make_space({a.path()}, 4 * MiB);
  // Either the kernel's tmpfs takes O_DIRECT, or the space fell back to buffered I/O with a
  // warning; both must be usable.
  const auto& f = s.files()[0];
  if (!f.direct) {
    EXPECT_EQ(f.offset_align, 1u);
    EXPECT_EQ(f.mem_align, 1u);
  }
  SwapSpaceConfig c;
  c.dirs = {a.path()};
  c.capacity = 4 * MiB;
  c.direct = DirectIo::off;
  s.remove_files();
  SwapSpace off = SwapSpace::create(c);
  EXPECT_FALSE(off.files()[0].direct);
}
