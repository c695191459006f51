#include "tierswap/process_config.hpp"

#include <array>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "tierswap/detail/config_table.hpp"
#include "tierswap/error.hpp"

namespace tierswap {

LogLevel parse_log_level(std::string_view s, std::string_view key) {
  if (s == "off") return LogLevel::off;
  if (s == "error") return LogLevel::error;
  if (s == "warn") return LogLevel::warn;
  if (s == "info") return LogLevel::info;
  if (s == "debug") return LogLevel::debug;
  throw_invalid(key, s, "expected off, error, warn, info or debug");
}

ListenAddress parse_listen_address(std::string_view s, std::string_view key, bool any_host) {
  ListenAddress a;
  std::string_view port = s;
  if (const auto colon = s.rfind(':'); colon != std::string_view::npos) {
    std::string_view host = s.substr(0, colon);
    port = s.substr(colon + 1);
    const bool bracketed = host.size() > 2 && host.front() == '[' && host.back() == ']';
    if (bracketed) host = host.substr(1, host.size() - 2);
    const bool ok =
        host == "localhost" ||
        (bracketed ? host.find_first_not_of("0123456789abcdefABCDEF:.") == std::string_view::npos
                   : host.find_first_not_of("0123456789.") == std::string_view::npos);
    if (host.empty() || !ok)
      throw_invalid(key, s, "expected [HOST:]PORT, HOST an IPv4 address, [IPv6] or localhost");
    // The endpoints answer anyone who reaches them (no authentication): loopback unless the
    // operator says otherwise; a scraper on another machine goes through a proxy, or a firewall.
    const bool loopback =
        host == "localhost" || host == "::1" || (!bracketed && host.substr(0, 4) == "127.");
    if (!loopback && !any_host)
      throw_invalid(key, s,
                    "the endpoint is unauthenticated and listens on loopback only (127.x.x.x, "
                    "[::1] or localhost): expose it through a proxy, or (tierswap serve) say "
                    "--metrics-any-host");
    a.host = std::string(host);
  }
  const bool digits = !port.empty() && port.size() <= 5 &&
                      port.find_first_not_of("0123456789") == std::string_view::npos;
  if (!digits || std::stoi(std::string(port)) > 65535)
    throw_invalid(key, s, "expected [HOST:]PORT with PORT in 0..65535");
  a.port = std::stoi(std::string(port));
  return a;
}

namespace {

using C = ProcessConfig;

// Every setting of ProcessConfig, in the configuration page's order.
const std::array<detail::ConfigField<C>, 4> kFields = {{
    {"log_level", "TIERSWAP_LOG_LEVEL", "`warn`",
     "`off`, `error`, `warn`, `info`, `debug` (process-wide)",
     [](C& c, const nlohmann::json& v, const std::string& k) {
       c.log_level = parse_log_level(detail::json_string(v, k), k);
     },
     [](C& c, const char* n) {
       if (const char* v = std::getenv(n)) c.log_level = parse_log_level(v, n);
     }},
    detail::string_field<C, &C::cpu_isa>("cpu_isa", "TIERSWAP_CPU_ISA", "`auto`",
                                         "force the kernels' instruction set: `scalar`, `avx2`, "
                                         "`avx512`, `avx512bf16`, `neon`, `sve` "
                                         "(an unknown or unsupported one is an error naming it)"),
    detail::bool_field<C, &C::huge_pages>("huge_pages", "TIERSWAP_HUGE_PAGES", "true",
                                          "buffers of 2 MiB or more ask for transparent huge pages "
                                          "(fewer TLB misses, one segment per MiB for the disk)"),
    {"metrics", "TIERSWAP_METRICS", "—",
     "serve Prometheus metrics at `http://HOST:PORT/metrics`: `[HOST:]PORT`, HOST a loopback "
     "address: 127.x.x.x, `[::1]` or `localhost` (default 127.0.0.1; the endpoint has no "
     "authentication, others are refused: expose it through a proxy); port 0 picks a free one "
     "(process-wide)",
     [](C& c, const nlohmann::json& v, const std::string& k) {
       c.metrics = detail::json_string(v, k);
       if (!c.metrics.empty()) parse_listen_address(c.metrics, k);
     },
     [](C& c, const char* n) {
       if (const char* v = std::getenv(n)) {
         c.metrics = v;
         if (!c.metrics.empty()) parse_listen_address(c.metrics, n);
       }
     }},
}};

}  // namespace

ProcessConfig ProcessConfig::from_env() {
  ProcessConfig c;
  detail::apply_env<ProcessConfig>(c, kFields);
  return c;
}

ProcessConfig ProcessConfig::from_json(std::string_view text) {
  auto c = detail::config_from_json<ProcessConfig>(text, kFields, "process config");
  return c;
}

std::vector<Setting> ProcessConfig::settings() {
  return detail::settings_of<ProcessConfig>(kFields);
}

const ProcessConfig& ProcessConfig::current() {
  static const ProcessConfig c = from_env();  // a throw leaves it to the next call
  return c;
}

}  // namespace tierswap
