// Temporary directories of tierswap's own (a training run's default swap directory, a
// benchmark's or a test's scratch) that never outlive their process for long.
//
// `<root>/<prefix>-<host>-<6 random characters>` (mode 0700), with `<that>.lock` beside it,
// flock(2)ed by the process that made it for as long as it lives (a forked child keeps it too). The
// directory is removed by the destructor, by the signal handler of signal_cleanup.hpp when SIGINT,
// SIGTERM or SIGHUP ends the process (unless OnSignal::leave), and otherwise (SIGKILL, the OOM
// killer, a job killed past its grace time: no code runs) by the next OwnedTempDir made under the
// same root on the same host, which finds its lock free: the kernel lets go of a dead process's
// locks however it died. A lock file is locked before it gets its name, so a live one is never
// found free, and made before its directory, so a process killed between the two leaves a lock
// with no directory, which the sweep removes (and a free `.lock.new` file of lock_by_name()'s
// older than a minute). Left alone: a directory without a lock file, another user's, and another
// host's (a root shared over the network, where flock may be local to each node).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace tierswap::detail {

class OwnedTempDir {
 public:
  /// A directory a sweep removed, and the bytes it held.
  struct Swept {
    std::filesystem::path path;
    std::uint64_t bytes = 0;
  };

  /// TMPDIR when set and not empty, else /var/tmp (a real disk: O_DIRECT, unlike tmpfs).
  static std::filesystem::path default_root();

  /// Whether the signal handler of signal_cleanup.hpp removes it (it takes two of its slots).
  enum class OnSignal { remove, leave };

  /// Sweeps `root` (what it removed goes to `swept` when given), then makes the directory and
  /// takes its lock. Throws std::system_error naming the path it could not make. Where the
  /// filesystem has no flock the directory is made without a lock file (never swept).
  OwnedTempDir(const std::filesystem::path& root, std::string_view prefix,
               OnSignal on_signal = OnSignal::remove, std::vector<Swept>* swept = nullptr);
  ~OwnedTempDir();  // remove()
  OwnedTempDir(const OwnedTempDir&) = delete;
  OwnedTempDir& operator=(const OwnedTempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  /// Removes the directory with its contents, then its lock file; idempotent. In a child
  /// forked from the process that made it, it only forgets it: the directory is the parent's.
  void remove() noexcept;
  /// Leaves the directory in place (no longer owned: a later sweep leaves it too); its path.
  std::filesystem::path keep() noexcept;

  /// Removes the directories of tierswap's own under `root` made on this host by processes that
  /// have ended (their lock free).
  static std::vector<Swept> sweep(const std::filesystem::path& root);

 private:
  void release_lock() noexcept;
  void release_lock_of(const std::filesystem::path& dir) noexcept;  // unlink, then unlock
  bool forget_if_forked() noexcept;

  std::filesystem::path path_;
  pid_t owner_ = 0;  // the process that made it
  int lock_fd_ = -1;
  int dir_handle_ = -1;  // signal_cleanup registrations
  int lock_handle_ = -1;
};

/// The lock file `lock` made and locked under the name `<lock>.new`, then hard-linked to `lock`
/// (never replacing a file there) and the `.new` name removed: what OwnedTempDir does where the
/// filesystem has no O_TMPFILE or there is no /proc. The locked descriptor, or -1 with errno
/// (EEXIST: `lock` or `<lock>.new` exists).
int lock_by_name(const std::filesystem::path& lock);

}  // namespace tierswap::detail
