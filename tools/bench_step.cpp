// `tierswap bench step`: the optimizer step with its state on NVMe, against what bounds it and
// against the traffic ZeRO-Infinity has. In one process, on a synthetic model (one AdamW or Lion
// group, parameters of at most 64M elements, bf16 gradients held in host memory or on NVMe):
//   (a) io-only: the engine alone moves the bytes a step moves (read master and moments, write
//       them back to another extent), sub-group by sub-group, in the step's order (ascending and
//       descending in turn, unless --ascending); as the step begins with state its budget still
//       holds from the step before, the pass begins with as many bytes (those the last timed
//       step did not read) from its buffers, and reads the rest;
//   (b) tierswap: ShardedOptimizer::step() (statistics, pipelined fused kernel, commit);
//   (c) zero-infinity: the same pipeline with ZeRO-Infinity's traffic: the fp32 gradient is
//       written to NVMe at the accumulation boundary and read back in the step (timed together).
// (a) uses as much buffer memory as the step has for state (the host budget less the host-resident
// gradients). Each run does (a), (b), (c) in a rotating order after two untimed warm-up rounds;
// times are medians over --runs. Gradient ingest (backward's work) is not timed.
//
// With --overlap: the tierswap step only, after a simulated backward of --backward-ms that
// delivers the gradient one sub-group at a time, evenly spread; each run does the ordinary step
// and the overlapped step (alternating order) and reports how much of the step the overlapped
// mode hid behind the backward: 1 - (overlapped step() time) / (ordinary step() time).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "tierswap/aligned_buffer.hpp"
#include "tierswap/communicator.hpp"
#include "tierswap/io_engine.hpp"
#include "tierswap/kernels.hpp"
#include "tierswap/optimizer.hpp"
#include "tierswap/swap_space.hpp"
#include "tierswap/thread_pool.hpp"
#include "tierswap/tier_manager.hpp"
#include "tierswap/tiered_optimizer.hpp"
#include "tierswap/units.hpp"
#include "tools/bench_step.hpp"
#include "tools/commands.hpp"
#include "tools/disk_busy.hpp"
#include "tools/temp_dir.hpp"
#include "tools/timing.hpp"

namespace tierswap::cli {
namespace {

constexpr BlockId kNone = ~BlockId{0};  // a ZeRO-Infinity sub-group without exp_avg_sq (Lion)

// The sub-directories the bench creates under each --dir: removed at exit, and when a signal
// ends the run, unless --keep.
struct Created {
  std::vector<std::unique_ptr<TempDir>> dirs;
  bool keep = false;
  void add(const std::filesystem::path& d) {
    if (!keep) dirs.push_back(std::make_unique<TempDir>(TempDir::Adopt{}, d));
  }
};

SwapSpace make_space(const std::vector<std::filesystem::path>& dirs, const char* sub,
                     std::uint64_t capacity, Created& created) {
  SwapSpaceConfig sc;
  for (const auto& d : dirs) {
    sc.dirs.push_back(d / sub);
    if (std::filesystem::exists(sc.dirs.back()))
      throw std::invalid_argument(
          fmt::format("--dir {}: {} exists (a kept run?); remove it or use another directory",
                      d.string(), sc.dirs.back().string()));
    std::filesystem::create_directories(sc.dirs.back());
    created.add(sc.dirs.back());
  }
  sc.capacity = round_up(capacity, 1ull << 20);
  return SwapSpace::create(sc);
}

// What every part of the bench shares: the model's size and kind, where it lives, the pool.
struct StepBench {
  const StepOptions& o;
  std::uint64_t n = 0, budget = 0, sg = 0;
  std::uint64_t per = 0;  // elements per parameter (per_param())
  OptimizerKind kind = OptimizerKind::adamw;
  Tier grad_tier = Tier::host;
  int moments = 2;
  std::uint64_t state_pp = 12;  // bytes per parameter of state
  std::vector<std::filesystem::path> dirs;

  explicit StepBench(const StepOptions& opts) : o(opts) {
    n = parse_param_count(o.params, "--params");
    budget = parse_size(o.host_budget, "--host-budget");
    kind = parse_optimizer_kind(o.optimizer);
    if (kind != OptimizerKind::adamw && kind != OptimizerKind::lion)
      throw std::invalid_argument("--optimizer: adamw or lion");
    grad_tier = parse_tier(o.grad_tier);
    if (grad_tier == Tier::device) throw std::invalid_argument("--grad-tier: host or nvme");
    if (n < 8192) throw std::invalid_argument("--params: at least 8K");
    if (o.runs < 1) throw std::invalid_argument("--runs: at least 1");
    if (o.bf16_moments && o.overlap)
      throw std::invalid_argument(
          "--bf16-moments: not with --overlap (it compares ordinary steps)");
    if (o.memory_only && o.state != "host")
      throw std::invalid_argument(
          "--memory-only needs --state host (NVMe state is never memory-only)");
    if (o.bf16_moments && o.state == "host")
      throw std::invalid_argument(
          "--bf16-moments: not with --state host (it compares the NVMe bytes of the two)");
    if ((o.bf16_moments || o.disk_busy || o.lend || o.distinct_grads || !o.tensor.empty()) &&
        trainer())
      throw std::invalid_argument(
          "--trainer-seconds: not with --bf16-moments, --disk-busy, --lend, --tensor or "
          "--distinct-grads (it steps one optimizer, a sub-group per parameter, as a trainer's "
          "loop does)");
    if (o.disk_busy && (o.overlap || o.state == "host"))
      throw std::invalid_argument(
          "--disk-busy: not with --overlap or --state host (it samples the three NVMe passes)");
    moments = kind == OptimizerKind::adamw ? 2 : 1;
    state_pp = 4ull * (1 + moments);
    sg = sub_group_size();
    // Parameters of --tensor elements (64Mi by default); for the loop modes one sub-group each,
    // so that the simulated backward finishes sub-groups one by one.
    per = loop()             ? sub_rounded()
          : o.tensor.empty() ? std::uint64_t{64} << 20
                             : parse_param_count(o.tensor, "--tensor");
  }
  // --sub-group auto: what TieredOptimizer (and tierswap.torch) picks for this budget.
  std::uint64_t sub_group_size() const {
    if (o.sub_group != "auto") {
      try {
        return parse_param_count(o.sub_group, "--sub-group");
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(std::string(e.what()) + ", or auto");
      }
    }
    OptimizerConfig oc;
    oc.prefetch_depth = o.prefetch_depth;
    return automatic_subgroup_size(budget, oc, state_pp);
  }
  std::uint64_t sub_rounded() const { return round_up(sg, kGradStatsChunk); }
  bool trainer() const { return o.trainer_seconds > 0; }
  bool loop() const { return o.overlap || trainer(); }  // tools/bench_overlap.cpp's modes
  std::uint64_t per_param() const { return per; }
};

TierConfig step_tier_config(const StepBench& sb) {
  TierConfig tc;
  tc.host_budget = sb.budget;
  tc.device_mode = DeviceTierMode::off;
  tc.durable = sb.o.keep || sb.trainer();  // the trainer's commits: durable, as tierswap.torch's
  tc.telemetry = sb.o.keep;
  OptimizerConfig reads;  // slabs, write-behind and prefetches as the one-object setup tunes them
  reads.subgroup_size = sb.sg;
  reads.prefetch_depth = sb.o.prefetch_depth;
  reads.grad_tier = sb.grad_tier;
  tune_tier_config(tc, reads, 1 + sb.moments);
  if (!sb.o.pinned_grads) size_pageable_budget(tc, reads, sb.n * 2);  // bf16 gradients
  return tc;
}

OptimizerConfig step_optimizer_config(const StepBench& sb, bool bf16_moments = false) {
  OptimizerConfig oc;
  oc.bf16_moments = bf16_moments;
  oc.subgroup_size = sb.sg;
  oc.state_tier =
      sb.o.state == "host" ? OptimizerConfig::StateTier::host : OptimizerConfig::StateTier::nvme;
  oc.persist_resident_state = !sb.o.memory_only;
  oc.overlap = sb.loop();  // at finalize: memory-only sub-groups get undo copies where they fit
  oc.pipelined_commit = sb.trainer();
  oc.overlap_param16_in_place = sb.o.param16_in_place;
  oc.grad_tier = sb.grad_tier;
  oc.prefetch_depth = sb.o.prefetch_depth;
  oc.alternate_step_order = !sb.o.ascending;
  return oc;
}

std::vector<ParamId> add_step_params(const StepBench& sb, ShardedOptimizer& opt) {
  opt.add_group(GroupConfig::defaults(sb.kind), "all");
  std::vector<ParamId> ids;
  const std::uint64_t per = sb.per_param();
  for (std::uint64_t off = 0; off < sb.n; off += per)
    ids.push_back(opt.add_param(0, {fmt::format("layer{}", ids.size()),
                                    {static_cast<std::int64_t>(std::min(per, sb.n - off))},
                                    Dtype::bf16,
                                    true}));
  return ids;
}

// (b) tierswap: a swap space (under --dir/<name>), engine, tier manager and optimizer of its own,
// initialized; `ingest` hands the same bf16 gradient to every parameter.
struct TierswapStack {
  SwapSpace space;
  IoEngine engine;
  TierManager tiers;
  std::unique_ptr<Communicator> comm;
  ShardedOptimizer opt;
  std::vector<ParamId> ids;

  TierswapStack(const StepBench& sb, ThreadPool& pool, Created& created, const char* name,
                bool bf16_moments)
      : space(make_space(sb.dirs, name, 2 * sb.n * sb.state_pp + 2 * sb.n * 2 + (256ull << 20),
                         created)),
        engine(space, IoEngineConfig::from_env()),
        tiers(space, engine, step_tier_config(sb)),
        comm(make_single_communicator()),
        opt(tiers, *comm, step_optimizer_config(sb, bf16_moments), &pool),
        ids(add_step_params(sb, opt)),
        lend(sb.o.lend),
        distinct(sb.o.distinct_grads) {
    opt.finalize();
    opt.initialize([](ParamId, std::uint64_t off, float* out, std::uint64_t k) {
      for (std::uint64_t i = 0; i < k; ++i) out[i] = 0.01f * static_cast<float>((off + i) % 101);
    });
  }
  // `grad`: one parameter's gradient, handed to every parameter, or (--distinct-grads) all of
  // them back to back, each parameter's its own.
  void ingest(const std::vector<std::uint16_t>& grad) {
    opt.begin_backward();
    std::uint64_t at = 0;
    for (ParamId id : ids) {
      const std::uint16_t* g = grad.data() + (distinct ? at : 0);
      at += opt.param(id).numel();
      if (lend)
        opt.lend_grad(id, g, Dtype::bf16);  // `grad` outlives the step
      else
        opt.add_grad(id, g, Dtype::bf16);
    }
    opt.end_backward();
  }
  bool lend = false;
  bool distinct = false;
};

// (c) ZeRO-Infinity's traffic: state blocks plus an fp32 gradient block per sub-group; at the
// accumulation boundary the fp32 gradient goes to NVMe, and the step reads it back with the state
// (read ahead, the fused kernel on fp32 gradients, written behind).
class ZeroInfinityTraffic {
 public:
  struct Sub {
    BlockId p, m, v, g;
    std::uint64_t off, n;
  };
  ZeroInfinityTraffic(const StepBench& sb, const TierConfig& tc, ThreadPool& pool, Created& created)
      : sb_(sb),
        pool_(pool),
        space_(make_space(sb.dirs, "zero-infinity", sb.n * (sb.state_pp + 4) + (256ull << 20),
                          created)),
        engine_(space_, IoEngineConfig::from_env()),
        tiers_(space_, engine_, quiet(tc)),
        p16_(std::min(sb.n, sb.sub_rounded())) {
    for (std::uint64_t off = 0; off < sb.n; off += sb.sub_rounded()) add_sub(off);
    tiers_.commit();
  }
  const std::vector<Sub>& subs() const { return subs_; }
  double step(const std::vector<std::uint16_t>& grad);

 private:
  // ZeRO-Infinity updates its swap files in place: one NVMe extent per block (the same bytes per
  // step as two, half the disk).
  static TierConfig quiet(TierConfig tc) {
    tc.durable = false;
    tc.telemetry = false;
    tc.shadow_slots = false;
    return tc;
  }
  BlockId make(std::size_t sub, const char* what, BlockClass c, std::uint64_t k) {
    BlockDesc d;
    d.name = fmt::format("zi.{}.{}", sub, what);
    d.cls = c;
    d.numel = k;
    return tiers_.create(d);
  }
  void add_sub(std::uint64_t off) {
    const std::uint64_t k = std::min(sb_.sub_rounded(), sb_.n - off);
    const std::size_t i = subs_.size();
    Sub z{make(i, "master", BlockClass::master, k),
          make(i, "exp_avg", BlockClass::exp_avg, k),
          sb_.moments == 2 ? make(i, "exp_avg_sq", BlockClass::exp_avg_sq, k) : kNone,
          make(i, "grad32", BlockClass::other, k),
          off,
          k};
    subs_.push_back(z);
    BlockView v = tiers_.acquire(z.p, Tier::host, Access::overwrite);
    auto* f = reinterpret_cast<float*>(v.data());
    for (std::uint64_t e = 0; e < k; ++e) f[e] = 0.01f * static_cast<float>((off + e) % 101);
    tiers_.release(v, true);
    tiers_.write_back(z.p);
  }
  void prefetch(std::size_t k) {
    if (k >= subs_.size()) return;
    for (BlockId b : {subs_[k].p, subs_[k].m, subs_[k].v, subs_[k].g})
      if (b != kNone) tiers_.prefetch(b, Tier::host);
  }
  void step_sub(const Sub& z);

  const StepBench& sb_;
  ThreadPool& pool_;
  SwapSpace space_;
  IoEngine engine_;
  TierManager tiers_;
  std::vector<Sub> subs_;
  std::vector<std::uint16_t> p16_;
  std::int64_t t_ = 0;
};

void ZeroInfinityTraffic::step_sub(const Sub& z) {
  {
    BlockView p = tiers_.acquire(z.p, Tier::host, Access::write);
    BlockView m = tiers_.acquire(z.m, Tier::host, Access::write);
    BlockView v;
    if (z.v != kNone) v = tiers_.acquire(z.v, Tier::host, Access::write);
    BlockView g = tiers_.acquire(z.g, Tier::host);
    const GradView gv{g.data(), Dtype::f32, 1.0f};
    const Param16View pv{p16_.data(), Dtype::bf16};
    CpuKernelContext ctx{default_cpu_isa(), &pool_};
    if (sb_.kind == OptimizerKind::adamw)
      adam_step(AdamConfig{}, t_,
                {reinterpret_cast<float*>(p.data()), m.data(), v.data(), nullptr, Dtype::f32}, gv,
                pv, z.n, ctx);
    else
      lion_step(LionConfig{}, reinterpret_cast<float*>(p.data()), m.data(), Dtype::f32, gv, pv, z.n,
                ctx);
    tiers_.release(p, true);
    tiers_.release(m, true);
    if (v) tiers_.release(v, true);
  }
  tiers_.trim(z.g);  // consumed (ZeRO-Infinity overwrites it at the next boundary)
  for (BlockId b : {z.p, z.m, z.v})
    if (b != kNone) tiers_.write_back(b);
}

double ZeroInfinityTraffic::step(const std::vector<std::uint16_t>& grad) {
  const auto t0 = Clock::now();
  const std::uint64_t per = sb_.per_param();
  for (const Sub& z : subs_) {  // the accumulation boundary: the fp32 gradient to NVMe
    BlockView v = tiers_.acquire(z.g, Tier::host, Access::overwrite);
    cast(grad.data() + (z.off % per), Dtype::bf16, v.data(), Dtype::f32, z.n,
         {default_cpu_isa(), &pool_});
    tiers_.release(v, true);
    tiers_.write_back(z.g);
  }
  ++t_;
  const std::size_t depth = sb_.o.prefetch_depth;
  for (std::size_t k = 0; k <= depth; ++k) prefetch(k);
  for (std::size_t k = 0; k < subs_.size(); ++k) {
    prefetch(k + depth + 1);
    step_sub(subs_[k]);
  }
  tiers_.commit();
  return since(t0);
}

// (a) io-only: the same bytes through the engine alone, sub-group by sub-group. Its buffers: the
// pinned memory the step has for state, the host budget less the gradients waiting in it (both
// passes run under the same budget), at least two sub-groups' worth. Two regions, read from one
// and written to the other, alternating per pass; region 0 is written first, so no pass reads an
// unwritten extent (the filesystem would return zeros without touching the disk). In the step's
// alternating order every other pass runs backwards: it begins with the blocks the pass before
// ended with, which the ring (block b in slot b % slots) still holds; run(kept) takes as many of
// them as make up `kept` bytes (what the step kept) instead of reading them.
class IoOnlyPass {
 public:
  IoOnlyPass(const StepBench& sb, const std::vector<ZeroInfinityTraffic::Sub>& subs,
             Created& created)
      : alternate_(!sb.o.ascending),
        blk_(round_up(sb.sub_rounded() * 4, 1ull << 20)),
        per_sub_(1 + sb.moments),
        nblk_(subs.size() * per_sub_),
        space_(make_space(sb.dirs, "io-only", 2 * nblk_ * blk_ + (64ull << 20), created)),
        engine_(space_, IoEngineConfig::from_env()) {
    const std::uint64_t grad_host = sb.grad_tier == Tier::host && sb.o.pinned_grads ? sb.n * 2 : 0;
    slots_ = std::max<std::size_t>(2 * per_sub_,
                                   (sb.budget > grad_host ? sb.budget - grad_host : 0) / blk_);
    ring_ = AlignedBuffer(slots_ * blk_);
    engine_.register_buffer(ring_.data(), ring_.size());
    for (const auto& z : subs) numel_.push_back(z.n);
    for (std::size_t b = 0; b < nblk_; ++b) {
      std::memset(ring_.data(), static_cast<int>(b), blk_);
      engine_.write(b * blk_, ring_.data(), bytes(b)).wait();
    }
  }
  double run(std::uint64_t kept = 0);
  /// Bytes the last run() read.
  std::uint64_t read_bytes() const { return read_bytes_; }

 private:
  std::uint64_t bytes(std::size_t b) const { return numel_[b / per_sub_] * 4; }

  bool alternate_;
  std::uint64_t blk_;
  std::size_t per_sub_, nblk_, slots_ = 0;
  SwapSpace space_;
  IoEngine engine_;
  AlignedBuffer ring_;
  std::vector<std::uint64_t> numel_;
  int flip_ = 0;
  bool ran_ = false;  // the ring holds the last pass's final blocks (this pass's first ones)
  std::uint64_t read_bytes_ = 0;
};

double IoOnlyPass::run(std::uint64_t kept) {
  const std::uint64_t from = flip_ * nblk_ * blk_, to = (1 - flip_) * nblk_ * blk_;
  const bool down = alternate_ && flip_ == 1;
  flip_ ^= 1;
  const auto block = [&](std::size_t i) { return down ? nblk_ - 1 - i : i; };
  const std::size_t held = alternate_ && ran_ ? std::min(slots_, nblk_) : 0;
  std::size_t reuse = 0;
  for (; reuse < held && bytes(block(reuse)) <= kept; ++reuse) kept -= bytes(block(reuse));
  const auto t0 = Clock::now();
  std::vector<std::optional<IoTicket>> rd(slots_), wr(slots_);
  std::size_t issued = 0;
  read_bytes_ = 0;
  auto issue = [&](std::size_t i) {
    const std::size_t b = block(i), s = b % slots_;
    if (wr[s]) wr[s]->wait(), wr[s].reset();
    if (i < reuse) return;  // still in its slot from the last pass
    rd[s] = engine_.read(from + b * blk_, ring_.data() + s * blk_, bytes(b));
    read_bytes_ += bytes(b);
  };
  const std::size_t ahead = slots_ - per_sub_;  // the rest holds writes in flight
  for (std::size_t i = 0; i < nblk_; ++i) {
    while (issued < nblk_ && issued < i + ahead) issue(issued++);
    const std::size_t b = block(i), s = b % slots_;
    if (rd[s]) rd[s]->wait(), rd[s].reset();
    wr[s] = engine_.write(to + b * blk_, ring_.data() + s * blk_, bytes(b));
  }
  for (auto& w : wr)
    if (w) w->wait();
  ran_ = true;
  return since(t0);
}

// The medians and per-run ratios of the three passes, and the last tierswap cycle's traffic.
struct StepBenchRuns {
  std::vector<double> ts, zs, is, ins, r_step_io, r_zi_step;  // times; ratios within each run
  std::vector<double> bfs, r_fp32_bf16;  // --bf16-moments: its step times; fp32 / bf16 per run
  TierCounters bf_cycle0, bf_cycle1;     // around the last run's bf16-moment ingest + step
  nlohmann::json runs = nlohmann::json::array();
  StepResult last;
  TierCounters cycle0, cycle1;  // around the last run's ingest + step
  std::uint64_t io_read = 0;    // what the last io-only pass read
  // State bytes the last timed step did not read (its budget held them).
  std::uint64_t step_kept = 0;
  std::vector<double> busy_io, busy_step, busy_zi;  // --disk-busy: per run
};

// --disk-busy: the inflight counters of the disks under the swap directories.
std::vector<std::filesystem::path> disks_to_sample(const std::vector<std::filesystem::path>& dirs) {
  std::string why;
  auto files = disk_inflight_files(dirs, &why);
  if (files.empty()) throw std::runtime_error("--disk-busy: " + why);
  return files;
}

// --disk-busy: samples the disks while one pass runs (does nothing without the flag).
struct PassSampler {
  DiskBusySampler* s;
  void begin() const {
    if (s) s->start();
  }
  DiskBusy end() const { return s ? s->stop() : DiskBusy{}; }
};

// Gradient bytes a cycle (between the two counters) spilled to NVMe at ingest (--grad-tier nvme):
// the step writes all of its state, so what was written beyond that was gradients.
std::uint64_t gradient_bytes_spilled(const StepBench& sb, const TierCounters& c0,
                                     const TierCounters& c1) {
  const int nv = static_cast<int>(Tier::nvme);
  const std::uint64_t state = sb.n * sb.state_pp, wr = c1.bytes_in[nv] - c0.bytes_in[nv];
  return wr > state ? wr - state : 0;
}

// Bytes of state a step (between the two counters) found in host memory: each spilled gradient
// byte was read back once, so the reads less those are the state it read.
std::uint64_t state_bytes_kept(const StepBench& sb, const TierCounters& c0,
                               const TierCounters& c1) {
  const int nv = static_cast<int>(Tier::nvme);
  const std::uint64_t state = sb.n * sb.state_pp, rd = c1.bytes_out[nv] - c0.bytes_out[nv];
  const std::uint64_t grad = gradient_bytes_spilled(sb, c0, c1);
  const std::uint64_t state_read = rd > grad ? rd - grad : 0;
  return state > state_read ? state - state_read : 0;
}

// The figures a report gives, from the runs' medians and counters.
struct StepSummary {
  double rd = 0, wr = 0;  // NVMe bytes per parameter over a whole cycle (ingest and step)
  double io_s = 0, step_s = 0, zi_s = 0;
  double grad_nvme = 0;  // gradient bytes per parameter written and read back
  std::uint64_t peak = 0, peak_pageable = 0;
  double bf_rd = 0, bf_wr = 0;  // the same for the bf16-moment step
};

StepSummary summarize_step_bench(const StepBench& sb, const StepBenchRuns& R,
                                 const TierManager& tiers) {
  const int nv = static_cast<int>(Tier::nvme);
  const auto n = static_cast<double>(sb.n);
  auto per_param = [n](std::uint64_t a, std::uint64_t b) { return static_cast<double>(b - a) / n; };
  const TierCounters c = tiers.counters();
  StepSummary S;
  S.rd = per_param(R.cycle0.bytes_out[nv], R.cycle1.bytes_out[nv]);
  S.wr = per_param(R.cycle0.bytes_in[nv], R.cycle1.bytes_in[nv]);
  S.io_s = median(R.is);
  S.step_s = median(R.ts);
  S.zi_s = median(R.zs);
  S.grad_nvme = 2 * static_cast<double>(gradient_bytes_spilled(sb, R.cycle0, R.cycle1)) / n;
  S.peak = c.peak_reserved_bytes[static_cast<int>(Tier::host)];
  S.peak_pageable = c.peak_pageable_bytes;
  S.bf_rd = per_param(R.bf_cycle0.bytes_out[nv], R.bf_cycle1.bytes_out[nv]);
  S.bf_wr = per_param(R.bf_cycle0.bytes_in[nv], R.bf_cycle1.bytes_in[nv]);
  return S;
}

void print_step_bench(const StepBench& sb, const StepBenchRuns& R, const StepSummary& S) {
  const auto n = static_cast<double>(sb.n);
  fmt::print(
      "median: io-only {:.3f} s, step {:.3f} s ({:.2f}x io-only), zero-infinity traffic {:.3f} s "
      "({:.2f}x the step); median of the per-run ratios: {:.2f}x io-only, zero-infinity {:.2f}x"
      "\nNVMe per parameter per step: {:.1f} B read (io-only {:.1f} B), {:.1f} B written ({:.1f} "
      "B "
      "of it gradient, 0 fp32); peak pinned {} of a {} budget ({} of state); gradients in "
      "pageable memory: peak {}\n",
      S.io_s, S.step_s, S.step_s / S.io_s, S.zi_s, S.zi_s / S.step_s, median(R.r_step_io),
      median(R.r_zi_step), S.rd, static_cast<double>(R.io_read) / n, S.wr, S.grad_nvme,
      format_bytes(S.peak), format_bytes(sb.budget), format_bytes(sb.n * sb.state_pp),
      format_bytes(S.peak_pageable));
  if (!R.bfs.empty())
    fmt::print(
        "bf16 moments: step {:.3f} s (median); fp32 / bf16 moments {:.2f}x (median of the "
        "per-run ratios); NVMe per parameter per step {:.1f} B read, {:.1f} B written\n",
        median(R.bfs), median(R.r_fp32_bf16), S.bf_rd, S.bf_wr);
  if (!R.busy_step.empty())
    fmt::print(
        "disk busy (a request in flight), median: io-only {:.1f}%, step {:.1f}%, "
        "zero-infinity {:.1f}%\n",
        100 * median(R.busy_io), 100 * median(R.busy_step), 100 * median(R.busy_zi));
}

nlohmann::json step_bench_json(const StepBench& sb, const StepBenchRuns& R, const StepSummary& S) {
  const int nv = static_cast<int>(Tier::nvme);
  const auto n = static_cast<double>(sb.n);
  nlohmann::json j{
      {"params", sb.n},
      {"optimizer", sb.o.optimizer},
      {"grad_tier", sb.o.grad_tier},
      {"lend", sb.o.lend},
      {"tensor", sb.per_param()},
      {"distinct_grads", sb.o.distinct_grads},
      {"sub_group", sb.sub_rounded()},
      {"runs", R.runs},
      {"io_only_s", S.io_s},
      {"step_s", S.step_s},
      {"ingest_s", median(R.ins)},
      {"zero_infinity_step_s", S.zi_s},
      {"step_over_io_only", S.step_s / S.io_s},
      {"zero_infinity_over_step", S.zi_s / S.step_s},
      {"median_run_step_over_io_only", median(R.r_step_io)},
      {"median_run_zero_infinity_over_step", median(R.r_zi_step)},
      {"nvme_read_bytes_per_param", S.rd},
      {"io_only_read_bytes_per_param", static_cast<double>(R.io_read) / n},
      {"alternate_step_order", !sb.o.ascending},
      {"nvme_write_bytes_per_param", S.wr},
      {"grad_nvme_bytes_per_param", S.grad_nvme},
      {"fp32_grad_bytes", 0},
      {"step_nvme_gbps", (R.last.bytes_in[nv] + R.last.bytes_out[nv]) / S.step_s / 1e9},
      {"io_wait_s", R.last.io_wait_seconds},
      {"peak_pinned_bytes", S.peak},
      {"peak_pageable_bytes", S.peak_pageable},
      {"host_budget_bytes", sb.budget},
      {"state_bytes", sb.n * sb.state_pp}};
  if (!R.busy_step.empty())
    j["median_disk_busy"] = {{"io_only", median(R.busy_io)},
                             {"step", median(R.busy_step)},
                             {"zero_infinity", median(R.busy_zi)}};
  if (!R.bfs.empty()) {
    j["step_bf16_moments_s"] = median(R.bfs);
    j["fp32_over_bf16_moments"] = median(R.r_fp32_bf16);
    j["bf16_moments_nvme_read_bytes_per_param"] = S.bf_rd;
    j["bf16_moments_nvme_write_bytes_per_param"] = S.bf_wr;
  }
  return j;
}

void report_step_bench(const StepBench& sb, const StepBenchRuns& R, const TierManager& tiers) {
  const StepSummary S = summarize_step_bench(sb, R, tiers);
  if (sb.o.json)
    fmt::print("{}\n", step_bench_json(sb, R, S).dump(2));
  else
    print_step_bench(sb, R, S);
}

// One run's measurements: each pass's seconds, the disk's business during it, and the engine's
// counters around the tierswap step.
struct RoundTimes {
  double step = 0, zi = 0, io = 0, ingest = 0, bf16 = 0;
  DiskBusy d_step, d_zi, d_io;
  IoStats e0, e1;
};

// One run: the passes in a rotating order (each takes each position equally often).
RoundTimes time_step_round(int r, const StepBench& sb, TierswapStack& ts, ZeroInfinityTraffic& zi,
                           IoOnlyPass& io, TierswapStack* bf,
                           const std::vector<std::uint16_t>& grad, DiskBusySampler* disk,
                           StepBenchRuns& R) {
  const int passes = bf ? 4 : 3;
  const PassSampler ps{disk};
  RoundTimes x;
  for (int k = 0; k < passes; ++k) {
    switch ((r + k) % passes) {
      case 0: {
        R.cycle0 = ts.tiers.counters();
        const auto t_in = Clock::now();
        ts.ingest(grad);
        x.ingest = since(t_in);
        x.e0 = ts.engine.stats();
        ps.begin();
        R.last = ts.opt.step();
        x.d_step = ps.end();
        x.e1 = ts.engine.stats();
        R.cycle1 = ts.tiers.counters();
        R.step_kept = state_bytes_kept(sb, R.cycle0, R.cycle1);
        x.step = R.last.seconds;
        break;
      }
      case 1:
        ps.begin();
        x.zi = zi.step(grad);
        x.d_zi = ps.end();
        break;
      case 2:
        ps.begin();
        x.io = io.run(R.step_kept);
        x.d_io = ps.end();
        R.io_read = io.read_bytes();
        break;
      case 3: {
        R.bf_cycle0 = bf->tiers.counters();
        bf->ingest(grad);
        x.bf16 = bf->opt.step().seconds;
        R.bf_cycle1 = bf->tiers.counters();
        break;
      }
    }
  }
  return x;
}

// The run's times and ratios into R (its JSON row too), and its line.
void record_step_round(int r, const StepBench& sb, const RoundTimes& x, bool bf, bool disk,
                       StepBenchRuns& R) {
  const double t = x.step, z = x.zi, i = x.io, b = x.bf16;
  R.ts.push_back(t);
  R.ins.push_back(x.ingest);
  R.zs.push_back(z);
  R.is.push_back(i);
  const int nv = static_cast<int>(Tier::nvme);
  nlohmann::json run{{"io_only_s", i},
                     {"step_s", t},
                     {"step_nvme_read_bytes", R.cycle1.bytes_out[nv] - R.cycle0.bytes_out[nv]},
                     {"io_only_read_bytes", R.io_read},
                     {"step_io_wait_s", R.last.io_wait_seconds},
                     {"step_commit_s", R.last.commit_seconds},
                     {"step_requests", x.e1.requests - x.e0.requests},
                     {"step_fixed_requests", x.e1.fixed_requests - x.e0.fixed_requests},
                     {"step_bounce_requests", x.e1.bounce_requests - x.e0.bounce_requests},
                     {"ingest_s", x.ingest},
                     {"zero_infinity_step_s", z},
                     {"step_over_io_only", t / i},
                     {"zero_infinity_over_step", z / t}};
  R.r_step_io.push_back(t / i);
  R.r_zi_step.push_back(z / t);
  if (bf) {
    R.bfs.push_back(b);
    R.r_fp32_bf16.push_back(t / b);
    run["step_bf16_moments_s"] = b;
    run["fp32_over_bf16_moments"] = t / b;
  }
  if (disk) {
    R.busy_io.push_back(x.d_io.busy);
    R.busy_step.push_back(x.d_step.busy);
    R.busy_zi.push_back(x.d_zi.busy);
    run["disk_busy"] = {
        {"io_only", x.d_io.busy}, {"step", x.d_step.busy}, {"zero_infinity", x.d_zi.busy}};
    run["disk_mean_inflight"] = {{"io_only", x.d_io.mean_inflight},
                                 {"step", x.d_step.mean_inflight},
                                 {"zero_infinity", x.d_zi.mean_inflight}};
  }
  R.runs.push_back(run);
  if (!sb.o.json)
    fmt::print(
        "run {}: io-only {:.3f} s, tierswap step {:.3f} s, zero-infinity traffic {:.3f} s{}{}\n",
        r + 1, i, t, z, bf ? fmt::format(", bf16-moment step {:.3f} s", b) : "",
        disk ? fmt::format("; disk busy {:.1f}% / {:.1f}% / {:.1f}% of each", 100 * x.d_io.busy,
                           100 * x.d_step.busy, 100 * x.d_zi.busy)
             : "");
}

// --state host without --overlap: tierswap's ingest + step alone, its state in host memory (no
// NVMe pass to set beside it): what a trainer with host-resident state pays per step.
void run_host_state_bench(const StepBench& sb, TierswapStack& ts,
                          const std::vector<std::uint16_t>& grad) {
  const StepOptions& o = sb.o;
  ts.ingest(grad);  // warm-up: first touch of every block
  ts.opt.step();
  std::vector<double> ins, steps;
  for (int r = 0; r < o.runs; ++r) {
    const auto t0 = Clock::now();
    ts.ingest(grad);
    ins.push_back(since(t0));
    steps.push_back(ts.opt.step().seconds);
    if (!o.json)
      fmt::print("run {}: ingest {:.3f} s, tierswap step {:.3f} s\n", r + 1, ins.back(),
                 steps.back());
  }
  if (!o.json) {
    fmt::print("median: ingest {:.3f} s, step {:.3f} s ({} params, host state{}, {} threads)\n",
               median(ins), median(steps), sb.n, o.memory_only ? " in memory only" : "", o.threads);
    return;
  }
  nlohmann::json j{{"params", sb.n},
                   {"optimizer", o.optimizer},
                   {"state", o.state},
                   {"memory_only", o.memory_only},
                   {"lend", o.lend},
                   {"tensor", sb.per_param()},
                   {"distinct_grads", o.distinct_grads},
                   {"sub_group", sb.sub_rounded()},
                   {"subgroups", ts.opt.subgroup_count()},
                   {"ingest_s", median(ins)},
                   {"step_s", median(steps)},
                   {"runs_ingest_s", ins},
                   {"runs_step_s", steps}};
  fmt::print("{}\n", j.dump(2));
}

// The bf16 gradient every pass ingests: one parameter's worth (lent to all of them), or the
// whole model's with --distinct-grads.
std::vector<std::uint16_t> bench_gradient(const StepBench& sb) {
  std::vector<std::uint16_t> grad(sb.o.distinct_grads ? sb.n : std::min(sb.n, sb.per_param()));
  for (std::size_t i = 0; i < grad.size(); ++i)
    grad[i] = float_to_bf16(1e-3f * static_cast<float>(static_cast<int>(i % 17) - 8));
  return grad;
}

// Warm-up, two rounds: every block has data in both of its slots on NVMe afterwards. The first
// write into a slot costs more than the later ones (likely the file system converting the
// allocated extent): with one round the first timed step and ZeRO-Infinity pass ran 1.5-2x
// slower than the next ones in every run, while the io-only pass, whose constructor writes one
// of its two regions, did not; a wait before the timed runs did not change that.
void warm_up(TierswapStack& ts, ZeroInfinityTraffic& zi, IoOnlyPass& io, TierswapStack* bf,
             const std::vector<std::uint16_t>& grad) {
  for (int w = 0; w < 2; ++w) {
    ts.ingest(grad);
    ts.opt.step();
    zi.step(grad);
    io.run();
    if (bf) {
      bf->ingest(grad);
      bf->opt.step();
    }
  }
}

void run_step_bench(const StepOptions& o) {
  StepBench sb(o);
  std::unique_ptr<TempDir> temp;
  sb.dirs.assign(o.dirs.begin(), o.dirs.end());
  if (sb.dirs.empty()) {
    temp = std::make_unique<TempDir>("tierswap-bench-step");
    sb.dirs = {temp->path};
  }
  std::unique_ptr<DiskBusySampler> disk;  // --disk-busy, checked before anything is created
  if (o.disk_busy) disk = std::make_unique<DiskBusySampler>(disks_to_sample(sb.dirs));
  ThreadPool pool(o.threads);
  Created created;
  created.keep = o.keep;
  TierswapStack ts(sb, pool, created, "tierswap", false);  // (b)
  const std::vector<std::uint16_t> grad = bench_gradient(sb);
  if (sb.loop()) {
    const LoopBench lb{o, ts.tiers, ts.opt, ts.ids, grad, sb.n};
    sb.trainer() ? run_trainer_bench(lb) : run_overlap_bench(lb);
    return;
  }
  if (o.state == "host") {
    run_host_state_bench(sb, ts, grad);
    return;
  }
  const TierConfig tc = step_tier_config(sb);
  ZeroInfinityTraffic zi(sb, tc, pool, created);  // (c)
  IoOnlyPass io(sb, zi.subs(), created);          // (a)
  std::unique_ptr<TierswapStack> bf;              // (d) --bf16-moments
  if (o.bf16_moments)
    bf = std::make_unique<TierswapStack>(sb, pool, created, "tierswap-bf16", true);

  if (!o.json)
    fmt::print(
        "tierswap bench step: {} params ({}), {} of state on NVMe ({}), host budget {}, "
        "sub-group {} params, gradients on {}{}\n",
        sb.n, o.optimizer, format_bytes(sb.n * sb.state_pp), sb.dirs.front().string(),
        format_bytes(sb.budget), sb.sub_rounded(), o.grad_tier,
        bf ? "; and the same with bf16 moments" : "");
  warm_up(ts, zi, io, bf.get(), grad);
  StepBenchRuns R;
  for (int r = 0; r < o.runs; ++r) {
    const RoundTimes x = time_step_round(r, sb, ts, zi, io, bf.get(), grad, disk.get(), R);
    record_step_round(r, sb, x, bf != nullptr, disk != nullptr, R);
  }
  report_step_bench(sb, R, ts.tiers);
  if (o.keep) {
    if (temp) fmt::print(stderr, "kept the swap directory {}\n", temp->keep().string());
    fmt::print(stderr, "inspect: tierswap residency --swap-dir {}\n",
               (sb.dirs.front() / "tierswap").string());
  }
}

}  // namespace

namespace {

// What is stepped and how much: the swap directories, the model, the budget, the repetitions.
void add_step_size_options(CLI::App* b, StepOptions* o) {
  b->add_option("--dir", o->dirs, "Swap directory (repeat to stripe; default: a temporary one)")
      ->check(CLI::ExistingDirectory);
  b->add_option("--params", o->params, kParamsHelp);
  b->add_option("--host-budget", o->host_budget, "Pinned host bytes");
  b->add_option("--sub-group", o->sub_group,
                "Parameters per sub-group (decimal suffixes, as --params), or auto: what "
                "TieredOptimizer and tierswap.torch pick for --host-budget (at most 8388608)");
  b->add_option("--optimizer", o->optimizer, "adamw | lion");
  b->add_option("--grad-tier", o->grad_tier, "Where the bf16 gradients wait: host | nvme");
  b->add_option("--runs", o->runs, "Repetitions (medians reported)");
  b->add_option("--prefetch-depth", o->prefetch_depth, "Sub-groups whose state is read ahead");
  b->add_option("--threads", o->threads, "Kernel threads");
}

// How the step runs: overlapped, host state, durability, moments, the gradients' hand-over and
// layout, the order, the disk sampling.
void add_step_mode_options(CLI::App* b, StepOptions* o) {
  auto* overlap = b->add_flag(
      "--overlap", o->overlap,
      "Ordinary vs overlapped step after a simulated backward (how much of the step hides)");
  b->add_option("--state", o->state,
                "Where the optimizer state lives: nvme (default) | host (without --overlap: "
                "tierswap's ingest + step alone, no NVMe pass beside it)")
      ->check(CLI::IsMember({"nvme", "host"}));
  b->add_flag("--memory-only", o->memory_only,
              "--state host: memory-only resident state (with --overlap, undo copies where the "
              "host budget holds them)");
  b->add_flag("--param16-in-place", o->param16_in_place,
              "--overlap: speculative steps write the 16-bit parameters in place "
              "(OptimizerConfig::overlap_param16_in_place; no copy after the verdict)")
      ->needs(overlap);
  b->add_option("--backward-ms", o->backward_ms,
                "--overlap: length of the simulated backward in milliseconds");
  b->add_option("--trainer-seconds", o->trainer_seconds,
                "Training steps whose forward and backward take this long (a third and two "
                "thirds; simulated): the commit durable and pipelined beside the forward, the "
                "step overlapped with the backward; prints the step's exposed time per step "
                "(what the trainer waits for beyond it), to size drives for a model")
      ->excludes(overlap)
      ->check(CLI::PositiveNumber);
  b->add_flag("--keep", o->keep,
              "Durable mode (fsync'd manifest every step); keep the swap directory");
  b->add_flag("--bf16-moments", o->bf16_moments,
              "Also step a second optimizer whose moments are bf16 (16 B/param of NVMe traffic "
              "instead of 24), alternated with the fp32 one in every run");
  b->add_flag("--pinned-grads", o->pinned_grads,
              "Keep the bf16 gradients in the pinned host budget (no pageable pool: the layout "
              "before gradients moved out of it)");
  b->add_flag("--lend", o->lend,
              "Hand tierswap's gradients over with lend_grad (the step reads them where they "
              "are, as tierswap.torch's step-time hand-over does) instead of add_grad's copy");
  b->add_option("--tensor", o->tensor,
                "Elements per parameter (decimal suffixes, as --params; default 64Mi = "
                "67108864; --overlap has one sub-group each)")
      ->excludes(overlap);
  b->add_flag("--distinct-grads", o->distinct_grads,
              "Each parameter's gradient in a buffer of its own (as a trainer's p.grad), not one "
              "buffer handed to every parameter")
      ->excludes(overlap);
  b->add_flag("--ascending", o->ascending,
              "Step the sub-groups in ascending order every step (alternate_step_order off), "
              "and the io-only pass with them: every step reads all of its state");
  b->add_flag("--disk-busy", o->disk_busy,
              "Sample /sys/block/DISK/inflight every millisecond during each pass: the fraction "
              "of the pass with a request in flight on the disks under --dir (was a slower pass "
              "the software or the disk?)");
}

}  // namespace

void add_bench_step(CLI::App& bench) {
  auto o = std::make_shared<StepOptions>();
  auto* b = bench.add_subcommand(
      "step",
      "Optimizer step on NVMe-resident state vs an I/O-only pass and ZeRO-Infinity traffic");
  add_step_size_options(b, o.get());
  add_step_mode_options(b, o.get());
  b->add_flag("--json", o->json, "Print JSON on stdout instead of text");
  b->callback([o] { run_step_bench(*o); });
}

}  // namespace tierswap::cli
