// A temporary directory on a real disk (not tmpfs: O_DIRECT), removed with its contents at exit.
#pragma once

#include <stdlib.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

namespace tierswap::cli {

/// Temporary directories are also removed when SIGINT, SIGTERM or SIGHUP ends the process (a
/// benchmark stopped with Ctrl-C must not leave gigabytes of swap files behind): each is
/// registered with a handler (installed at the first, where the signal's disposition is the
/// default) that removes the registered trees with async-signal-safe calls only and then lets
/// the signal end the process as it would have. Returns the slot (-1: none free, not covered).
/// A directory the user named (--dir) is the user's; what a run makes in it, it adopts as a
/// TempDir (bench step's sub-directories there).
int register_temp_dir(const std::filesystem::path& dir) noexcept;
void unregister_temp_dir(int slot) noexcept;

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const char* prefix = "tierswap-bench") {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/var/tmp") + "/" + prefix + "-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr)
      throw std::system_error(errno, std::system_category(), "mkdtemp " + tmpl);
    path = tmpl;
    slot_ = register_temp_dir(path);
  }
  /// A directory the run has just made elsewhere (under a --dir), owned the same way.
  struct Adopt {};
  TempDir(Adopt, std::filesystem::path made) : path(std::move(made)) {
    slot_ = register_temp_dir(path);
  }
  ~TempDir() {
    unregister_temp_dir(slot_);
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
  /// Leaves the directory in place at exit; returns its path.
  std::filesystem::path keep() {
    unregister_temp_dir(std::exchange(slot_, -1));
    return std::exchange(path, {});
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

 private:
  int slot_ = -1;
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
