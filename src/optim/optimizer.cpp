// ShardedOptimizer: layout, gradient ingest and reduction, the pipelined step.
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
#include "tierswap/cuda_kernels.hpp"
#include "tierswap/device.hpp"
#include "tierswap/log.hpp"
#include "tierswap/thread_pool.hpp"
#include "tierswap/units.hpp"

namespace tierswap {
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void bad_value(const std::string& key, const std::string& value, const char* why) {
  throw std::invalid_argument(fmt::format("{} = {}: {}", key, value, why));
}

AdamConfig adam_config(const GroupConfig& c) {
  AdamConfig a;
  a.lr = c.lr;
  a.beta1 = c.beta1;
  a.beta2 = c.beta2;
  a.eps = c.eps;
  a.weight_decay = c.weight_decay;
  a.decoupled = c.kind == OptimizerKind::adamw;
  a.amsgrad = c.amsgrad;
  a.maximize = c.maximize;
  return a;
}
LionConfig lion_config(const GroupConfig& c) {
  LionConfig l;
  l.lr = c.lr;
  l.beta1 = c.beta1;
  l.beta2 = c.beta2;
  l.weight_decay = c.weight_decay;
  l.maximize = c.maximize;
  return l;
}
SgdConfig sgd_config(const GroupConfig& c) {
  SgdConfig s;
  s.lr = c.lr;
  s.momentum = c.momentum;
  s.dampening = c.dampening;
  s.weight_decay = c.weight_decay;
  s.nesterov = c.nesterov;
  s.maximize = c.maximize;
  return s;
}

// The GPU's part of a split step (concurrent_gpu_step): the sub-groups the GPU steps, in order,
// on a thread of their own while step()'s thread steps the CPU's part. Finished sub-groups go
// back to step()'s thread (take), which does their bookkeeping. The lane stops at its first
// failure (finish() rethrows it); the destructor stops it after the sub-group in progress and
// joins, so nothing runs on the lane once an error unwinds step().
class GpuLane {
 public:
  GpuLane(std::vector<std::size_t> ks, std::function<void(std::size_t)> step)
      : ks_(std::move(ks)), step_(std::move(step)), thread_([this] { run(); }) {}
  ~GpuLane() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }
  GpuLane(const GpuLane&) = delete;
  GpuLane& operator=(const GpuLane&) = delete;

  /// The sub-groups finished since the last call, in order. `wait`: blocks until there is one
  /// or the lane has ended (then none means it is over).
  std::vector<std::size_t> take(bool wait) {
    std::unique_lock lk(mu_);
    if (wait) cv_.wait(lk, [&] { return !done_.empty() || ended_; });
    return std::exchange(done_, {});
  }
  bool failed() {
    std::lock_guard lk(mu_);
    return err_ != nullptr;
  }
  /// Joins the lane and rethrows its failure; else returns the time from its start to the end
  /// of its last sub-group.
  double finish() {
    thread_.join();
    if (err_) std::rethrow_exception(err_);
    return seconds_;
  }

 private:
  void run() {
    const auto t0 = Clock::now();
    for (std::size_t k : ks_) {
      {
        std::lock_guard lk(mu_);
        if (stop_ || err_) break;
      }
      std::exception_ptr err;
      try {
        step_(k);
      } catch (...) {
        err = std::current_exception();
      }
      std::lock_guard lk(mu_);
      if (err)
        err_ = err;
      else
        done_.push_back(k);
      cv_.notify_all();
    }
    std::lock_guard lk(mu_);
    seconds_ = std::chrono::duration<double>(Clock::now() - t0).count();
    ended_ = true;
    cv_.notify_all();
  }

  const std::vector<std::size_t> ks_;
  const std::function<void(std::size_t)> step_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::size_t> done_;
  std::exception_ptr err_;
  bool stop_ = false, ended_ = false;
  double seconds_ = 0;
  std::thread thread_;  // last: starts once everything above is constructed
};

std::uint64_t round_up_u64(std::uint64_t v, std::uint64_t m) {
  return (v + m - 1) / m * m;
}

// Releases a view on scope exit (clean unless marked dirty).
struct Held {
  TierManager& t;
  BlockView v;
  bool dirty = false;
  Held(TierManager& tm, BlockView view) : t(tm), v(std::move(view)) {}
  ~Held() {
    if (v) {
      try {
        t.release(v, dirty);
      } catch (...) {
      }
    }
  }
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;
};

}  // namespace

std::string_view to_string(OptimizerKind k) noexcept {
  switch (k) {
    case OptimizerKind::adamw:
      return "adamw";
    case OptimizerKind::adam:
      return "adam";
    case OptimizerKind::lion:
      return "lion";
    case OptimizerKind::sgd:
      return "sgd";
  }
  return "?";
}

OptimizerKind parse_optimizer_kind(std::string_view t) {
  if (t == "adamw") return OptimizerKind::adamw;
  if (t == "adam") return OptimizerKind::adam;
  if (t == "lion") return OptimizerKind::lion;
  if (t == "sgd") return OptimizerKind::sgd;
  throw std::invalid_argument(
      fmt::format("optimizer '{}': expected adamw, adam, lion or sgd", std::string(t)));
}

void GroupConfig::validate() const {
  switch (kind) {
    case OptimizerKind::adamw:
    case OptimizerKind::adam:
      adam_config(*this).validate();
      break;
    case OptimizerKind::lion:
      lion_config(*this).validate();
      break;
    case OptimizerKind::sgd:
      sgd_config(*this).validate();
      break;
  }
}

GroupConfig GroupConfig::defaults(OptimizerKind kind) {
  GroupConfig c;
  c.kind = kind;
  switch (kind) {
    case OptimizerKind::adamw:
      break;
    case OptimizerKind::adam:
      c.weight_decay = 0.0;
      break;
    case OptimizerKind::lion:
      c.lr = 1e-4;
      c.beta2 = 0.99;
      c.weight_decay = 0.0;
      break;
    case OptimizerKind::sgd:
      c.weight_decay = 0.0;
      break;
  }
  return c;
}

void LossScalerConfig::validate() const {
  if (mode == LossScaling::none) return;
  if (!(init_scale > 0) || !std::isfinite(init_scale))
    bad_value("loss_scaler.init_scale", std::to_string(init_scale), "must be finite and > 0");
  if (!(growth_factor > 1))
    bad_value("loss_scaler.growth_factor", std::to_string(growth_factor), "must be > 1");
  if (!(backoff_factor > 0 && backoff_factor < 1))
    bad_value("loss_scaler.backoff_factor", std::to_string(backoff_factor), "must be in (0, 1)");
  if (growth_interval == 0) bad_value("loss_scaler.growth_interval", "0", "must be > 0");
}

void OptimizerConfig::validate() const {
  if (subgroup_size == 0) bad_value("subgroup_size", "0", "must be > 0");
  if (subgroup_size > (std::uint64_t{1} << 30))
    bad_value("subgroup_size", std::to_string(subgroup_size), "must be at most 2^30 elements");
  if (prefetch_depth > 64)
    bad_value("prefetch_depth", std::to_string(prefetch_depth), "must be at most 64");
  if (grad_tier == Tier::device)
    bad_value("grad_tier", "gpu", "gradients are kept in host memory or on NVMe");
  if (!(max_grad_norm >= 0) || !std::isfinite(max_grad_norm))
    bad_value("max_grad_norm", std::to_string(max_grad_norm), "must be finite and >= 0");
  loss_scaler.validate();
}

std::uint64_t ParamSpec::numel() const {
  if (shape.empty()) return 1;  // a scalar
  std::uint64_t n = 1;
  for (auto d : shape) {
    if (d <= 0)
      throw std::invalid_argument(fmt::format("parameter '{}': dimension {} must be > 0", name, d));
    n *= static_cast<std::uint64_t>(d);
  }
  return n;
}

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

bool OptGroup::has_slot(int slot) const {
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

// ---- Impl --------------------------------------------------------------------------------------
ShardedOptimizer::Impl::Impl(TierManager& t, Communicator& c, OptimizerConfig o, ThreadPool* p)
    : tiers(t), comm(c), cfg(std::move(o)), pool(p) {
  cfg.validate();
  rank = comm.rank();
  world = comm.size();
  sub_size = round_up_u64(cfg.subgroup_size, kGradStatsChunk);
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

void ShardedOptimizer::Impl::require_finalized(const char* what) const {
  if (!finalized) throw std::logic_error(fmt::format("{}: call finalize() first", what));
}

void ShardedOptimizer::Impl::layout() {
  if (groups.empty()) throw std::logic_error("finalize: no parameter groups were added");
  std::uint64_t trainable = 0;
  for (auto& g : groups) {
    g.numel = 0;
    for (ParamId id : g.params) {
      OptParam& p = params[id];
      if (!p.spec.requires_grad) continue;
      p.offset = g.numel;
      g.numel += p.numel;
    }
    trainable += g.numel;
    const std::uint64_t per = (g.numel + world - 1) / static_cast<std::uint64_t>(world);
    g.part = std::max<std::uint64_t>(kGradStatsChunk, round_up_u64(per, kGradStatsChunk));
    std::tie(g.lo, g.hi) = rank_range(g, rank);
    g.slots = (g.part + sub_size - 1) / sub_size;
    g.chunk_base = chunks;
    chunks += (g.numel + kGradStatsChunk - 1) / kGradStatsChunk;
    g.p16.assign(g.numel, 0);
    g.first_sub = subs.size();
    for (std::uint64_t k = 0; k < g.slots; ++k) {
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
          ++s.nparams;
          s.pids.push_back(id);
          ++params[id].nsubs;
        }
      }
      s.slice_written.assign(s.pids.size(), 0);
      subs.push_back(s);
    }
    g.nsubs = subs.size() - g.first_sub;
    if (world > 1) g.local_grad.assign(g.numel * dtype_size(acc_dtype(g)), std::byte{0});
  }
  if (trainable == 0) throw std::logic_error("finalize: no parameter requires a gradient");
}

std::uint64_t ShardedOptimizer::Impl::state_block_bytes(const OptSub& s) const {
  std::uint64_t b = 0;
  for (int slot = 0; slot < kStateSlots; ++slot)
    if (groups[s.group].has_slot(slot))
      b += round_up_u64(s.numel * dtype_size(slot_dtype(slot)), 4096);
  return b;
}

std::uint64_t ShardedOptimizer::Impl::grad_block_bytes(const OptSub& s) const {
  return round_up_u64(s.numel * dtype_size(acc_dtype(groups[s.group])), 4096);
}

void ShardedOptimizer::Impl::create_blocks() {
  std::uint64_t state = 0, grads = 0;
  for (const auto& s : subs) {
    const OptGroup& g = groups[s.group];
    for (int slot = 0; slot < kStateSlots; ++slot)
      if (g.has_slot(slot)) state += s.numel * dtype_size(slot_dtype(slot));
    grads += s.numel * dtype_size(acc_dtype(g));
  }
  switch (cfg.state_tier) {
    case OptimizerConfig::StateTier::host:
      streaming = false;
      break;
    case OptimizerConfig::StateTier::nvme:
      streaming = true;
      break;
    case OptimizerConfig::StateTier::automatic:
      streaming = state + grads > tiers.config().host_budget / 2;
      break;
  }
  // A plan decides per sub-group, by the sub-group's middle element as a fraction of this rank's
  // parameters (so a plan made for another sub-group size or model still applies).
  if (!plan && !cfg.plan_file.empty()) plan = Plan::load(cfg.plan_file);
  gpu_simulated = tiers.device_tier() == DeviceTierMode::simulated;
  device_ptrs = cuda::available();
  std::uint64_t rank_total = 0, pos = 0;
  for (const auto& s : subs) rank_total += s.numel;
  bool any_streaming = false;
  for (auto& s : subs) {
    s.streaming = streaming;
    if (plan) {
      const PlanSubgroup& d =
          plan->at_fraction((static_cast<double>(pos) + static_cast<double>(s.numel) / 2) /
                            static_cast<double>(std::max<std::uint64_t>(rank_total, 1)));
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
    s.memory_only = !cfg.persist_resident_state && !s.streaming;
    any_streaming |= s.streaming;
    pos += s.numel;
  }
  auto tier_of = [](const OptSub& s) {
    return static_cast<int>(s.on_gpu ? Tier::device : Tier::host);
  };
  std::uint64_t per_sub = 0;  // the largest sub-group's state
  for (const auto& s : subs) per_sub = std::max(per_sub, state_block_bytes(s));
  {  // memory-only state is never evicted: it must fit its tier beside the pinned gradients
    std::uint64_t mem[kTierCount] = {}, mem_grads[kTierCount] = {};
    for (const auto& s : subs)
      if (s.memory_only) {
        mem[tier_of(s)] += state_block_bytes(s);
        mem_grads[tier_of(s)] += grad_block_bytes(s);
      }
    const TierConfig& tc = tiers.config();
    const int h = static_cast<int>(Tier::host), d = static_cast<int>(Tier::device);
    // What stays in each memory tier: memory-only state, its pinned gradients (all host-resident
    // gradients on the host), and the slack for slab granularity (TierConfig::slab_slack).
    std::uint64_t held[kTierCount] = {};
    held[h] =
        mem[h] + (cfg.grad_tier == Tier::host ? grads : mem_grads[h]) + tc.slab_slack(Tier::host);
    held[d] = mem[d] + mem_grads[d] + tc.slab_slack(Tier::device);
    if (mem[h] > 0 && held[h] > tc.host_budget)
      throw std::invalid_argument(fmt::format(
          "persist_resident_state=false: {} of memory-only host state and {} of host-resident "
          "gradients do not fit the host budget {} with {} to spare for slab granularity (raise "
          "TierConfig::host_budget, keep resident state persisted, or move sub-groups to NVMe)",
          format_bytes(mem[h]), format_bytes(held[h] - mem[h] - tc.slab_slack(Tier::host)),
          format_bytes(tc.host_budget), format_bytes(tc.slab_slack(Tier::host))));
    if (mem[d] > 0 && held[d] > tc.device_budget)
      throw std::invalid_argument(fmt::format(
          "persist_resident_state=false: {} of memory-only GPU state and its {} of gradients do "
          "not fit the device budget {} with {} to spare for slab granularity (raise "
          "TierConfig::device_budget, keep resident state persisted, or keep fewer sub-groups on "
          "the GPU)",
          format_bytes(mem[d]), format_bytes(mem_grads[d]), format_bytes(tc.device_budget),
          format_bytes(tc.slab_slack(Tier::device))));
    // Overlapped mode: memory-only state steps during the backward where its tier also holds an
    // undo copy of it, the sub-groups final first (the last ones) first; the rest steps after
    // the verdict. The host also keeps the staging of streamed sub-groups (the one stepped, one
    // written behind, the read-ahead).
    if (cfg.overlap && mem[h] + mem[d] > 0) {
      if (any_streaming) held[h] += per_sub * (cfg.prefetch_depth + 2);
      const std::uint64_t budget[kTierCount] = {tc.device_budget, tc.host_budget, 0};
      std::uint64_t left[kTierCount] = {}, undo_bytes[kTierCount] = {};
      std::size_t n_undo[kTierCount] = {}, n_mem[kTierCount] = {};
      bool full[kTierCount] = {};
      for (const int t : {h, d}) left[t] = budget[t] > held[t] ? budget[t] - held[t] : 0;
      for (auto it = subs.rbegin(); it != subs.rend(); ++it) {
        OptSub& s = *it;
        if (!s.memory_only) continue;
        const int t = tier_of(s);
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
  }
  // Gradients from device memory are accumulated in the device tier for GPU-stepped sub-groups
  // only where that tier holds, beside what stays there (memory-only state, its gradients and
  // undo copies, the slab slack), the views a step pins (a sub-group's state and gradient) and,
  // in the overlapped mode, an ingest's gradient at the same time; else they go through host
  // memory (the same bits), rather than a step failing on the device budget.
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
  if (plan && plan->persist_resident_state &&
      *plan->persist_resident_state != cfg.persist_resident_state)
    log(LogLevel::warn,
        fmt::format("plan: it was made for persist_resident_state={} but the optimizer runs with "
                    "{}: its predicted times and NVMe bytes do not apply (set "
                    "persist_resident_state / TIERSWAP_PERSIST_RESIDENT_STATE={}, or make the "
                    "plan {} --persist-resident-state)",
                    *plan->persist_resident_state, cfg.persist_resident_state,
                    *plan->persist_resident_state ? 1 : 0,
                    cfg.persist_resident_state ? "with" : "without"));
  if (plan) {  // a plan made for more host memory than this tier manager's budget
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
  // Read-ahead within the budget: host-resident gradients, the sub-group being stepped, one being
  // written behind, the one the GPU steps meanwhile (a concurrent split step), and `depth` read
  // ahead must fit, or memory pressure would spill gradients and drop prefetched state before
  // its use.
  depth = cfg.prefetch_depth;
  if (any_streaming) {
    const bool split =
        cfg.concurrent_gpu_step &&
        std::any_of(subs.begin(), subs.end(), [](const OptSub& s) { return s.step_gpu; });
    const std::uint64_t per = per_sub;
    const std::uint64_t budget = tiers.config().host_budget;
    const std::uint64_t held = (cfg.grad_tier == Tier::host ? grads : 0) + (split ? 3 : 2) * per;
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
  for (auto& s : subs) {
    const OptGroup& g = groups[s.group];
    const std::string base = fmt::format("g{}.r{}.s{}", s.group, rank, s.index);
    for (int slot = 0; slot < kStateSlots; ++slot) {
      if (!g.has_slot(slot)) continue;
      BlockDesc d;
      d.name = fmt::format("{}.{}", base, to_string(state_class(slot)));
      if (tiers.find(d.name))
        throw std::runtime_error(fmt::format(
            "finalize: the swap space already holds block '{}' (optimizer state of an earlier "
            "run): use a fresh swap directory, and load() a checkpoint to resume",
            d.name));
      d.cls = state_class(slot);
      d.dtype = slot_dtype(slot);
      d.numel = s.numel;
      d.owner = {rank, s.group, s.index};
      d.memory_only = s.memory_only;
      s.state[slot] = tiers.create(d);
      if (s.undo) {
        d.name += ".undo";
        s.undo_block[slot] = tiers.create(d);
      }
    }
    BlockDesc gd;
    gd.name = base + ".grad16";
    gd.cls = BlockClass::grad16;
    gd.dtype = acc_dtype(g);
    gd.numel = s.numel;
    gd.owner = {rank, s.group, s.index};
    gd.transient = true;
    s.grad = tiers.create(gd);
  }
}

void ShardedOptimizer::Impl::gather_param16() {
  if (world == 1) return;
  std::vector<std::size_t> counts(world), displs(world);
  for (auto& g : groups) {
    for (std::uint64_t k = 0; k < g.slots; ++k) {
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

void ShardedOptimizer::Impl::settle(const OptSub& s, BlockId b) {
  if (!s.memory_only || !s.on_gpu) return;
  BlockView v = tiers.acquire(b, Tier::device);
  tiers.release(v, false);
}

void ShardedOptimizer::Impl::p16_begin() {
  for (auto& p : params) p.left = p.nsubs;
  for (auto& s : subs) s.d16_done = false;
}

void ShardedOptimizer::Impl::put16(const OptParam& q, std::uint64_t b, std::uint64_t e) {
  auto* dst = static_cast<std::uint16_t*>(q.d16) + (b - q.offset);
  const std::uint16_t* src = groups[q.group].p16.data() + b;
  if (device_ptrs) {
    cuda::copy_to_device(dst, src, (e - b) * sizeof(std::uint16_t), nullptr);
    p16_pending = true;
  } else {
    std::memcpy(dst, src, (e - b) * sizeof(std::uint16_t));
  }
}

void ShardedOptimizer::Impl::upload16(const OptSub& s) {
  if (s.d16_done) return;
  for (ParamId id : s.pids) {
    const OptParam& q = params[id];
    if (q.d16 == nullptr) continue;
    const auto [b, e] = Impl::slice(q, s);
    put16(q, b, e);
  }
}

void ShardedOptimizer::Impl::upload16_all() {
  for (const OptParam& q : params)
    if (q.d16 != nullptr) put16(q, q.offset, q.offset + q.numel);
}

void ShardedOptimizer::Impl::p16_sync() {
  if (!p16_pending) return;
  p16_pending = false;
  cuda::synchronize(nullptr);
}

void ShardedOptimizer::Impl::p16_done(const OptSub& s) {
  if (world > 1) return;
  upload16(s);
  if (!p16_ready) return;
  for (ParamId id : s.pids) {
    OptParam& p = params[id];
    if (p.left > 0 && --p.left == 0)
      p16_ready(id, {groups[p.group].p16.data() + p.offset, p.numel});
  }
}

void ShardedOptimizer::Impl::p16_all() {
  upload16_all();
  if (!p16_ready) return;
  for (std::size_t id = 0; id < params.size(); ++id) {
    const OptParam& p = params[id];
    if (p.spec.requires_grad)
      p16_ready(static_cast<ParamId>(id), {groups[p.group].p16.data() + p.offset, p.numel});
  }
}

void ShardedOptimizer::Impl::refresh_param16() {
  for (const auto& s : subs) refresh_sub16(s);
  gather_param16();
}

bool ShardedOptimizer::Impl::gradient_done(OptSub& s, const BlockView& grad, Tier tier) {
  if (!final_backward) return false;
  s.sums.assign((s.numel + kGradStatsChunk - 1) / kGradStatsChunk, 0.0);
  chunk_sums(s, grad, tier, s.sums.data());
  return std::all_of(s.sums.begin(), s.sums.end(), [](double v) { return std::isfinite(v); });
}

void ShardedOptimizer::Impl::chunk_sums(const OptSub& s, const BlockView& grad, Tier tier,
                                        double* out) {
  const Dtype dt = acc_dtype(groups[s.group]);
  if (tier != Tier::device || gpu_simulated) {
    grad_chunk_sums(grad.data(), dt, s.numel, out, ctx());
    return;
  }
  const std::size_t bytes = (s.numel + kGradStatsChunk - 1) / kGradStatsChunk * sizeof(double);
  auto* d = static_cast<double*>(gpu_sums.reserve(bytes));
  cuda::grad_chunk_sums(grad.data(), dt, s.numel, d, nullptr);
  cuda::copy_to_host(out, d, bytes, nullptr);
  cuda::synchronize(nullptr);
}

template <class Add>
void ShardedOptimizer::Impl::ingest(OptSub& s, Tier tier, Access access, Add&& add) {
  spec_touch(s);
  bool final = false;
  {
    Held v(tiers, tiers.acquire(s.grad, tier, access));
    add(v.v.data());
    v.dirty = true;
    s.grad_zero = false;
    s.sums.clear();
    if (++s.seen == s.nparams) final = gradient_done(s, v.v, tier);
  }
  if (s.seen == s.nparams) after_ingest(s, final);
}

void ShardedOptimizer::Impl::drop_grad(OptSub& s) {
  tiers.trim(s.grad);
  s.sums.clear();
  std::fill(s.slice_written.begin(), s.slice_written.end(), 0);
  s.grad_zero = true;
}

const OptParam& ShardedOptimizer::Impl::grad_param(const char* what, ParamId id,
                                                   const void* grad) const {
  require_finalized(what);
  if (!in_backward) throw std::logic_error(fmt::format("{}: call begin_backward() first", what));
  if (id >= params.size())
    throw std::invalid_argument(fmt::format("{}: no parameter {}", what, id));
  const OptParam& p = params[id];
  if (!p.spec.requires_grad)
    throw std::invalid_argument(
        fmt::format("{}: parameter '{}' is frozen (requires_grad=false)", what, p.spec.name));
  if (grad == nullptr)
    throw std::invalid_argument(fmt::format("{} '{}': null gradient", what, p.spec.name));
  return p;
}

void ShardedOptimizer::Impl::after_ingest(OptSub& s, bool final) {
  // Memory-only state without an undo copy steps after the verdict.
  if (final && cfg.overlap && (!s.memory_only || s.undo)) {
    std::unique_lock lk(spec_mu);
    if (!spec_invalid && !spec_error) {
      if (!cfg.overlap_param16_in_place) s.spec16.resize(s.numel);
      s.spec = OptSub::Spec::queued;
      spec_queue.push_back(static_cast<std::size_t>(&s - subs.data()));
      const bool soon = spec_queue.size() <= depth + 1;
      lk.unlock();
      spec_cv.notify_one();
      if (soon && s.streaming)  // read its state while the queue ahead of it is stepped
        for (BlockId b : s.state)
          if (b != kNoBlock) tiers.prefetch(b, Tier::host);
      return;  // the speculative step spills the gradient when grad_tier is nvme
    }
  }
  if (cfg.grad_tier == Tier::nvme && !s.grad_gpu) tiers.evict(s.grad, Tier::host);
}

void ShardedOptimizer::Impl::gpu_step(OptSub& s, const GroupConfig& gc, const GradView& grad,
                                      void* const* ptr, std::uint64_t t, std::uint16_t* p16,
                                      bool speculative) {
  const OptGroup& g = groups[s.group];
  const std::size_t bytes16 = s.numel * sizeof(std::uint16_t);
  void* const d16 = gpu_p16.reserve(bytes16);
  const Param16View out{d16, g.dtype16};
  auto* p = static_cast<float*>(ptr[kMaster]);
  switch (gc.kind) {
    case OptimizerKind::adamw:
    case OptimizerKind::adam: {
      AdamState a;
      a.param = p;
      a.exp_avg = ptr[kExpAvg];
      a.exp_avg_sq = ptr[kExpAvgSq];
      a.max_exp_avg_sq = ptr[kMaxExpAvgSq];
      a.moment_dtype = moment_dtype();
      cuda::adam_step(adam_config(gc), static_cast<std::int64_t>(t), a, grad, out, s.numel,
                      nullptr);
      break;
    }
    case OptimizerKind::lion:
      cuda::lion_step(lion_config(gc), p, ptr[kExpAvg], moment_dtype(), grad, out, s.numel,
                      nullptr);
      break;
    case OptimizerKind::sgd:
      cuda::sgd_step(sgd_config(gc), t == 1, p, static_cast<float*>(ptr[kMomentum]), grad, out,
                     s.numel, nullptr);
      break;
  }
  cuda::copy_to_host(p16, d16, bytes16, nullptr);  // stream-ordered after the kernel
  // The final output (not a speculative one) at world size 1: bound device copies take it from
  // the kernel's output, device to device (at world size > 1 they follow the all-gather).
  if (world == 1 && !speculative) {
    for (ParamId id : s.pids) {
      const OptParam& q = params[id];
      if (q.d16 == nullptr) continue;
      const auto [b, e] = Impl::slice(q, s);
      cuda::copy_on_device(static_cast<std::uint16_t*>(q.d16) + (b - q.offset),
                           static_cast<const std::uint16_t*>(d16) + (b - s.begin),
                           (e - b) * sizeof(std::uint16_t), nullptr);
    }
    s.d16_done = true;
  }
  cuda::synchronize(nullptr);
}

void ShardedOptimizer::Impl::step_sub(OptSub& s, const GroupConfig& gc, float multiplier,
                                      std::uint64_t t, std::uint16_t* p16, bool* wrote16,
                                      bool speculative) {
  const OptGroup& g = groups[s.group];
  // Where the state is read and written: host memory, or GPU memory for GPU-resident state. A GPU
  // step of host-resident state (a plan's choice on a coherent link) works on it in place.
  const Tier tier = s.on_gpu ? Tier::device : Tier::host;
  {
    std::optional<Held> st[kStateSlots];
    void* ptr[kStateSlots] = {};
    for (int slot = 0; slot < kStateSlots; ++slot) {
      if (s.state[slot] == kNoBlock) continue;
      st[slot].emplace(tiers, tiers.acquire(s.state[slot], tier, Access::write));
      ptr[slot] = st[slot]->v.data();
    }
    Held gv(tiers, tiers.acquire(s.grad, grad_tier_of(s)));
    const GradView gview{gv.v.data(), acc_dtype(g), multiplier};
    const Param16View out{p16, g.dtype16};
    auto* p = static_cast<float*>(ptr[kMaster]);
    if (wrote16) *wrote16 = true;
    // A simulated GPU is a processor of its own: one thread, not the CPU's workers (the same
    // bits for any thread count), so a split step's two parts do not share them.
    CpuKernelContext kc = ctx();
    if (s.step_gpu) kc.pool = nullptr;
    if (s.step_gpu && !gpu_simulated)
      gpu_step(s, gc, gview, ptr, t, p16, speculative);
    else
      switch (gc.kind) {
        case OptimizerKind::adamw:
        case OptimizerKind::adam: {
          AdamState a;
          a.param = p;
          a.exp_avg = ptr[kExpAvg];
          a.exp_avg_sq = ptr[kExpAvgSq];
          a.max_exp_avg_sq = ptr[kMaxExpAvgSq];
          a.moment_dtype = moment_dtype();
          adam_step(adam_config(gc), static_cast<std::int64_t>(t), a, gview, out, s.numel, kc);
          break;
        }
        case OptimizerKind::lion:
          lion_step(lion_config(gc), p, ptr[kExpAvg], moment_dtype(), gview, out, s.numel, kc);
          break;
        case OptimizerKind::sgd:
          sgd_step(sgd_config(gc), t == 1, p, static_cast<float*>(ptr[kMomentum]), gview, out,
                   s.numel, kc);
          break;
      }
    for (auto& h : st)
      if (h) h->dirty = true;
  }
  if (s.streaming)
    for (BlockId b : s.state)
      if (b != kNoBlock) tiers.write_back(b);
}

ShardedOptimizer::Impl::~Impl() {
  for (void* p : p16_registered) cuda::host_unregister(p);
  if (!spec_thread.joinable()) return;
  {
    std::lock_guard lk(spec_mu);
    spec_stop = true;
  }
  spec_cv.notify_all();
  spec_thread.join();
}

void ShardedOptimizer::Impl::spec_loop() {
  std::unique_lock lk(spec_mu);
  for (;;) {
    spec_cv.wait(lk, [&] { return spec_stop || !spec_queue.empty(); });
    if (spec_stop) return;
    const std::size_t k = spec_queue.front();
    spec_queue.pop_front();
    spec_busy = true;
    const bool skip = spec_error != nullptr || spec_invalid;
    // Read ahead for the sub-groups queued behind this one.
    std::vector<std::size_t> next(
        spec_queue.begin(), spec_queue.begin() + std::min<std::size_t>(spec_queue.size(), depth));
    lk.unlock();
    std::exception_ptr err;
    OptSub& s = subs[k];
    if (!skip) {
      try {
        for (std::size_t j : next)
          if (subs[j].streaming)
            for (BlockId b : subs[j].state)
              if (b != kNoBlock) tiers.prefetch(b, Tier::host);
        if (s.undo) undo_save(s);
        step_sub(s, spec_cfgs[s.group], spec_mult, spec_t, spec_out16(s), nullptr, true);
        if (cfg.grad_tier == Tier::nvme && !s.grad_gpu) tiers.evict(s.grad, Tier::host);
      } catch (...) {
        err = std::current_exception();
      }
    }
    lk.lock();
    s.spec = skip || err ? OptSub::Spec::none : OptSub::Spec::stepped;
    if (err && !spec_error) spec_error = err;
    spec_busy = false;
    if (spec_queue.empty()) spec_idle_cv.notify_all();
  }
}

void ShardedOptimizer::Impl::spec_drain() {
  std::unique_lock lk(spec_mu);
  spec_idle_cv.wait(lk, [&] { return spec_queue.empty() && !spec_busy; });
}

void ShardedOptimizer::Impl::spec_touch(OptSub& s) {
  if (!cfg.overlap) return;
  {
    std::lock_guard lk(spec_mu);
    if (s.spec == OptSub::Spec::none) return;
  }
  spec_drain();  // the worker must be done with its gradient before it changes
  std::lock_guard lk(spec_mu);
  spec_invalid = true;
}

bool ShardedOptimizer::Impl::spec_pending() {
  std::lock_guard lk(spec_mu);
  return std::any_of(subs.begin(), subs.end(),
                     [](const OptSub& s) { return s.spec != OptSub::Spec::none; });
}

// Copies block `from` into block `to` (same size) in the sub-group's memory tier: host memory,
// or GPU memory (a device-to-device copy; host memory standing in on a simulated device tier).
void ShardedOptimizer::Impl::undo_copy(const OptSub& s, BlockId from, BlockId to) {
  const Tier tier = s.on_gpu ? Tier::device : Tier::host;
  Held src(tiers, tiers.acquire(from, tier));
  Held dst(tiers, tiers.acquire(to, tier, Access::write));
  if (tier == Tier::device && !gpu_simulated) {
    cuda::copy_on_device(dst.v.data(), src.v.data(), src.v.bytes(), nullptr);
    cuda::synchronize(nullptr);
  } else {
    std::memcpy(dst.v.data(), src.v.data(), src.v.bytes());
  }
  dst.dirty = true;
}

void ShardedOptimizer::Impl::undo_save(OptSub& s) {
  for (int slot = 0; slot < kStateSlots; ++slot)
    if (s.state[slot] != kNoBlock) undo_copy(s, s.state[slot], s.undo_block[slot]);
  s.undo_saved = true;
}

void ShardedOptimizer::Impl::undo_restore() {
  for (auto& s : subs) {
    if (!s.undo_saved) continue;
    for (int slot = 0; slot < kStateSlots; ++slot)
      if (s.state[slot] != kNoBlock) undo_copy(s, s.undo_block[slot], s.state[slot]);
    s.undo_saved = false;
  }
}

std::uint16_t* ShardedOptimizer::Impl::spec_out16(OptSub& s) {
  return cfg.overlap_param16_in_place ? groups[s.group].p16.data() + s.begin : s.spec16.data();
}

void ShardedOptimizer::Impl::refresh_sub16(const OptSub& s) {
  OptGroup& g = groups[s.group];
  {
    Held m(tiers, tiers.acquire(s.state[kMaster], Tier::host));
    cast(m.v.data(), Dtype::f32, g.p16.data() + s.begin, g.dtype16, s.numel, ctx());
  }
  if (s.streaming) tiers.write_back(s.state[kMaster]);  // the first copy to go
}

void ShardedOptimizer::Impl::spec_discard() {
  undo_restore();
  tiers.discard();
  if (cfg.overlap_param16_in_place) {
    std::vector<const OptSub*> stepped;
    {
      std::lock_guard lk(spec_mu);
      for (const auto& s : subs)
        if (s.spec == OptSub::Spec::stepped) stepped.push_back(&s);
    }
    for (const OptSub* s : stepped) refresh_sub16(*s);
  }
  spec_reset();
}

void ShardedOptimizer::Impl::spec_reset() {
  std::lock_guard lk(spec_mu);
  for (auto& s : subs) {
    s.spec = OptSub::Spec::none;
    s.undo_saved = false;  // restored (undo_restore) or kept: either way no longer needed
  }
  spec_invalid = false;
  spec_error = nullptr;
}

// Reduce-scatters group g's local gradient, slot by slot, into this rank's gradient blocks.
void ShardedOptimizer::Impl::reduce_local(OptGroup& g) {
  if (!g.local_dirty) return;
  const Dtype dt = acc_dtype(g);
  const std::size_t es = dtype_size(dt);
  std::vector<std::size_t> counts(world);
  std::vector<std::byte> send, recv;
  for (std::uint64_t k = 0; k < g.slots; ++k) {
    std::size_t total = 0;
    for (int r = 0; r < world; ++r) total += counts[r] = piece(g, r, k).second;
    if (total == 0) continue;
    send.resize(total * es);
    std::size_t off = 0;
    for (int r = 0; r < world; ++r) {
      const auto [b, n] = piece(g, r, k);
      std::memcpy(send.data() + off * es, g.local_grad.data() + b * es, n * es);
      off += n;
    }
    recv.resize(std::max<std::size_t>(1, counts[rank]) * es);
    comm.reduce_scatter(send.data(), recv.data(), counts, dt);
    if (counts[rank] == 0) continue;
    OptSub& s = subs[g.first_sub + k];
    spec_touch(s);
    bool final = false;
    {
      // The first reduction since the drop lands on zeros: taken as it is.
      const bool fresh = s.grad_zero;
      Held v(tiers, tiers.acquire(s.grad, Tier::host, fresh ? Access::overwrite : Access::write));
      if (fresh)
        std::memcpy(v.v.data(), recv.data(), s.numel * es);
      else
        accumulate(v.v.data(), dt, recv.data(), dt, s.numel, ctx());
      v.dirty = true;
      s.grad_zero = false;
      s.sums.clear();
      final = gradient_done(s, v.v);
    }
    after_ingest(s, final);
  }
  std::memset(g.local_grad.data(), 0, g.local_grad.size());
  g.local_dirty = false;
}

// ---- ShardedOptimizer --------------------------------------------------------------------------
ShardedOptimizer::ShardedOptimizer(TierManager& tiers, Communicator& comm, OptimizerConfig cfg,
                                   ThreadPool* pool)
    : impl_(std::make_unique<Impl>(tiers, comm, std::move(cfg), pool)) {}

ShardedOptimizer::~ShardedOptimizer() = default;

int ShardedOptimizer::add_group(const GroupConfig& cfg, std::string name) {
  Impl& m = *impl_;
  if (m.finalized) throw std::logic_error("add_group: the optimizer is finalized");
  cfg.validate();
  OptGroup g;
  g.cfg = cfg;
  g.name = name.empty() ? fmt::format("group{}", m.groups.size()) : std::move(name);
  m.groups.push_back(std::move(g));
  return static_cast<int>(m.groups.size() - 1);
}

ParamId ShardedOptimizer::add_param(int group, const ParamSpec& spec) {
  Impl& m = *impl_;
  if (m.finalized) throw std::logic_error("add_param: the optimizer is finalized");
  if (group < 0 || group >= static_cast<int>(m.groups.size()))
    throw std::invalid_argument(fmt::format("add_param '{}': no group {}", spec.name, group));
  if (spec.name.empty()) throw std::invalid_argument("add_param: empty parameter name");
  if (spec.dtype == Dtype::f32)
    throw std::invalid_argument(fmt::format(
        "add_param '{}': dtype must be bf16 or f16 (the model's 16-bit copy)", spec.name));
  for (const auto& p : m.params)
    if (p.spec.name == spec.name)
      throw std::invalid_argument(
          fmt::format("add_param '{}': a parameter of that name exists", spec.name));
  OptGroup& g = m.groups[group];
  if (spec.requires_grad) {
    if (g.has_dtype && g.dtype16 != spec.dtype)
      throw std::invalid_argument(fmt::format(
          "add_param '{}': dtype {} but group '{}' holds {} parameters (one dtype per group)",
          spec.name, to_string(spec.dtype), g.name, to_string(g.dtype16)));
    g.dtype16 = spec.dtype;
    g.has_dtype = true;
  }
  OptParam p;
  p.spec = spec;
  p.group = group;
  p.numel = spec.numel();
  m.params.push_back(std::move(p));
  const auto id = static_cast<ParamId>(m.params.size() - 1);
  g.params.push_back(id);
  return id;
}

void ShardedOptimizer::finalize() {
  Impl& m = *impl_;
  if (m.finalized) throw std::logic_error("finalize: already finalized");
  if (m.cfg.overlap && !m.tiers.config().shadow_slots)
    throw std::invalid_argument(
        "overlap: the overlapped step needs shadow slots to discard a speculative step "
        "(TierConfig::shadow_slots is off)");
  const int node = m.tiers.config().numa_node;
  if (node >= 0 && (!m.pool || m.pool->numa_node() != node))
    log(LogLevel::warn,
        fmt::format("finalize: the host slabs are bound to NUMA node {} but the step's workers are "
                    "not (pass a ThreadPool(threads, {}) to the optimizer)",
                    node, node));
  m.layout();
  m.create_blocks();
  if (cuda::available())  // copies of the 16-bit parameters to the GPU go straight from here
    for (auto& g : m.groups) {
      if (g.p16.empty()) continue;
      if (cuda::host_register(g.p16.data(), g.p16.size() * sizeof(std::uint16_t)))
        m.p16_registered.push_back(g.p16.data());
      else
        log(LogLevel::info, fmt::format("finalize: could not page-lock the 16-bit parameters of "
                                        "group '{}'; copies to the GPU will be staged",
                                        g.name));
    }
  m.finalized = true;
}

void ShardedOptimizer::on_param16_ready(Param16Ready fn) {
  impl_->p16_ready = std::move(fn);
}

void ShardedOptimizer::bind_param16_device(ParamId id, void* d_param16) {
  Impl& m = *impl_;
  m.require_finalized("bind_param16_device");
  if (id >= m.params.size())
    throw std::invalid_argument(fmt::format("bind_param16_device: no parameter {}", id));
  OptParam& p = m.params[id];
  if (!p.spec.requires_grad)
    throw std::invalid_argument(fmt::format(
        "bind_param16_device: parameter '{}' is frozen (its 16-bit values are the trainer's)",
        p.spec.name));
  if (d_param16 != nullptr && !m.device_ptrs && !m.gpu_simulated)
    throw std::runtime_error(
        fmt::format("bind_param16_device '{}': no usable GPU ({}) and no simulated device tier",
                    p.spec.name, device_info().reason));
  p.d16 = d_param16;
  if (d_param16 == nullptr) return;
  m.put16(p, p.offset, p.offset + p.numel);
  m.p16_sync();
}

void ShardedOptimizer::set_plan(const Plan& plan) {
  Impl& m = *impl_;
  if (m.finalized) throw std::logic_error("set_plan: the optimizer is finalized");
  if (plan.subgroups.empty()) throw std::invalid_argument("set_plan: the plan has no sub-groups");
  m.plan = plan;
}

bool ShardedOptimizer::gradient_on_device(std::size_t k) const {
  const Impl& m = *impl_;
  m.require_finalized("gradient_on_device");
  if (k >= m.subs.size())
    throw std::invalid_argument(fmt::format("gradient_on_device: no sub-group {}", k));
  return m.subs[k].grad_gpu;
}

std::pair<Tier, bool> ShardedOptimizer::placement(std::size_t k) const {
  const Impl& m = *impl_;
  m.require_finalized("placement");
  if (k >= m.subs.size()) throw std::invalid_argument(fmt::format("placement: no sub-group {}", k));
  const OptSub& s = m.subs[k];
  return {s.on_gpu ? Tier::device : s.streaming ? Tier::nvme : Tier::host, s.step_gpu};
}

bool ShardedOptimizer::finalized() const noexcept {
  return impl_->finalized;
}

void ShardedOptimizer::initialize(const ParamInit& init) {
  Impl& m = *impl_;
  m.require_finalized("initialize");
  if (!init) throw std::invalid_argument("initialize: no initializer");
  const bool in_place = !m.tiers.config().shadow_slots;
  for (auto& s : m.subs) {
    OptGroup& g = m.groups[s.group];
    {
      Held v(m.tiers, m.tiers.acquire(s.state[kMaster], Tier::host, Access::overwrite));
      auto* out = reinterpret_cast<float*>(v.v.data());
      for (ParamId id : g.params) {
        const OptParam& p = m.params[id];
        if (!p.spec.requires_grad) continue;
        const auto [b, e] = Impl::slice(p, s);
        if (b < e) init(id, b - p.offset, out + (b - s.begin), e - b);
      }
      cast(out, Dtype::f32, g.p16.data() + s.begin, g.dtype16, s.numel, m.ctx());
      v.dirty = true;
    }
    if (s.streaming) m.tiers.write_back(s.state[kMaster]);
    m.settle(s, s.state[kMaster]);
    for (int slot = kExpAvg; slot < kStateSlots; ++slot) {
      if (s.state[slot] == kNoBlock) continue;
      if (!in_place) {
        m.tiers.trim(s.state[slot]);  // zeros, without writing them
        continue;
      }
      {
        Held v(m.tiers, m.tiers.acquire(s.state[slot], Tier::host, Access::overwrite));
        std::memset(v.v.data(), 0, v.v.bytes());
        v.dirty = true;
      }
      m.settle(s, s.state[slot]);
    }
    m.drop_grad(s);
  }
  m.gather_param16();
  m.upload16_all();
  m.p16_sync();
  m.step_count = 0;
  m.scale = m.cfg.loss_scaler.mode != LossScaling::none ? m.cfg.loss_scaler.init_scale : 1.0;
  m.growth_tracker = 0;
  m.tiers.commit();
}

int ShardedOptimizer::group_count() const {
  return static_cast<int>(impl_->groups.size());
}

const GroupConfig& ShardedOptimizer::group_config(int group) const {
  if (group < 0 || group >= group_count())
    throw std::invalid_argument(fmt::format("group {}: no such group", group));
  return impl_->groups[group].cfg;
}

void ShardedOptimizer::set_group_config(int group, const GroupConfig& cfg) {
  Impl& m = *impl_;
  if (group < 0 || group >= group_count())
    throw std::invalid_argument(fmt::format("group {}: no such group", group));
  cfg.validate();
  OptGroup& g = m.groups[group];
  if (m.finalized) {
    OptGroup probe = g;
    probe.cfg = cfg;
    for (int slot = 0; slot < kStateSlots; ++slot)
      if (probe.has_slot(slot) != g.has_slot(slot) || cfg.kind != g.cfg.kind)
        throw std::invalid_argument(fmt::format(
            "group '{}': kind, amsgrad and SGD momentum (on/off) are fixed at finalize()", g.name));
  }
  g.cfg = cfg;
}

void ShardedOptimizer::set_lr(int group, double lr) {
  GroupConfig c = group_config(group);
  c.lr = lr;
  set_group_config(group, c);
}

void ShardedOptimizer::begin_backward(bool final) {
  Impl& m = *impl_;
  m.require_finalized("begin_backward");
  if (m.in_backward) throw std::logic_error("begin_backward: the previous backward has not ended");
  m.in_backward = true;
  m.final_backward = final;
  for (auto& s : m.subs) s.seen = 0;
  if (!m.cfg.overlap || !final) return;
  // What a speculative step uses; if results from an earlier final backward are pending, they
  // stay valid only while all of it is unchanged.
  std::vector<GroupConfig> cfgs;
  for (const auto& g : m.groups) cfgs.push_back(g.cfg);
  const auto mult = static_cast<float>(1.0 / m.scale);
  const std::uint64_t t = m.step_count + 1;
  if (m.spec_pending()) {
    if (cfgs != m.spec_cfgs || mult != m.spec_mult || t != m.spec_t) {
      std::lock_guard lk(m.spec_mu);
      m.spec_invalid = true;
    }
    return;
  }
  m.spec_cfgs = std::move(cfgs);
  m.spec_mult = mult;
  m.spec_t = t;
  if (!m.spec_thread.joinable()) m.spec_thread = std::thread([&m] { m.spec_loop(); });
}

void ShardedOptimizer::add_grad(ParamId id, const void* grad, Dtype dtype) {
  Impl& m = *impl_;
  const OptParam& p = m.grad_param("add_grad", id, grad);
  OptGroup& g = m.groups[p.group];
  const Dtype acc = m.acc_dtype(g);
  const std::size_t in_es = dtype_size(dtype), acc_es = dtype_size(acc);
  if (m.world > 1) {
    accumulate(g.local_grad.data() + p.offset * acc_es, acc, grad, dtype, p.numel, m.ctx());
    g.local_dirty = true;
    return;
  }
  for (std::size_t k = 0; k < g.nsubs; ++k) {
    OptSub& s = m.subs[g.first_sub + k];
    const auto [b, e] = Impl::slice(p, s);
    if (b >= e) continue;
    // A slice's first gradient since the drop lands on zeros: copied (cast), not added; over
    // the whole block, without zero-filling it first.
    char& written = s.slice_written[s.slice_of(id)];
    const bool whole = b == s.begin && e == s.begin + s.numel;
    const Access access = !written && whole ? Access::overwrite : Access::write;
    // Host memory goes to the gradient's host copy (the tier manager moves it up for a GPU step).
    m.ingest(s, Tier::host, access, [&](std::byte* v) {
      std::byte* dst = v + (b - s.begin) * acc_es;
      const auto* src = static_cast<const std::byte*>(grad) + (b - p.offset) * in_es;
      if (written)
        accumulate(dst, acc, src, dtype, e - b, m.ctx());
      else
        cast(src, dtype, dst, acc, e - b, m.ctx());
    });
    written = 1;
  }
}

void ShardedOptimizer::add_grad_device(ParamId id, const void* d_grad, Dtype dtype,
                                       std::span<void* const> events) {
  Impl& m = *impl_;
  const OptParam& p = m.grad_param("add_grad_device", id, d_grad);
  const bool gpu = m.device_ptrs;
  if (!gpu && !m.gpu_simulated)
    throw std::runtime_error(fmt::format(
        "add_grad_device '{}': no usable GPU ({}); add_grad takes gradients in host memory",
        p.spec.name, device_info().reason));
  if (!gpu && !events.empty())
    throw std::invalid_argument(fmt::format(
        "add_grad_device '{}': {} event(s) given but no GPU is usable (on a simulated device "
        "tier d_grad is host memory standing in for the GPU's, and there are no events)",
        p.spec.name, events.size()));
  for (void* e : events) {
    if (e == nullptr)
      throw std::invalid_argument(fmt::format("add_grad_device '{}': a null event", p.spec.name));
    cuda::stream_wait_event(nullptr, e);  // every producing stream, without blocking the host
  }
  const auto* src = static_cast<const std::byte*>(d_grad);
  const std::size_t in_es = dtype_size(dtype);
  // A slice of device memory in host memory (a real GPU): copied into page-locked staging.
  auto to_host = [&](std::uint64_t off, std::uint64_t n) -> const std::byte* {
    if (!gpu) return src + off * in_es;  // the simulated device's memory is host memory
    std::byte* dst = m.grad_staging.reserve(n * in_es);
    cuda::copy_to_host(dst, src + off * in_es, n * in_es, nullptr);
    cuda::synchronize(nullptr);
    return dst;
  };
  OptGroup& g = m.groups[p.group];
  if (m.world > 1) {  // the reduction runs in host memory
    add_grad(id, to_host(0, p.numel), dtype);
    return;
  }
  const Dtype acc = m.acc_dtype(g);
  const std::size_t acc_es = dtype_size(acc);
  for (std::size_t k = 0; k < g.nsubs; ++k) {
    OptSub& s = m.subs[g.first_sub + k];
    const auto [b, e] = Impl::slice(p, s);
    if (b >= e) continue;
    const std::size_t at = (b - s.begin) * acc_es;
    const Tier tier = s.grad_gpu ? Tier::device : Tier::host;  // where it accumulates
    if (tier == Tier::device && gpu && !m.gpu_simulated) {
      // A sub-group the GPU steps: its gradient is accumulated where it is stepped (never
      // down to the host and back up).
      m.ingest(s, Tier::device, Access::write, [&](std::byte* v) {
        cuda::accumulate(v + at, acc, src + (b - p.offset) * in_es, dtype, e - b, nullptr);
        cuda::synchronize(nullptr);  // before the view goes: the tier manager may copy it
      });
    } else {
      const std::byte* host = to_host(b - p.offset, e - b);
      m.ingest(s, tier, Access::write,
               [&](std::byte* v) { accumulate(v + at, acc, host, dtype, e - b, m.ctx()); });
    }
    s.slice_written[s.slice_of(id)] = 1;  // added to: a later add_grad must add, not copy
  }
}

void ShardedOptimizer::add_grad_bucket(ParamId first, std::size_t count, const void* grad,
                                       Dtype dtype) {
  Impl& m = *impl_;
  if (first + count > m.params.size() || count == 0)
    throw std::invalid_argument(
        fmt::format("add_grad_bucket: parameters {}..{} do not exist", first, first + count));
  const int group = m.params[first].group;
  std::uint64_t off = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const OptParam& p = m.params[first + i];
    if (p.group != group || !p.spec.requires_grad)
      throw std::invalid_argument(fmt::format(
          "add_grad_bucket: parameter '{}' is {} (a bucket holds trainable parameters of one "
          "group)",
          p.spec.name, p.spec.requires_grad ? "in another group" : "frozen"));
    add_grad(first + static_cast<ParamId>(i),
             static_cast<const std::byte*>(grad) + off * dtype_size(dtype), dtype);
    off += p.numel;
  }
}

void ShardedOptimizer::end_backward() {
  Impl& m = *impl_;
  if (!m.in_backward) throw std::logic_error("end_backward: no backward in progress");
  m.in_backward = false;
  if (m.world > 1 && (!m.cfg.coalesce || m.final_backward))
    for (auto& g : m.groups) m.reduce_local(g);
}

bool ShardedOptimizer::gradient_final(std::size_t k) const {
  if (k >= impl_->subs.size())
    throw std::invalid_argument(fmt::format("gradient_final: no sub-group {}", k));
  return !impl_->subs[k].sums.empty();  // taken when its final gradient was complete
}

double ShardedOptimizer::loss_scale() const {
  return impl_->scale;
}

std::uint64_t ShardedOptimizer::step_count() const {
  return impl_->step_count;
}

template <class Step, class After>
void ShardedOptimizer::Impl::run_steps(const std::vector<std::size_t>& ks, Step&& step,
                                       After&& after, bool* wrote16, StepResult& r) {
  auto on_gpu = [&](std::size_t k) { return subs[k].step_gpu; };
  const auto n_gpu = static_cast<std::size_t>(std::count_if(ks.begin(), ks.end(), on_gpu));
  r.gpu_subgroups += static_cast<std::uint32_t>(n_gpu);
  // A split (both kinds): the GPU's on the lane, the rest here; else all here, in order.
  const bool split = cfg.concurrent_gpu_step && n_gpu > 0 && n_gpu < ks.size();
  std::vector<std::size_t> lane_ks, here;
  for (std::size_t k : ks) (split && on_gpu(k) ? lane_ks : here).push_back(k);
  std::optional<GpuLane> lane;
  if (split) {
    if (wrote16 != nullptr) *wrote16 = true;  // the lane's writes are not tracked one by one
    lane.emplace(std::move(lane_ks), [&](std::size_t k) { step(k, nullptr); });
  }
  auto prefetch = [&](std::size_t i) {  // streamed state, read ahead of its step
    if (i >= here.size() || !subs[here[i]].streaming) return;
    for (BlockId b : subs[here[i]].state)
      if (b != kNoBlock) tiers.prefetch(b, Tier::host);
  };
  for (std::size_t i = 0; i < std::min<std::size_t>(here.size(), depth + 1); ++i) prefetch(i);
  auto drain = [&](bool wait) {
    const auto ks_done = lane->take(wait);
    for (std::size_t k : ks_done) after(k);
    return !ks_done.empty();
  };
  for (std::size_t i = 0; i < here.size(); ++i) {
    prefetch(i + depth + 1);
    const std::size_t k = here[i];
    const auto t0 = Clock::now();
    step(k, wrote16);
    if (on_gpu(k)) r.gpu_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    after(k);
    if (lane) {
      drain(false);
      if (lane->failed()) break;  // finish() below rethrows it
    }
  }
  if (!lane) return;
  while (drain(true)) {
  }
  r.gpu_seconds += lane->finish();
}

StepResult ShardedOptimizer::step() {
  Impl& m = *impl_;
  m.require_finalized("step");
  if (m.in_backward) throw std::logic_error("step: end_backward() first");
  const auto t0 = Clock::now();
  const TierCounters c0 = m.tiers.counters();
  if (m.world > 1)
    for (auto& g : m.groups) m.reduce_local(g);  // whatever was not reduced yet

  // Overlapped mode: the speculative steps finish first (they overlap the statistics below).
  std::exception_ptr spec_error;
  bool spec_any = false, spec_keep = false;
  if (m.cfg.overlap) {
    m.spec_drain();
    std::lock_guard lk(m.spec_mu);
    spec_error = m.spec_error;
    for (const auto& s : m.subs) spec_any |= s.spec == OptSub::Spec::stepped;
    spec_keep = spec_any && !m.spec_invalid && !spec_error;
  }
  // A failed step leaves the state as it was before the backward and drops the gradients.
  auto drop_gradients = [&] {
    for (auto& s : m.subs) m.drop_grad(s);
  };
  if (spec_error) {
    m.spec_discard();
    drop_gradients();
    std::rethrow_exception(spec_error);
  }

  // Validation: chunk sums of the 16-bit gradient, gathered so every rank adds the same numbers
  // in the same order (the norm is the same for every world size and thread count).
  std::vector<double> chunk(m.chunks, 0.0);
  for (auto& s : m.subs) {
    const OptGroup& g = m.groups[s.group];
    double* out = chunk.data() + g.chunk_base + s.begin / kGradStatsChunk;
    if (!s.sums.empty()) {  // taken at ingest
      std::copy(s.sums.begin(), s.sums.end(), out);
      continue;
    }
    const Tier tier = m.grad_tier_of(s);
    Held v(m.tiers, m.tiers.acquire(s.grad, tier));
    m.chunk_sums(s, v.v, tier, out);
  }
  if (m.world > 1) m.comm.all_reduce_sum(chunk.data(), chunk.size());
  double sum_sq = 0;
  bool nonfinite = false;
  for (double c : chunk) {
    sum_sq += c;
    nonfinite |= !std::isfinite(c);
  }

  StepResult r;
  r.loss_scale = m.scale;
  const double inv = 1.0 / m.scale;
  r.grad_norm = std::sqrt(sum_sq) * inv;
  const auto& ls = m.cfg.loss_scaler;
  auto finish = [&] {
    drop_gradients();
    const TierCounters c1 = m.tiers.counters();
    for (int t = 0; t < kTierCount; ++t) {
      r.bytes_in[t] = c1.bytes_in[t] - c0.bytes_in[t];
      r.bytes_out[t] = c1.bytes_out[t] - c0.bytes_out[t];
    }
    r.io_wait_seconds = c1.stall_seconds - c0.stall_seconds;
    r.step = m.step_count;
    r.next_loss_scale = m.scale;
    r.generation = m.tiers.committed_generation();
    r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  };
  if (nonfinite) {
    r.skipped = true;
    if (spec_any) {  // the speculative generation goes; the committed one is bit for bit intact
      m.spec_discard();
    }
    if (ls.mode == LossScaling::dynamic) {
      m.scale *= ls.backoff_factor;
      m.growth_tracker = 0;
    }
    finish();
    return r;
  }
  if (m.cfg.max_grad_norm > 0) {
    const double c = m.cfg.max_grad_norm / (r.grad_norm + 1e-6);
    if (c < 1) r.clip_factor = c;
  }
  const auto multiplier = static_cast<float>(inv * r.clip_factor);
  const std::uint64_t t = m.step_count + 1;
  if (spec_keep) {
    std::vector<GroupConfig> cfgs;
    for (const auto& g : m.groups) cfgs.push_back(g.cfg);
    spec_keep = multiplier == m.spec_mult && t == m.spec_t && cfgs == m.spec_cfgs;
  }
  if (spec_any && !spec_keep) {  // clipping (or a change) discovered late: discard and redo
    m.spec_discard();
    r.redone = true;
  }
  // The sub-groups still to step (all of them, except those kept from the overlapped backward).
  // Memory-only sub-groups (`late`) step after the commit, from gradients pinned before it
  // (except those kept from the overlapped backward: their undo copies restore them on failure).
  std::vector<std::size_t> todo, late;
  for (std::size_t k = 0; k < m.subs.size(); ++k)
    if (!spec_keep || m.subs[k].spec != OptSub::Spec::stepped)
      (m.subs[k].memory_only ? late : todo).push_back(k);
  // Read (if spilled) and pinned before the commit, so nothing after it does I/O; a view
  // destroyed unreleased is released clean.
  std::vector<BlockView> late_grads;

  // The pipeline: prefetch ahead, step, write behind (the GPU's sub-groups meanwhile, on their
  // lane). Errors roll the generation back.
  bool p16_changed = false;  // param16 no longer matches the committed master weights
  try {
    m.p16_begin();
    if (spec_keep)  // the speculative results kept: their 16-bit parameters are final now
      for (auto& s : m.subs) {
        if (s.spec != OptSub::Spec::stepped) continue;
        OptGroup& g = m.groups[s.group];
        std::uint16_t* dst = g.p16.data() + s.begin;
        const std::uint16_t* src = s.spec16.data();
        if (m.cfg.overlap_param16_in_place) {
          // already there: the speculative step wrote param16() itself
        } else if (m.pool != nullptr && m.pool->size() > 1 && s.numel >= (1u << 20)) {
          m.pool->parallel_for(s.numel, 2048, [&](std::size_t b, std::size_t e) {
            std::memcpy(dst + b, src + b, (e - b) * sizeof(std::uint16_t));
          });
        } else {
          std::copy(s.spec16.begin(), s.spec16.end(), dst);
        }
        p16_changed = true;
        ++r.overlapped_subgroups;
        m.p16_done(s);
      }
    m.run_steps(
        todo,
        [&](std::size_t k, bool* wrote16) {
          OptSub& s = m.subs[k];
          OptGroup& g = m.groups[s.group];
          m.step_sub(s, g.cfg, multiplier, t, g.p16.data() + s.begin, wrote16);
        },
        [&](std::size_t k) {
          m.drop_grad(m.subs[k]);
          m.p16_done(m.subs[k]);
        },
        &p16_changed, r);
    late_grads.resize(m.subs.size());
    for (std::size_t k : late)  // where the step reads it
      late_grads[k] = m.tiers.acquire(m.subs[k].grad, m.grad_tier_of(m.subs[k]));
    m.step_count = t;
    m.tiers.commit();
  } catch (...) {
    late_grads.clear();
    m.step_count = t - 1;
    try {
      m.spec_discard();
      drop_gradients();
      if (p16_changed) {
        m.refresh_param16();
        m.p16_all();  // the values the trainer was given are undone
      }
      m.p16_sync();
    } catch (const std::exception& e) {
      log(LogLevel::error,
          fmt::format("step: rolling back after an error failed too: {}", e.what()));
    }
    throw;
  }
  // The memory-only state: the committed generation is the new step for everything else, and
  // this part cannot fail (resident state, pinned gradients, the CPU kernel).
  m.run_steps(
      late,
      [&](std::size_t k, bool*) {
        OptSub& s = m.subs[k];
        OptGroup& g = m.groups[s.group];
        try {
          m.step_sub(s, g.cfg, multiplier, t, g.p16.data() + s.begin);
        } catch (const std::exception& e) {
          log(LogLevel::error,
              fmt::format("step {}: memory-only sub-group {} of group {} failed after the commit "
                          "({}): the in-memory state is now inconsistent; load a checkpoint",
                          t, s.index, s.group, e.what()));
          throw;
        }
      },
      [&](std::size_t k) {
        late_grads[k] = BlockView{};
        m.drop_grad(m.subs[k]);
        m.p16_done(m.subs[k]);
      },
      nullptr, r);
  if (spec_keep) m.spec_reset();
  m.gather_param16();
  if (ls.mode == LossScaling::dynamic && ++m.growth_tracker >= ls.growth_interval) {
    m.scale *= ls.growth_factor;
    m.growth_tracker = 0;
  }
  finish();
  if (m.world > 1) m.p16_all();  // the step is complete: an exception here leaves it done
  m.p16_sync();
  return r;
}

void ShardedOptimizer::set_overlap(bool on) {
  Impl& m = *impl_;
  if (m.in_backward || m.spec_pending())
    throw std::logic_error(
        "set_overlap: between steps only (a backward or its speculative steps are pending)");
  if (on && !m.tiers.config().shadow_slots)
    throw std::logic_error(
        "set_overlap: the overlapped step needs shadow slots (TierConfig::shadow_slots is off)");
  m.cfg.overlap = on;
}

bool ShardedOptimizer::overlap() const noexcept {
  return impl_->cfg.overlap;
}

std::span<const std::uint16_t> ShardedOptimizer::param16(ParamId id) const {
  const Impl& m = *impl_;
  m.require_finalized("param16");
  if (id >= m.params.size())
    throw std::invalid_argument(fmt::format("param16: no parameter {}", id));
  const OptParam& p = m.params[id];
  if (!p.spec.requires_grad)
    throw std::invalid_argument(fmt::format(
        "param16: parameter '{}' is frozen: tierswap keeps no 16-bit copy of it", p.spec.name));
  return {m.groups[p.group].p16.data() + p.offset, p.numel};
}

std::vector<std::pair<std::uint64_t, std::vector<float>>> ShardedOptimizer::shard(ParamId id,
                                                                                  BlockClass cls) {
  Impl& m = *impl_;
  m.require_finalized("shard");
  if (id >= m.params.size()) throw std::invalid_argument(fmt::format("shard: no parameter {}", id));
  const OptParam& p = m.params[id];
  std::vector<std::pair<std::uint64_t, std::vector<float>>> out;
  if (!p.spec.requires_grad) return out;
  const OptGroup& g = m.groups[p.group];
  int slot = -1;
  for (int s = 0; s < kStateSlots; ++s)
    if (state_class(s) == cls && g.has_slot(s)) slot = s;
  if (slot < 0)
    throw std::invalid_argument(fmt::format("shard: group '{}' ({}) keeps no {} state", g.name,
                                            to_string(g.cfg.kind), to_string(cls)));
  const Dtype dt = m.slot_dtype(slot);
  for (std::size_t k = 0; k < g.nsubs; ++k) {
    const OptSub& s = m.subs[g.first_sub + k];
    const auto [b, e] = Impl::slice(p, s);
    if (b >= e) continue;
    Held v(m.tiers, m.tiers.acquire(s.state[slot], Tier::host));
    std::vector<float> vals(e - b);
    cast(v.v.data() + (b - s.begin) * dtype_size(dt), dt, vals.data(), Dtype::f32, e - b);
    if (!out.empty() && out.back().first + out.back().second.size() == b - p.offset)
      out.back().second.insert(out.back().second.end(), vals.begin(), vals.end());
    else
      out.emplace_back(b - p.offset, std::move(vals));
  }
  return out;
}

const ParamSpec& ShardedOptimizer::param(ParamId id) const {
  if (id >= impl_->params.size()) throw std::invalid_argument(fmt::format("no parameter {}", id));
  return impl_->params[id].spec;
}

std::size_t ShardedOptimizer::param_count() const {
  return impl_->params.size();
}

std::size_t ShardedOptimizer::subgroup_count() const {
  return impl_->subs.size();
}

SubgroupInfo ShardedOptimizer::subgroup(std::size_t k) const {
  if (k >= impl_->subs.size()) throw std::invalid_argument(fmt::format("no sub-group {}", k));
  const OptSub& s = impl_->subs[k];
  return {s.group, s.index, s.begin, s.numel};
}

std::pair<std::uint64_t, std::uint64_t> ShardedOptimizer::partition(int group, int rank) const {
  const Impl& m = *impl_;
  m.require_finalized("partition");
  if (group < 0 || group >= group_count() || rank < 0 || rank >= m.world)
    throw std::invalid_argument(fmt::format("partition({}, {}): out of range", group, rank));
  return m.rank_range(m.groups[group], rank);
}

std::uint64_t ShardedOptimizer::trainable_numel() const {
  std::uint64_t n = 0;
  for (const auto& p : impl_->params)
    if (p.spec.requires_grad) n += p.numel;
  return n;
}

std::uint64_t ShardedOptimizer::state_bytes() const {
  const Impl& m = *impl_;
  std::uint64_t n = 0;
  for (const auto& s : m.subs)
    for (int slot = 0; slot < kStateSlots; ++slot)
      if (s.state[slot] != kNoBlock) n += s.numel * dtype_size(m.slot_dtype(slot));
  return n;
}

const OptimizerConfig& ShardedOptimizer::config() const noexcept {
  return impl_->cfg;
}

}  // namespace tierswap
