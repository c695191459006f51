// Removal of the CLI's temporary directories when a signal ends the process (temp_dir.hpp).
// The handler runs on whichever thread the signal interrupts, while the others go on: it uses
// only async-signal-safe calls (openat, getdents64, unlinkat, close, sigaction, raise) on
// paths copied into fixed slots at registration.
#include "tools/temp_dir.hpp"

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

namespace tierswap::cli {

namespace {

constexpr int kSlots = 64;
constexpr std::size_t kPathBytes = 1024;
constexpr int kMaxDepth = 8;  // the CLI's trees: temp dir / rank dir / files
char g_paths[kSlots][kPathBytes];
std::atomic<bool> g_live[kSlots];
std::mutex g_mu;  // registration only (never taken by the handler)
int g_used = 0;   // slots handed out, under g_mu

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
  for (int i = 0; i < kSlots; ++i)
    if (g_live[i].load()) remove_entry(AT_FDCWD, g_paths[i], 0);
  errno = saved;
  (void)::raise(sig);  // SA_RESETHAND: the default action, once this handler returns
}

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

int register_temp_dir(const std::filesystem::path& dir) noexcept {
  std::error_code ec;
  const std::string abs = std::filesystem::absolute(dir, ec).string();
  if (ec || abs.size() >= kPathBytes) return -1;
  std::lock_guard lk(g_mu);
  if (g_used == kSlots) return -1;
  if (g_used == 0) install_handlers();
  const int i = g_used++;  // slots are never reused: a handler never reads one being written
  std::memcpy(g_paths[i], abs.c_str(), abs.size() + 1);
  g_live[i].store(true);
  return i;
}

void unregister_temp_dir(int slot) noexcept {
  if (slot >= 0 && slot < kSlots) g_live[slot].store(false);
}

}  // namespace tierswap::cli
