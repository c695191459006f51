// `tierswap demo`: the embedded default main job. A synthetic transformer-like model (a few
// hundred million parameters by default, two parameter groups: weights with decay, biases and norm
// scales without) is trained for a few AdamW steps by the ShardedOptimizer with its state on the
// NVMe tier of a temporary swap directory, under a 1 GiB pinned host budget: every step ingests
// bf16 gradients, then streams the sub-groups (prefetch, fused kernel, write-behind) and commits
// a generation. Prints per-step figures (time, NVMe bytes per parameter, GB/s) and the residency
// tables; the process serves telemetry meanwhile (`tierswap ps`, `tierswap residency PID`).
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
#include "tierswap/checksum.hpp"
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

// Whole layers of an MLP stack: the count nearest to `params` (1M: 2 layers of 526,080).
std::vector<DemoParam> demo_model(std::uint64_t params) {
  const std::int64_t h = params >= (64u << 20) ? 1024 : 256;  // small models for tests
  const std::uint64_t per_layer = 2 * h * 4 * h + 4 * h + h + 2 * h;
  const std::uint64_t layers = std::max<std::uint64_t>(1, (params + per_layer / 2) / per_layer);
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

OptimizerConfig demo_optimizer_config(const DemoOptions& o, const std::optional<Plan>& plan) {
  OptimizerConfig oc;
  oc.subgroup_size = parse_param_count(o.sub_group, "--sub-group");
  oc.state_tier = OptimizerConfig::StateTier::nvme;
  oc.max_grad_norm = o.max_grad_norm;
  oc.overlap = o.overlap;
  oc.concurrent_gpu_step = !o.serial_gpu_step;
  // the resident-state mode the plan was made for
  if (plan && plan->persist_resident_state)
    oc.persist_resident_state = *plan->persist_resident_state;
  return oc;
}

TierConfig demo_tier_config(const DemoOptions& o, const std::optional<Plan>& plan,
                            std::uint64_t params, const OptimizerConfig& oc) {
  // A device tier when the plan keeps state on the GPU (or one is asked for): GPU memory when a
  // GPU is usable, else a simulated one standing in (device_mode auto). The size (--device-budget,
  // else the plan's) goes in before the environment is read, so TIERSWAP_DEVICE_TIER=simulated
  // needs no TIERSWAP_DEVICE_BUDGET beside it; --device-budget wins over that variable.
  TierConfig base;
  if (!o.device_budget.empty())
    base.device_budget = parse_size(o.device_budget, "--device-budget");
  else if (plan)
    base.device_budget = device_budget_for(*plan, params, oc.subgroup_size, o.overlap);
  TierConfig tc = TierConfig::from_env(base);
  tc.host_budget = parse_size(o.host_budget, "--host-budget");
  tc.host_slab_size = 64ull << 20;
  tc.lookahead = 9;
  if (!o.device_budget.empty()) tc.device_budget = base.device_budget;  // over the environment's
  if (tc.device_budget == 0 && tc.device_mode != DeviceTierMode::simulated)
    tc.device_mode = DeviceTierMode::off;  // no device state (simulated: validate() says why)
  tc.validate();
  return tc;
}

std::vector<ParamId> add_demo_params(ShardedOptimizer& opt, const std::vector<DemoParam>& model) {
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
  return ids;
}

void initialize_demo(ShardedOptimizer& opt) {
  opt.initialize([](ParamId id, std::uint64_t off, float* out, std::uint64_t n) {
    std::uint64_t x = (static_cast<std::uint64_t>(id) << 40) ^ off;
    for (std::uint64_t i = 0; i < n; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      out[i] = 0.02f * (static_cast<float>(x >> 40) * (1.0f / 16777216.0f) - 0.5f);
    }
  });
}

// The trainer's side on a device tier with GPU sub-groups: gradients handed over from device
// memory (add_grad_device), and a device copy of the 16-bit parameters the optimizer keeps
// (bind_param16_device): GPU memory when a GPU is usable, else host memory standing in for it.
// Without GPU sub-groups, gradients come from host memory (add_grad) and nothing is bound.
class DemoDevice {
 public:
  DemoDevice(ShardedOptimizer& opt, const TierManager& tiers, const std::vector<ParamId>& ids)
      : opt_(opt), ids_(ids), gpu_ptrs_(tiers.device_tier() == DeviceTierMode::gpu) {
    bool gpu_steps = false;
    for (std::size_t k = 0; k < opt.subgroup_count(); ++k) gpu_steps |= opt.placement(k).gpu_steps;
    grads_ = tiers.device_tier() != DeviceTierMode::off && gpu_steps;
    if (grads_) bind();
  }
  bool device_grads() const { return grads_; }

  void hand_over(ParamId id, const std::uint16_t* host, std::uint64_t n) {
    if (!grads_) {
      opt_.add_grad(id, host, Dtype::bf16);
    } else if (!gpu_ptrs_) {
      opt_.add_grad_device(id, host, Dtype::bf16, {});
    } else {  // the same values from GPU memory
      cuda::copy_to_device(d_grad_.reserve(n * 2), host, n * 2, nullptr);
      cuda::synchronize(nullptr);
      opt_.add_grad_device(id, d_grad_.data(), Dtype::bf16, {});
    }
  }

  // Whether the bound device copy equals param16() (none bound: nullopt).
  std::optional<bool> copy_matches() const {
    if (d16_ == nullptr) return std::nullopt;
    std::vector<std::uint16_t> got(n16_);
    if (gpu_ptrs_) {
      cuda::copy_to_host(got.data(), d16_, n16_ * 2, nullptr);
      cuda::synchronize(nullptr);
    } else {
      got = d16_host_;
    }
    for (std::size_t i = 0; i < ids_.size(); ++i) {
      const auto v = opt_.param16(ids_[i]);
      if (!std::equal(v.begin(), v.end(), got.begin() + at16_[i])) return false;
    }
    return true;
  }

 private:
  void bind() {  // one buffer, each parameter at its place in it
    for (const ParamId id : ids_) {
      at16_.push_back(n16_);
      n16_ += opt_.param(id).numel();
    }
    if (gpu_ptrs_) {
      d16_ = static_cast<std::uint16_t*>(d16_gpu_.reserve(n16_ * 2));
    } else {
      d16_host_.assign(n16_, 0);
      d16_ = d16_host_.data();
    }
    for (std::size_t i = 0; i < ids_.size(); ++i)
      opt_.bind_param16_device(ids_[i], d16_ + at16_[i]);
  }

  ShardedOptimizer& opt_;
  const std::vector<ParamId>& ids_;
  const bool gpu_ptrs_;
  bool grads_ = false;
  cuda::DeviceBuffer d_grad_;  // on a GPU: the gradient handed over, in GPU memory
  std::uint64_t n16_ = 0;
  std::vector<std::uint64_t> at16_;
  cuda::DeviceBuffer d16_gpu_;
  std::vector<std::uint16_t> d16_host_;  // standing in for GPU memory
  std::uint16_t* d16_ = nullptr;
};

void print_demo_placement(const DemoOptions& o, const ShardedOptimizer& opt, const TierConfig& tc,
                          const OptimizerConfig& oc, DeviceTierMode device, bool device_grads) {
  if (device != DeviceTierMode::off)
    fmt::print("device tier: {} ({}), gradients handed over from {}\n",
               device == DeviceTierMode::gpu ? "GPU memory" : "simulated: host memory standing in",
               format_bytes(tc.device_budget),
               device_grads ? "device memory (add_grad_device), 16-bit parameters kept in a device "
                              "copy (bind_param16_device)"
                            : "host memory (add_grad)");
  if (o.plan.empty()) return;
  std::size_t where[kTierCount] = {};
  for (std::size_t k = 0; k < opt.subgroup_count(); ++k)
    ++where[static_cast<int>(opt.placement(k).state_tier)];
  fmt::print(
      "plan {}: {} sub-groups with their state on the GPU, {} in host memory, {} on NVMe; "
      "resident state {}\n",
      o.plan, where[static_cast<int>(Tier::device)], where[static_cast<int>(Tier::host)],
      where[static_cast<int>(Tier::nvme)],
      oc.persist_resident_state ? "persisted to NVMe every step" : "in memory only");
}

// Gradients: one random bf16 buffer, read at a different offset by every parameter and step.
std::vector<std::uint16_t> demo_noise() {
  std::vector<std::uint16_t> noise((16u << 20) + 4096);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1e-3f);
  for (auto& v : noise) v = float_to_bf16(nd(rng));
  return noise;
}

void demo_backward(ShardedOptimizer& opt, const std::vector<ParamId>& ids, DemoDevice& dev,
                   const std::vector<std::uint16_t>& noise, int step) {
  opt.begin_backward();
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::uint64_t n = opt.param(ids[i]).numel();
    const std::uint64_t shift = (i * 977 + step * 131) % 4096;
    if (n <= noise.size() - shift) {
      dev.hand_over(ids[i], noise.data() + shift, n);
    } else {
      std::vector<std::uint16_t> g(n);
      for (std::uint64_t off = 0; off < n; off += 16u << 20)
        std::memcpy(g.data() + off, noise.data() + shift,
                    std::min<std::uint64_t>(16u << 20, n - off) * 2);
      dev.hand_over(ids[i], g.data(), n);
    }
  }
  opt.end_backward();
}

// One step's figures: the JSON row, and the text line unless --json.
nlohmann::json report_step(const DemoOptions& o, const OptimizerConfig& oc,
                           const ShardedOptimizer& opt, DeviceTierMode device, int step,
                           const StepResult& r, double ingest_s, std::uint64_t params) {
  const int nv = static_cast<int>(Tier::nvme), hv = static_cast<int>(Tier::host),
            dv = static_cast<int>(Tier::device);
  const double gbps = static_cast<double>(r.bytes_in[nv] + r.bytes_out[nv]) /
                      (o.overlap ? ingest_s + r.seconds : r.seconds) / 1e9;
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
            ? fmt::format("; {} sub-groups on the GPU{} in {:.2f} s", r.gpu_subgroups,
                          oc.concurrent_gpu_step ? " beside the CPU's" : " in turn with the CPU's",
                          r.gpu_seconds)
            : std::string(),
        o.overlap ? fmt::format("; {} of {} sub-groups stepped during the ingest{}",
                                r.overlapped_subgroups, opt.subgroup_count(),
                                r.redone ? " (redone: clipped)" : "")
                  : std::string());
  return {{"step", step},
          {"seconds", r.seconds},
          {"grad_ingest_seconds", ingest_s},
          {"io_wait_seconds", r.io_wait_seconds},
          {"commit_seconds", r.commit_seconds},
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
          {"generation", r.generation}};
}

// XXH3 digests of the final state, parameter by parameter in registration order: two runs (a
// GPU against the CPU, say) end with the same bits exactly when their digests are equal.
nlohmann::json state_digests(ShardedOptimizer& opt, const std::vector<ParamId>& ids) {
  auto chain = [](std::uint64_t h, const void* data, std::size_t bytes) {
    const std::uint64_t both[2] = {h, checksum64(data, bytes)};
    return checksum64(both, sizeof both);
  };
  nlohmann::json out;
  for (BlockClass cls : {BlockClass::master, BlockClass::exp_avg, BlockClass::exp_avg_sq}) {
    std::uint64_t h = 0;
    for (ParamId id : ids) {
      const std::vector<float> v = opt.gather(id, cls);
      h = chain(h, v.data(), v.size() * sizeof(float));
    }
    out[std::string(to_string(cls))] = checksum_hex(h);
  }
  std::uint64_t h = 0;
  for (ParamId id : ids) h = chain(h, opt.param16(id).data(), opt.param16(id).size_bytes());
  out["param16"] = checksum_hex(h);
  return out;
}

void print_demo_end(const DemoOptions& o, const OptimizerConfig& oc, const TierManager& tiers,
                    std::uint64_t params, bool device_grads, std::optional<bool> d16_match,
                    const nlohmann::json& steps, const nlohmann::json& digests) {
  const std::string snap = tiers.snapshot().to_json();
  const DeviceTierMode device = tiers.device_tier();
  if (!o.json) {
    if (d16_match)
      fmt::print("device copy of the 16-bit parameters {} param16()\n",
                 *d16_match ? "equals" : "DIFFERS FROM");
    fmt::print("\n");
    print_residency(snap, stdout);
    return;
  }
  fmt::print("{}\n", nlohmann::json{{"params", params},
                                    {"persist_resident_state", oc.persist_resident_state},
                                    {"device_tier", device == DeviceTierMode::off   ? "off"
                                                    : device == DeviceTierMode::gpu ? "gpu"
                                                                                    : "simulated"},
                                    {"device_gradients", device_grads},
                                    {"param16_device_copy_matches",
                                     d16_match ? nlohmann::json(*d16_match) : nlohmann::json()},
                                    {"steps", steps},
                                    {"digests", digests},
                                    {"residency", nlohmann::json::parse(snap)}}
                         .dump(2));
}

// The swap space: two slots of the fp32 state (12 B/param) and of the 16-bit gradients, and
// slack, in --dir (new or empty) or in a temporary directory owned by `temp`.
SwapSpace demo_swap_space(const DemoOptions& o, std::uint64_t params,
                          std::unique_ptr<TempDir>& temp) {
  const std::filesystem::path dir = dir_or_temp(o.dir, "tierswap-demo", temp);
  if (!o.dir.empty()) make_new_or_empty(dir, "--dir");
  SwapSpaceConfig sc;
  sc.dirs = {dir};
  sc.capacity = round_up(2 * params * 12 + 2 * params * 2 + (256ull << 20), 1ull << 20);
  return SwapSpace::create(sc);
}

// A step's tier traffic: the counters' difference over the whole backward + step cycle (the
// overlapped mode does part of the step's I/O during the gradient ingest).
void bytes_since(const TierCounters& c0, const TierCounters& c1, StepResult* r) {
  for (int t = 0; t < kTierCount; ++t) {
    r->bytes_in[t] = c1.bytes_in[t] - c0.bytes_in[t];
    r->bytes_out[t] = c1.bytes_out[t] - c0.bytes_out[t];
  }
}

// --hold: the process stays up so that `tierswap ps` / `residency` can be tried on it.
void hold_for_inspection(const DemoOptions& o) {
  if (o.hold <= 0) return;
  if (!o.json)
    fmt::print("\nholding for {} s: try `tierswap ps` and `tierswap residency {}`\n", o.hold,
               ::getpid());
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::duration<double>(o.hold));
}

void run_demo(const DemoOptions& o) {
  const std::uint64_t want = parse_param_count(o.params, "--params");
  if (want < 1'000'000) throw std::invalid_argument("--params: at least 1M (10^6) parameters");
  if (o.steps < 1) throw std::invalid_argument("--steps: must be >= 1");
  const auto model = demo_model(want);
  std::uint64_t params = 0;
  for (const auto& p : model) params += static_cast<std::uint64_t>(p.rows * p.cols);
  std::unique_ptr<TempDir> temp;
  SwapSpace space = demo_swap_space(o, params, temp);
  IoEngine engine(space, IoEngineConfig::from_env());
  std::optional<Plan> plan;
  if (!o.plan.empty()) plan = Plan::load(o.plan);
  const OptimizerConfig oc = demo_optimizer_config(o, plan);
  const TierConfig tc = demo_tier_config(o, plan, params, oc);
  TierManager tiers(space, engine, tc);
  auto comm = make_single_communicator();
  ThreadPool pool(o.threads, tc.numa_node);  // step workers next to the pinned slabs
  ShardedOptimizer opt(tiers, *comm, oc, &pool);
  if (plan) opt.set_plan(*plan);
  const std::vector<ParamId> ids = add_demo_params(opt, model);
  opt.finalize();
  if (!o.json)
    fmt::print(
        "tierswap demo: {} parameters ({} tensors, 2 groups), {} of AdamW state {} {}, "
        "host budget {}, {} sub-groups; telemetry {}\n",
        params, model.size(), format_bytes(params * 12),
        o.plan.empty() ? "on NVMe at" : "placed by the plan, swap space at",
        space.files()[0].path.parent_path().string(), format_bytes(tc.host_budget),
        opt.subgroup_count(),
        tiers.telemetry_socket().empty() ? std::string("off") : tiers.telemetry_socket().string());
  const auto t_init = Clock::now();
  initialize_demo(opt);
  if (!o.json) fmt::print("initialized in {:.2f} s\n", since(t_init));
  DemoDevice dev(opt, tiers, ids);
  if (!o.json) print_demo_placement(o, opt, tc, oc, tiers.device_tier(), dev.device_grads());
  const std::vector<std::uint16_t> noise = demo_noise();
  nlohmann::json steps = nlohmann::json::array();
  for (int step = 1; step <= o.steps; ++step) {
    const TierCounters c0 = tiers.counters();
    const auto tg = Clock::now();
    demo_backward(opt, ids, dev, noise, step);
    const double ingest_s = since(tg);
    StepResult r = opt.step();
    bytes_since(c0, tiers.counters(), &r);
    steps.push_back(report_step(o, oc, opt, tiers.device_tier(), step, r, ingest_s, params));
  }
  const std::optional<bool> d16_match = dev.copy_matches();  // the bound copy equals param16()
  const nlohmann::json digests = o.json ? state_digests(opt, ids) : nlohmann::json();
  print_demo_end(o, oc, tiers, params, dev.device_grads(), d16_match, steps, digests);
  if (d16_match == false)
    throw std::runtime_error("demo: the bound device copy differs from param16()");
  hold_for_inspection(o);
}

}  // namespace

void add_demo(CLI::App& app) {
  auto o = std::make_shared<DemoOptions>();
  auto* d = app.add_subcommand(
      "demo", "Train a synthetic model a few steps with its optimizer state on NVMe");
  d->add_option("--dir", o->dir,
                "Swap directory, new or empty (default: a temporary one, removed at exit)");
  d->add_option("--params", o->params,
                std::string(kParamsHelp) + ", rounded to whole layers of the synthetic model");
  d->add_option("--sub-group", o->sub_group,
                "Parameters per sub-group (decimal suffixes, as --params)");
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

}  // namespace tierswap::cli
