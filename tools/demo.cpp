// `tierswap demo`: the embedded default main job. A synthetic transformer-like model (a few
// hundred million parameters by default, two parameter groups: weights with decay, biases and norm
// scales without) is trained for a few AdamW steps by the ShardedOptimizer with its state on the
// NVMe tier of a temporary swap directory, under a 1 GiB pinned host budget: every step ingests
// bf16 gradients, then streams the sub-groups (prefetch, fused kernel, write-behind) and commits
// a generation. Prints per-step figures (time, NVMe bytes per parameter, GB/s) and the residency
// tables; the process serves telemetry meanwhile (`tierswap ps`, `tierswap residency PID`).
//
// `tierswap bench tier`: prefetch effectiveness. N blocks larger than the host budget are
// streamed with look-ahead 2 (prefetch i+1, i+2; acquire i) and compared, in the same run, with
// the engine reading the same bytes directly at the same request size and depth.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tierswap/aligned_buffer.hpp"
#include "tierswap/communicator.hpp"
#include "tierswap/cuda_runtime.hpp"
#include "tierswap/io_engine.hpp"
#include "tierswap/kernels.hpp"
#include "tierswap/optimizer.hpp"
#include "tierswap/placement.hpp"
#include "tierswap/swap_space.hpp"
#include "tierswap/thread_pool.hpp"
#include "tierswap/tier_manager.hpp"
#include "tierswap/units.hpp"
#include "tools/commands.hpp"
#include "tools/temp_dir.hpp"
#include "tools/timing.hpp"

#include <fmt/format.h>

namespace tierswap::cli {
namespace {

struct DemoOptions {
  std::string dir;
  std::string params = "256M";
  std::string sub_group = "16M";
  int steps = 3;
  std::string host_budget = "1GiB";
  unsigned threads = 2;
  double hold = 0;
  bool json = false;
  std::string plan;              // a plan file (tierswap plan --out): per-sub-group placement
  bool overlap = false;          // sub-groups step during the (simulated) backward
  bool serial_gpu_step = false;  // a split plan's GPU part after the CPU's, not beside it
  double max_grad_norm = 1.0;
  std::string device_budget;  // empty: TIERSWAP_DEVICE_BUDGET, else sized for the plan's GPU state
};

// The device tier a plan with GPU sub-groups needs for the demo's model: their state (twice with
// overlap: undo copies) and gradients, one sub-group more for granularity, and the slab slack.
std::uint64_t device_budget_for(const Plan& plan, std::uint64_t params, std::uint64_t sub_group,
                                bool overlap) {
  std::uint64_t total = 0, gpu = 0;
  for (const auto& s : plan.subgroups) {
    total += s.numel;
    if (s.state_tier == Tier::device) gpu += s.numel;
  }
  if (gpu == 0 || total == 0) return 0;
  const auto on_gpu =
      static_cast<std::uint64_t>(static_cast<double>(params) * static_cast<double>(gpu) /
                                 static_cast<double>(total)) +
      sub_group;
  const std::uint64_t bytes = on_gpu * ((overlap ? 2 : 1) * 12 + 2);  // AdamW fp32 state, bf16 grad
  return round_up(bytes + bytes / 8 + 2 * kDeviceSlabSize, kDeviceSlabSize);
}

// The synthetic model: transformer-like layers of [h, 4h] and [4h, h] weights (the "decay"
// group) plus per-layer biases and norm scales ("no_decay"), h = 1024, as many layers as fit.
struct DemoParam {
  std::string name;
  std::int64_t rows, cols;
  int group;
};

std::vector<DemoParam> demo_model(std::uint64_t params) {
  const std::int64_t h = params >= (64u << 20) ? 1024 : 256;  // small models for tests
  const std::uint64_t per_layer = 2 * h * 4 * h + 4 * h + h + 2 * h;
  const std::uint64_t layers = std::max<std::uint64_t>(1, params / per_layer);
  std::vector<DemoParam> out;
  for (std::uint64_t l = 0; l < layers; ++l) {
    out.push_back({fmt::format("layer{}.up.weight", l), 4 * h, h, 0});
    out.push_back({fmt::format("layer{}.up.bias", l), 1, 4 * h, 1});
    out.push_back({fmt::format("layer{}.down.weight", l), h, 4 * h, 0});
    out.push_back({fmt::format("layer{}.down.bias", l), 1, h, 1});
    out.push_back({fmt::format("layer{}.norm.scale", l), 1, 2 * h, 1});
  }
  return out;
}

void run_demo(const DemoOptions& o) {
  const std::uint64_t want = parse_param_count(o.params, "--params");
  if (want < 1'000'000) throw std::invalid_argument("--params: at least 1M (10^6) parameters");
  if (o.steps < 1) throw std::invalid_argument("--steps: must be >= 1");
  const auto model = demo_model(want);
  std::uint64_t params = 0;
  for (const auto& p : model) params += static_cast<std::uint64_t>(p.rows * p.cols);
  const std::uint64_t state = params * 12;
  std::unique_ptr<TempDir> temp;
  const std::filesystem::path dir = dir_or_temp(o.dir, "tierswap-demo", temp);
  if (!o.dir.empty()) make_new_or_empty(dir, "--dir");
  SwapSpaceConfig sc;
  sc.dirs = {dir};
  sc.capacity = round_up(2 * state + 2 * params * 2 + (256ull << 20), 1ull << 20);
  SwapSpace space = SwapSpace::create(sc);
  IoEngine engine(space, IoEngineConfig::from_env());
  OptimizerConfig oc;
  oc.subgroup_size = parse_param_count(o.sub_group, "--sub-group");
  oc.state_tier = OptimizerConfig::StateTier::nvme;
  oc.max_grad_norm = o.max_grad_norm;
  oc.overlap = o.overlap;
  oc.concurrent_gpu_step = !o.serial_gpu_step;
  std::optional<Plan> plan;
  if (!o.plan.empty()) {  // the plan's placement, and the resident-state mode it was made for
    plan = Plan::load(o.plan);
    if (plan->persist_resident_state) oc.persist_resident_state = *plan->persist_resident_state;
  }
  TierConfig tc = TierConfig::from_env();
  tc.host_budget = parse_size(o.host_budget, "--host-budget");
  tc.host_slab_size = 64ull << 20;
  tc.lookahead = 9;
  // A device tier when the plan keeps state on the GPU (or one is asked for): GPU memory when a
  // GPU is usable, else a simulated one standing in (device_mode auto).
  if (!o.device_budget.empty())
    tc.device_budget = parse_size(o.device_budget, "--device-budget");
  else if (tc.device_budget == 0 && plan)
    tc.device_budget = device_budget_for(*plan, params, oc.subgroup_size, o.overlap);
  if (tc.device_budget == 0) tc.device_mode = DeviceTierMode::off;
  TierManager tiers(space, engine, tc);
  auto comm = make_single_communicator();
  ThreadPool pool(o.threads, tc.numa_node);  // step workers next to the pinned slabs
  ShardedOptimizer opt(tiers, *comm, oc, &pool);
  if (plan) opt.set_plan(*plan);
  GroupConfig decay;
  decay.lr = 3e-4;
  decay.weight_decay = 0.1;
  GroupConfig no_decay = decay;
  no_decay.weight_decay = 0.0;
  opt.add_group(decay, "decay");
  opt.add_group(no_decay, "no_decay");
  std::vector<ParamId> ids;
  for (const auto& p : model)
    ids.push_back(opt.add_param(p.group, {p.name, {p.rows, p.cols}, Dtype::bf16, true}));
  opt.finalize();
  if (!o.json)
    fmt::print(
        "tierswap demo: {} parameters ({} tensors, 2 groups), {} of AdamW state {} {}, "
        "host budget {}, {} sub-groups; telemetry {}\n",
        params, model.size(), format_bytes(state),
        o.plan.empty() ? "on NVMe at" : "placed by the plan, swap space at", dir.string(),
        format_bytes(tc.host_budget), opt.subgroup_count(),
        tiers.telemetry_socket().empty() ? std::string("off") : tiers.telemetry_socket().string());
  const auto t_init = Clock::now();
  opt.initialize([](ParamId id, std::uint64_t off, float* out, std::uint64_t n) {
    std::uint64_t x = (static_cast<std::uint64_t>(id) << 40) ^ off;
    for (std::uint64_t i = 0; i < n; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      out[i] = 0.02f * (static_cast<float>(x >> 40) * (1.0f / 16777216.0f) - 0.5f);
    }
  });
  if (!o.json) fmt::print("initialized in {:.2f} s\n", since(t_init));
  // Gradients: one random bf16 buffer, read at a different offset by every parameter and step.
  std::vector<std::uint16_t> noise((16u << 20) + 4096);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1e-3f);
  for (auto& v : noise) v = float_to_bf16(nd(rng));
  nlohmann::json steps = nlohmann::json::array();
  const int nv = static_cast<int>(Tier::nvme), hv = static_cast<int>(Tier::host),
            dv = static_cast<int>(Tier::device);
  // With GPU sub-groups the gradients come from the GPU, as a trainer's backward hands them over
  // (add_grad_device): from GPU memory, or on a simulated device tier from host memory standing
  // in for it.
  const DeviceTierMode device = tiers.device_tier();
  bool gpu_steps = false;
  for (std::size_t k = 0; k < opt.subgroup_count(); ++k) gpu_steps |= opt.placement(k).gpu_steps;
  const bool device_grads = device != DeviceTierMode::off && gpu_steps;
  // What the optimizer takes for device memory: GPU memory when a GPU is usable, else host memory
  // standing in for it (a simulated device tier).
  const bool gpu_ptrs = cuda::available();
  cuda::DeviceBuffer d_grad;  // on a GPU: the gradient handed over, in GPU memory
  auto hand_over = [&](ParamId id, const std::uint16_t* host, std::uint64_t n) {
    if (!device_grads) {
      opt.add_grad(id, host, Dtype::bf16);
    } else if (!gpu_ptrs) {
      opt.add_grad_device(id, host, Dtype::bf16, {});
    } else {  // the same values from GPU memory
      cuda::copy_to_device(d_grad.reserve(n * 2), host, n * 2, nullptr);
      cuda::synchronize(nullptr);
      opt.add_grad_device(id, d_grad.data(), Dtype::bf16, {});
    }
  };
  // And the trainer's device copy of the 16-bit parameters, kept by the optimizer
  // (bind_param16_device): one buffer, each parameter at its place in it.
  std::uint64_t n16 = 0;
  std::vector<std::uint64_t> at16;
  for (const ParamId id : ids) {
    at16.push_back(n16);
    n16 += opt.param(id).numel();
  }
  cuda::DeviceBuffer d16_gpu;
  std::vector<std::uint16_t> d16_host;  // standing in for GPU memory
  std::uint16_t* d16 = nullptr;
  if (device_grads) {
    if (gpu_ptrs) {
      d16 = static_cast<std::uint16_t*>(d16_gpu.reserve(n16 * 2));
    } else {
      d16_host.assign(n16, 0);
      d16 = d16_host.data();
    }
    for (std::size_t i = 0; i < ids.size(); ++i) opt.bind_param16_device(ids[i], d16 + at16[i]);
  }
  if (device != DeviceTierMode::off && !o.json)
    fmt::print("device tier: {} ({}), gradients handed over from {}\n",
               device == DeviceTierMode::gpu ? "GPU memory" : "simulated: host memory standing in",
               format_bytes(tc.device_budget),
               device_grads ? "device memory (add_grad_device), 16-bit parameters kept in a device "
                              "copy (bind_param16_device)"
                            : "host memory (add_grad)");
  if (!o.plan.empty() && !o.json) {
    std::size_t where[kTierCount] = {};
    for (std::size_t k = 0; k < opt.subgroup_count(); ++k)
      ++where[static_cast<int>(opt.placement(k).state_tier)];
    fmt::print(
        "plan {}: {} sub-groups with their state on the GPU, {} in host memory, {} on NVMe; "
        "resident state {}\n",
        o.plan, where[static_cast<int>(Tier::device)], where[hv], where[nv],
        oc.persist_resident_state ? "persisted to NVMe every step" : "in memory only");
  }
  for (int step = 1; step <= o.steps; ++step) {
    // NVMe bytes over the whole cycle: the overlapped mode does part of the step's I/O during
    // the gradient ingest.
    const TierCounters c0 = tiers.counters();
    const auto tg = Clock::now();
    opt.begin_backward();
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const std::uint64_t n = opt.param(ids[i]).numel();
      const std::uint64_t shift = (i * 977 + step * 131) % 4096;
      if (n <= noise.size() - shift) {
        hand_over(ids[i], noise.data() + shift, n);
      } else {
        std::vector<std::uint16_t> g(n);
        for (std::uint64_t off = 0; off < n; off += 16u << 20)
          std::memcpy(g.data() + off, noise.data() + shift,
                      std::min<std::uint64_t>(16u << 20, n - off) * 2);
        hand_over(ids[i], g.data(), n);
      }
    }
    opt.end_backward();
    const double ingest_s = since(tg);
    StepResult r = opt.step();
    const TierCounters c1 = tiers.counters();
    for (int t = 0; t < kTierCount; ++t) {
      r.bytes_in[t] = c1.bytes_in[t] - c0.bytes_in[t];
      r.bytes_out[t] = c1.bytes_out[t] - c0.bytes_out[t];
    }
    const double gbps = static_cast<double>(r.bytes_in[nv] + r.bytes_out[nv]) /
                        (o.overlap ? ingest_s + r.seconds : r.seconds) / 1e9;
    steps.push_back({{"step", step},
                     {"seconds", r.seconds},
                     {"grad_ingest_seconds", ingest_s},
                     {"io_wait_seconds", r.io_wait_seconds},
                     {"grad_norm", r.grad_norm},
                     {"clip_factor", r.clip_factor},
                     {"nvme_read_bytes", r.bytes_out[nv]},
                     {"nvme_written_bytes", r.bytes_in[nv]},
                     {"host_in_bytes", r.bytes_in[hv]},
                     {"device_in_bytes", r.bytes_in[dv]},
                     {"device_out_bytes", r.bytes_out[dv]},
                     {"nvme_gbps", gbps},
                     {"overlapped_subgroups", r.overlapped_subgroups},
                     {"gpu_subgroups", r.gpu_subgroups},
                     {"gpu_seconds", r.gpu_seconds},
                     {"redone", r.redone},
                     {"generation", r.generation}});
    if (!o.json)
      fmt::print(
          "step {}: {:.2f} s (waited {:.2f} s on I/O; gradient ingest {:.2f} s before it), NVMe "
          "read {} ({:.1f} B/param) written {} ({:.1f} B/param), {:.2f} GB/s; grad norm {:.4g}, "
          "clip {:.3f}; generation {}{}{}{}\n",
          step, r.seconds, r.io_wait_seconds, ingest_s, format_bytes(r.bytes_out[nv]),
          static_cast<double>(r.bytes_out[nv]) / params, format_bytes(r.bytes_in[nv]),
          static_cast<double>(r.bytes_in[nv]) / params, gbps, r.grad_norm, r.clip_factor,
          r.generation,
          device != DeviceTierMode::off
              ? fmt::format("; host->device {}, device->host {}", format_bytes(r.bytes_in[dv]),
                            format_bytes(r.bytes_out[dv]))
              : std::string(),
          r.gpu_subgroups > 0
              ? fmt::format(
                    "; {} sub-groups on the GPU{} in {:.2f} s", r.gpu_subgroups,
                    oc.concurrent_gpu_step ? " beside the CPU's" : " in turn with the CPU's",
                    r.gpu_seconds)
              : std::string(),
          o.overlap ? fmt::format("; {} of {} sub-groups stepped during the ingest{}",
                                  r.overlapped_subgroups, opt.subgroup_count(),
                                  r.redone ? " (redone: clipped)" : "")
                    : std::string());
  }
  // The device copy of the 16-bit parameters must equal param16().
  std::optional<bool> d16_match;
  if (d16 != nullptr) {
    std::vector<std::uint16_t> got(n16);
    if (gpu_ptrs) {
      cuda::copy_to_host(got.data(), d16, n16 * 2, nullptr);
      cuda::synchronize(nullptr);
    } else {
      got = d16_host;
    }
    bool same = true;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const auto v = opt.param16(ids[i]);
      same = same && std::equal(v.begin(), v.end(), got.begin() + at16[i]);
    }
    d16_match = same;
    if (!o.json)
      fmt::print("device copy of the 16-bit parameters {} param16()\n",
                 same ? "equals" : "DIFFERS FROM");
    if (!same) throw std::runtime_error("demo: the bound device copy differs from param16()");
  }
  const std::string snap = tiers.snapshot().to_json();
  if (o.json) {
    fmt::print("{}\n",
               nlohmann::json{{"params", params},
                              {"persist_resident_state", oc.persist_resident_state},
                              {"device_tier", device == DeviceTierMode::off   ? "off"
                                              : device == DeviceTierMode::gpu ? "gpu"
                                                                              : "simulated"},
                              {"device_gradients", device_grads},
                              {"param16_device_copy_matches",
                               d16_match ? nlohmann::json(*d16_match) : nlohmann::json()},
                              {"steps", steps},
                              {"residency", nlohmann::json::parse(snap)}}
                   .dump(2));
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
  const std::filesystem::path dir = dir_or_temp(o.dir, "tierswap-bench-tier", temp);
  SwapSpaceConfig sc;
  sc.dirs = {dir};
  sc.capacity = bb * static_cast<std::uint64_t>(o.blocks) + (16ull << 20);
  SwapSpace space = SwapSpace::create(sc);
  IoEngine engine(space, IoEngineConfig::from_env());
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
      "demo", "Train a synthetic model a few steps with its optimizer state on NVMe");
  d->add_option("--dir", o->dir,
                "Swap directory, new or empty (default: a temporary one, removed at exit)");
  d->add_option("--params", o->params, kParamsHelp);
  d->add_option("--sub-group", o->sub_group, "Parameters per sub-group (decimal suffixes, as --params)");
  d->add_option("--steps", o->steps, "Optimizer steps");
  d->add_option("--host-budget", o->host_budget, "Pinned host bytes");
  d->add_option("--threads", o->threads, "Kernel threads");
  d->add_option("--hold", o->hold, "Keep serving telemetry this many seconds at the end");
  d->add_flag("--json", o->json, "Print JSON on stdout instead of text");
  d->add_option(
      "--max-grad-norm", o->max_grad_norm,
      "Clip the global gradient norm (0: off; the demo's gradients have a norm of ~16, so "
      "1 clips every step, which the overlapped mode redoes)");
  d->add_option("--plan", o->plan, "Place sub-groups by this plan file (tierswap plan --out)");
  d->add_flag("--overlap", o->overlap,
              "Overlapped step: sub-groups step during the gradient ingest, speculatively");
  d->add_option("--device-budget", o->device_budget,
                "Device tier bytes (default: TIERSWAP_DEVICE_BUDGET, else what the plan's "
                "GPU-resident state needs; a simulated tier stands in without a GPU)");
  d->add_flag("--serial-gpu-step", o->serial_gpu_step,
              "A plan's GPU sub-groups step after the CPU's instead of beside them "
              "(OptimizerConfig::concurrent_gpu_step off; the same bits)");
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
