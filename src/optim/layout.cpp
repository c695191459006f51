// ShardedOptimizer layout: parameter groups flattened into rank partitions and sub-groups, each
// sub-group's placement (streamed, resident, memory-only, GPU), and its state and gradient blocks.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <stdexcept>
#include <utility>

#include "src/optim/optimizer_impl.hpp"
#include "tierswap/cuda_runtime.hpp"
#include "tierswap/device.hpp"
#include "tierswap/log.hpp"
#include "tierswap/thread_pool.hpp"
#include "tierswap/units.hpp"

namespace tierswap {

BlockClass state_class(int slot) {
  switch (slot) {
    case kMaster:
      return BlockClass::master;
    case kExpAvg:
      return BlockClass::exp_avg;
    case kExpAvgSq:
      return BlockClass::exp_avg_sq;
    case kMaxExpAvgSq:
      return BlockClass::max_exp_avg_sq;
    default:
      return BlockClass::momentum;
  }
}

bool keeps_slot(const GroupConfig& cfg, int slot) {
  switch (slot) {
    case kMaster:
      return true;
    case kExpAvg:
      return cfg.kind != OptimizerKind::sgd;
    case kExpAvgSq:
      return cfg.kind == OptimizerKind::adamw || cfg.kind == OptimizerKind::adam;
    case kMaxExpAvgSq:
      return (cfg.kind == OptimizerKind::adamw || cfg.kind == OptimizerKind::adam) && cfg.amsgrad;
    case kMomentum:
      return cfg.kind == OptimizerKind::sgd && cfg.momentum != 0;
  }
  return false;
}

bool same_state_layout(const GroupConfig& a, const GroupConfig& b) {
  if (a.kind != b.kind) return false;
  for (int slot = 0; slot < kStateSlots; ++slot)
    if (keeps_slot(a, slot) != keeps_slot(b, slot)) return false;
  return true;
}

bool OptGroup::has_slot(int slot) const {
  return keeps_slot(cfg, slot);
}

int OptGroup::slot_for(BlockClass cls) const {
  for (int s = 0; s < kStateSlots; ++s)
    if (state_class(s) == cls && has_slot(s)) return s;
  return -1;
}

// ---- Impl --------------------------------------------------------------------------------------
ShardedOptimizer::Impl::Impl(TierManager& t, Communicator& c, OptimizerConfig o, ThreadPool* p)
    : tiers(t),
      comm(c),
      cfg(std::move(o)),
      pool(p),
      step_metrics({{"manager", std::to_string(t.instance())}, {"rank", std::to_string(c.rank())}},
                   cfg.loss_scaler.mode != LossScaling::none ? cfg.loss_scaler.init_scale : 1.0) {
  cfg.validate();
  rank = comm.rank();
  world = comm.size();
  sub_size = round_up(cfg.subgroup_size, kGradStatsChunk);
  if (cfg.loss_scaler.mode != LossScaling::none) scale = cfg.loss_scaler.init_scale;
}

std::pair<std::uint64_t, std::uint64_t> ShardedOptimizer::Impl::rank_range(const OptGroup& g,
                                                                           int r) const {
  const std::uint64_t lo = std::min(g.numel, g.part * static_cast<std::uint64_t>(r));
  const std::uint64_t hi = std::min(g.numel, g.part * static_cast<std::uint64_t>(r + 1));
  return {lo, hi};
}

std::pair<std::uint64_t, std::uint64_t> ShardedOptimizer::Impl::piece(const OptGroup& g, int r,
                                                                      std::uint64_t k) const {
  const auto [lo, hi] = rank_range(g, r);
  const std::uint64_t b = std::min(hi, lo + k * sub_size);
  const std::uint64_t e = std::min(hi, b + sub_size);
  return {b, e - b};
}

std::span<const OptSub> ShardedOptimizer::Impl::subs_holding(const OptParam& p) const {
  const OptGroup& g = groups[p.group];
  const auto first = subs.begin() + static_cast<std::ptrdiff_t>(g.first_sub);
  const auto last = first + static_cast<std::ptrdiff_t>(g.nsubs);
  const auto lo = std::partition_point(
      first, last, [&](const OptSub& s) { return s.begin + s.numel <= p.offset; });
  const auto hi =
      std::partition_point(lo, last, [&](const OptSub& s) { return s.begin < p.offset + p.numel; });
  return {lo, hi};
}

std::span<OptSub> ShardedOptimizer::Impl::subs_holding(const OptParam& p) {
  const auto held = std::as_const(*this).subs_holding(p);
  const auto at = static_cast<std::size_t>(held.data() - subs.data());
  return {subs.data() + at, held.size()};
}

void ShardedOptimizer::Impl::require_finalized(const char* what) const {
  if (!finalized) throw std::logic_error(fmt::format("{}: call finalize() first", what));
}

// Nothing committed yet: the master weights were never written (a step would train whatever the
// fresh swap space holds).
void ShardedOptimizer::Impl::require_state(const char* what) const {
  require_finalized(what);
  if (!unusable.empty()) throw std::runtime_error(fmt::format("{}: {}", what, unusable));
  if (tiers.committed_generation() == 0)
    throw std::logic_error(fmt::format(
        "{}: the optimizer holds no state yet: call initialize() or load() after finalize() (or "
        "resume from a swap directory)",
        what));
}

void ShardedOptimizer::Impl::layout() {
  if (groups.empty()) throw std::logic_error("finalize: no parameter groups were added");
  for (auto& g : groups) layout_group(g);
}

// g's partitions and this rank's sub-groups of them, appended to subs; its statistics chunks
// after the groups' before it.
void ShardedOptimizer::Impl::layout_group(OptGroup& g) {
  g.numel = 0;
  for (ParamId id : g.params) {
    OptParam& p = params[id];
    if (!p.spec.requires_grad) continue;
    p.offset = g.numel;
    g.numel += p.numel;
  }
  const std::uint64_t per = (g.numel + world - 1) / static_cast<std::uint64_t>(world);
  g.part = std::max<std::uint64_t>(kGradStatsChunk, round_up(per, kGradStatsChunk));
  std::tie(g.lo, g.hi) = rank_range(g, rank);
  g.subs_per_part = (g.part + sub_size - 1) / sub_size;
  g.chunk_base = chunks;
  chunks += (g.numel + kGradStatsChunk - 1) / kGradStatsChunk;
  g.p16.assign(g.numel, 0);
  g.first_sub = subs.size();
  for (std::uint64_t k = 0; k < g.subs_per_part; ++k) {
    const auto [b, n] = piece(g, rank, k);
    if (n == 0) break;
    OptSub s;
    s.group = static_cast<int>(&g - groups.data());
    s.index = static_cast<int>(k);
    s.begin = b;
    s.numel = n;
    for (ParamId id : g.params) {
      const OptParam& p = params[id];
      if (p.spec.requires_grad && p.offset < b + n && p.offset + p.numel > b) {
        s.pids.push_back(id);
        ++params[id].nsubs;
      }
    }
    books.emplace_back().written.assign(s.pids.size(), 0);
    spec.per_sub.emplace_back();
    subs.push_back(s);
  }
  g.nsubs = subs.size() - g.first_sub;
  if (world > 1) g.local_grad.assign(g.numel * dtype_size(acc_dtype(g)), std::byte{0});
}

std::uint64_t ShardedOptimizer::Impl::state_block_bytes(const OptSub& s) const {
  std::uint64_t b = 0;
  for (int slot = 0; slot < kStateSlots; ++slot)
    if (groups[s.group].has_slot(slot)) b += round_up(s.numel * dtype_size(slot_dtype(slot)), 4096);
  return b;
}

std::uint64_t ShardedOptimizer::Impl::grad_block_bytes(const OptSub& s) const {
  return round_up(s.numel * dtype_size(acc_dtype(groups[s.group])), 4096);
}

// ---- create_blocks, in the order it runs --------------------------------------------------------
std::pair<std::uint64_t, std::uint64_t> ShardedOptimizer::Impl::state_and_grad_bytes() const {
  std::uint64_t state = 0, grads = 0;
  for (const auto& s : subs) {
    const OptGroup& g = groups[s.group];
    for (int slot = 0; slot < kStateSlots; ++slot)
      if (g.has_slot(slot)) state += s.numel * dtype_size(slot_dtype(slot));
    grads += s.numel * dtype_size(acc_dtype(g));
  }
  return {state, grads};
}

bool ShardedOptimizer::Impl::default_streaming(std::uint64_t state, std::uint64_t grads) const {
  switch (cfg.state_tier) {
    case OptimizerConfig::StateTier::host:
      return false;
    case OptimizerConfig::StateTier::nvme:
      return true;
    case OptimizerConfig::StateTier::automatic:
      break;
  }
  return state + grads > tiers.config().host_budget / 2;
}

// A plan decides per sub-group, by the sub-group's middle element as a fraction of this rank's
// parameters (so a plan made for another sub-group size or model still applies).
bool ShardedOptimizer::Impl::apply_placement(bool streaming) {
  if (!plan && !cfg.plan_file.empty()) plan = Plan::load(cfg.plan_file);
  gpu_simulated = tiers.device_tier() == DeviceTierMode::simulated;
  device_ptrs = cuda::available() && !gpu_simulated;
  p16out.configure(device_ptrs, world);
  std::uint64_t rank_total = 0, pos = 0;
  for (const auto& s : subs) rank_total += s.numel;
  bool any_streaming = false;
  for (auto& s : subs) {
    s.streaming = streaming;
    if (plan)
      place_by_plan(
          s, plan->at_fraction((static_cast<double>(pos) + static_cast<double>(s.numel) / 2) /
                               static_cast<double>(std::max<std::uint64_t>(rank_total, 1))));
    s.memory_only = !cfg.persist_resident_state && !s.streaming;
    any_streaming |= s.streaming;
    pos += s.numel;
  }
  return any_streaming;
}

void ShardedOptimizer::Impl::place_by_plan(OptSub& s, const PlanSubgroup& d) {
  s.streaming = d.state_tier == Tier::nvme;
  s.step_gpu = d.step_device == StepDevice::gpu;
  s.on_gpu = d.state_tier == Tier::device;
  s.grad_gpu = s.step_gpu && tiers.device_tier() != DeviceTierMode::off;
  // A simulated device tier stands in for the GPU: its sub-groups step with the CPU kernels
  // (same bits), which exercises the placement without a GPU.
  if (s.step_gpu && !gpu_simulated && !cuda::available())
    throw std::invalid_argument(fmt::format(
        "plan: sub-group {} of group {} is to step on the GPU (plan sub-group {}), but no GPU "
        "is usable here ({}): make the plan for this machine (tierswap probe, then tierswap "
        "plan --profile FILE) or edit it",
        s.index, s.group, d.id, device_info().reason));
  if (s.on_gpu && tiers.device_tier() == DeviceTierMode::off)
    throw std::invalid_argument(fmt::format(
        "plan: sub-group {} of group {} keeps its state on the GPU, but the tier manager has "
        "no device tier (TierConfig::device_budget is 0 or device_mode is off)",
        s.index, s.group));
}

std::uint64_t ShardedOptimizer::Impl::largest_state_bytes() const {
  std::uint64_t per_sub = 0;
  for (const auto& s : subs) per_sub = std::max(per_sub, state_block_bytes(s));
  return per_sub;
}

// Memory-only state is never evicted: it must fit its tier beside the pinned gradients. Returns
// what stays in each memory tier: memory-only state, its pinned gradients (all host-resident
// gradients on the host), and the slack for slab granularity (TierConfig::slab_slack).
ShardedOptimizer::Impl::TierBytes ShardedOptimizer::Impl::check_memory_only_budgets(
    std::uint64_t grads, TierBytes* mem) const {
  TierBytes mem_grads{}, held{};
  for (const auto& s : subs)
    if (s.memory_only) {
      (*mem)[memory_tier(s)] += state_block_bytes(s);
      mem_grads[memory_tier(s)] += grad_block_bytes(s);
    }
  const TierConfig& tc = tiers.config();
  const int h = static_cast<int>(Tier::host), d = static_cast<int>(Tier::device);
  held[h] = (*mem)[h] +
            (cfg.grad_tier == Tier::host ? grads
             : tc.pageable_budget > 0    ? 0
                                         : mem_grads[h]) +
            tc.slab_slack(Tier::host);
  held[d] = (*mem)[d] + mem_grads[d] + tc.slab_slack(Tier::device);
  if ((*mem)[h] > 0 && held[h] > tc.host_budget)
    throw std::invalid_argument(fmt::format(
        "persist_resident_state=false: {} of memory-only host state and {} of host-resident "
        "gradients do not fit the host budget {} with {} to spare for slab granularity (raise "
        "TierConfig::host_budget, keep resident state persisted, or move sub-groups to NVMe)",
        format_bytes((*mem)[h]), format_bytes(held[h] - (*mem)[h] - tc.slab_slack(Tier::host)),
        format_bytes(tc.host_budget), format_bytes(tc.slab_slack(Tier::host))));
  if ((*mem)[d] > 0 && held[d] > tc.device_budget)
    throw std::invalid_argument(fmt::format(
        "persist_resident_state=false: {} of memory-only GPU state and its {} of gradients do "
        "not fit the device budget {} with {} to spare for slab granularity (raise "
        "TierConfig::device_budget, keep resident state persisted, or keep fewer sub-groups on "
        "the GPU)",
        format_bytes((*mem)[d]), format_bytes(mem_grads[d]), format_bytes(tc.device_budget),
        format_bytes(tc.slab_slack(Tier::device))));
  return held;
}

// Overlapped mode: memory-only state steps during the backward where its tier also holds an
// undo copy of it, the sub-groups final first (the last ones) first; the rest steps after the
// verdict. The host also keeps the staging of streamed sub-groups (the one stepped, one written
// behind, the read-ahead).
void ShardedOptimizer::Impl::assign_undo_copies(TierBytes held, std::uint64_t per_sub,
                                                bool any_streaming) {
  const TierConfig& tc = tiers.config();
  const int h = static_cast<int>(Tier::host), d = static_cast<int>(Tier::device);
  if (any_streaming) held[h] += per_sub * (cfg.prefetch_depth + 2);
  const std::uint64_t budget[kTierCount] = {tc.device_budget, tc.host_budget, 0};
  TierBytes left{}, undo_bytes{};
  std::size_t n_undo[kTierCount] = {}, n_mem[kTierCount] = {};
  bool full[kTierCount] = {};
  for (const int t : {h, d}) left[t] = budget[t] > held[t] ? budget[t] - held[t] : 0;
  for (auto it = subs.rbegin(); it != subs.rend(); ++it) {
    OptSub& s = *it;
    if (!s.memory_only) continue;
    const int t = memory_tier(s);
    const std::uint64_t b = state_block_bytes(s);
    ++n_mem[t];
    full[t] = full[t] || b > left[t];
    if (full[t]) continue;
    s.undo = true;
    left[t] -= b;
    undo_bytes[t] += b;
    ++n_undo[t];
  }
  for (const int t : {h, d})
    if (n_mem[t] > 0)
      log(n_undo[t] < n_mem[t] ? LogLevel::info : LogLevel::debug,
          fmt::format("overlapped step: {} of {} memory-only {} sub-groups keep an undo copy "
                      "({}) and step during the backward; the rest step after the verdict "
                      "(the {} budget {} holds no more copies)",
                      n_undo[t], n_mem[t], t == d ? "GPU" : "host", format_bytes(undo_bytes[t]),
                      t == d ? "device" : "host", format_bytes(budget[t])));
}

// Gradients from device memory are accumulated in the device tier for GPU-stepped sub-groups
// only where that tier holds, beside what stays there (memory-only state, its gradients and undo
// copies, the slab slack), the views a step pins (a sub-group's state and gradient) and, in the
// overlapped mode, an ingest's gradient at the same time; else they go through host memory (the
// same bits), rather than a step failing on the device budget.
void ShardedOptimizer::Impl::choose_device_gradients() {
  if (std::any_of(subs.begin(), subs.end(), [](const OptSub& s) { return s.grad_gpu; })) {
    const TierConfig& tc = tiers.config();
    std::uint64_t need = tc.slab_slack(Tier::device), step_pins = 0, grad_max = 0;
    for (const auto& s : subs) {
      if (!s.grad_gpu && !s.on_gpu) continue;
      const std::uint64_t g = grad_block_bytes(s);
      const std::uint64_t st = s.on_gpu ? state_block_bytes(s) : 0;
      if (s.memory_only && s.on_gpu) {
        need += st * (s.undo ? 2 : 1) + g;
      } else {
        step_pins = std::max(step_pins, st + g);
      }
      grad_max = std::max(grad_max, g);
    }
    need += step_pins + (cfg.overlap ? grad_max : 0);
    if (need > tc.device_budget) {
      for (auto& s : subs) s.grad_gpu = false;
      log(LogLevel::info,
          fmt::format("add_grad_device: the device budget {} cannot hold a step's views beside an "
                      "ingest's gradient and the resident GPU state ({} needed): gradients from "
                      "device memory go through host memory",
                      format_bytes(tc.device_budget), format_bytes(need)));
    }
  }
}

namespace {

// A plan made for another value of a mode the optimizer reads (`key`, its environment variable
// `env`); `flag` is `tierswap plan`'s option that plans for `flag_plans_for`.
void warn_plan_mode(const char* key, const char* env, const char* flag, bool flag_plans_for,
                    std::optional<bool> planned, bool runs) {
  if (!planned || *planned == runs) return;
  log(LogLevel::warn,
      fmt::format("plan: it was made for {}={} but the optimizer runs with {}: its predicted "
                  "times and NVMe bytes do not apply (set {} / {}={}, or make the plan {} {})",
                  key, *planned, runs, key, env, *planned ? 1 : 0,
                  runs == flag_plans_for ? "with" : "without", flag));
}

}  // namespace

// A plan made for other modes, or for more host memory than this budget.
void ShardedOptimizer::Impl::warn_plan_mismatch(std::uint64_t grads) const {
  if (!plan) return;
  warn_plan_mode("persist_resident_state", "TIERSWAP_PERSIST_RESIDENT_STATE",
                 "--persist-resident-state", true, plan->persist_resident_state,
                 cfg.persist_resident_state);
  if (!plan->overlap)  // the overlapped step's order is the backward's, whatever this says
    warn_plan_mode("alternate_step_order", "TIERSWAP_ALTERNATE_STEP_ORDER", "--ascending", false,
                   plan->alternate_step_order, cfg.alternate_step_order);
  // A plan made for more host memory than this tier manager's budget.
  std::uint64_t resident = cfg.grad_tier == Tier::host ? grads : 0;
  for (const auto& s : subs)
    if (!s.streaming && !s.on_gpu) resident += state_block_bytes(s);
  if (resident > tiers.config().host_budget)
    log(LogLevel::warn,
        fmt::format("plan: it keeps {} of state and gradients in host memory but the host "
                    "budget is {}: sub-groups will be evicted and read back every step (make "
                    "the plan for this budget, or raise TierConfig::host_budget)",
                    format_bytes(resident), format_bytes(tiers.config().host_budget)));
}

// A streamed sub-group steps with its whole state in host memory, beside the host-resident
// gradients: a budget below that would let finalize() pass and every step fail. (The slab slack
// is left out: a budget a little short of it works, reading less ahead.)
void ShardedOptimizer::Impl::check_streaming_budget(std::uint64_t grads, std::uint64_t per) const {
  const std::uint64_t budget = tiers.config().host_budget;
  if (grads + per <= budget) return;
  throw std::invalid_argument(fmt::format(
      "host budget {}: a sub-group's state streamed from NVMe ({}) does not fit beside {} of "
      "host-resident gradients; a step needs more than {} (raise the host budget, lower "
      "subgroup_size, or give gradients a pageable budget)",
      format_bytes(budget), format_bytes(per), format_bytes(grads), format_bytes(grads + per)));
}

// Read-ahead within the budget: host-resident gradients, the sub-group being stepped, one being
// written behind, the one the GPU steps meanwhile (a concurrent split step), and `depth` read
// ahead must fit, or memory pressure would spill gradients and drop prefetched state before its
// use.
void ShardedOptimizer::Impl::fit_prefetch_depth(std::uint64_t grads, std::uint64_t per_sub,
                                                bool any_streaming) {
  depth = cfg.prefetch_depth;
  if (any_streaming) {
    const bool split =
        cfg.concurrent_gpu_step &&
        std::any_of(subs.begin(), subs.end(), [](const OptSub& s) { return s.step_gpu; });
    const std::uint64_t per = per_sub;
    const std::uint64_t budget = tiers.config().host_budget;
    // The slab slack too: whole slabs, and a prefetch that finds no room drops another one's
    // copy before its use (read twice).
    const std::uint64_t host_grads = cfg.grad_tier == Tier::host ? grads : 0;
    check_streaming_budget(host_grads, per);
    const std::uint64_t held =
        host_grads + (split ? 3 : 2) * per + tiers.config().slab_slack(Tier::host);
    const std::uint64_t fit = budget > held ? (budget - held) / std::max<std::uint64_t>(per, 1) : 0;
    if (fit < depth) {
      log(LogLevel::info,
          fmt::format("optimizer: reading {} sub-group(s) ahead, not {}: the host budget {} holds "
                      "{} of gradients and {} per sub-group of state (smaller sub-groups or a "
                      "larger budget read further ahead)",
                      fit, depth, format_bytes(budget),
                      format_bytes(cfg.grad_tier == Tier::host ? grads : 0), format_bytes(per)));
      depth = static_cast<std::uint32_t>(fit);
    }
  }
}

BlockId ShardedOptimizer::Impl::make_block(const BlockDesc& d) {
  const auto have = tiers.find(d.name);
  if (!have) {
    if (adopt_blocks && !d.transient && !d.memory_only)
      throw std::runtime_error(fmt::format(
          "resume: the swap directory has no block '{}' (its record describes this layout, its "
          "block table does not: damaged or edited)",
          d.name));
    return tiers.create(d);
  }
  // A group added between steps takes the blocks an earlier attempt that failed left (no
  // group holds them; their contents are written again).
  if (!adopt_blocks && !adding_group)
    throw std::runtime_error(fmt::format(
        "finalize: the swap space already holds block '{}' (optimizer state of an earlier run): "
        "resume() continues from it; or use a fresh swap directory and load() a checkpoint",
        d.name));
  const BlockDesc b = tiers.desc(*have);
  if (b.cls != d.cls || b.dtype != d.dtype || b.numel != d.numel || !(b.owner == d.owner) ||
      b.memory_only != d.memory_only)
    throw std::runtime_error(fmt::format(
        "{}: block '{}' in the swap directory is {} {} x{}{}, this layout needs {} {} x{}{}{}",
        adding_group ? "add_group_between_steps" : "resume", d.name, to_string(b.cls),
        to_string(b.dtype), b.numel, b.memory_only ? " (memory-only)" : "", to_string(d.cls),
        to_string(d.dtype), d.numel, d.memory_only ? " (memory-only)" : "",
        adding_group ? " (left by an earlier attempt to add a group of another shape: add that "
                       "group, or resume this run from its last commit in a fresh process)"
                     : ""));
  tiers.set_pageable(*have, d.pageable);  // where the host copy lives is not stored
  return *have;
}

void ShardedOptimizer::Impl::create_state_blocks(std::size_t from) {
  for (std::size_t k = from; k < subs.size(); ++k) {
    OptSub& s = subs[k];
    const OptGroup& g = groups[s.group];
    const std::string base = fmt::format("g{}.r{}.s{}", s.group, rank, s.index);
    for (int slot = 0; slot < kStateSlots; ++slot) {
      if (!g.has_slot(slot)) continue;
      BlockDesc d;
      d.name = fmt::format("{}.{}", base, to_string(state_class(slot)));
      d.cls = state_class(slot);
      d.dtype = slot_dtype(slot);
      d.numel = s.numel;
      d.owner = {rank, s.group, s.index};
      d.memory_only = s.memory_only;
      s.state[slot] = make_block(d);
      if (s.undo) {
        d.name += ".undo";
        s.undo_block[slot] = make_block(d);
      }
    }
    BlockDesc gd;
    gd.name = base + ".grad16";
    gd.cls = BlockClass::grad16;
    gd.dtype = acc_dtype(g);
    gd.numel = s.numel;
    gd.owner = {rank, s.group, s.index};
    gd.transient = true;
    // Gradients stepped by the CPU need no pinned memory (the pageable pool, when the tier
    // manager has one); a GPU-stepped sub-group's are copied to the device from pinned memory.
    gd.pageable = !s.step_gpu;
    s.grad = make_block(gd);
  }
}

// With a pageable pool (TierConfig::pageable_budget) the gradients of CPU-stepped sub-groups wait
// outside the pinned budget: only GPU-stepped sub-groups' (none before placement) count in it.
std::uint64_t ShardedOptimizer::Impl::pinned_grad_bytes(std::uint64_t grads) const {
  if (tiers.config().pageable_budget == 0) return grads;
  std::uint64_t n = 0;
  for (const auto& s : subs)
    if (s.step_gpu) n += grad_block_bytes(s);
  return n;
}

void ShardedOptimizer::Impl::create_blocks() {
  const auto [state, all_grads] = state_and_grad_bytes();
  const bool any_streaming =
      apply_placement(default_streaming(state, pinned_grad_bytes(all_grads)));
  const std::uint64_t grads = pinned_grad_bytes(all_grads);  // after placement
  const std::uint64_t per_sub = largest_state_bytes();
  TierBytes mem{};
  const TierBytes held = check_memory_only_budgets(grads, &mem);
  if (cfg.overlap && mem[static_cast<int>(Tier::host)] + mem[static_cast<int>(Tier::device)] > 0)
    assign_undo_copies(held, per_sub, any_streaming);
  choose_device_gradients();
  warn_plan_mismatch(grads);
  fit_prefetch_depth(grads, per_sub, any_streaming);
  create_state_blocks();
}

void ShardedOptimizer::Impl::gather_param16() {
  if (world == 1) return;
  std::vector<std::size_t> counts(world), displs(world);
  for (auto& g : groups) {
    for (std::uint64_t k = 0; k < g.subs_per_part; ++k) {
      bool any = false;
      for (int r = 0; r < world; ++r) {
        const auto [b, n] = piece(g, r, k);
        counts[r] = n;
        displs[r] = b;
        any |= n > 0;
      }
      if (any) comm.all_gather_v(g.p16.data(), counts, displs, g.dtype16);
    }
  }
}

}  // namespace tierswap
