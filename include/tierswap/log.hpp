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
/// What starts each line: nothing (the default: a training script's output), an ISO 8601 UTC
/// time with milliseconds and a space (a long-running service's own log), or the syslog priority
/// "<N>" that journald reads as the line's level (a service whose stderr is the journal, which
/// stamps the time itself).
enum class LogPrefix { none, timestamp, journald };
void set_log_prefix(LogPrefix prefix) noexcept;
/// Writes "<prefix>tierswap[<level>]: <message>\n" when `level` is enabled.
void log(LogLevel level, std::string_view message) noexcept;

}  // namespace tierswap
