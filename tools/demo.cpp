// `tierswap demo`: the embedded default main job. A synthetic model's optimizer state (fp32
// master, exp_avg, exp_avg_sq and bf16 grad/param blocks per sub-group) lives on the tiers of a
// temporary swap directory, with host and (simulated, without a GPU) device budgets smaller than
// the state. Each step streams the sub-groups (prefetch ahead, fused AdamW, write-behind), copies
// the bf16 parameters to the device tier and commits a generation; then it prints the residency
// tables. The process serves telemetry meanwhile (`tierswap ps`, `tierswap residency PID`).
//
// `tierswap bench tier`: prefetch effectiveness. N blocks larger than the host budget are
// streamed with look-ahead 2 (prefetch i+1, i+2; acquire i) and compared, in the same run, with
// the engine reading the same bytes directly at the same request size and depth.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tierswap/aligned_buffer.hpp"
#include "tierswap/io_engine.hpp"
#include "tierswap/kernels.hpp"
#include "tierswap/swap_space.hpp"
#include "tierswap/thread_pool.hpp"
#include "tierswap/tier_manager.hpp"
#include "tierswap/units.hpp"
#include "tools/commands.hpp"
#include "tools/temp_dir.hpp"

#include <fmt/format.h>

namespace tierswap::cli {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct DemoOptions {
  std::string dir;
  std::string params = "16M";
  int subgroups = 8;
  int steps = 3;
  std::string host_budget;    // default: a quarter of the state
  std::string device_budget;  // default: two sub-groups' bf16 parameters
  unsigned threads = 2;
  double hold = 0;
  bool json = false;
};

void run_demo(const DemoOptions& o) {
  const std::uint64_t params = parse_size(o.params, "--params");
  if (params < 1024) throw std::invalid_argument("--params: at least 1K parameters");
  if (o.subgroups < 1 || static_cast<std::uint64_t>(o.subgroups) > params)
    throw std::invalid_argument("--subgroups: must be in 1..params");
  if (o.steps < 1) throw std::invalid_argument("--steps: must be >= 1");
  const std::uint64_t per = (params + o.subgroups - 1) / o.subgroups;
  const std::uint64_t state = params * (4 + 4 + 4 + 2 + 2);
  std::unique_ptr<TempDir> temp;
  std::filesystem::path dir = o.dir;
  if (dir.empty()) {
    temp = std::make_unique<TempDir>("tierswap-demo");
    dir = temp->path;
  }
  SwapSpaceConfig sc;
  sc.dirs = {dir};
  sc.capacity = round_up(2 * state + (64ull << 20), 1ull << 20);  // shadow slots, margin
  bool created = false;
  SwapSpace space = SwapSpace::open_or_create(sc, &created);
  IoEngine engine(space);
  TierConfig tc = TierConfig::from_env();
  tc.host_budget = o.host_budget.empty() ? std::max<std::uint64_t>(state / 4, 8 * per * 4)
                                         : parse_size(o.host_budget, "--host-budget");
  tc.host_slab_size = round_up(per * 4, 4096);
  tc.device_budget = o.device_budget.empty() ? round_up(2 * per * 2, 4096)
                                             : parse_size(o.device_budget, "--device-budget");
  tc.max_dirty_bytes = 2 * per * 4;
  tc.lookahead = 3;
  TierManager m(space, engine, tc);
  if (!o.json)
    fmt::print(
        "tierswap demo: {} params in {} sub-groups, {} of state on {} (swap {}), host budget {}, "
        "{} device tier {}; telemetry {}\n",
        params, o.subgroups, format_bytes(state), dir.string(), format_bytes(space.capacity()),
        format_bytes(tc.host_budget), m.snapshot().simulated_device ? "simulated" : "GPU",
        format_bytes(tc.device_budget),
        m.telemetry_socket().empty() ? std::string("off") : m.telemetry_socket().string());

  struct Sub {
    BlockId master, m, v, grad, p16;
    std::uint64_t n;
  };
  std::vector<Sub> subs;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int i = 0; i < o.subgroups; ++i) {
    const std::uint64_t n = std::min(per, params - per * static_cast<std::uint64_t>(i));
    auto mk = [&](const char* what, BlockClass c, Dtype d) {
      const std::string name = fmt::format("sg{}.{}", i, what);
      if (auto id = m.find(name)) return *id;
      BlockDesc b;
      b.name = name;
      b.cls = c;
      b.dtype = d;
      b.numel = n;
      b.owner = {0, 0, i};
      return m.create(b);
    };
    Sub s{mk("master", BlockClass::master, Dtype::f32),
          mk("exp_avg", BlockClass::exp_avg, Dtype::f32),
          mk("exp_avg_sq", BlockClass::exp_avg_sq, Dtype::f32),
          mk("grad", BlockClass::grad16, Dtype::bf16),
          mk("param16", BlockClass::param16, Dtype::bf16),
          n};
    subs.push_back(s);
    if (m.committed_generation() == 0) {  // a fresh model: random weights and gradients
      BlockView p = m.acquire(s.master, Tier::host, Access::write);
      auto* pf = reinterpret_cast<float*>(p.data());
      for (std::uint64_t k = 0; k < n; ++k) pf[k] = 0.02f * nd(rng);
      m.release(p, true);
      BlockView g = m.acquire(s.grad, Tier::host, Access::write);
      auto* gh = reinterpret_cast<std::uint16_t*>(g.data());
      for (std::uint64_t k = 0; k < n; ++k) gh[k] = float_to_bf16(0.001f * nd(rng));
      m.release(g, true);
    }
  }
  if (m.committed_generation() == 0) m.commit();

  ThreadPool pool(o.threads);
  CpuKernelContext ctx{default_cpu_isa(), &pool};
  AdamConfig adam;
  adam.weight_decay = 0.01;
  nlohmann::json steps = nlohmann::json::array();
  for (int step = 1; step <= o.steps; ++step) {
    const auto t0 = Clock::now();
    const auto c0 = m.counters();
    for (std::size_t i = 0; i < subs.size(); ++i) {
      for (std::size_t k = i + 1; k < std::min(subs.size(), i + 2); ++k)
        for (BlockId id : {subs[k].master, subs[k].m, subs[k].v}) m.prefetch(id, Tier::host);
      const Sub& s = subs[i];
      BlockView p = m.acquire(s.master, Tier::host, Access::write);
      BlockView mm = m.acquire(s.m, Tier::host, Access::write);
      BlockView vv = m.acquire(s.v, Tier::host, Access::write);
      BlockView g = m.acquire(s.grad, Tier::host);
      BlockView p16 = m.acquire(s.p16, Tier::host, Access::overwrite);  // output only
      adam_step(adam, static_cast<std::int64_t>(m.committed_generation()),
                {reinterpret_cast<float*>(p.data()), mm.data(), vv.data(), nullptr, Dtype::f32},
                {g.data(), Dtype::bf16, 1.0f}, {p16.data(), Dtype::bf16}, s.n, ctx);
      m.release(p, true);
      m.release(mm, true);
      m.release(vv, true);
      m.release(p16, true);
      g = BlockView();
      // The 16-bit parameters go "up" to the device tier, as they would to the GPU.
      BlockView up = m.acquire(s.p16, Tier::device);
    }
    const std::uint64_t gen = m.commit();
    const auto c1 = m.counters();
    const double secs = since(t0);
    const int nv = static_cast<int>(Tier::nvme);
    const std::uint64_t rd = c1.bytes_out[nv] - c0.bytes_out[nv];
    const std::uint64_t wr = c1.bytes_in[nv] - c0.bytes_in[nv];
    steps.push_back({{"step", step},
                     {"generation", gen},
                     {"seconds", secs},
                     {"nvme_read_bytes", rd},
                     {"nvme_written_bytes", wr}});
    if (!o.json)
      fmt::print("step {}: {:.2f} s, NVMe read {} written {}, committed generation {}\n", step,
                 secs, format_bytes(rd), format_bytes(wr), gen);
  }
  const std::string snap = m.snapshot().to_json();
  if (o.json) {
    fmt::print(
        "{}\n",
        nlohmann::json{{"steps", steps}, {"residency", nlohmann::json::parse(snap)}}.dump(2));
  } else {
    fmt::print("\n");
    print_residency(snap, stdout);
  }
  if (o.hold > 0) {
    if (!o.json)
      fmt::print("\nholding for {} s: try `tierswap ps` and `tierswap residency {}`\n", o.hold,
                 ::getpid());
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::duration<double>(o.hold));
  }
}

struct TierBenchOptions {
  std::string dir;
  std::string block_bytes = "64MiB";
  int blocks = 24;
  int host_blocks = 4;
  std::uint32_t lookahead = 2;
  int runs = 3;
  bool json = false;
};

void run_tier_bench(const TierBenchOptions& o) {
  const std::uint64_t bb = parse_size(o.block_bytes, "--block-bytes");
  if (bb < 4096 || bb % 4096 != 0)
    throw std::invalid_argument("--block-bytes: a multiple of 4 KiB");
  if (o.blocks < 4 || o.host_blocks < 3 || o.host_blocks >= o.blocks)
    throw std::invalid_argument(
        "--blocks >= 4 and 3 <= --host-blocks < --blocks (the stream must not fit the budget)");
  std::unique_ptr<TempDir> temp;
  std::filesystem::path dir = o.dir;
  if (dir.empty()) {
    temp = std::make_unique<TempDir>("tierswap-bench-tier");
    dir = temp->path;
  }
  SwapSpaceConfig sc;
  sc.dirs = {dir};
  sc.capacity = bb * static_cast<std::uint64_t>(o.blocks) + (16ull << 20);
  SwapSpace space = SwapSpace::create(sc);
  IoEngine engine(space);
  TierConfig tc;
  tc.host_budget = bb * static_cast<std::uint64_t>(o.host_blocks);
  tc.host_slab_size = bb;
  tc.lookahead = o.lookahead;
  tc.device_mode = DeviceTierMode::off;
  tc.telemetry = false;
  tc.durable = false;
  tc.shadow_slots = false;  // one extent per block: block i is [i, i + 1) x block bytes
  TierManager m(space, engine, tc);
  std::vector<BlockId> ids;
  for (int i = 0; i < o.blocks; ++i) {
    BlockDesc d;
    d.name = fmt::format("stream{}", i);
    d.numel = bb / 4;
    ids.push_back(m.create(d));
    BlockView v = m.acquire(ids.back(), Tier::host, Access::write);
    std::memset(v.data(), i, v.bytes());
    m.release(v, true);
  }
  m.commit();
  for (BlockId id : ids) m.evict(id, Tier::host);
  // The reference: the engine reading the same committed extents, as `bench io` does (one ticket
  // per block, depth and request size from the engine config), into a ring of host buffers.
  AlignedBuffer ring(bb * 2);
  engine.register_buffer(ring.data(), ring.size());
  nlohmann::json runs = nlohmann::json::array();
  std::vector<double> ratios;
  for (int r = 0; r < o.runs; ++r) {
    // Tier manager stream: look-ahead prefetch, acquire, release; evicted afterwards.
    const std::uint64_t total = bb * ids.size();
    TierCounters c0, c1;
    auto tier_stream = [&] {
      c0 = m.counters();
      const auto t0 = Clock::now();
      for (std::uint32_t k = 0; k < o.lookahead && k < ids.size(); ++k)
        m.prefetch(ids[k], Tier::host);
      for (std::size_t i = 0; i < ids.size(); ++i) {
        if (i + o.lookahead < ids.size()) m.prefetch(ids[i + o.lookahead], Tier::host);
        BlockView v = m.acquire(ids[i], Tier::host);
      }
      const double s = since(t0);
      c1 = m.counters();
      for (BlockId id : ids) m.evict(id, Tier::host);
      return s;
    };
    // The engine alone over the same extents, two blocks in flight as the stream has.
    auto engine_stream = [&] {
      const auto t0 = Clock::now();
      std::vector<IoTicket> tickets;
      for (std::uint64_t off = 0; off < total; off += bb) {
        tickets.push_back(engine.read(off, ring.data() + ((off / bb) % 2) * bb, bb));
        if (tickets.size() == 2) {
          tickets.front().wait();
          tickets.erase(tickets.begin());
        }
      }
      for (auto& t : tickets) t.wait();
      return since(t0);
    };
    double tier_s = 0, io_s = 0;
    if (r % 2 == 0) {  // alternate who goes first
      tier_s = tier_stream();
      io_s = engine_stream();
    } else {
      io_s = engine_stream();
      tier_s = tier_stream();
    }
    const double tier_gbps = static_cast<double>(total) / tier_s / 1e9;
    const double io_gbps = static_cast<double>(total) / io_s / 1e9;
    ratios.push_back(tier_gbps / io_gbps);
    runs.push_back({{"tier_gbps", tier_gbps},
                    {"engine_gbps", io_gbps},
                    {"ratio", tier_gbps / io_gbps},
                    {"prefetch_hits", c1.prefetch_hits - c0.prefetch_hits},
                    {"prefetch_misses", c1.prefetch_misses - c0.prefetch_misses},
                    {"stall_seconds", c1.stall_seconds - c0.stall_seconds}});
    if (!o.json)
      fmt::print(
          "run {}: tier stream {:.3f} GB/s, engine {:.3f} GB/s, ratio {:.3f}; prefetch "
          "hits {} misses {}, stalled {:.3f} s\n",
          r + 1, tier_gbps, io_gbps, tier_gbps / io_gbps, c1.prefetch_hits - c0.prefetch_hits,
          c1.prefetch_misses - c0.prefetch_misses, c1.stall_seconds - c0.stall_seconds);
  }
  std::sort(ratios.begin(), ratios.end());
  const double med = ratios[ratios.size() / 2];
  if (o.json)
    fmt::print("{}\n", nlohmann::json{{"block_bytes", bb},
                                      {"blocks", o.blocks},
                                      {"host_budget", tc.host_budget},
                                      {"lookahead", o.lookahead},
                                      {"engine_block_size", engine.config().block_size},
                                      {"queue_depth", engine.config().queue_depth},
                                      {"runs", runs},
                                      {"median_ratio", med}}
                           .dump(2));
  else
    fmt::print("median tier-stream / engine ratio: {:.3f}\n", med);
}

}  // namespace

void add_demo(CLI::App& app) {
  auto o = std::make_shared<DemoOptions>();
  auto* d = app.add_subcommand(
      "demo", "Run a synthetic model's optimizer steps on the tiers and show the residency");
  d->add_option("--dir", o->dir, "Swap directory (default: a temporary one, removed at exit)");
  d->add_option("--params", o->params, "Parameters (suffixes K, M, G: powers of 1024)");
  d->add_option("--subgroups", o->subgroups, "Sub-groups");
  d->add_option("--steps", o->steps, "Optimizer steps");
  d->add_option("--host-budget", o->host_budget, "Pinned host bytes (default: state / 4)");
  d->add_option("--device-budget", o->device_budget, "Device tier bytes");
  d->add_option("--threads", o->threads, "Kernel threads");
  d->add_option("--hold", o->hold, "Keep serving telemetry this many seconds at the end");
  d->add_flag("--json", o->json, "Print JSON on stdout instead of text");
  d->callback([o] { run_demo(*o); });
}

void add_bench_tier(CLI::App& bench) {
  auto o = std::make_shared<TierBenchOptions>();
  auto* b = bench.add_subcommand(
      "tier", "Prefetch effectiveness: stream blocks larger than the host budget vs the engine");
  b->add_option("--dir", o->dir, "Swap directory (default: a temporary one)");
  b->add_option("--block-bytes", o->block_bytes, "Bytes per block");
  b->add_option("--blocks", o->blocks, "Blocks streamed");
  b->add_option("--host-blocks", o->host_blocks, "Host budget, in blocks");
  b->add_option("--lookahead", o->lookahead, "Prefetches in flight");
  b->add_option("--runs", o->runs, "Repetitions (median ratio reported)");
  b->add_flag("--json", o->json, "Print JSON on stdout instead of text");
  b->callback([o] { run_tier_bench(*o); });
}

}  // namespace tierswap::cli
