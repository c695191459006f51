// Minimal leveled logging to stderr. Level from TIERSWAP_LOG_LEVEL (error|warn|info|debug),
// default warn. Thread-safe: one line is written with one write(2).
#pragma once

#include <string_view>

namespace tierswap {

enum class LogLevel { error = 0, warn = 1, info = 2, debug = 3 };

/// Current level (read once from the environment, then settable).
LogLevel log_level() noexcept;
void set_log_level(LogLevel level) noexcept;
/// Writes "tierswap[<level>]: <message>\n" when `level` is enabled.
void log(LogLevel level, std::string_view message) noexcept;

}  // namespace tierswap
