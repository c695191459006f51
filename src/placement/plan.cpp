// The placement cost model (see placement.hpp): a pipeline simulation per candidate plan, and a
// search over the candidates' shape (how many tail sub-groups keep their state on the GPU, how
// many more step on the GPU over the link, how many stream from NVMe).
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "src/placement/json_reader.hpp"
#include "tierswap/detail/file.hpp"
#include "tierswap/detail/json.hpp"
#include "tierswap/placement.hpp"
#include "tierswap/tier_manager.hpp"
#include "tierswap/units.hpp"

namespace tierswap {
namespace {

using nlohmann::json;

enum Resource : int { kGpu, kCpu, kHostMem, kH2D, kD2H, kNvmeRead, kNvmeWrite, kResources };

// What a sub-group does, by option.
enum class Option : std::uint8_t { gpu_gpu, host_cpu, host_gpu, nvme_cpu };

struct Rates {  // bytes per second available to one GPU rank
  double r[kResources] = {};
  double host_read = 0, host_write = 0;  // in-place GPU access to host memory
};

struct Shape {
  std::size_t gpu = 0;   // tail sub-groups (lowest ids) with state and step on the GPU
  std::size_t link = 0;  // the next ones: host state stepped by the GPU over the link
  std::size_t nvme = 0;  // head sub-groups (highest ids) streamed from NVMe
  bool grad_nvme = false;
};

struct Model {
  const HardwareProfile& hw;
  PlanOptions opt;
  int gpus = 1;
  std::uint64_t per_rank = 0;        // parameters per rank
  std::uint64_t sub = 0;             // sub-group size
  std::vector<std::uint64_t> numel;  // per sub-group
  double state_b = 12;               // state bytes per parameter
  double kernel_b = 28;              // fused kernel bytes per parameter
  Rates rates;
  double backward = 0;
  std::uint64_t budget[kTierCount] = {};
  bool persist = false;                  // resident state committed to NVMe at every step
  std::uint64_t slack[kTierCount] = {};  // bytes undo copies leave free (slab granularity)
};

// Host bytes that stage streamed state: the sub-group stepped, one written behind, the read-ahead.
std::uint64_t staging_bytes(const Model& m) {
  return (m.opt.prefetch_depth + 2) * static_cast<std::uint64_t>(m.state_b) * m.sub;
}

struct Sim {
  double makespan = 0;
  std::vector<double> ready, done;
};

// One stage: resources it occupies for `secs[r]` (all start together; it ends when the longest
// is done), not before `ready`.
struct Stage {
  std::array<double, kResources> secs{};
  double run(std::array<double, kResources>& free, double ready) const {
    double start = ready;
    for (int r = 0; r < kResources; ++r)
      if (secs[r] > 0) start = std::max(start, free[r]);
    double len = 0;
    for (double s : secs) len = std::max(len, s);
    const double end = start + len;
    for (int r = 0; r < kResources; ++r)
      if (secs[r] > 0) free[r] = end;
    return end;
  }
};

Option option_of(const Model& m, const Shape& s, std::size_t id) {
  const std::size_t n = m.numel.size();
  if (id < s.gpu) return Option::gpu_gpu;
  if (id < s.gpu + s.link) return Option::host_gpu;
  if (id >= n - s.nvme) return Option::nvme_cpu;
  return Option::host_cpu;
}

bool resident(Option o) {
  return o != Option::nvme_cpu;
}

// Whether a sub-group steps only after the commit of the rest, as the optimizer orders it:
// memory-only resident state without an undo copy (persisted and streamed state speculate).
bool waits_for_commit(const Model& m, Option o, bool undo_copy) {
  return !m.persist && resident(o) && !undo_copy;
}

// The step as a pipeline. `backward`: gradients become final during it (highest id first) and
// the GPU is busy until it ends; 0 for the step alone. `undo` (memory-only resident state, with
// overlap): the host-resident sub-groups that speculate with an undo copy. Memory-only resident
// state without one steps after the commit of everything else (as the optimizer does), from a
// gradient moved to where it steps before that; persisted resident state is also written to
// NVMe (GPU state through the link) and speculates like the rest.
// One simulated step of shape s: each sub-group's stages on the resources they occupy, in the
// order gradients become final, after a backward of `backward` seconds (0: the step alone).
class Simulation {
 public:
  Simulation(const Model& m, const Shape& s, double backward, const std::vector<char>& undo,
             std::size_t kept_from)
      : m_(m), s_(s), r_(m.rates.r), backward_(backward), undo_(undo), kept_from_(kept_from) {
    free_[kGpu] = backward;
  }
  Sim run();

 private:
  double x(std::size_t id) const { return static_cast<double>(m_.numel[id]); }
  Option option(std::size_t id) const { return option_of(m_, s_, id); }
  bool overlap() const { return backward_ > 0; }
  bool late(std::size_t id) const {
    return waits_for_commit(m_, option(id), overlap() && undo_[id]);
  }
  double stage(std::initializer_list<std::pair<int, double>> secs, double ready) {
    Stage st;
    for (const auto& [res, t] : secs) st.secs[res] = t;
    return st.run(free_, ready);
  }
  double step_resident(std::size_t id, double ready);
  double step_streamed(std::size_t id, double at);
  double undo_copy(std::size_t id, double at);

  const Model& m_;
  const Shape& s_;
  const double* r_;  // m.rates.r
  double backward_;
  const std::vector<char>& undo_;
  std::size_t kept_from_;  // streamed sub-groups from this id up find their state in memory
  std::array<double, kResources> free_{};
  std::vector<double> cpu_end_nvme_;  // CPU-stage ends of NVMe sub-groups, in processing order
};

// The step of resident sub-group `id` from `ready` (its gradient where it steps by then).
double Simulation::step_resident(std::size_t id, double ready) {
  const double n = x(id);
  double end = ready;
  switch (option(id)) {
    case Option::gpu_gpu:
      end = stage({{kGpu, m_.kernel_b * n / r_[kGpu]}}, ready);
      // the 16-bit output down into param16() (the GPU's copy is written in place)
      end = stage({{kD2H, 2 * n / r_[kD2H]}}, end);
      if (m_.persist) {  // the new state down the link and onto NVMe
        end = stage({{kD2H, m_.state_b * n / r_[kD2H]}}, end);
        end = stage({{kNvmeWrite, m_.state_b * n / r_[kNvmeWrite]}}, end);
      }
      break;
    case Option::host_gpu: {
      Stage g;  // the kernel streams the state over the link, both ways at once
      g.secs[kH2D] = m_.state_b * n / m_.rates.host_read;
      g.secs[kD2H] = (m_.state_b + 2) * n / m_.rates.host_write;  // and the 16-bit output
      g.secs[kHostMem] = 2 * m_.state_b * n / r_[kHostMem];
      g.secs[kGpu] = std::max({g.secs[kH2D], g.secs[kD2H], (4 + 2) * n / r_[kGpu]});
      end = g.run(free_, ready);
      break;
    }
    case Option::host_cpu:
      end = stage({{kCpu, m_.kernel_b * n / r_[kCpu]}, {kHostMem, m_.kernel_b * n / r_[kHostMem]}},
                  ready);
      end = stage({{kH2D, 2 * n / r_[kH2D]}}, end);  // the 16-bit parameters back to the GPU
      break;
    case Option::nvme_cpu:
      break;  // step_streamed: its reads run ahead of the step
  }
  if (m_.persist && option(id) != Option::gpu_gpu)  // host-resident state written behind
    end = std::max(end, stage({{kNvmeWrite, m_.state_b * n / r_[kNvmeWrite]}}, end));
  return end;
}

// An NVMe sub-group whose gradient is on the host at `at`: its state read ahead (at most
// prefetch_depth sub-groups ahead of the CPU) unless kept from the step before, stepped, its
// 16-bit output up, its state written.
double Simulation::step_streamed(std::size_t id, double at) {
  const double n = x(id);
  if (s_.grad_nvme)  // spilled on arrival, read back for the step
    at = stage({{kNvmeWrite, 2 * n / r_[kNvmeWrite]}}, at);
  const std::size_t j = cpu_end_nvme_.size();
  const std::size_t depth = m_.opt.prefetch_depth;
  const double slot_free = j > depth ? cpu_end_nvme_[j - depth - 1] : 0.0;
  const double read_b = (id >= kept_from_ ? 0 : m_.state_b) + (s_.grad_nvme ? 2 : 0);
  const double state_at = read_b == 0 ? 0.0
                                      : stage({{kNvmeRead, read_b * n / r_[kNvmeRead]}},
                                              std::max(slot_free, s_.grad_nvme ? at : 0.0));
  const double cpu_end =
      stage({{kCpu, m_.kernel_b * n / r_[kCpu]}, {kHostMem, m_.kernel_b * n / r_[kHostMem]}},
            std::max(at, state_at));
  cpu_end_nvme_.push_back(cpu_end);
  const double up = stage({{kH2D, 2 * n / r_[kH2D]}}, cpu_end);
  return std::max(up, stage({{kNvmeWrite, m_.state_b * n / r_[kNvmeWrite]}}, cpu_end));
}

// The overlapped step's undo copy of sub-group id's state: read and written once.
double Simulation::undo_copy(std::size_t id, double at) {
  const double t = 2 * m_.state_b * x(id);
  if (option(id) == Option::gpu_gpu) return stage({{kGpu, t / r_[kGpu]}}, at);
  return stage({{kCpu, t / r_[kHostMem]}, {kHostMem, t / r_[kHostMem]}}, at);
}

Sim Simulation::run() {
  const std::size_t n = m_.numel.size();
  Sim out;
  out.ready.assign(n, 0);
  out.done.assign(n, 0);
  std::vector<double> grad_at(n, 0);
  double commit = backward_;
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t id = n - 1 - k;  // processing order: the order gradients become final
    const double ready = backward_ * static_cast<double>(k + 1) / static_cast<double>(n);
    out.ready[id] = ready;
    const Option o = option(id);
    double at = ready;
    if (o == Option::host_cpu || o == Option::nvme_cpu)  // the 16-bit gradient to the host
      at = stage({{kD2H, 2 * x(id) / r_[kD2H]}}, ready);
    grad_at[id] = at;
    if (late(id)) continue;
    double end = 0;
    if (o == Option::nvme_cpu) {
      end = step_streamed(id, at);
    } else {
      if (overlap() && undo_[id]) at = undo_copy(id, at);
      end = step_resident(id, at);
    }
    out.done[id] = end;
    commit = std::max(commit, end);
  }
  for (std::size_t k = 0; k < n; ++k) {  // memory-only state after the commit
    const std::size_t id = n - 1 - k;
    if (late(id)) out.done[id] = step_resident(id, std::max(commit, grad_at[id]));
  }
  for (double d : out.done) out.makespan = std::max(out.makespan, d);
  return out;
}

struct Usage {
  std::uint64_t bytes[kTierCount] = {};
};

// Bytes each tier holds for a shape; `grad_nvme` moves the NVMe sub-groups' gradients there.
Usage usage(const Model& m, const Shape& s) {
  Usage u;
  const auto dev = static_cast<int>(Tier::device), host = static_cast<int>(Tier::host),
             nv = static_cast<int>(Tier::nvme);
  const std::size_t n = m.numel.size();
  bool any_nvme = false;
  for (std::size_t id = 0; id < n; ++id) {
    const auto x = m.numel[id];
    const auto state = static_cast<std::uint64_t>(m.state_b) * x;
    switch (option_of(m, s, id)) {
      case Option::gpu_gpu:
        u.bytes[dev] += state;
        break;
      case Option::host_gpu:
        u.bytes[host] += state;
        break;
      case Option::host_cpu:
        u.bytes[host] += state + 2 * x;
        break;
      case Option::nvme_cpu:
        any_nvme = true;
        u.bytes[nv] += 2 * state;  // two shadow slots
        if (s.grad_nvme)
          u.bytes[nv] += 2 * x;
        else
          u.bytes[host] += 2 * x;
        break;
    }
  }
  if (any_nvme) u.bytes[host] += staging_bytes(m);
  if (m.persist)  // resident state committed to NVMe too, in two shadow slots
    for (std::size_t id = 0; id < n; ++id)
      if (resident(option_of(m, s, id)))
        u.bytes[nv] += 2 * static_cast<std::uint64_t>(m.state_b) * m.numel[id];
  return u;
}

// The lowest id of the streamed sub-groups whose state a step finds in host memory (n: none).
// The ordinary step in alternating order (PlanOptions::alternate_step_order) begins with the
// sub-groups the step before ended with; the host memory beside the shape's other bytes (its
// staging for streamed state, and what the shape leaves free) still holds as many of them as
// fit, whole. The model processes the highest ids first, so those are the ones it keeps.
std::size_t kept_streamed_from(const Model& m, const Shape& s) {
  const std::size_t n = m.numel.size();
  if (m.opt.overlap || !m.opt.alternate_step_order || s.nvme == 0) return n;
  const int host = static_cast<int>(Tier::host);
  const std::uint64_t other = usage(m, s).bytes[host] - staging_bytes(m);
  std::uint64_t left = m.budget[host] > other ? m.budget[host] - other : 0;
  std::size_t id = n;
  for (; id > n - s.nvme; --id) {
    const auto b = static_cast<std::uint64_t>(m.state_b) * m.numel[id - 1];
    if (b > left) break;
    left -= b;
  }
  return id;
}

Sim simulate(const Model& m, const Shape& s, double backward, const std::vector<char>& undo) {
  return Simulation(m, s, backward, undo, kept_streamed_from(m, s)).run();
}

// Memory-only resident state with overlap: undo copies for resident sub-groups, the ones final
// first (highest ids) first, while the memory of their tier beyond `u` (less the slack) holds
// them, as the optimizer's finalize() chooses. Adds their bytes to `u`.
std::vector<char> undo_copies(const Model& m, const Shape& s, Usage& u) {
  const std::size_t n = m.numel.size();
  std::vector<char> undo(n, 0);
  if (m.persist || !m.opt.overlap) return undo;
  std::uint64_t left[kTierCount] = {};
  bool full[kTierCount] = {};
  for (const Tier t : {Tier::host, Tier::device}) {
    const int i = static_cast<int>(t);
    const std::uint64_t used = u.bytes[i] + m.slack[i];
    left[i] = m.budget[i] > used ? m.budget[i] - used : 0;
  }
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t id = n - 1 - k;
    const Option o = option_of(m, s, id);
    if (!resident(o)) continue;
    const int t = static_cast<int>(o == Option::gpu_gpu ? Tier::device : Tier::host);
    const auto b = static_cast<std::uint64_t>(m.state_b) * m.numel[id];
    full[t] = full[t] || b > left[t];
    if (full[t]) continue;
    undo[id] = 1;
    left[t] -= b;
    u.bytes[t] += b;
  }
  return undo;
}

bool fits(const Model& m, const Usage& u) {
  for (int t = 0; t < kTierCount; ++t)
    if (u.bytes[t] > m.budget[t]) return false;
  return true;
}

double state_bytes_per_param(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::adamw:
    case OptimizerKind::adam:
      return 12;
    case OptimizerKind::lion:
    case OptimizerKind::sgd:  // with momentum
      return 8;
  }
  return 12;
}

std::string tier_name(Tier t) {
  return t == Tier::device ? "gpu" : std::string(to_string(t));
}

Tier parse_plan_tier(std::string_view origin, const std::string& key, const std::string& v) {
  if (v == "gpu") return Tier::device;
  if (v == "host") return Tier::host;
  if (v == "nvme") return Tier::nvme;
  throw std::invalid_argument(
      fmt::format("{}: {}: '{}': expected gpu, host or nvme", origin, key, v));
}

StepDevice parse_device(std::string_view origin, const std::string& key, const std::string& v) {
  if (v == "gpu") return StepDevice::gpu;
  if (v == "cpu") return StepDevice::cpu;
  throw std::invalid_argument(fmt::format("{}: {}: '{}': expected gpu or cpu", origin, key, v));
}

std::string_view device_name(StepDevice d) {
  return d == StepDevice::gpu ? "gpu" : "cpu";
}

}  // namespace

void PlanOptions::validate() const {
  if (params == 0) throw std::invalid_argument("plan: params must be > 0");
  if (gpus < 0) throw std::invalid_argument("plan: gpus must be >= 0");
  if (!(host_reserve_fraction >= 0 && host_reserve_fraction < 1))
    throw std::invalid_argument("plan: host_reserve_fraction must be in [0, 1)");
  if (!(mfu > 0 && mfu <= 1)) throw std::invalid_argument("plan: mfu must be in (0, 1]");
  if (prefetch_depth > 64) throw std::invalid_argument("plan: prefetch_depth must be <= 64");
}

namespace {

bool cpu_only(const HardwareProfile& hw) {
  return hw.gpus.empty();
}

// The GPU whose kind all ranks share (the first), or none on a CPU-only profile.
const GpuProfile& rank_gpu(const HardwareProfile& hw) {
  static const GpuProfile none;
  return cpu_only(hw) ? none : hw.gpus.front();
}

// Ranks, and each rank's parameters cut into sub-groups: the optimizer's default size, larger so
// that a rank has at most 4096 of them.
void set_ranks_and_subgroups(Model& m) {
  const HardwareProfile& hw = m.hw;
  const PlanOptions& o = m.opt;
  // A profile without a GPU (a CPU-only machine, as `tierswap probe` reports one) plans for one
  // process: state on the host or NVMe, stepped by the CPU, nothing over a link.
  if (cpu_only(hw) && o.gpus > 1)
    throw std::invalid_argument(
        fmt::format("plan: --gpus {}: profile '{}' has no GPU (a CPU-only plan is for one process)",
                    o.gpus, hw.name));
  m.gpus = cpu_only(hw) ? 1 : o.gpus == 0 ? static_cast<int>(hw.gpus.size()) : o.gpus;
  if (m.gpus > std::max<int>(1, static_cast<int>(hw.gpus.size())))
    throw std::invalid_argument(fmt::format("plan: --gpus {}: profile '{}' has {} GPU(s)", m.gpus,
                                            hw.name, hw.gpus.size()));
  m.per_rank = (o.params + m.gpus - 1) / m.gpus;
  m.state_b = state_bytes_per_param(o.optimizer);
  m.kernel_b = 2 * m.state_b + 4;
  m.sub = o.subgroup_size ? o.subgroup_size : kDefaultSubgroupSize;
  m.sub = std::max<std::uint64_t>(m.sub, (m.per_rank + 4095) / 4096);
  m.sub = (m.sub + kGradStatsChunk - 1) / kGradStatsChunk * kGradStatsChunk;
  for (std::uint64_t off = 0; off < m.per_rank; off += m.sub)
    m.numel.push_back(std::min(m.sub, m.per_rank - off));
}

// Each resource's rate for one rank (shared ones divided among the ranks), in bytes per second.
void set_rates(Model& m) {
  const HardwareProfile& hw = m.hw;
  const GpuProfile& g = rank_gpu(hw);
  const auto G = static_cast<double>(m.gpus);
  double nvme_rd = 0, nvme_wr = 0;
  for (const auto& d : hw.nvme) {
    nvme_rd += d.read_gbps;
    nvme_wr += d.write_gbps;
  }
  const double no_link = std::numeric_limits<double>::infinity();
  auto& r = m.rates.r;
  r[kGpu] = g.memory_gbps * 1e9;
  r[kCpu] = hw.cpu_adam_gbps * 1e9 / G;
  r[kHostMem] = (hw.host_memory_gbps > 0 ? hw.host_memory_gbps : hw.cpu_adam_gbps) * 1e9 / G;
  r[kH2D] = cpu_only(hw) ? no_link : g.h2d_gbps * 1e9;
  r[kD2H] = cpu_only(hw) ? no_link : g.d2h_gbps * 1e9;
  r[kNvmeRead] = nvme_rd * 1e9 / G;
  r[kNvmeWrite] = nvme_wr * 1e9 / G;
  m.rates.host_read = g.host_read_gbps * 1e9;
  m.rates.host_write = g.host_write_gbps * 1e9;
}

// What a rank may use of each tier, the slack undo copies leave, and the backward's length.
void set_budgets_and_backward(Model& m) {
  const HardwareProfile& hw = m.hw;
  const PlanOptions& o = m.opt;
  const GpuProfile& g = rank_gpu(hw);
  const std::uint64_t gpu_reserve =
      o.gpu_reserve_bytes != ~std::uint64_t{0}
          ? o.gpu_reserve_bytes
          : 2 * o.params + static_cast<std::uint64_t>(0.2 * static_cast<double>(g.memory_bytes));
  std::uint64_t nvme_cap = 0;
  for (const auto& d : hw.nvme) nvme_cap += d.capacity_bytes;
  m.budget[static_cast<int>(Tier::device)] =
      g.memory_bytes > gpu_reserve ? g.memory_bytes - gpu_reserve : 0;
  const auto host_avail = static_cast<std::uint64_t>(static_cast<double>(hw.host_memory_bytes) *
                                                     (1 - o.host_reserve_fraction));
  m.budget[static_cast<int>(Tier::host)] = std::min(host_avail, hw.memlock_bytes) / m.gpus;
  m.budget[static_cast<int>(Tier::nvme)] = nvme_cap / m.gpus;
  m.persist = o.persist_resident_state;
  {  // what the optimizer leaves free beside memory-only state (default slab sizes)
    TierConfig tc;
    tc.host_budget = m.budget[static_cast<int>(Tier::host)];
    tc.device_budget = m.budget[static_cast<int>(Tier::device)];
    for (const Tier t : {Tier::host, Tier::device}) m.slack[static_cast<int>(t)] = tc.slab_slack(t);
  }
  m.backward = o.backward_s >= 0 ? o.backward_s
                                 : (g.bf16_tflops > 0 ? 4.0 * static_cast<double>(o.params) *
                                                            static_cast<double>(o.tokens_per_gpu) /
                                                            (g.bf16_tflops * 1e12 * o.mfu)
                                                      : 0.0);
}

struct Best {
  bool found = false;
  Shape shape;
  double objective = 0, alone = 0;
};

// Shape s with the fewest NVMe sub-groups that fit (gradients in host memory, else on NVMe),
// kept in *best when it beats it.
void consider(const Model& m, Shape s, Best* best) {
  const std::size_t n = m.numel.size();
  for (const bool gn : {false, true}) {
    s.grad_nvme = gn;
    std::size_t lo = 0, hi = n - s.gpu - s.link;
    Shape t = s;
    t.nvme = hi;
    if (!fits(m, usage(m, t))) continue;
    while (lo < hi) {  // host bytes fall as nvme grows: binary search for the fewest
      const std::size_t mid = (lo + hi) / 2;
      t.nvme = mid;
      if (fits(m, usage(m, t)))
        hi = mid;
      else
        lo = mid + 1;
    }
    t.nvme = lo;
    Usage u = usage(m, t);
    const std::vector<char> undo = undo_copies(m, t, u);
    const double alone = simulate(m, t, 0, undo).makespan;
    const double obj = m.opt.overlap
                           ? std::max(0.0, simulate(m, t, m.backward, undo).makespan - m.backward)
                           : alone;
    if (!best->found || obj < best->objective - 1e-12 ||
        (obj <= best->objective + 1e-12 && alone < best->alone)) {
      *best = {true, t, obj, alone};
    }
    return;  // gradients go to NVMe only when they must
  }
}

[[noreturn]] void throw_does_not_fit(const Model& m) {
  Shape all;
  all.nvme = m.numel.size();
  all.grad_nvme = true;
  const Usage u = usage(m, all);
  throw std::invalid_argument(fmt::format(
      "plan: {} parameters do not fit profile '{}' on {} GPU(s): with everything on NVMe a "
      "rank needs {} of host memory (budget {}) and {} of NVMe (budget {})",
      m.opt.params, m.hw.name, m.gpus, format_bytes(u.bytes[static_cast<int>(Tier::host)]),
      format_bytes(m.budget[static_cast<int>(Tier::host)]),
      format_bytes(u.bytes[static_cast<int>(Tier::nvme)]),
      format_bytes(m.budget[static_cast<int>(Tier::nvme)])));
}

// The search. For each number of GPU-resident tail sub-groups (as many as the GPU budget allows,
// or fewer), and each number of link-stepped ones after them, the head streams from NVMe only as
// far as host memory requires: coarsely first (about 48 steps each way), then refined around the
// best.
Best search(const Model& m) {
  const std::size_t n = m.numel.size();
  const bool link_ok = m.rates.host_read > 0;
  const std::size_t step = std::max<std::size_t>(1, n / 48);
  auto candidates = [&](std::size_t hi) {
    std::vector<std::size_t> v;
    for (std::size_t x = 0; x <= hi; x += step) v.push_back(x);
    if (v.back() != hi) v.push_back(hi);
    return v;
  };
  const std::uint64_t gpu_budget = m.budget[static_cast<int>(Tier::device)];
  std::size_t gmax = 0;
  for (std::uint64_t used = 0; gmax < n; ++gmax) {
    used += static_cast<std::uint64_t>(m.state_b) * m.numel[gmax];
    if (used > gpu_budget) break;
  }
  Best best;
  for (std::size_t gc : candidates(gmax)) {
    const std::size_t lmax = link_ok ? n - gc : 0;
    for (std::size_t lc : candidates(lmax)) consider(m, {gc, lc, 0, false}, &best);
  }
  if (!best.found) throw_does_not_fit(m);
  for (std::size_t span = step; span > 1;) {
    const Shape c = best.shape;
    const std::size_t fine = std::max<std::size_t>(1, span / 8);
    for (std::size_t gc = c.gpu > span ? c.gpu - span : 0; gc <= std::min(gmax, c.gpu + span);
         gc += fine) {
      const std::size_t lmax = link_ok ? n - gc : 0;
      const std::size_t l0 = c.link > span ? c.link - span : 0;
      for (std::size_t lc = std::min(l0, lmax); lc <= std::min(lmax, c.link + span); lc += fine)
        consider(m, {gc, lc, 0, false}, &best);
    }
    span = fine;
  }
  return best;
}

// Sub-group id of the chosen shape: where its state lives and steps, and the bytes it moves over
// each link per step (added to *links).
PlanSubgroup describe_subgroup(const Model& m, const Shape& shape, std::size_t id, bool undo,
                               std::size_t kept_from, PlanLinks* links) {
  PlanSubgroup s;
  s.id = static_cast<std::uint32_t>(id);
  s.numel = m.numel[id];
  const std::uint64_t x = s.numel;
  const auto st = static_cast<std::uint64_t>(m.state_b) * x;
  const Option opt_id = option_of(m, shape, id);
  s.speculative = m.opt.overlap && !waits_for_commit(m, opt_id, undo);
  if (resident(opt_id) && m.persist) {  // committed to NVMe (GPU state down the link first)
    links->nvme_write += st;
    if (opt_id == Option::gpu_gpu) links->d2h += st;
  }
  if (undo && m.opt.overlap)  // the undo copy
    (opt_id == Option::gpu_gpu ? links->gpu_memory : links->host_memory) += 2 * st;
  switch (opt_id) {
    case Option::gpu_gpu:
      s.state_tier = Tier::device;
      s.step_device = s.cast_on = StepDevice::gpu;
      s.grad_tier = Tier::device;
      links->gpu_memory += static_cast<std::uint64_t>(m.kernel_b) * x;
      links->d2h += 2 * x;  // the 16-bit output into param16()
      break;
    case Option::host_gpu:
      s.state_tier = Tier::host;
      s.step_device = s.cast_on = StepDevice::gpu;
      s.grad_tier = Tier::device;
      links->h2d += st;
      links->d2h += st + 2 * x;  // and the 16-bit output into param16()
      links->host_memory += 2 * st;
      links->gpu_memory += 6 * x;
      break;
    case Option::host_cpu:
    case Option::nvme_cpu: {
      const bool nv = opt_id == Option::nvme_cpu;
      s.state_tier = nv ? Tier::nvme : Tier::host;
      s.step_device = s.cast_on = StepDevice::cpu;
      s.grad_tier = nv && shape.grad_nvme ? Tier::nvme : Tier::host;
      if (!cpu_only(m.hw)) {  // the 16-bit gradient down, the 16-bit parameters up
        links->d2h += 2 * x;
        links->h2d += 2 * x;
      }
      links->host_memory += static_cast<std::uint64_t>(m.kernel_b) * x;
      if (nv) {
        links->nvme_read += (id >= kept_from ? 0 : st) + (shape.grad_nvme ? 2 * x : 0);
        links->nvme_write += st + (shape.grad_nvme ? 2 * x : 0);
      }
      break;
    }
  }
  return s;
}

}  // namespace

Plan make_plan(const HardwareProfile& hw, const PlanOptions& o) {
  o.validate();
  hw.validate();
  Model m{hw, o};
  set_ranks_and_subgroups(m);
  set_rates(m);
  set_budgets_and_backward(m);
  const Best best = search(m);

  Plan p;
  p.profile = hw.name;
  p.params = o.params;
  p.gpus = cpu_only(hw) ? 0 : m.gpus;
  p.subgroup_numel = m.sub;
  p.optimizer = o.optimizer;
  p.overlap = o.overlap;
  p.backward_s = m.backward;
  p.predicted_step_s = best.alone;
  p.exposed_step_s = best.objective;
  p.persist_resident_state = o.persist_resident_state;
  p.alternate_step_order = o.alternate_step_order;
  for (int t = 0; t < kTierCount; ++t) p.budget[t] = m.budget[t];
  Usage u = usage(m, best.shape);
  const std::vector<char> undo = undo_copies(m, best.shape, u);
  for (int t = 0; t < kTierCount; ++t) p.bytes[t] = u.bytes[t];
  const Sim sim = simulate(m, best.shape, o.overlap ? m.backward : 0, undo);
  const std::size_t kept_from = kept_streamed_from(m, best.shape);
  for (std::size_t id = 0; id < m.numel.size(); ++id) {
    PlanSubgroup s = describe_subgroup(m, best.shape, id, undo[id], kept_from, &p.links);
    s.ready_s = sim.ready[id];
    s.done_s = sim.done[id];
    p.subgroups.push_back(s);
  }
  return p;
}

std::string Plan::to_json() const {
  auto tiers = [&](const std::uint64_t* v) {
    return json{{"gpu", v[static_cast<int>(Tier::device)]},
                {"host", v[static_cast<int>(Tier::host)]},
                {"nvme", v[static_cast<int>(Tier::nvme)]}};
  };
  auto mode = [](const std::optional<bool>& v) { return v ? json(*v) : json(nullptr); };
  json j{{"format", "tierswap.plan"},
         {"version", 1},
         {"profile", profile},
         {"params", params},
         {"gpus", gpus},
         {"optimizer", to_string(optimizer)},
         {"subgroup_numel", subgroup_numel},
         {"overlap", overlap},
         {"persist_resident_state", mode(persist_resident_state)},
         {"alternate_step_order", mode(alternate_step_order)},
         {"predicted_step_s", predicted_step_s},
         {"backward_s", backward_s},
         {"exposed_step_s", exposed_step_s},
         {"bytes", tiers(bytes)},
         {"budget", tiers(budget)},
         {"link_bytes_per_step",
          {{"h2d", links.h2d},
           {"d2h", links.d2h},
           {"nvme_read", links.nvme_read},
           {"nvme_write", links.nvme_write},
           {"host_memory", links.host_memory},
           {"gpu_memory", links.gpu_memory}}},
         {"subgroups", json::array()}};
  for (const auto& s : subgroups)
    j["subgroups"].push_back({{"id", s.id},
                              {"numel", s.numel},
                              {"state_tier", tier_name(s.state_tier)},
                              {"step_device", device_name(s.step_device)},
                              {"cast_on", device_name(s.cast_on)},
                              {"grad_tier", tier_name(s.grad_tier)},
                              {"speculative", s.speculative},
                              {"ready_s", s.ready_s},
                              {"done_s", s.done_s}});
  return j.dump(2);
}

namespace {

using placement_json::bad;
using placement_json::Reader;

// A mode the plan was made for: true, false, or null / absent (a plan that does not say).
std::optional<bool> plan_mode(Reader& r, const char* key) {
  const json* v = r.get(key, false);
  if (v == nullptr || v->is_null()) return std::nullopt;
  if (!v->is_boolean()) bad(r.origin, key, "expected true, false or null");
  return v->get<bool>();
}

PlanSubgroup parse_subgroup(std::string_view origin, const json& e, std::size_t i) {
  const std::string k = fmt::format("subgroups[{}]", i);
  Reader r(origin, k, e);
  PlanSubgroup s;
  s.id = static_cast<std::uint32_t>(i);
  s.numel = r.count("numel", 0, true);
  if (s.numel == 0) bad(origin, k + ".numel", "expected an element count > 0");
  s.state_tier = parse_plan_tier(origin, k + ".state_tier", r.str("state_tier", "", true));
  s.step_device = parse_device(origin, k + ".step_device", r.str("step_device", "", true));
  s.cast_on = parse_device(origin, k + ".cast_on",
                           r.str("cast_on", std::string(device_name(s.step_device))));
  s.speculative = r.boolean("speculative", false);
  s.grad_tier =
      parse_plan_tier(origin, k + ".grad_tier",
                      r.str("grad_tier", s.step_device == StepDevice::gpu ? "gpu" : "host"));
  if (s.state_tier == Tier::device && s.step_device == StepDevice::cpu)
    bad(origin, k, "state on the GPU is stepped on the GPU (step_device gpu)");
  if (s.state_tier == Tier::nvme && s.step_device == StepDevice::gpu)
    bad(origin, k, "state on NVMe is stepped by the CPU (step_device cpu)");
  if (s.grad_tier == Tier::device && s.step_device == StepDevice::cpu)
    bad(origin, k, "a CPU step needs its gradient on the host or NVMe");
  return s;
}

}  // namespace

// Keys the plan does not read (`bytes`, each sub-group's `id`, `ready_s`, `done_s`: what
// to_json() writes for people) are left alone: an edited plan may keep them.
Plan Plan::from_json(std::string_view text, std::string_view origin) {
  json j;
  try {
    j = json::parse(text, nullptr, true, /*ignore_comments=*/true);
  } catch (const json::parse_error& e) {
    throw std::invalid_argument(fmt::format("{}: not valid JSON: {}", origin, e.what()));
  }
  Reader r(origin, "", j);
  if (r.str("format", "") != "tierswap.plan") bad(origin, "format", "expected \"tierswap.plan\"");
  if (r.integer("version", 0) != 1) bad(origin, "version", "this build reads plan version 1");
  const json& subs = r.array("subgroups");
  if (subs.empty()) bad(origin, "subgroups", "expected a non-empty array");
  Plan p;
  p.profile = r.str("profile", "");
  p.params = r.count("params", 0);
  p.gpus = r.integer("gpus", 1);
  p.overlap = r.boolean("overlap", true);
  p.persist_resident_state = plan_mode(r, "persist_resident_state");
  p.alternate_step_order = plan_mode(r, "alternate_step_order");
  p.predicted_step_s = r.num("predicted_step_s", 0.0);
  p.backward_s = r.num("backward_s", 0.0);
  p.exposed_step_s = r.num("exposed_step_s", 0.0);
  p.subgroup_numel = r.count("subgroup_numel", 0);
  for (std::size_t i = 0; i < subs.size(); ++i)
    p.subgroups.push_back(parse_subgroup(origin, subs[i], i));
  return p;
}

Plan Plan::load(const std::filesystem::path& file) {
  return from_json(detail::read_text_file(file, fmt::format("plan file {}", file.string())),
                   file.string());
}

const PlanSubgroup& Plan::at_fraction(double f) const {
  if (subgroups.empty()) throw std::logic_error("plan: no sub-groups");
  std::uint64_t total = 0;
  for (const auto& s : subgroups) total += s.numel;
  const double target = std::clamp(f, 0.0, 1.0) * static_cast<double>(total);
  std::uint64_t acc = 0;
  for (const auto& s : subgroups) {
    acc += s.numel;
    if (static_cast<double>(acc) > target) return s;
  }
  return subgroups.back();
}

}  // namespace tierswap
