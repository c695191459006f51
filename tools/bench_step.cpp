// `tierswap bench step`: the optimizer step with its state on NVMe, against what bounds it and
// against the traffic ZeRO-Infinity has. In one process, on a synthetic model (one AdamW or Lion
// group, parameters of at most 64M elements, bf16 gradients held in host memory or on NVMe):
//   (a) io-only: the engine alone moves exactly the bytes a step moves (read master and moments,
//       write them back to another extent), sub-group by sub-group, with the same look-ahead;
//   (b) tierswap: ShardedOptimizer::step() (statistics, pipelined fused kernel, commit);
//   (c) zero-infinity: the same pipeline with ZeRO-Infinity's traffic: the fp32 gradient is
//       written to NVMe at the accumulation boundary and read back in the step (timed together).
// (a) uses as much buffer memory as the step has for state (the host budget less the host-resident
// gradients). Each run does (a), (b), (c) in a rotating order after one untimed warm-up step; times
// are medians over --runs. Gradient ingest (backward's work) is not timed.
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
#include "tools/commands.hpp"
#include "tools/temp_dir.hpp"
#include "tools/timing.hpp"

namespace tierswap::cli {
namespace {

constexpr BlockId kNone = ~BlockId{0};  // a ZeRO-Infinity sub-group without exp_avg_sq (Lion)

struct StepOptions {
  std::vector<std::string> dirs;
  std::string params = "256M";
  std::string host_budget = "1GiB";
  std::string sub_group = "16M";
  std::string optimizer = "adamw";
  std::string grad_tier = "host";
  int runs = 3;
  std::uint32_t prefetch_depth = 2;
  unsigned threads = 2;
  bool overlap = false;
  std::string state = "nvme";     // --overlap: where the state lives (nvme | host)
  bool memory_only = false;       // --overlap --state host: persist_resident_state = false
  bool param16_in_place = false;  // --overlap: overlap_param16_in_place
  double backward_ms = 2000;
  bool keep = false;
  bool json = false;
};

// The sub-directories the bench creates under each --dir, removed at exit unless --keep.
struct Created {
  std::vector<std::filesystem::path> dirs;
  bool keep = false;
  ~Created() {
    if (keep) return;
    std::error_code ec;
    for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
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
    created.dirs.push_back(sc.dirs.back());
  }
  sc.capacity = round_up(capacity, 1ull << 20);
  return SwapSpace::create(sc);
}

// --overlap: ordinary vs overlapped step after the same simulated backward.
void run_overlap_bench(const StepOptions& o, TierManager& tiers, ShardedOptimizer& opt,
                       const std::vector<ParamId>& ids, const std::vector<std::uint16_t>& grad,
                       std::uint64_t n) {
  if (!(o.backward_ms >= 0)) throw std::invalid_argument("--backward-ms: must be >= 0");
  // The backward: parameter i's gradient arrives at (i + 1) / P of its length.
  auto backward = [&] {
    const auto t0 = Clock::now();
    const auto len = std::chrono::duration<double, std::milli>(o.backward_ms);
    opt.begin_backward();
    for (std::size_t i = 0; i < ids.size(); ++i) {
      std::this_thread::sleep_until(
          t0 + std::chrono::duration_cast<Clock::duration>(len * static_cast<double>(i + 1) /
                                                           static_cast<double>(ids.size())));
      opt.add_grad(ids[i], grad.data(), Dtype::bf16);
    }
    opt.end_backward();
    return since(t0);
  };
  // One backward + step: its backward's length, the step's result and the NVMe bytes written
  // over both (the overlapped mode writes during the backward).
  auto cycle = [&](bool overlap) {
    opt.set_overlap(overlap);
    const std::uint64_t w0 = tiers.counters().bytes_in[static_cast<int>(Tier::nvme)];
    const double b = backward();
    const StepResult r = opt.step();
    return std::tuple{b, r, tiers.counters().bytes_in[static_cast<int>(Tier::nvme)] - w0};
  };
  if (!o.json)
    fmt::print(
        "tierswap bench step --overlap: {} params ({}), sub-group {} params ({} sub-groups), "
        "simulated backward {:.0f} ms, host budget {}, state on {}{}{}\n",
        n, o.optimizer, round_up(parse_param_count(o.sub_group, "--sub-group"), kGradStatsChunk),
        opt.subgroup_count(), o.backward_ms, o.host_budget, o.state,
        o.state == "host" ? (o.memory_only ? " (memory-only)" : " (persisted to NVMe each step)")
                          : "",
        o.param16_in_place ? ", speculative 16-bit output in place" : "");
  cycle(false);  // warm-up: every block has data on NVMe
  cycle(true);
  std::vector<double> ord, ovl, hidden, bwd;
  nlohmann::json runs = nlohmann::json::array();
  for (int r = 0; r < o.runs; ++r) {
    double t_ord = 0, t_ovl = 0, b_ovl = 0;
    std::uint32_t kept = 0;
    std::uint64_t nvme_written = 0;  // by the overlapped cycle
    for (int k = 0; k < 2; ++k) {
      const bool overlap = (r + k) % 2 == 1;
      const auto [b, res, written] = cycle(overlap);
      if (res.redone || res.skipped)
        throw std::runtime_error("bench step --overlap: a step was redone or skipped");
      if (overlap) {
        t_ovl = res.seconds;
        b_ovl = b;
        kept = res.overlapped_subgroups;
        nvme_written = written;
      } else {
        t_ord = res.seconds;
      }
    }
    ord.push_back(t_ord);
    ovl.push_back(t_ovl);
    bwd.push_back(b_ovl);
    hidden.push_back(1.0 - t_ovl / t_ord);
    runs.push_back({{"backward_s", b_ovl},
                    {"ordinary_step_s", t_ord},
                    {"overlapped_step_s", t_ovl},
                    {"overlapped_subgroups", kept},
                    {"nvme_write_bytes", nvme_written},
                    {"hidden_fraction", hidden.back()}});
    if (!o.json)
      fmt::print(
          "run {}: ordinary step {:.3f} s; overlapped: backward {:.3f} s, then step {:.3f} s "
          "({} of {} sub-groups stepped during the backward, {} written to NVMe): {:.0f}% of "
          "the step hidden\n",
          r + 1, t_ord, b_ovl, t_ovl, kept, opt.subgroup_count(), format_bytes(nvme_written),
          100 * hidden.back());
  }
  nlohmann::json j{{"params", n},
                   {"optimizer", o.optimizer},
                   {"sub_group", round_up(parse_param_count(o.sub_group, "--sub-group"), kGradStatsChunk)},
                   {"subgroups", opt.subgroup_count()},
                   {"backward_ms", o.backward_ms},
                   {"state", o.state},
                   {"memory_only", o.memory_only},
                   {"param16_in_place", o.param16_in_place},
                   {"runs", runs},
                   {"backward_s", median(bwd)},
                   {"ordinary_step_s", median(ord)},
                   {"overlapped_step_s", median(ovl)},
                   {"hidden_fraction", median(hidden)}};
  if (o.json)
    fmt::print("{}\n", j.dump(2));
  else
    fmt::print(
        "median: ordinary step {:.3f} s, overlapped step after the backward {:.3f} s: {:.0f}% of "
        "the step hidden behind a {:.0f} ms backward (median of per-run ratios)\n",
        median(ord), median(ovl), 100 * median(hidden), o.backward_ms);
}

void run_step_bench(const StepOptions& o) {
  const std::uint64_t n = parse_param_count(o.params, "--params");
  const std::uint64_t budget = parse_size(o.host_budget, "--host-budget");
  const std::uint64_t sg = parse_param_count(o.sub_group, "--sub-group");
  const OptimizerKind kind = parse_optimizer_kind(o.optimizer);
  if (kind != OptimizerKind::adamw && kind != OptimizerKind::lion)
    throw std::invalid_argument("--optimizer: adamw or lion");
  const Tier grad_tier = parse_tier(o.grad_tier);
  if (grad_tier == Tier::device) throw std::invalid_argument("--grad-tier: host or nvme");
  if (n < 8192) throw std::invalid_argument("--params: at least 8K");
  if (o.runs < 1) throw std::invalid_argument("--runs: at least 1");
  const int moments = kind == OptimizerKind::adamw ? 2 : 1;
  const std::uint64_t state_pp = 4ull * (1 + moments);  // bytes per parameter of state

  std::unique_ptr<TempDir> temp;
  std::vector<std::filesystem::path> dirs(o.dirs.begin(), o.dirs.end());
  if (dirs.empty()) {
    temp = std::make_unique<TempDir>("tierswap-bench-step");
    dirs = {temp->path};
  }
  ThreadPool pool(o.threads);
  Created created;
  created.keep = o.keep;

  // (b) tierswap.
  SwapSpace space =
      make_space(dirs, "tierswap", 2 * n * state_pp + 2 * n * 2 + (256ull << 20), created);
  IoEngine engine(space, IoEngineConfig::from_env());
  TierConfig tc;
  tc.host_budget = budget;
  tc.device_mode = DeviceTierMode::off;
  tc.durable = o.keep;
  tc.telemetry = o.keep;
  {  // slabs, write-behind and prefetches in flight as the one-object setup tunes them
    OptimizerConfig reads;
    reads.subgroup_size = sg;
    reads.prefetch_depth = o.prefetch_depth;
    tune_tier_config(tc, reads, 1 + moments);
  }
  TierManager tiers(space, engine, tc);
  auto comm = make_single_communicator();
  OptimizerConfig oc;
  oc.subgroup_size = sg;
  oc.state_tier = OptimizerConfig::StateTier::nvme;
  if (o.memory_only && o.state != "host")
    throw std::invalid_argument(
        "--memory-only needs --state host (NVMe state is never memory-only)");
  if (o.state == "host") oc.state_tier = OptimizerConfig::StateTier::host;
  oc.persist_resident_state = !o.memory_only;
  oc.overlap = o.overlap;  // at finalize: memory-only sub-groups get undo copies where they fit
  oc.overlap_param16_in_place = o.param16_in_place;
  oc.grad_tier = grad_tier;
  oc.prefetch_depth = o.prefetch_depth;
  ShardedOptimizer opt(tiers, *comm, oc, &pool);
  GroupConfig gc = GroupConfig::defaults(kind);
  opt.add_group(gc, "all");
  std::vector<ParamId> ids;
  // Parameters of at most 64M elements; for --overlap one sub-group each, so that the simulated
  // backward finishes sub-groups one by one.
  const std::uint64_t per = o.overlap ? round_up(sg, kGradStatsChunk) : std::uint64_t{64} << 20;
  for (std::uint64_t off = 0; off < n; off += per)
    ids.push_back(opt.add_param(0, {fmt::format("layer{}", ids.size()),
                                    {static_cast<std::int64_t>(std::min(per, n - off))},
                                    Dtype::bf16,
                                    true}));
  opt.finalize();
  opt.initialize([](ParamId, std::uint64_t off, float* out, std::uint64_t k) {
    for (std::uint64_t i = 0; i < k; ++i) out[i] = 0.01f * static_cast<float>((off + i) % 101);
  });
  std::vector<std::uint16_t> grad(std::min(n, per));
  for (std::size_t i = 0; i < grad.size(); ++i)
    grad[i] = float_to_bf16(1e-3f * static_cast<float>(static_cast<int>(i % 17) - 8));
  auto ingest = [&] {
    opt.begin_backward();
    for (ParamId id : ids) opt.add_grad(id, grad.data(), Dtype::bf16);
    opt.end_backward();
  };
  if (o.overlap) {
    run_overlap_bench(o, tiers, opt, ids, grad, n);
    return;
  }

  // (c) ZeRO-Infinity's traffic: state blocks plus an fp32 gradient block per sub-group.
  SwapSpace zspace =
      make_space(dirs, "zero-infinity", 2 * n * (state_pp + 4) + (256ull << 20), created);
  IoEngine zengine(zspace, IoEngineConfig::from_env());
  TierConfig ztc = tc;
  ztc.durable = false;
  ztc.telemetry = false;
  TierManager ztiers(zspace, zengine, ztc);
  struct ZSub {
    BlockId p, m, v, g;
    std::uint64_t off, n;
  };
  std::vector<ZSub> zsubs;
  const std::uint64_t sgr = round_up(sg, kGradStatsChunk);
  for (std::uint64_t off = 0; off < n; off += sgr) {
    const std::uint64_t k = std::min(sgr, n - off);
    auto mk = [&](const char* what, BlockClass c) {
      BlockDesc d;
      d.name = fmt::format("zi.{}.{}", zsubs.size(), what);
      d.cls = c;
      d.numel = k;
      return ztiers.create(d);
    };
    ZSub z{mk("master", BlockClass::master),
           mk("exp_avg", BlockClass::exp_avg),
           moments == 2 ? mk("exp_avg_sq", BlockClass::exp_avg_sq) : kNone,
           mk("grad32", BlockClass::other),
           off,
           k};
    zsubs.push_back(z);
    BlockView v = ztiers.acquire(z.p, Tier::host, Access::overwrite);
    auto* f = reinterpret_cast<float*>(v.data());
    for (std::uint64_t i = 0; i < k; ++i) f[i] = 0.01f * static_cast<float>((off + i) % 101);
    ztiers.release(v, true);
    ztiers.write_back(z.p);
  }
  ztiers.commit();
  std::vector<std::uint16_t> p16(std::min(n, sgr));
  std::int64_t zstep = 0;
  auto zero_infinity_step = [&] {
    const auto t0 = Clock::now();
    // The accumulation boundary: the fp32 gradient goes to NVMe.
    for (const ZSub& z : zsubs) {
      BlockView v = ztiers.acquire(z.g, Tier::host, Access::overwrite);
      cast(grad.data() + (z.off % per), Dtype::bf16, v.data(), Dtype::f32, z.n,
           {default_cpu_isa(), &pool});
      ztiers.release(v, true);
      ztiers.write_back(z.g);
    }
    // The step: read state and fp32 gradient ahead, fused kernel on fp32 gradients, write behind.
    ++zstep;
    auto pre = [&](std::size_t k) {
      if (k >= zsubs.size()) return;
      for (BlockId b : {zsubs[k].p, zsubs[k].m, zsubs[k].v, zsubs[k].g})
        if (b != kNone) ztiers.prefetch(b, Tier::host);
    };
    for (std::size_t k = 0; k <= oc.prefetch_depth; ++k) pre(k);
    for (std::size_t k = 0; k < zsubs.size(); ++k) {
      pre(k + oc.prefetch_depth + 1);
      const ZSub& z = zsubs[k];
      {
        BlockView p = ztiers.acquire(z.p, Tier::host, Access::write);
        BlockView m = ztiers.acquire(z.m, Tier::host, Access::write);
        BlockView v;
        if (z.v != kNone) v = ztiers.acquire(z.v, Tier::host, Access::write);
        BlockView g = ztiers.acquire(z.g, Tier::host);
        const GradView gv{g.data(), Dtype::f32, 1.0f};
        const Param16View pv{p16.data(), Dtype::bf16};
        CpuKernelContext ctx{default_cpu_isa(), &pool};
        if (kind == OptimizerKind::adamw)
          adam_step(AdamConfig{}, zstep,
                    {reinterpret_cast<float*>(p.data()), m.data(), v.data(), nullptr, Dtype::f32},
                    gv, pv, z.n, ctx);
        else
          lion_step(LionConfig{}, reinterpret_cast<float*>(p.data()), m.data(), Dtype::f32, gv, pv,
                    z.n, ctx);
        ztiers.release(p, true);
        ztiers.release(m, true);
        if (v) ztiers.release(v, true);
      }
      ztiers.trim(z.g);  // consumed (ZeRO-Infinity overwrites it at the next boundary)
      for (BlockId b : {z.p, z.m, z.v})
        if (b != kNone) ztiers.write_back(b);
    }
    ztiers.commit();
    return since(t0);
  };

  // (a) io-only: the same bytes through the engine alone.
  const std::uint64_t blk = round_up(sgr * 4, 1ull << 20);
  const std::size_t nblk = zsubs.size() * (1 + moments);
  SwapSpace ispace = make_space(dirs, "io-only", 2 * nblk * blk + (64ull << 20), created);
  IoEngine iengine(ispace, IoEngineConfig::from_env());
  // Its buffers: the pinned memory the step has for state, the host budget less the gradients
  // waiting in it (both passes run under the same budget), at least two sub-groups' worth.
  const std::uint64_t grad_host = grad_tier == Tier::host ? n * 2 : 0;
  const std::size_t slots =
      std::max<std::size_t>(2 * (1 + moments), (budget > grad_host ? budget - grad_host : 0) / blk);
  AlignedBuffer ring(slots * blk);
  iengine.register_buffer(ring.data(), ring.size());
  // Two regions, read from one and written to the other, alternating per pass; region 0 is
  // written first, so no pass reads an unwritten extent (the filesystem would return zeros without
  // touching the disk).
  int flip = 0;
  for (std::size_t b = 0; b < nblk; ++b) {
    std::memset(ring.data(), static_cast<int>(b), blk);
    iengine.write(b * blk, ring.data(), zsubs[b / (1 + moments)].n * 4).wait();
  }
  auto io_only = [&] {
    const std::uint64_t from = flip * nblk * blk, to = (1 - flip) * nblk * blk;
    flip ^= 1;
    const auto t0 = Clock::now();
    std::vector<std::optional<IoTicket>> rd(slots), wr(slots);
    std::size_t issued = 0;
    auto issue = [&](std::size_t b) {
      const std::size_t s = b % slots;
      if (wr[s]) wr[s]->wait(), wr[s].reset();
      rd[s] = iengine.read(from + b * blk, ring.data() + s * blk, zsubs[b / (1 + moments)].n * 4);
    };
    const std::size_t ahead = slots - (1 + moments);  // the rest holds writes in flight
    for (std::size_t b = 0; b < nblk; ++b) {
      while (issued < nblk && issued < b + ahead) issue(issued++);
      const std::size_t s = b % slots;
      rd[s]->wait();
      rd[s].reset();
      wr[s] = iengine.write(to + b * blk, ring.data() + s * blk, zsubs[b / (1 + moments)].n * 4);
    }
    for (auto& w : wr)
      if (w) w->wait();
    return since(t0);
  };

  if (!o.json)
    fmt::print(
        "tierswap bench step: {} params ({}), {} of state on NVMe ({}), host budget {}, "
        "sub-group {} params, gradients on {}\n",
        n, o.optimizer, format_bytes(n * state_pp), dirs.front().string(), format_bytes(budget),
        sgr, o.grad_tier);
  // Warm-up: every block has data on NVMe afterwards.
  ingest();
  opt.step();
  zero_infinity_step();
  io_only();
  std::vector<double> ts, zs, is, ins, r_step_io, r_zi_step;  // times; ratios within each run
  nlohmann::json runs = nlohmann::json::array();
  StepResult last;
  TierCounters cycle0, cycle1;  // around the last run's ingest + step
  for (int r = 0; r < o.runs; ++r) {
    double t = 0, z = 0, i = 0, i_s = 0;
    for (int k = 0; k < 3; ++k) {
      switch ((r + k) % 3) {
        case 0: {
          cycle0 = tiers.counters();
          const auto t_in = Clock::now();
          ingest();
          i_s = since(t_in);
          last = opt.step();
          cycle1 = tiers.counters();
          t = last.seconds;
          break;
        }
        case 1:
          z = zero_infinity_step();
          break;
        case 2:
          i = io_only();
          break;
      }
    }
    ts.push_back(t);
    ins.push_back(i_s);
    zs.push_back(z);
    is.push_back(i);
    runs.push_back({{"io_only_s", i},
                    {"step_s", t},
                    {"ingest_s", i_s},
                    {"zero_infinity_step_s", z},
                    {"step_over_io_only", t / i},
                    {"zero_infinity_over_step", z / t}});
    r_step_io.push_back(t / i);
    r_zi_step.push_back(z / t);
    if (!o.json)
      fmt::print(
          "run {}: io-only {:.3f} s, tierswap step {:.3f} s, zero-infinity traffic {:.3f} s\n",
          r + 1, i, t, z);
  }
  const int nv = static_cast<int>(Tier::nvme);
  // Per parameter over a whole cycle (gradient ingest, which spills with --grad-tier nvme, and
  // the step).
  const double rd =
      static_cast<double>(cycle1.bytes_out[nv] - cycle0.bytes_out[nv]) / static_cast<double>(n);
  const double wr =
      static_cast<double>(cycle1.bytes_in[nv] - cycle0.bytes_in[nv]) / static_cast<double>(n);
  const TierCounters c = tiers.counters();
  const double io_s = median(is), step_s = median(ts), zi_s = median(zs);
  const double grad_nvme = rd + wr - 2.0 * static_cast<double>(state_pp);
  nlohmann::json j{{"params", n},
                   {"optimizer", o.optimizer},
                   {"grad_tier", o.grad_tier},
                   {"sub_group", sgr},
                   {"runs", runs},
                   {"io_only_s", io_s},
                   {"step_s", step_s},
                   {"ingest_s", median(ins)},
                   {"zero_infinity_step_s", zi_s},
                   {"step_over_io_only", step_s / io_s},
                   {"zero_infinity_over_step", zi_s / step_s},
                   {"median_run_step_over_io_only", median(r_step_io)},
                   {"median_run_zero_infinity_over_step", median(r_zi_step)},
                   {"nvme_read_bytes_per_param", rd},
                   {"nvme_write_bytes_per_param", wr},
                   {"grad_nvme_bytes_per_param", grad_nvme},
                   {"fp32_grad_bytes", 0},
                   {"step_nvme_gbps", (last.bytes_in[nv] + last.bytes_out[nv]) / step_s / 1e9},
                   {"io_wait_s", last.io_wait_seconds},
                   {"peak_pinned_bytes", c.peak_reserved_bytes[static_cast<int>(Tier::host)]},
                   {"host_budget_bytes", budget},
                   {"state_bytes", n * state_pp}};
  if (o.json) {
    fmt::print("{}\n", j.dump(2));
  } else {
    fmt::print(
        "median: io-only {:.3f} s, step {:.3f} s ({:.2f}x io-only), zero-infinity traffic {:.3f} s "
        "({:.2f}x the step); median of the per-run ratios: {:.2f}x io-only, zero-infinity {:.2f}x"
        "\nNVMe per parameter per step: {:.1f} B read, {:.1f} B written ({:.1f} B "
        "of it gradient, 0 fp32); peak pinned {} of a {} budget ({} of state)\n",
        io_s, step_s, step_s / io_s, zi_s, zi_s / step_s, median(r_step_io), median(r_zi_step), rd,
        wr, grad_nvme, format_bytes(c.peak_reserved_bytes[static_cast<int>(Tier::host)]),
        format_bytes(budget), format_bytes(n * state_pp));
  }
  if (o.keep) {
    if (temp) fmt::print(stderr, "kept the swap directory {}\n", temp->keep().string());
    fmt::print(stderr, "inspect: tierswap residency --swap-dir {}\n",
               (dirs.front() / "tierswap").string());
  }
}

}  // namespace

void add_bench_step(CLI::App& bench) {
  auto o = std::make_shared<StepOptions>();
  auto* b = bench.add_subcommand(
      "step",
      "Optimizer step on NVMe-resident state vs an I/O-only pass and ZeRO-Infinity traffic");
  b->add_option("--dir", o->dirs, "Swap directory (repeat to stripe; default: a temporary one)");
  b->add_option("--params", o->params, kParamsHelp);
  b->add_option("--host-budget", o->host_budget, "Pinned host bytes");
  b->add_option("--sub-group", o->sub_group, "Parameters per sub-group (decimal suffixes, as --params)");
  b->add_option("--optimizer", o->optimizer, "adamw | lion");
  b->add_option("--grad-tier", o->grad_tier, "Where the bf16 gradients wait: host | nvme");
  b->add_option("--runs", o->runs, "Repetitions (medians reported)");
  b->add_option("--prefetch-depth", o->prefetch_depth, "Sub-groups whose state is read ahead");
  b->add_option("--threads", o->threads, "Kernel threads");
  auto* overlap = b->add_flag(
      "--overlap", o->overlap,
      "Ordinary vs overlapped step after a simulated backward (how much of the step hides)");
  b->add_option("--state", o->state,
                "--overlap: where the optimizer state lives: nvme (default) | host")
      ->check(CLI::IsMember({"nvme", "host"}))
      ->needs(overlap);
  b->add_flag("--memory-only", o->memory_only,
              "--overlap --state host: memory-only resident state (undo copies where the host "
              "budget holds them)")
      ->needs(overlap);
  b->add_flag("--param16-in-place", o->param16_in_place,
              "--overlap: speculative steps write the 16-bit parameters in place "
              "(OptimizerConfig::overlap_param16_in_place; no copy after the verdict)")
      ->needs(overlap);
  b->add_option("--backward-ms", o->backward_ms,
                "--overlap: length of the simulated backward in milliseconds");
  b->add_flag("--keep", o->keep,
              "Durable mode (fsync'd manifest every step); keep the swap directory");
  b->add_flag("--json", o->json, "Print JSON on stdout instead of text");
  b->callback([o] { run_step_bench(*o); });
}

}  // namespace tierswap::cli
