// A temporary directory on a real disk (not tmpfs: O_DIRECT), removed with its contents at exit.
#pragma once

#include <stdlib.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

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
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace tierswap::cli
