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

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const char* prefix = "tierswap-bench") {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/var/tmp") + "/" + prefix + "-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr)
      throw std::system_error(errno, std::system_category(), "mkdtemp " + tmpl);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
  /// Leaves the directory in place at exit; returns its path.
  std::filesystem::path keep() { return std::exchange(path, {}); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
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
