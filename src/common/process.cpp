#include "tierswap/detail/process.hpp"

#include <pthread.h>
#include <unistd.h>

#include <atomic>

namespace tierswap::detail {
namespace {

std::atomic<pid_t> cached{0};

void refresh_in_child() {
  cached.store(::getpid(), std::memory_order_relaxed);
}

}  // namespace

pid_t current_pid() noexcept {
  pid_t pid = cached.load(std::memory_order_relaxed);
  if (pid == 0) {  // the first call: the handler is registered before the id is kept
    static const int registered = ::pthread_atfork(nullptr, nullptr, refresh_in_child);
    (void)registered;
    pid = ::getpid();
    cached.store(pid, std::memory_order_relaxed);
  }
  return pid;
}

}  // namespace tierswap::detail
