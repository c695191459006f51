// `tierswap bench tier`: prefetch effectiveness. N blocks larger than the host budget are
// streamed with look-ahead 2 (prefetch i+1, i+2; acquire i) and compared, in the same run, with
// the engine reading the same bytes directly at the same request size and depth.
#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tierswap/aligned_buffer.hpp"
#include "tierswap/io_engine.hpp"
#include "tierswap/swap_space.hpp"
#include "tierswap/tier_manager.hpp"
#include "tierswap/units.hpp"
#include "tools/commands.hpp"
#include "tools/temp_dir.hpp"
#include "tools/timing.hpp"

#include <fmt/format.h>

namespace tierswap::cli {
namespace {

struct TierBenchOptions {
  std::string dir;
  std::string block_bytes = "64MiB";
  int blocks = 24;
  int host_blocks = 4;
  std::uint32_t lookahead = 2;
  int runs = 3;
  bool json = false;
};

// `n` blocks of `bb` bytes, filled (block i with byte i), committed and evicted: a stream on NVMe.
std::vector<BlockId> make_stream(TierManager& m, int n, std::uint64_t bb) {
  std::vector<BlockId> ids;
  for (int i = 0; i < n; ++i) {
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
  return ids;
}

// The tier manager's stream: look-ahead prefetch, acquire, release; evicted afterwards (not
// timed). Seconds; *c0 and *c1 the counters around it.
double tier_stream(TierManager& m, const std::vector<BlockId>& ids, std::uint32_t lookahead,
                   TierCounters* c0, TierCounters* c1) {
  *c0 = m.counters();
  const auto t0 = Clock::now();
  for (std::uint32_t k = 0; k < lookahead && k < ids.size(); ++k) m.prefetch(ids[k], Tier::host);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i + lookahead < ids.size()) m.prefetch(ids[i + lookahead], Tier::host);
    BlockView v = m.acquire(ids[i], Tier::host);
  }
  const double s = since(t0);
  *c1 = m.counters();
  for (BlockId id : ids) m.evict(id, Tier::host);
  return s;
}

// The reference: the engine alone reading the same committed extents as `bench io` does (one
// ticket per block, depth and request size from the engine config), two blocks in flight as
// the stream has, into a ring of two host buffers. Seconds.
double engine_stream(IoEngine& engine, std::byte* ring, std::uint64_t total, std::uint64_t bb) {
  const auto t0 = Clock::now();
  std::vector<IoTicket> tickets;
  for (std::uint64_t off = 0; off < total; off += bb) {
    tickets.push_back(engine.read(off, ring + ((off / bb) % 2) * bb, bb));
    if (tickets.size() == 2) {
      tickets.front().wait();
      tickets.erase(tickets.begin());
    }
  }
  for (auto& t : tickets) t.wait();
  return since(t0);
}

TierConfig stream_tier_config(const TierBenchOptions& o, std::uint64_t bb) {
  TierConfig tc;
  tc.host_budget = bb * static_cast<std::uint64_t>(o.host_blocks);
  tc.host_slab_size = bb;
  tc.lookahead = o.lookahead;
  tc.device_mode = DeviceTierMode::off;
  tc.telemetry = false;
  tc.durable = false;
  tc.shadow_slots = false;  // one extent per block: block i is [i, i + 1) x block bytes
  return tc;
}

// One run: the tier manager's stream and the engine's alone over the same bytes, alternating
// who goes first.
nlohmann::json tier_run(const TierBenchOptions& o, int r, TierManager& m,
                        const std::vector<BlockId>& ids, IoEngine& engine, std::byte* ring,
                        std::uint64_t bb) {
  const std::uint64_t total = bb * ids.size();
  TierCounters c0, c1;
  double tier_s = 0, io_s = 0;
  if (r % 2 == 0) {
    tier_s = tier_stream(m, ids, o.lookahead, &c0, &c1);
    io_s = engine_stream(engine, ring, total, bb);
  } else {
    io_s = engine_stream(engine, ring, total, bb);
    tier_s = tier_stream(m, ids, o.lookahead, &c0, &c1);
  }
  const double tier_gbps = static_cast<double>(total) / tier_s / 1e9;
  const double io_gbps = static_cast<double>(total) / io_s / 1e9;
  const auto hits = c1.prefetch_hits - c0.prefetch_hits;
  const auto misses = c1.prefetch_misses - c0.prefetch_misses;
  const double stalled = c1.stall_seconds - c0.stall_seconds;
  if (!o.json)
    fmt::print(
        "run {}: tier stream {:.3f} GB/s, engine {:.3f} GB/s, ratio {:.3f}; prefetch "
        "hits {} misses {}, stalled {:.3f} s\n",
        r + 1, tier_gbps, io_gbps, tier_gbps / io_gbps, hits, misses, stalled);
  return {{"tier_gbps", tier_gbps}, {"engine_gbps", io_gbps},    {"ratio", tier_gbps / io_gbps},
          {"prefetch_hits", hits},  {"prefetch_misses", misses}, {"stall_seconds", stalled}};
}

void run_tier_bench(const TierBenchOptions& o) {
  const std::uint64_t bb = parse_size(o.block_bytes, "--block-bytes");
  if (bb < 4096 || bb % 4096 != 0)
    throw std::invalid_argument("--block-bytes: a multiple of 4 KiB");
  if (o.blocks < 4 || o.host_blocks < 3 || o.host_blocks >= o.blocks)
    throw std::invalid_argument(
        "--blocks >= 4 and 3 <= --host-blocks < --blocks (the stream must not fit the budget)");
  std::unique_ptr<TempDir> temp;
  SwapSpaceConfig sc;
  sc.dirs = {dir_or_temp(o.dir, "tierswap-bench-tier", temp)};
  sc.capacity = bb * static_cast<std::uint64_t>(o.blocks) + (16ull << 20);
  SwapSpace space = SwapSpace::create(sc);
  IoEngine engine(space, IoEngineConfig::from_env());
  const TierConfig tc = stream_tier_config(o, bb);
  TierManager m(space, engine, tc);
  const std::vector<BlockId> ids = make_stream(m, o.blocks, bb);
  AlignedBuffer ring(bb * 2);
  engine.register_buffer(ring.data(), ring.size());
  nlohmann::json runs = nlohmann::json::array();
  std::vector<double> ratios;
  for (int r = 0; r < o.runs; ++r) {
    runs.push_back(tier_run(o, r, m, ids, engine, ring.data(), bb));
    ratios.push_back(runs.back()["ratio"].get<double>());
  }
  std::sort(ratios.begin(), ratios.end());
  const double med = ratios[ratios.size() / 2];
  if (!o.json) {
    fmt::print("median tier-stream / engine ratio: {:.3f}\n", med);
    return;
  }
  fmt::print("{}\n", nlohmann::json{{"block_bytes", bb},
                                    {"blocks", o.blocks},
                                    {"host_budget", tc.host_budget},
                                    {"lookahead", o.lookahead},
                                    {"engine_block_size", engine.config().block_size},
                                    {"queue_depth", engine.config().queue_depth},
                                    {"runs", runs},
                                    {"median_ratio", med}}
                         .dump(2));
}

}  // namespace

void add_bench_tier(CLI::App& bench) {
  auto o = std::make_shared<TierBenchOptions>();
  auto* b = bench.add_subcommand(
      "tier", "Prefetch effectiveness: stream blocks larger than the host budget vs the engine");
  b->add_option("--dir", o->dir, "Swap directory (default: a temporary one)")
      ->check(CLI::ExistingDirectory);
  b->add_option("--block-bytes", o->block_bytes, "Bytes per block");
  b->add_option("--blocks", o->blocks, "Blocks streamed");
  b->add_option("--host-blocks", o->host_blocks, "Host budget, in blocks");
  b->add_option("--lookahead", o->lookahead, "Prefetches in flight");
  b->add_option("--runs", o->runs, "Repetitions (median ratio reported)");
  b->add_flag("--json", o->json, "Print JSON on stdout instead of text");
  b->callback([o] { run_tier_bench(*o); });
}

}  // namespace tierswap::cli
