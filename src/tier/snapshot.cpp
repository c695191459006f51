// The residency snapshot: what each tier holds, by class and block, and its JSON (the telemetry
// endpoint, `tierswap residency`, `tierswap ps`).
#include "src/tier/tier_impl.hpp"

namespace tierswap {

namespace {

using ByClass = std::map<std::pair<BlockClass, Tier>, std::uint64_t>;

// Block b's row, its bytes added to the tiers' rows (device, host, NVMe) and to by_class.
ResidencySnapshot::BlockRow account_block(const Block& b, ResidencySnapshot::TierRow* rows,
                                          ByClass& by_class) {
  ResidencySnapshot::BlockRow row;
  row.name = b.desc.name;
  row.cls = b.desc.cls;
  row.dtype = b.desc.dtype;
  row.numel = b.desc.numel;
  row.owner = b.desc.owner;
  row.pins = b.pins[kDev] + b.pins[kHost];
  for (int s : {kDev, kHost}) {
    const int t = s == kDev ? 0 : 1;
    row.state[t] = b.st[s];
    switch (b.st[s]) {
      case CopyState::dirty:
        rows[t].dirty_bytes += b.bytes;
        [[fallthrough]];
      case CopyState::valid:
        rows[t].resident_bytes += b.bytes;
        by_class[{b.desc.cls, s == kDev ? Tier::device : Tier::host}] += b.bytes;
        break;
      case CopyState::writing:
        rows[t].resident_bytes += b.bytes;
        rows[t].dirty_bytes += b.bytes;
        rows[t].inflight_bytes += b.bytes;
        rows[2].inflight_bytes += b.bytes;
        by_class[{b.desc.cls, Tier::host}] += b.bytes;
        break;
      case CopyState::reading:
        rows[t].inflight_bytes += b.bytes;
        rows[2].inflight_bytes += b.bytes;
        break;
      case CopyState::absent:
        break;
    }
    if (b.pins[s] > 0) rows[t].pinned_bytes += b.bytes;
  }
  const bool on_nvme = b.nvme_has_data();
  row.state[2] = b.st[kHost] == CopyState::writing ? CopyState::writing
                 : on_nvme                         ? CopyState::valid
                                                   : CopyState::absent;
  if (on_nvme) {
    rows[2].resident_bytes += b.bytes;
    by_class[{b.desc.cls, Tier::nvme}] += b.bytes;
  }
  if (b.written) rows[2].dirty_bytes += b.bytes;  // written, not committed yet
  return row;
}

}  // namespace

ResidencySnapshot TierManager::snapshot() const {
  std::lock_guard lk(impl_->mu);
  const Impl& m = *impl_;
  ResidencySnapshot r;
  r.pid = static_cast<int>(::getpid());
  r.device_tier = m.device != nullptr;
  r.simulated_device = m.device && m.device->simulated();
  r.host_memory = m.host.memory_kind();
  r.locked_host_bytes = r.host_memory == "pageable" ? 0 : m.host.reserved();
  r.committed_generation = m.committed_gen;
  r.checksums_verified = m.checksums_verified;
  r.counters = m.counters_now();
  ResidencySnapshot::TierRow rows[kTierCount];
  rows[0].tier = Tier::device;
  rows[0].capacity_bytes = m.device ? m.device->budget() : 0;
  rows[1].tier = Tier::host;
  // The host tier: the pinned budget and the pageable pool beside it (pageable blocks' copies
  // count as host-resident too).
  r.host_budget_bytes = m.host.budget();
  r.pageable_budget_bytes = m.pageable ? m.pageable->budget() : 0;
  rows[1].capacity_bytes = r.host_budget_bytes + r.pageable_budget_bytes;
  rows[2].tier = Tier::nvme;
  rows[2].capacity_bytes = m.alloc.stats().capacity;
  rows[0].reserved_bytes = m.device ? m.device->reserved() : 0;
  rows[1].reserved_bytes = m.host.reserved() + (m.pageable ? m.pageable->reserved() : 0);
  rows[2].reserved_bytes = m.alloc.stats().used;
  ByClass by_class;
  for (auto& bp : m.blocks) r.blocks.push_back(account_block(*bp, rows, by_class));
  for (int t = 0; t < kTierCount; ++t)
    if (t != 0 || r.device_tier) r.tiers.push_back(rows[t]);
  for (auto& [k, v] : by_class) r.classes.push_back({k.first, k.second, v});
  return r;
}

ExtentStats TierManager::swap_extents() const {
  std::lock_guard lk(impl_->mu);
  return impl_->alloc.stats();
}

namespace {

nlohmann::json tiers_json(const std::vector<ResidencySnapshot::TierRow>& tiers) {
  auto out = nlohmann::json::array();
  for (auto& t : tiers)
    out.push_back({{"tier", std::string(to_string(t.tier))},
                   {"capacity_bytes", t.capacity_bytes},
                   {"resident_bytes", t.resident_bytes},
                   {"dirty_bytes", t.dirty_bytes},
                   {"inflight_bytes", t.inflight_bytes},
                   {"pinned_bytes", t.pinned_bytes},
                   {"reserved_bytes", t.reserved_bytes}});
  return out;
}

nlohmann::json counters_json(const TierCounters& c) {
  nlohmann::json per_tier = nlohmann::json::object();
  for (Tier t : {Tier::device, Tier::host, Tier::nvme}) {
    const int i = static_cast<int>(t);
    per_tier[std::string(to_string(t))] = {
        {"bytes_in", c.bytes_in[i]},
        {"bytes_out", c.bytes_out[i]},
        {"ops_in", c.ops_in[i]},
        {"ops_out", c.ops_out[i]},
        {"gbps_in", c.busy_seconds_in[i] > 0 ? c.bytes_in[i] / c.busy_seconds_in[i] / 1e9 : 0.0},
        {"gbps_out",
         c.busy_seconds_out[i] > 0 ? c.bytes_out[i] / c.busy_seconds_out[i] / 1e9 : 0.0}};
  }
  return {{"tiers", per_tier},
          {"stalls", c.stalls},
          {"stall_seconds", c.stall_seconds},
          {"prefetch_hits", c.prefetch_hits},
          {"prefetch_misses", c.prefetch_misses},
          {"evictions", c.evictions},
          {"write_behind", c.write_behind},
          {"commits", c.commits},
          {"discards", c.discards},
          {"inflight_ops", c.inflight_ops},
          {"peak_host_bytes", c.peak_reserved_bytes[static_cast<int>(Tier::host)]},
          {"queued_prefetches", c.queued_prefetches}};
}

// Per sub-group (rank, group, sub-group): where each of its blocks is.
nlohmann::json subgroups_json(const std::vector<ResidencySnapshot::BlockRow>& blocks) {
  std::map<std::tuple<int, int, int>, nlohmann::json> groups;
  for (auto& b : blocks) {
    auto& g = groups[{b.owner.rank, b.owner.group, b.owner.subgroup}];
    if (g.is_null()) g = nlohmann::json::array();
    g.push_back({{"name", b.name},
                 {"class", std::string(to_string(b.cls))},
                 {"dtype", std::string(to_string(b.dtype))},
                 {"numel", b.numel},
                 {"pins", b.pins},
                 {"gpu", std::string(to_string(b.state[0]))},
                 {"host", std::string(to_string(b.state[1]))},
                 {"nvme", std::string(to_string(b.state[2]))}});
  }
  auto out = nlohmann::json::array();
  for (auto& [k, v] : groups)
    out.push_back({{"rank", std::get<0>(k)},
                   {"group", std::get<1>(k)},
                   {"subgroup", std::get<2>(k)},
                   {"blocks", v}});
  return out;
}

}  // namespace

std::string ResidencySnapshot::to_json() const {
  nlohmann::json j;
  j["pid"] = pid;
  j["simulated_device"] = simulated_device;
  j["device_tier"] = device_tier;
  j["host_memory"] = host_memory;
  j["locked_host_bytes"] = locked_host_bytes;
  j["host_budget_bytes"] = host_budget_bytes;
  j["pageable_budget_bytes"] = pageable_budget_bytes;
  j["tiers"] = tiers_json(tiers);
  auto classes_j = nlohmann::json::array();
  for (auto& c : classes)
    classes_j.push_back({{"class", std::string(to_string(c.cls))},
                         {"tier", std::string(to_string(c.tier))},
                         {"bytes", c.bytes}});
  j["classes"] = classes_j;
  j["generation"] = {{"committed", committed_generation},
                     {"checksums_verified", checksums_verified}};
  j["counters"] = counters_json(counters);
  j["subgroups"] = subgroups_json(blocks);
  return j.dump();
}

}  // namespace tierswap
