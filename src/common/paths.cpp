// check_trusted_dir: the ownership and permission checks on directories holding tierswap's state.
#include "tierswap/detail/paths.hpp"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace tierswap::detail {

void check_trusted_dir(const std::filesystem::path& dir, std::string_view role, bool private_dir) {
  auto refuse = [&](const std::string& why) {
    return std::invalid_argument(fmt::format("{} {}: {} (refused)", role, dir.string(), why));
  };
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0)
    throw refuse(errno == ENOENT ? "is missing" : std::strerror(errno));
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

}  // namespace tierswap::detail
