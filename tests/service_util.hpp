// What the tests of the node service share: a service in a child process, so that a test can
// kill it with kill -9 (and fork clients before any thread of its own exists).
#pragma once

#include <unistd.h>

#include "tierswap/service.hpp"

namespace tierswap::test {

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

}  // namespace tierswap::test
