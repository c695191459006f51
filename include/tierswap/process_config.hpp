// Settings that hold for the whole process rather than for one object: the log level, the
// instruction set of the CPU kernels, whether large buffers ask for huge pages and where the
// Prometheus endpoint listens. They are read from the environment once, at first use
// (ProcessConfig::current()). Like the other config structs they are one table
// (src/common/process_config.cpp): the variables, the JSON keys, the "unknown key" message and the
// documented rows (tools/docs/configuration.md) come from it.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tierswap/log.hpp"
#include "tierswap/setting.hpp"

namespace tierswap {

struct ProcessConfig {
  /// Initial log level (TIERSWAP_LOG_LEVEL: off|error|warn|info|debug); set_log_level() changes it.
  LogLevel log_level = LogLevel::warn;
  /// "auto" (the best the CPU and build support) or an instruction set name as parse_isa()
  /// reads it (TIERSWAP_CPU_ISA); default_cpu_isa() rejects an unknown or unsupported one.
  std::string cpu_isa = "auto";
  /// Buffers of 2 MiB or more ask for transparent huge pages (TIERSWAP_HUGE_PAGES=0: they do
  /// not; a control for measurements, or where khugepaged's compaction costs more than it saves).
  bool huge_pages = true;
  /// Where the Prometheus endpoint listens (TIERSWAP_METRICS, "[HOST:]PORT" as
  /// parse_listen_address() reads it); empty: no endpoint. See metrics.hpp.
  std::string metrics;

  /// Overrides from the environment, each setting's variable as settings() lists it. A value that
  /// does not parse throws std::invalid_argument naming the variable.
  static ProcessConfig from_env();
  /// Loads a JSON object of the keys settings() lists; unknown keys or bad values throw naming the
  /// key.
  static ProcessConfig from_json(std::string_view json);
  /// Every setting, in the configuration page's order (its table is generated from them).
  static std::vector<Setting> settings();
  /// The process's settings: from_env() at the first call that succeeds, then the same object.
  /// Throws as from_env() does while a variable is bad. Thread-safe.
  static const ProcessConfig& current();
};

/// A TCP address to listen on.
struct ListenAddress {
  std::string host = "127.0.0.1";
  int port = 0;  ///< 0: any free port
};

/// "[HOST:]PORT": HOST a loopback address, 127.x.x.x, [::1] or `localhost` (default 127.0.0.1;
/// the endpoints have no authentication), PORT 0..65535 (0: any free port). `any_host`: HOST may
/// be any IPv4 or bracketed IPv6 address (0.0.0.0, [::]: every interface), an operator's explicit
/// choice (`tierswap serve --metrics-any-host`). std::invalid_argument naming `key` otherwise.
ListenAddress parse_listen_address(std::string_view text, std::string_view key,
                                   bool any_host = false);

/// "off" | "error" | "warn" | "info" | "debug"; std::invalid_argument naming `key` otherwise.
LogLevel parse_log_level(std::string_view text, std::string_view key);

}  // namespace tierswap
