// File: the one owner of a file descriptor outside the I/O backends' hot paths (swap-file
// headers, manifests, checkpoints, the telemetry socket). Move-only; closes on destruction. Its
// loops read and write whole buffers, retry EINTR, and throw io_error naming
// "<op> <path> @<offset>+<length>" (a file that ends early is "truncated").
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>

namespace tierswap::detail {

class File {
 public:
  File() noexcept = default;
  /// Takes ownership of `fd`; `path` names it in errors.
  File(int fd, std::string path) noexcept : fd_(fd), path_(std::move(path)) {}
  /// open(2) with O_CLOEXEC | O_NOFOLLOW added; throws std::system_error "open <path>".
  static File open(const std::filesystem::path& path, int flags, mode_t mode = 0600);
  File(File&& o) noexcept : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)) {}
  File& operator=(File&& o) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File() { close(); }

  int fd() const noexcept { return fd_; }
  const std::string& path() const noexcept { return path_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  /// Gives up ownership (the caller closes it).
  int release() noexcept { return std::exchange(fd_, -1); }
  void close() noexcept;

  /// write(2) at the file position until all `n` bytes are written.
  void write_all(const void* data, std::size_t n) const;
  void pwrite_all(const void* data, std::size_t n, std::uint64_t offset) const;
  /// pread(2) until all `n` bytes are read; the end of the file first is an error.
  void pread_all(void* data, std::size_t n, std::uint64_t offset) const;
  /// read(2) at the file position until the end (a file, a pipe or a socket).
  std::string read_to_end() const;
  std::uint64_t size() const;
  void sync() const;  ///< fsync(2)

 private:
  int fd_ = -1;
  std::string path_;
};

/// A file a user names (TIERSWAP_IO_CONFIG, a hardware profile, a plan), whole. A file that is
/// missing, unreadable or a directory throws std::invalid_argument "<what>: cannot read it
/// (<why>)".
std::string read_text_file(const std::filesystem::path& path, std::string_view what);

/// The loops of File on a descriptor File does not own (a swap file's, held by SwapSpace).
void pwrite_all(int fd, std::string_view path, const void* data, std::size_t n,
                std::uint64_t offset);
void pread_all(int fd, std::string_view path, void* data, std::size_t n, std::uint64_t offset);

/// A descriptor of its own on `path` holding flock(2) LOCK_EX (file_lock.cpp): one open at a
/// time, so one process. The lock goes with it: close_lock(), or a process that dies (kill -9
/// too). A child forked while it is open does not keep it. Held by a live process: throws
/// std::runtime_error "<what> <path> is in use by process N ..." at once (a holder that has
/// exited, with the file still open somewhere, is waited for up to 10 s first). `shared`:
/// LOCK_SH, which any number of holders share and only an exclusive one refuses (and is refused
/// by).
int open_lock(const std::filesystem::path& path, std::string_view what, bool shared = false);
void close_lock(int fd) noexcept;

/// fsync(2) of a directory (a rename or create in it made durable).
void fsync_directory(const std::filesystem::path& dir);
/// What fsync_directory() runs. A directory sync almost never fails on a healthy disk, so the
/// fault tests put in one that throws, to see what a failing sync leaves on disk. nullptr:
/// fsync(2) again. Returns the one it replaces; not for use while other threads sync.
using DirectorySync = void (*)(const std::filesystem::path& dir);
DirectorySync replace_directory_sync(DirectorySync sync) noexcept;

/// Bytes an unprivileged writer may still allocate on the filesystem of `path` (statvfs(2):
/// f_bavail x f_frsize); throws std::system_error naming the path.
std::uint64_t filesystem_free_bytes(const std::filesystem::path& path);

}  // namespace tierswap::detail
