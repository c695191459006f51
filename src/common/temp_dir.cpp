// detail::OwnedTempDir: temporary directories whose process holds a lock beside them, and the
// sweep that removes those whose process has ended (see the header).
#include "tierswap/detail/temp_dir.hpp"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <ctime>
#include <random>
#include <string>
#include <system_error>
#include <utility>

#include "tierswap/detail/process.hpp"
#include "tierswap/signal_cleanup.hpp"

namespace tierswap::detail {

namespace {

constexpr std::string_view kLockSuffix = ".lock";
constexpr std::size_t kRandomChars = 6;  // as many as mkdtemp fills in
constexpr int kNameAttempts = 100;       // names tried before giving up (each taken: EEXIST)
constexpr std::string_view kNewSuffix = ".new";  // lock_by_name()'s file before it has its name
constexpr std::time_t kNewLifeSeconds = 60;      // a live one lives microseconds

std::filesystem::path lock_of(const std::filesystem::path& dir) {
  return dir.string() + std::string(kLockSuffix);
}

std::string host_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') return "localhost";
  std::string h = host;
  for (char& c : h)
    if (c == '/') c = '_';
  return h;
}

// Whether `name` is the lock file of one of tierswap's directories made on `host`:
// "tierswap*-<host>-<6 random characters>.lock".
bool ours(std::string_view name, const std::string& host) {
  if (!name.starts_with("tierswap") || !name.ends_with(kLockSuffix)) return false;
  name.remove_suffix(kLockSuffix.size());
  if (name.size() < kRandomChars + 1) return false;
  name.remove_suffix(kRandomChars);
  return name.ends_with("-" + host + "-");
}

std::uint64_t bytes_in(const std::filesystem::path& dir) {
  std::uint64_t total = 0;
  std::error_code ec;
  for (std::filesystem::recursive_directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) == 0) total += std::uint64_t(st.st_blocks) * 512;
  }
  return total;
}

// The lock of a directory of this user's, opened and taken when its process has ended; -1 when
// it still runs (or the file is not this user's, or cannot be opened).
int take_if_free(const std::filesystem::path& lock) {
  const int fd = ::open(lock.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_uid != ::geteuid() || ::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// `n` random characters of [0-9A-Za-z], as mkdtemp's.
std::string random_chars(std::size_t n) {
  static constexpr std::string_view kChars =
      "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  std::random_device rd;
  std::uniform_int_distribution<std::size_t> pick(0, kChars.size() - 1);
  std::string s(n, '0');
  for (char& c : s) c = kChars[pick(rd)];
  return s;
}

// The lock file `lock`, made and locked before it has its name, so a sweep never finds a live
// one free: an unnamed file (O_TMPFILE) linked in once locked, or where the filesystem has no
// O_TMPFILE (or there is no /proc to link it through) the named way, lock_by_name(). The
// descriptor, or -1 with errno (EEXIST: the name is taken).
int hold(const std::filesystem::path& lock) {
  const int fd = ::open(lock.parent_path().c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0) return lock_by_name(lock);
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  if (::flock(fd, LOCK_EX) == 0 &&
      ::linkat(AT_FDCWD, self.c_str(), AT_FDCWD, lock.c_str(), AT_SYMLINK_FOLLOW) == 0)
    return fd;
  const int err = errno;
  ::close(fd);
  if (err == EEXIST) return errno = EEXIST, -1;
  return lock_by_name(lock);
}

// Removes a ".lock.new" file (lock_by_name()'s, which lives microseconds) left by a process
// killed before it removed it: free, and older than any live one can be. A younger free one may
// be a live process's between its open and its flock, so it stays for a later sweep.
void sweep_new(const std::filesystem::path& made) {
  const int fd = take_if_free(made);
  if (fd < 0) return;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && ::time(nullptr) - st.st_mtime > kNewLifeSeconds)
    ::unlink(made.c_str());
  ::close(fd);
}

}  // namespace

int lock_by_name(const std::filesystem::path& lock) {
  const std::string made = lock.string() + std::string(kNewSuffix);
  const int fd = ::open(made.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return -1;
  const bool held = ::flock(fd, LOCK_EX) == 0 && ::link(made.c_str(), lock.c_str()) == 0;
  const int err = errno;
  ::unlink(made.c_str());
  if (held) return fd;
  ::close(fd);
  return errno = err, -1;
}

std::filesystem::path OwnedTempDir::default_root() {
  const char* env = std::getenv("TMPDIR");
  return env && *env ? env : "/var/tmp";
}

std::vector<OwnedTempDir::Swept> OwnedTempDir::sweep(const std::filesystem::path& root) {
  std::vector<Swept> swept;
  const std::string host = host_name();
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.ends_with(kNewSuffix) && ours(name.substr(0, name.size() - kNewSuffix.size()), host)) {
      sweep_new(e.path());
      continue;
    }
    if (!ours(name, host)) continue;
    const int fd = take_if_free(e.path());
    if (fd < 0) continue;
    const std::filesystem::path dir = root / name.substr(0, name.size() - kLockSuffix.size());
    struct stat st {};
    bool gone = true;  // else the lock file stays, for a later sweep to try again
    if (::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::geteuid()) {
      Swept s{dir, bytes_in(dir)};
      std::error_code rm;
      std::filesystem::remove_all(dir, rm);
      gone = !rm;
      if (gone) swept.push_back(std::move(s));
    }
    if (gone) ::unlink(e.path().c_str());
    ::close(fd);
  }
  return swept;
}

// The lock first, then the directory: a process killed between the two leaves a free lock with
// no directory, which a sweep removes; never a directory without its lock.
OwnedTempDir::OwnedTempDir(const std::filesystem::path& root, std::string_view prefix,
                           OnSignal on_signal, std::vector<Swept>* swept) {
  auto gone = sweep(root);
  if (swept) *swept = std::move(gone);
  const std::string stem = std::string(prefix) + "-" + host_name() + "-";
  for (int attempt = 1; path_.empty(); ++attempt) {
    const std::filesystem::path dir = root / (stem + random_chars(kRandomChars));
    lock_fd_ = hold(lock_of(dir));  // -1 where the filesystem has no flock: then never swept
    const bool taken = lock_fd_ < 0 && errno == EEXIST;
    if (!taken && ::mkdir(dir.c_str(), 0700) == 0) {
      path_ = dir;
      break;
    }
    const int err = taken ? EEXIST : errno;
    release_lock_of(dir);
    if (err != EEXIST || attempt == kNameAttempts)
      throw std::system_error(err, std::system_category(), "cannot make directory " + dir.string());
  }
  owner_ = current_pid();
  if (on_signal == OnSignal::leave) return;
  dir_handle_ = remove_on_signal(path_);
  if (lock_fd_ >= 0) lock_handle_ = remove_on_signal(lock_of(path_));
}

OwnedTempDir::~OwnedTempDir() {
  remove();
}

void OwnedTempDir::release_lock() noexcept {
  forget_on_signal(lock_handle_);
  lock_handle_ = -1;
  release_lock_of(path_);
}

void OwnedTempDir::release_lock_of(const std::filesystem::path& dir) noexcept {
  if (lock_fd_ < 0) return;
  ::unlink(lock_of(dir).c_str());
  ::close(lock_fd_);  // last: never unlocked while the directory or its lock file is there
  lock_fd_ = -1;
}

void OwnedTempDir::remove() noexcept {
  if (path_.empty() || forget_if_forked()) return;
  forget_on_signal(dir_handle_);
  dir_handle_ = -1;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
  release_lock();
  path_.clear();
}

bool OwnedTempDir::forget_if_forked() noexcept {
  if (current_pid() == owner_) return false;
  // A forked child's copy: the directory and its lock file are the parent's, whose descriptor
  // keeps the lock when the child's closes.
  if (lock_fd_ >= 0) ::close(lock_fd_);
  lock_fd_ = -1;
  path_.clear();
  return true;
}

std::filesystem::path OwnedTempDir::keep() noexcept {
  if (std::filesystem::path p = path_; forget_if_forked()) return p;
  forget_on_signal(dir_handle_);
  dir_handle_ = -1;
  release_lock();
  return std::exchange(path_, {});
}

}  // namespace tierswap::detail
