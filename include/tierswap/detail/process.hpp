// This process's id without a system call (internal). glibc no longer caches getpid(), and the
// check that an object was not inherited by a forked child runs on every call into the optimizer
// (thousands per step for a model of many small parameters); the id is kept here and refreshed in
// a child by a fork handler.
#pragma once

#include <sys/types.h>

namespace tierswap::detail {

pid_t current_pid() noexcept;

}  // namespace tierswap::detail
