// The tier manager's Prometheus samples (metrics.hpp): what each tier holds and has moved, the
// scheduler's stalls and prefetches, commits and discards, from one residency snapshot per scrape.
#include "src/tier/tier_impl.hpp"

namespace tierswap {
namespace {

void tier_gauges(const ResidencySnapshot& s, const std::string& mgr, MetricsWriter& w) {
  struct Row {
    const char* name;
    const char* help;
    std::uint64_t ResidencySnapshot::TierRow::*field;
  };
  static constexpr Row rows[] = {
      {"tierswap_tier_capacity_bytes", "Budget of the tier (host: pinned + pageable).",
       &ResidencySnapshot::TierRow::capacity_bytes},
      {"tierswap_tier_resident_bytes", "Bytes of blocks with a copy in the tier.",
       &ResidencySnapshot::TierRow::resident_bytes},
      {"tierswap_tier_dirty_bytes", "Bytes in the tier not yet written below it.",
       &ResidencySnapshot::TierRow::dirty_bytes},
      {"tierswap_tier_inflight_bytes", "Bytes being moved into or out of the tier.",
       &ResidencySnapshot::TierRow::inflight_bytes},
      {"tierswap_tier_reserved_bytes", "Memory the tier's pools hold (whole slabs; NVMe: extents).",
       &ResidencySnapshot::TierRow::reserved_bytes},
  };
  for (const Row& r : rows) {
    w.family(r.name, r.help, MetricType::gauge);
    for (const auto& t : s.tiers)
      w.sample(static_cast<double>(t.*r.field),
               {{"manager", mgr}, {"tier", std::string(to_string(t.tier))}});
  }
  w.family("tierswap_pinned_host_bytes", "Page-locked host memory held by the pinned pool.",
           MetricType::gauge);
  w.sample(static_cast<double>(s.locked_host_bytes), {{"manager", mgr}});
  w.family("tierswap_committed_generation", "The last committed generation.", MetricType::gauge);
  w.sample(static_cast<double>(s.committed_generation), {{"manager", mgr}});
}

void traffic(const TierCounters& c, const std::string& mgr, MetricsWriter& w) {
  constexpr int nvme = static_cast<int>(Tier::nvme);
  w.family("tierswap_nvme_read_bytes_total", "Bytes read from NVMe.", MetricType::counter);
  w.sample(static_cast<double>(c.bytes_out[nvme]), {{"manager", mgr}});
  w.family("tierswap_nvme_written_bytes_total", "Bytes written to NVMe.", MetricType::counter);
  w.sample(static_cast<double>(c.bytes_in[nvme]), {{"manager", mgr}});
  w.family("tierswap_tier_in_bytes_total", "Bytes moved into the tier.", MetricType::counter);
  for (int t = 0; t < kTierCount; ++t)
    w.sample(static_cast<double>(c.bytes_in[t]),
             {{"manager", mgr}, {"tier", std::string(to_string(static_cast<Tier>(t)))}});
  w.family("tierswap_tier_out_bytes_total", "Bytes moved out of the tier.", MetricType::counter);
  for (int t = 0; t < kTierCount; ++t)
    w.sample(static_cast<double>(c.bytes_out[t]),
             {{"manager", mgr}, {"tier", std::string(to_string(static_cast<Tier>(t)))}});
}

void scheduler(const TierCounters& c, const std::string& mgr, MetricsWriter& w) {
  const std::pair<const char*, const char*> names[] = {
      {"tierswap_stalls_total", "Acquires that waited for a transfer."},
      {"tierswap_stall_seconds_total", "Time those waits took."},
      {"tierswap_prefetch_hits_total", "Acquires served by a prefetch."},
      {"tierswap_prefetch_misses_total", "Acquires no prefetch had started."},
      {"tierswap_evictions_total", "Copies evicted to make room."},
      {"tierswap_write_behind_total", "Write-backs started by the dirty-bytes bound."},
      {"tierswap_commits_total", "Generations committed."},
      {"tierswap_discards_total", "Generations discarded (rolled back)."},
  };
  const double values[] = {double(c.stalls),          c.stall_seconds,     double(c.prefetch_hits),
                           double(c.prefetch_misses), double(c.evictions), double(c.write_behind),
                           double(c.commits),         double(c.discards)};
  for (std::size_t i = 0; i < std::size(names); ++i) {
    w.family(names[i].first, names[i].second, MetricType::counter);
    w.sample(values[i], {{"manager", mgr}});
  }
  w.family("tierswap_inflight_ops", "Transfers in flight.", MetricType::gauge);
  w.sample(c.inflight_ops, {{"manager", mgr}});
}

}  // namespace

MetricsRegistry::Source TierManager::Impl::register_metrics(const TierManager& self,
                                                            std::uint64_t instance) {
  const std::string mgr = std::to_string(instance);
  return MetricsRegistry::process().add([&self, mgr](MetricsWriter& w) {
    const ResidencySnapshot s = self.snapshot();
    tier_gauges(s, mgr, w);
    traffic(s.counters, mgr, w);
    scheduler(s.counters, mgr, w);
  });
}

}  // namespace tierswap
