// Minimal leveled logging to stderr. Level from TIERSWAP_LOG_LEVEL (off|error|warn|info|debug;
// ProcessConfig), default warn. Thread-safe: one line is written with one write(2).
#pragma once

#include <string_view>

namespace tierswap {

/// `off` silences everything (a level to set, never one to log at).
enum class LogLevel { off = -1, error = 0, warn = 1, info = 2, debug = 3 };

/// Current level (read once from the environment, then settable).
LogLevel log_level() noexcept;
void set_log_level(LogLevel level) noexcept;
/// Writes "tierswap[<level>]: <message>\n" when `level` is enabled, after an ISO 8601 UTC time
/// with milliseconds and a space when timestamps are on (a long-running service's log; off by
/// default: a journal or a training script's output has its own).
void log(LogLevel level, std::string_view message) noexcept;
void set_log_timestamps(bool on) noexcept;

}  // namespace tierswap
