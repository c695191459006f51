// The node service's metrics: its budget and grants, each client's traffic, the swap space's
// capacity, and the counters of what went wrong (refused, dropped, failed).
#include <fmt/format.h>

#include <cctype>
#include <mutex>
#include <string>

#include "src/service/server_impl.hpp"
#include "tierswap/metrics.hpp"

namespace tierswap {

void SwapService::Impl::fill_metrics(MetricsWriter& w) const {
  {
    std::lock_guard lk(mu);
    fill_client_metrics(w);
  }
  const ExtentStats nvme = regions->stats();
  w.family("tierswap_service_nvme_capacity_bytes",
           "The swap space the service's regions come from.", MetricType::gauge);
  w.sample(static_cast<double>(nvme.capacity));
  w.family("tierswap_service_nvme_free_bytes",
           "Swap space not in any region (kept regions included), ready for new clients.",
           MetricType::gauge);
  w.sample(static_cast<double>(nvme.free));
  fill_failure_metrics(w);
}

void SwapService::Impl::fill_client_metrics(MetricsWriter& w) const {
  w.family("tierswap_service_clients", "Clients attached to the node service.", MetricType::gauge);
  w.sample(static_cast<double>(live.size()));
  w.family("tierswap_service_memory_budget_bytes", "The node's shared-memory budget.",
           MetricType::gauge);
  w.sample(static_cast<double>(cfg.host_budget));
  const service::MemoryBudget::Granted g = budget->granted();
  w.family("tierswap_service_memory_granted_bytes", "Shared memory granted to clients.",
           MetricType::gauge);
  w.sample(static_cast<double>(g.memory));
  w.family("tierswap_service_pageable_budget_bytes",
           "The node's budget of unlocked shared memory (outside the memory budget).",
           MetricType::gauge);
  w.sample(static_cast<double>(budget->limits().pageable_budget));
  w.family("tierswap_service_pageable_granted_bytes", "Unlocked shared memory granted to clients.",
           MetricType::gauge);
  w.sample(static_cast<double>(g.pageable));
  struct Col {
    const char* name;
    const char* help;
    MetricType type;
    std::uint64_t (*value)(const Live&);
  };
  static constexpr Col cols[] = {
      {"tierswap_client_nvme_read_bytes_total", "Bytes a client read from NVMe (this attach).",
       MetricType::counter, [](const Live& l) { return l.traffic->read_bytes.load(); }},
      {"tierswap_client_nvme_written_bytes_total", "Bytes a client wrote to NVMe (this attach).",
       MetricType::counter, [](const Live& l) { return l.traffic->written_bytes.load(); }},
      {"tierswap_client_memory_bytes", "Locked shared memory a client holds (in the node budget).",
       MetricType::gauge, [](const Live& l) { return l.memory; }},
      {"tierswap_client_pageable_bytes", "Unlocked shared memory a client holds beside it.",
       MetricType::gauge, [](const Live& l) { return l.pageable; }},
      {"tierswap_client_throttled_requests_total",
       "A client's NVMe requests that waited for its share of the engine's queue.",
       MetricType::counter, [](const Live& l) { return l.traffic->throttled.load(); }},
      {"tierswap_client_peak_inflight_bytes",
       "Most bytes of a client's NVMe requests in the engine at once.", MetricType::gauge,
       [](const Live& l) { return l.traffic->peak_inflight_bytes.load(); }},
  };
  for (const Col& col : cols) {
    w.family(col.name, col.help, col.type);
    for (const auto& [k, l] : live) w.sample(static_cast<double>(col.value(l)), {{"client", k}});
  }
  w.family("tierswap_client_generation",
           "A block client's committed generation (a tier manager's is in its own manifest).",
           MetricType::gauge);
  for (const auto& [k, c] : clients)
    if (!c.raw) w.sample(static_cast<double>(c.generation), {{"client", k}});
}

void SwapService::Impl::fill_failure_metrics(MetricsWriter& w) const {
  w.family("tierswap_service_expired_regions_total",
           "Regions released because no client attached to them for the region TTL.",
           MetricType::counter);
  w.sample(static_cast<double>(expired.load()));
  w.family("tierswap_service_refused_connections_total",
           "Connections refused at their first message (another uid, a stop, the budget).",
           MetricType::counter);
  w.sample(static_cast<double>(refused.load()));
  w.family("tierswap_service_dropped_connections_total",
           "Connections dropped for what they sent, or for sending nothing in time.",
           MetricType::counter);
  w.sample(static_cast<double>(dropped.load()));
  w.family("tierswap_service_failed_requests_total",
           "Requests answered with an error (a failed commit or sync, a refused read), by type.",
           MetricType::counter);
  static constexpr wire::Body kRequests[] = {
      wire::Body::Put,     wire::Body::Get,    wire::Body::Commit,
      wire::Body::Discard, wire::Body::Status, wire::Body::Read,
      wire::Body::Write,   wire::Body::Sync,   wire::Body::Release};
  for (const wire::Body type : kRequests) {
    std::string name = wire::EnumNameBody(type);
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    w.sample(static_cast<double>(failed[static_cast<std::size_t>(type)].load()),
             {{"request", name}});
  }
}

}  // namespace tierswap
