// Directories removed when a signal ends the process: a benchmark stopped with Ctrl-C, or a
// training job's swap files in a temporary directory when the scheduler sends SIGTERM, must not
// leave gigabytes behind.
//
// A registered directory is removed with its contents by a handler for SIGINT, SIGTERM and SIGHUP,
// installed at a registration for each of those signals whose disposition is then the default
// (a program's own handler, Python's SIGINT handler included, is never replaced: its exit path
// cleans up; an ignored signal stays ignored). The handler uses async-signal-safe calls only
// (openat, getdents64, unlinkat, close, getpid, raise) on paths copied at registration, and then
// lets the signal end the process as it would have (status 128 + signal). A directory is
// removed by the process that registered it only: a child forked from it (a data loader's
// worker) that a signal ends leaves it to its parent.
#pragma once

#include <filesystem>

namespace tierswap {

/// Registers `dir` (made absolute) for removal on SIGINT / SIGTERM / SIGHUP. Returns a handle for
/// `forget_on_signal`, or -1 when the directory is not covered (no free slot of 64, a path of
/// 1024 bytes or more). A directory the user named is the user's: register only what the run made.
int remove_on_signal(const std::filesystem::path& dir) noexcept;

/// The directory is no longer removed by the handler (it was removed, or is to be kept). A handle
/// of -1 is ignored; the slot is free for another registration afterwards.
void forget_on_signal(int handle) noexcept;

}  // namespace tierswap
