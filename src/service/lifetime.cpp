// How long the node service keeps a region: each attach and detach recorded in the registry (its
// last use survives a restart), and a detached region that no client attached to for the region
// TTL (`tierswap serve --region-ttl`) released as `tierswap release` would.
#include <algorithm>
#include <chrono>
#include <vector>

#include "src/service/server_impl.hpp"
#include "tierswap/log.hpp"
#include "tierswap/units.hpp"

#include <fmt/format.h>

namespace tierswap {

std::int64_t SwapService::Impl::unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void SwapService::Impl::touch(ClientRecord& c) {
  const std::int64_t before = c.last_used;
  c.last_used = unix_now();
  try {
    save_registry(files, uuid, clients);
  } catch (const std::exception& e) {  // only its age is lost: the region and blocks stay
    log(LogLevel::warn,
        fmt::format("service: recording the last use of {} in the registry: {}; its region TTL "
                    "counts from its previous use until the registry is written again",
                    c.key(), e.what()));
    c.last_used = before;
  }
}

void SwapService::Impl::expire_idle() {
  const double ttl = cfg.region_ttl_seconds;
  if (ttl <= 0) return;
  const auto now = std::chrono::steady_clock::now();
  // A sweep walks the registry under mu: at most every tenth of the TTL, every second or more.
  const auto every = std::chrono::duration<double>(std::clamp(ttl / 10, 1.0, 60.0));
  if (now - last_sweep < every) return;
  last_sweep = now;
  std::lock_guard lk(mu);
  const std::int64_t t = unix_now();
  std::vector<std::string> idle;
  for (const auto& [k, c] : clients)
    if (!live.count(k) && static_cast<double>(t - c.last_used) >= ttl) idle.push_back(k);
  for (const auto& k : idle) {
    log(LogLevel::info,
        fmt::format("service: {} expired: no client attached to it for {} (--region-ttl {})", k,
                    format_duration(static_cast<double>(t - clients.at(k).last_used)),
                    format_duration(ttl)));
    forget(k);
    if (!clients.count(k)) ++expired;
  }
}

}  // namespace tierswap
