// Removal of registered directories when a signal ends the process (signal_cleanup.hpp).
// The handler runs on whichever thread the signal interrupts, while the others go on: it uses
// only async-signal-safe calls (openat, getdents64, unlinkat, close, getpid, raise) on paths
// copied into fixed slots at registration. A slot's state says who may touch its path: free ->
// writing (the registering thread) -> live -> free again (forget), or live -> removing (the
// handler, which then ends the process), so the handler never reads a path being rewritten. A
// slot belongs to the process that registered it: a child forked without exec (a DataLoader
// worker, which its parent may end with SIGTERM) inherits the handler and the slots, and must
// not remove the parent's directories.
#include "tierswap/signal_cleanup.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>
#include <system_error>

namespace tierswap {

namespace {

constexpr int kSlots = 64;
constexpr std::size_t kPathBytes = 1024;
constexpr int kMaxDepth = 8;  // swap directories: dir / rank or sub-group dir / files
enum Slot : int { kFree, kWriting, kLive, kRemoving };
char g_paths[kSlots][kPathBytes];
pid_t g_owner[kSlots];             // the registering process, written with the path
std::atomic<int> g_state[kSlots];  // Slot; zero-initialized: free
std::mutex g_install_mu;           // installation only (never taken by the handler)

bool is_dot(const char* n) {
  return n[0] == '.' && (n[1] == 0 || (n[1] == '.' && n[2] == 0));
}

// The directory's entries: files unlinked, directories emptied and removed (up to three passes).
void empty_dir(int fd, int depth);

void remove_entry(int parent, const char* name, int depth) {
  if (::unlinkat(parent, name, 0) == 0 || errno != EISDIR || depth > kMaxDepth) return;
  const int fd = ::openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  // The process's other threads run on: a file one of them makes meanwhile (a manifest's
  // rename) fails the rmdir, and the directory is emptied again.
  for (int round = 0; round < 4; ++round) {
    empty_dir(fd, depth + 1);
    if (::unlinkat(parent, name, AT_REMOVEDIR) == 0 || errno != ENOTEMPTY) break;
  }
  ::close(fd);
}

void empty_dir(int fd, int depth) {
  alignas(8) char buf[2048];
  for (int pass = 0; pass < 3; ++pass) {  // entries removed while reading may be skipped: again
    if (::lseek(fd, 0, SEEK_SET) != 0) return;
    bool any = false;
    for (;;) {
      const ssize_t n = ::getdents64(fd, buf, sizeof buf);
      if (n <= 0) break;
      for (ssize_t off = 0; off < n;) {
        const auto* d = reinterpret_cast<const dirent64*>(buf + off);
        off += d->d_reclen;
        if (is_dot(d->d_name)) continue;
        any = true;
        remove_entry(fd, d->d_name, depth);
      }
    }
    if (!any) return;
  }
}

void on_signal(int sig) {
  const int saved = errno;
  const pid_t self = ::getpid();
  for (int i = 0; i < kSlots; ++i) {
    int live = kLive;  // taken for good: the process ends below
    if (g_state[i].compare_exchange_strong(live, kRemoving) && g_owner[i] == self)
      remove_entry(AT_FDCWD, g_paths[i], 0);
  }
  errno = saved;
  (void)::raise(sig);  // SA_RESETHAND: the default action, once this handler returns
}

// Under g_install_mu, at every registration: the handler for each signal whose disposition is
// the default now (one ignored or handled at an earlier registration may have been reset since).
void install_handlers() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) continue;
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    (void)::sigaction(sig, &sa, nullptr);
  }
}

}  // namespace

int remove_on_signal(const std::filesystem::path& dir) noexcept {
  std::error_code ec;
  const std::string abs = std::filesystem::absolute(dir, ec).string();
  if (ec || abs.size() >= kPathBytes) return -1;
  {
    std::lock_guard lk(g_install_mu);
    install_handlers();
  }
  for (int i = 0; i < kSlots; ++i) {
    int free = kFree;
    if (!g_state[i].compare_exchange_strong(free, kWriting)) continue;
    std::memcpy(g_paths[i], abs.c_str(), abs.size() + 1);
    g_owner[i] = ::getpid();
    g_state[i].store(kLive);
    return i;
  }
  return -1;
}

void forget_on_signal(int handle) noexcept {
  if (handle < 0 || handle >= kSlots) return;
  int live = kLive;  // a slot the handler took stays taken: the process is ending
  g_state[handle].compare_exchange_strong(live, kFree);
}

}  // namespace tierswap
