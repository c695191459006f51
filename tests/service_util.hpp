// What the tests of the node service share: a service in a child process, so that a test can
// kill it with kill -9 (and fork clients before any thread of its own exists).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <functional>
#include <string>
#include <system_error>
#include <utility>

#include "tierswap/service.hpp"

namespace tierswap::test {

/// A service on `dir`: 64 MiB of swap space, a 4 MiB budget, its socket in `dir`, nothing locked.
inline ServiceConfig small_service(const std::filesystem::path& dir) {
  ServiceConfig c;
  c.swap_dirs = {dir};
  c.capacity = 64ull << 20;
  c.host_budget = 4ull << 20;
  c.socket = dir / "service.sock";
  c.lock_memory = false;
  return c;
}

/// Client `job`.0 of `s`: 64 KiB of shared memory, a 4 MiB region.
inline ServiceClientConfig small_client(const ServiceConfig& s, std::string job) {
  ServiceClientConfig c;
  c.socket = s.socket;
  c.job = std::move(job);
  c.memory_bytes = 64 << 10;
  c.region_bytes = 4 << 20;
  c.timeout_seconds = 30;
  return c;
}

/// The errno of what f() throws (0: nothing), its message in *what.
template <class F>
int errno_of(F&& f, std::string* what = nullptr) {
  try {
    f();
  } catch (const std::system_error& e) {
    if (what) *what = e.what();
    return e.code().value();
  }
  return 0;
}

/// Starts a SwapService on `sc` in a child process; returns its pid once it listens (-1 when it
/// could not start). The caller kills and reaps it.
inline pid_t spawn_service(const ServiceConfig& sc) {
  int p[2];
  if (::pipe(p) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    try {
      SwapService svc(sc);
      const char ok = 1;
      if (::write(p[1], &ok, 1) != 1) ::_exit(2);
      for (;;) ::pause();
    } catch (...) {
      ::_exit(3);
    }
  }
  ::close(p[1]);
  char ok = 0;
  const bool ready = ::read(p[0], &ok, 1) == 1;
  ::close(p[0]);
  return ready ? pid : -1;
}

/// What `fn` returns, run in a child process as uid 65534 (nobody); 99 when it throws, 98 when
/// the uid cannot be taken (the caller checks it runs as root).
inline int as_nobody(const std::function<int()>& fn) {
  const pid_t child = ::fork();
  if (child == 0) {
    if (::setuid(65534) != 0) ::_exit(98);
    try {
      ::_exit(fn());
    } catch (...) {
      ::_exit(99);
    }
  }
  int status = 0;
  if (::waitpid(child, &status, 0) != child || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

}  // namespace tierswap::test
