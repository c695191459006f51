// detail::open_lock / close_lock: one process at a time on a file (a swap space's), who holds it
// when another asks, and lock descriptors a forked child does not keep.
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "tierswap/detail/file.hpp"
#include "tierswap/error.hpp"

namespace tierswap::detail {

namespace {

// The pid /proc/locks gives for a flock on the file: the process that took it, which may have
// exited since while something else keeps the open file (see lock_file). Matched by device and
// inode, else by inode alone when that is unique (an overlay filesystem reports another device than
// /proc/locks). 0 when not found.
long flock_holder(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return 0;
  const std::string dev = fmt::format("{:02x}:{:02x}:", major(st.st_dev), minor(st.st_dev));
  const std::string ino = std::to_string(st.st_ino);
  std::ifstream locks("/proc/locks");
  long exact = 0, by_inode = 0;
  int inode_matches = 0;
  for (std::string line; std::getline(locks, line);) {
    std::istringstream in(line);
    std::string id, kind, mode, access, file;
    long pid = 0;
    if (!(in >> id >> kind >> mode >> access >> pid >> file) || kind != "FLOCK") continue;
    if (file == dev + ino) exact = pid;
    const auto colon = file.rfind(':');
    if (colon != std::string::npos && file.substr(colon + 1) == ino) {
      by_inode = pid;
      ++inode_matches;
    }
  }
  return exact != 0 ? exact : inode_matches == 1 ? by_inode : 0;
}

bool alive(long pid) {
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

std::string holder_text(long pid) {
  if (pid <= 0) return "another process";
  if (pid == ::getpid())  // a notebook's second optimizer on the directory, say
    return fmt::format(
        "this process ({}), which holds it already (an optimizer on it not yet closed: close() "
        "it first; or a save into it under way on another thread)",
        pid);
  if (alive(pid)) return fmt::format("process {}", pid);
  return fmt::format(
      "a process that inherited it from process {}, which has exited (a child it made, still "
      "running?)",
      pid);
}

bool try_lock(int fd, const std::string& path, bool shared) {
  int rc;
  do rc = ::flock(fd, (shared ? LOCK_SH : LOCK_EX) | LOCK_NB);
  while (rc != 0 && errno == EINTR);
  if (rc == 0) return true;
  if (errno != EWOULDBLOCK) throw_errno(errno, "flock " + path);
  return false;
}

void lock_file(int fd, const std::string& path, std::string_view what, bool shared) {
  // A live holder is an error at once. One that has exited lets go when whatever still has the
  // descriptor closes it (a child made without fork's handlers, as posix_spawn does, between its
  // clone and its exec), so that is waited for, up to kDeadHolderWait.
  constexpr auto kDeadHolderWait = std::chrono::seconds(10);
  const auto deadline = std::chrono::steady_clock::now() + kDeadHolderWait;
  long holder = 0;
  while (!try_lock(fd, path, shared)) {
    holder = flock_holder(fd);
    if ((holder > 0 && alive(holder)) || std::chrono::steady_clock::now() >= deadline)
      throw std::runtime_error(fmt::format(
          "{} {} is in use by {}: {}", what, path, holder_text(holder),
          shared ? "it is being written (a save into it under way): read it once that is done"
                 : "one process at a time uses it (a run still going, or two jobs given one "
                   "directory; `tierswap ps` lists live runs, `tierswap residency PID` shows "
                   "one)"));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// The lock descriptors this process holds. A child forked while they are open would hold the
// locks as long as it lives (a DataLoader worker keeping the directory locked after the trainer
// closed its optimizer, or died): at fork the child's copies are pointed at /dev/null (their
// numbers stay valid for whatever the child closes later; async-signal-safe calls only).
std::mutex lock_fds_mu;
std::set<int>* const lock_fds = new std::set<int>;  // never destroyed: atfork handlers use it

void release_in_child() {
  const int nul = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (nul >= 0) {
    for (int fd : *lock_fds) ::dup3(nul, fd, O_CLOEXEC);
    ::close(nul);
  }
  lock_fds_mu.unlock();
}

void register_lock(int fd) {
  static std::once_flag once;
  std::call_once(once, [] {
    ::pthread_atfork([] { lock_fds_mu.lock(); }, [] { lock_fds_mu.unlock(); }, release_in_child);
  });
  std::lock_guard lk(lock_fds_mu);
  lock_fds->insert(fd);
}

}  // namespace

int open_lock(const std::filesystem::path& path, std::string_view what, bool shared) {
  File f = File::open(path, O_RDONLY);
  lock_file(f.fd(), f.path(), what, shared);
  register_lock(f.fd());
  return f.release();
}

void close_lock(int fd) noexcept {
  if (fd < 0) return;
  {
    std::lock_guard lk(lock_fds_mu);
    lock_fds->erase(fd);
  }
  ::close(fd);
}

}  // namespace tierswap::detail
