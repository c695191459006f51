// check_trusted_dir: the ownership and permission checks on directories holding tierswap's state;
// block_device_sysfs: the block device a directory lives on.
#include "tierswap/detail/paths.hpp"

#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace tierswap::detail {

void check_trusted_dir(const std::filesystem::path& dir, std::string_view role, bool private_dir,
                       std::string_view if_missing) {
  auto refuse = [&](const std::string& why, std::string_view then = {}) {
    return std::invalid_argument(fmt::format("{} {}: {} (refused){}{}", role, dir.string(), why,
                                             then.empty() ? "" : ": ", then));
  };
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0)
    throw errno == ENOENT ? refuse("is missing", if_missing) : refuse(std::strerror(errno));
  if (S_ISLNK(st.st_mode))
    throw refuse("is a symbolic link (give the directory it points to, if it is yours)");
  if (!S_ISDIR(st.st_mode)) throw refuse("is not a directory");
  if (st.st_uid != ::geteuid() && st.st_uid != 0)
    throw refuse(
        fmt::format("is owned by uid {}, not by this user (uid {})", st.st_uid, ::geteuid()));
  if ((st.st_mode & S_IWOTH) != 0 && (st.st_mode & S_ISVTX) == 0)
    throw refuse(
        fmt::format("is writable by every user without the sticky bit (mode {:o}): "
                    "another user could replace its files",
                    st.st_mode & 07777));
  if (private_dir && (st.st_mode & 022) != 0)
    throw refuse(fmt::format("is writable by group or others (mode {:o}); tierswap makes it 0700",
                             st.st_mode & 07777));
}

bool valid_job_id(std::string_view job) noexcept {
  if (job.empty() || job.size() > 64 || job == "." || job == "..") return false;
  for (char c : job)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '_' || c == '-'))
      return false;
  return true;
}

std::filesystem::path block_device_sysfs(const std::filesystem::path& path, std::string* why) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    *why = fmt::format("{}: cannot stat it ({})", path.string(), std::strerror(errno));
    return {};
  }
  const std::filesystem::path link =
      fmt::format("/sys/dev/block/{}:{}", major(st.st_dev), minor(st.st_dev));
  std::error_code ec;
  auto dev = std::filesystem::canonical(link, ec);
  if (ec) {
    *why = fmt::format("{} is not on a block device ({} does not exist)", path.string(),
                       link.string());
    return {};
  }
  return dev;
}

}  // namespace tierswap::detail
