#include "tierswap/log.hpp"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <string>

#include "tierswap/error.hpp"
#include "tierswap/process_config.hpp"

#include <fmt/format.h>

namespace tierswap {
namespace {

// The initial level; a bad TIERSWAP_* variable is reported once here and the level stays warn
// (the call that needs the bad setting throws naming it).
LogLevel level_from_env() noexcept {
  try {
    return ProcessConfig::current().log_level;
  } catch (const std::exception& e) {
    const std::string line = std::string("tierswap[warn]: ") + e.what() + "\n";
    [[maybe_unused]] auto r = ::write(STDERR_FILENO, line.data(), line.size());
    return LogLevel::warn;
  }
}

std::atomic<int>& level_ref() noexcept {
  static std::atomic<int> level{static_cast<int>(level_from_env())};
  return level;
}

constexpr const char* kNames[] = {"error", "warn", "info", "debug"};

std::atomic<LogPrefix> prefix{LogPrefix::none};

std::string now_utc() {
  const auto t = std::chrono::system_clock::now();
  const std::time_t s = std::chrono::system_clock::to_time_t(t);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count() % 1000;
  std::tm tm{};
  ::gmtime_r(&s, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z ", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
}

// syslog's priorities of error, warning, info and debug (sd-daemon(3)).
constexpr const char* kJournalPriorities[] = {"<3>", "<4>", "<6>", "<7>"};

std::string prefix_of(LogLevel level) {
  switch (prefix.load()) {
    case LogPrefix::timestamp:
      return now_utc();
    case LogPrefix::journald:
      return kJournalPriorities[static_cast<int>(level)];
    case LogPrefix::none:
      break;
  }
  return {};
}

}  // namespace

LogLevel log_level() noexcept {
  return static_cast<LogLevel>(level_ref().load());
}
void set_log_level(LogLevel level) noexcept {
  level_ref().store(static_cast<int>(level));
}
void set_log_prefix(LogPrefix p) noexcept {
  prefix.store(p);
}

void log(LogLevel level, std::string_view message) noexcept {
  if (level == LogLevel::off ||
      static_cast<int>(level) > level_ref().load(std::memory_order_relaxed))
    return;
  try {
    std::string line = fmt::format("{}tierswap[{}]: {}\n", prefix_of(level),
                                   kNames[static_cast<int>(level)], message);
    [[maybe_unused]] auto r = ::write(STDERR_FILENO, line.data(), line.size());
  } catch (...) {
  }
}

std::system_error io_error(int err, std::string_view op, std::string_view path,
                           std::uint64_t offset, std::uint64_t length, std::string_view detail) {
  std::string what = fmt::format("{} {} @{}+{}", op, path, offset, length);
  if (!detail.empty()) what += fmt::format(" ({})", detail);
  return std::system_error(err, std::system_category(), what);
}

void throw_invalid(std::string_view key, std::string_view value, std::string_view why) {
  throw std::invalid_argument(fmt::format("{}={}: {}", key, value, why));
}

void throw_errno(int err, std::string_view what) {
  throw std::system_error(err, std::system_category(), std::string(what));
}

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown error";
  }
}

}  // namespace tierswap
