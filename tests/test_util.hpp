// Helpers shared by the test suites.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tierswap/detail/io_backend.hpp"
#include "tierswap/detail/temp_dir.hpp"
#include "tierswap/io_engine.hpp"
#include "tierswap/swap_space.hpp"
#include "tierswap/tiered_optimizer.hpp"

namespace tierswap::test {

/// The names of the entries of `dir`.
inline std::set<std::string> names_in(const std::filesystem::path& dir) {
  std::set<std::string> n;
  for (const auto& e : std::filesystem::directory_iterator(dir)) n.insert(e.path().filename());
  return n;
}

/// The one-object setup's options for a test: one swap directory, `budget` pinned bytes, one
/// process, `threads` kernel threads, no telemetry and no device tier, commits without fsync.
inline TieredOptions tiered_options(const std::filesystem::path& dir, std::uint64_t budget,
                                    unsigned threads = 2) {
  TieredOptions o;
  o.swap_dirs = {dir};
  o.host_budget = budget;
  o.communicator = "single";
  o.threads = threads;
  o.tiers.telemetry = false;
  o.tiers.durable = false;
  o.tiers.device_mode = DeviceTierMode::off;
  return o;
}

/// A fresh directory on a real filesystem (TMPDIR or /var/tmp: not tmpfs, so O_DIRECT works),
/// removed with everything in it at the end of the test; one a killed test run left (swap files
/// of up to several GiB) is removed by the next one made (detail::OwnedTempDir). Not left to the
/// signal handler: a test process keeps the signals' dispositions and the handler's slots as
/// the test sets them.
class TempDir {
 public:
  explicit TempDir(const char* base = nullptr)
      : dir_(base ? std::filesystem::path(base) : detail::OwnedTempDir::default_root(),
             "tierswap-test", detail::OwnedTempDir::OnSignal::leave) {}
  const std::filesystem::path& path() const { return dir_.path(); }

 private:
  detail::OwnedTempDir dir_;
};

/// Sets an environment variable for its lifetime (a setting read at construction, e.g. by
/// IoEngineConfig::from_env()), then restores what it was: unset, or its earlier value (so
/// guards of one variable nest, and a setting the test run was started with survives).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* was = std::getenv(name)) was_ = was;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (was_)
      ::setenv(name_.c_str(), was_->c_str(), 1);
    else
      ::unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> was_;
};

/// A Unix-domain socket listening at `path` that the test answers (or not) itself: connects
/// to it complete in the backlog. Its descriptor; the test closes it.
inline int listening_socket(const std::filesystem::path& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << path;
  EXPECT_EQ(::listen(fd, 4), 0) << path;
  return fd;
}

/// Deterministic bytes: the value at absolute offset `off` of stream `seed`.
// What `f` threw ("" when nothing).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

inline std::uint8_t pattern_byte(std::uint64_t seed, std::uint64_t off) {
  std::uint64_t x = (off >> 3) * 0x9E3779B97F4A7C15ull + seed * 0xD1B54A32D192ED03ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<std::uint8_t>(x >> ((off & 7) * 8));
}

inline void fill_pattern(void* buf, std::uint64_t n, std::uint64_t seed, std::uint64_t base) {
  auto* p = static_cast<std::uint8_t*>(buf);
  for (std::uint64_t i = 0; i < n; ++i) p[i] = pattern_byte(seed, base + i);
}

/// Index of the first byte that differs from the pattern, or -1.
inline std::int64_t first_mismatch(const void* buf, std::uint64_t n, std::uint64_t seed,
                                   std::uint64_t base) {
  auto* p = static_cast<const std::uint8_t*>(buf);
  for (std::uint64_t i = 0; i < n; ++i)
    if (p[i] != pattern_byte(seed, base + i)) return static_cast<std::int64_t>(i);
  return -1;
}

inline SwapSpace make_space(const std::vector<std::filesystem::path>& dirs, std::uint64_t capacity,
                            std::uint64_t stripe = 1024 * 1024,
                            DirectIo direct = DirectIo::automatic) {
  SwapSpaceConfig c;
  c.dirs = dirs;
  c.capacity = capacity;
  c.stripe_size = stripe;
  c.direct = direct;
  return SwapSpace::create(c);
}

/// A backend of `kind` over `space`'s files, or nullptr (with the reason) when it cannot start
/// here: the caller skips.
inline std::unique_ptr<detail::IoBackend> make_backend(IoBackendKind kind, const SwapSpace& space,
                                                       std::uint32_t depth, std::string* why) {
  IoEngineConfig config;
  config.queue_depth = depth;
  std::vector<int> fds;
  const detail::BackendParams p = detail::backend_params(space, config, fds);
  int err = 0;
  switch (kind) {
    case IoBackendKind::uring:
      return detail::make_uring_backend(p, &err, why);
    case IoBackendKind::aio:
      return detail::make_aio_backend(p, &err, why);
    default:
      return detail::make_posix_backend(p, &err, why);
  }
}

inline const IoBackendKind kAllBackends[] = {IoBackendKind::uring, IoBackendKind::aio,
                                             IoBackendKind::posix};

inline std::string backend_name(const ::testing::TestParamInfo<IoBackendKind>& info) {
  switch (info.param) {
    case IoBackendKind::uring:
      return "uring";
    case IoBackendKind::aio:
      return "aio";
    default:
      return "posix";
  }
}

/// An engine with a forced backend, or null with *why saying why that backend cannot start here.
inline std::unique_ptr<IoEngine> try_engine(const SwapSpace& space, const IoEngineConfig& cfg,
                                            std::string* why) {
  try {
    return std::make_unique<IoEngine>(space, cfg);
  } catch (const std::system_error& e) {
    *why = "backend " + std::string(to_string(cfg.backend)) + " unavailable here: " + e.what();
    return nullptr;
  }
}

/// The one skip macro: `var` holds `expr`; when that is null (or false) the test is skipped with
/// `why` (evaluated afterwards, so `expr` may fill it in).
#define TIERSWAP_OR_SKIP(var, expr, why) \
  auto var = (expr);                     \
  if (!var) GTEST_SKIP() << (why)

/// Starts an engine with a forced backend, or skips the test saying why it is unavailable.
#define TIERSWAP_ENGINE_OR_SKIP(var, space, cfg) \
  std::string var##_why;                         \
  TIERSWAP_OR_SKIP(var, ::tierswap::test::try_engine(space, cfg, &var##_why), var##_why)

}  // namespace tierswap::test
