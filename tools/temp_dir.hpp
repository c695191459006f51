// A temporary directory on a real disk (not tmpfs: O_DIRECT), removed with its contents at exit.
#pragma once

#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "tierswap/detail/temp_dir.hpp"
#include "tierswap/signal_cleanup.hpp"
#include "tierswap/swap_space.hpp"
#include "tierswap/units.hpp"

namespace tierswap::cli {

/// Temporary directories are also removed when SIGINT, SIGTERM or SIGHUP ends the process
/// (tierswap/signal_cleanup.hpp), and, when the process is killed outright (SIGKILL, the OOM
/// killer), by the next tierswap run that makes one on the host (detail::OwnedTempDir), which
/// says so on stderr. A directory the user named (--dir) is the user's; what a run makes in it,
/// it adopts as a TempDir (bench step's sub-directories there).
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const char* prefix = "tierswap-bench") {
    std::vector<detail::OwnedTempDir::Swept> swept;
    owned_ = std::make_unique<detail::OwnedTempDir>(detail::OwnedTempDir::default_root(), prefix,
                                                    detail::OwnedTempDir::OnSignal::remove, &swept);
    for (const auto& s : swept)
      fmt::print(stderr,
                 "tierswap: removed {} ({}): the temporary directory of a tierswap process that "
                 "ended without removing it (killed with SIGKILL, or by the OOM killer)\n",
                 s.path.string(), format_bytes(s.bytes));
    path = owned_->path();
  }
  /// A directory the run has just made elsewhere (under a --dir), owned the same way.
  struct Adopt {};
  TempDir(Adopt, std::filesystem::path made) : path(std::move(made)) {
    slot_ = remove_on_signal(path);
  }
  ~TempDir() {
    if (owned_) return;  // its own destructor removes it
    forget_on_signal(slot_);
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
  /// Leaves the directory in place at exit; returns its path.
  std::filesystem::path keep() {
    if (owned_) owned_->keep();
    forget_on_signal(std::exchange(slot_, -1));
    return std::exchange(path, {});
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

 private:
  std::unique_ptr<detail::OwnedTempDir> owned_;  // made here; none when adopted
  int slot_ = -1;
};

/// A benchmark's swap space in the user's --dir: its files are the run's (the directory is the
/// user's), removed at scope exit and when a signal ends the process; `keep` leaves them.
class SwapFilesGuard {
 public:
  explicit SwapFilesGuard(SwapSpace& space, bool keep = false) : space_(space), keep_(keep) {
    if (!keep_)
      for (const SwapFile& f : space.files()) handles_.push_back(remove_on_signal(f.path));
  }
  ~SwapFilesGuard() {
    for (int h : handles_) forget_on_signal(h);
    if (!keep_) space_.remove_files();
  }
  SwapFilesGuard(const SwapFilesGuard&) = delete;
  SwapFilesGuard& operator=(const SwapFilesGuard&) = delete;

 private:
  SwapSpace& space_;
  bool keep_;
  std::vector<int> handles_;
};

/// `dir` when given, else a new temporary directory owned by `temp` (removed with it).
/// `dir` made if missing (0700, parents too); refused when it is not a directory or holds
/// anything (what a "new or empty" directory option promises). Errors name the option.
inline void make_new_or_empty(const std::filesystem::path& dir, const char* option) {
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) {
    std::filesystem::create_directories(dir, ec);
    if (ec)
      throw std::runtime_error(std::string(option) + " " + dir.string() + ": cannot create it (" +
                               ec.message() + ")");
    std::filesystem::permissions(dir, std::filesystem::perms::owner_all, ec);
    return;
  }
  if (!std::filesystem::is_directory(dir, ec))
    throw std::invalid_argument(std::string(option) + " " + dir.string() + ": not a directory");
  if (!std::filesystem::is_empty(dir, ec))
    throw std::invalid_argument(std::string(option) + " " + dir.string() +
                                ": not empty (give a new or empty directory)");
}

inline std::filesystem::path dir_or_temp(const std::string& dir, const char* prefix,
                                         std::unique_ptr<TempDir>& temp) {
  if (!dir.empty()) return dir;
  temp = std::make_unique<TempDir>(prefix);
  return temp->path;
}

}  // namespace tierswap::cli
