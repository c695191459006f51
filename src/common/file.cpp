// detail::File: whole-buffer reads and writes with EINTR retried and errors naming the request.
#include "tierswap/detail/file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#include "tierswap/error.hpp"

namespace tierswap::detail {

File File::open(const std::filesystem::path& path, int flags, mode_t mode) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0) throw_errno(errno, "open " + path.string());
  return File(fd, path.string());
}

std::string read_text_file(const std::filesystem::path& path, std::string_view what) {
  auto refuse = [&](int err) {
    return std::invalid_argument(fmt::format("{}: cannot read it ({})", what, std::strerror(err)));
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);  // a symbolic link is followed
  if (fd < 0) throw refuse(errno);
  const File f(fd, path.string());
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw refuse(errno);
  if (S_ISDIR(st.st_mode)) throw refuse(EISDIR);
  try {
    return f.read_to_end();
  } catch (const std::system_error& e) {
    throw refuse(e.code().value());
  }
}

File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = std::exchange(o.fd_, -1);
    path_ = std::move(o.path_);
  }
  return *this;
}

void File::close() noexcept {
  if (fd_ >= 0) ::close(std::exchange(fd_, -1));
}

void File::write_all(const void* data, std::size_t n) const {
  const auto* p = static_cast<const char*>(data);
  for (std::size_t done = 0; done < n;) {
    const ssize_t w = ::write(fd_, p + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw io_error(w < 0 ? errno : EIO, "write", path_, done, n - done);
    done += static_cast<std::size_t>(w);
  }
}

void pwrite_all(int fd, std::string_view path, const void* data, std::size_t n,
                std::uint64_t offset) {
  const auto* p = static_cast<const char*>(data);
  for (std::size_t done = 0; done < n;) {
    const ssize_t w = ::pwrite(fd, p + done, n - done, static_cast<off_t>(offset + done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw io_error(w < 0 ? errno : EIO, "write", path, offset + done, n - done);
    done += static_cast<std::size_t>(w);
  }
}

void pread_all(int fd, std::string_view path, void* data, std::size_t n, std::uint64_t offset) {
  auto* p = static_cast<char*>(data);
  for (std::size_t done = 0; done < n;) {
    const ssize_t r = ::pread(fd, p + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw io_error(errno, "read", path, offset + done, n - done);
    if (r == 0)
      throw io_error(EIO, "read", path, offset + done, n - done,
                     "file is truncated: unexpected end of file");
    done += static_cast<std::size_t>(r);
  }
}

void File::pwrite_all(const void* data, std::size_t n, std::uint64_t offset) const {
  detail::pwrite_all(fd_, path_, data, n, offset);
}

void File::pread_all(void* data, std::size_t n, std::uint64_t offset) const {
  detail::pread_all(fd_, path_, data, n, offset);
}

std::string File::read_to_end() const {
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t r = ::read(fd_, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw io_error(errno, "read", path_, out.size(), sizeof buf);
    if (r == 0) return out;
    out.append(buf, static_cast<std::size_t>(r));
  }
}

std::uint64_t File::size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) throw_errno(errno, "stat " + path_);
  return static_cast<std::uint64_t>(st.st_size);
}

void File::sync() const {
  if (::fsync(fd_) != 0) throw_errno(errno, "fsync " + path_);
}

namespace {
void sync_directory(const std::filesystem::path& dir) {
  const File d = File::open(dir, O_RDONLY | O_DIRECTORY);
  if (::fsync(d.fd()) != 0) throw_errno(errno, "fsync directory " + dir.string());
}
std::atomic<DirectorySync> directory_sync{&sync_directory};
}  // namespace

void fsync_directory(const std::filesystem::path& dir) {
  directory_sync.load(std::memory_order_acquire)(dir);
}

DirectorySync replace_directory_sync(DirectorySync sync) noexcept {
  return directory_sync.exchange(sync ? sync : &sync_directory, std::memory_order_acq_rel);
}

std::uint64_t filesystem_free_bytes(const std::filesystem::path& path) {
  struct statvfs st {};
  if (::statvfs(path.c_str(), &st) != 0) throw_errno(errno, "statvfs " + path.string());
  return std::uint64_t{st.f_bavail} * st.f_frsize;
}

}  // namespace tierswap::detail
