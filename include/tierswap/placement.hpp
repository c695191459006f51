// Placement: what the hardware is (a profile: probed, shipped, or a JSON file) and where each
// sub-group of optimizer state lives and steps (a plan, from a cost model).
//
// Hardware profile. GPUs (model, memory, memory bandwidth, how each reaches host memory: PCIe
// generation/width or NVLink-C2C, the pinned-copy bandwidths, and whether a GPU kernel can work
// on host memory in place, as on a Grace-Hopper superchip where pageable memory is accessed
// through the host page tables with native atomics), NUMA nodes, NVMe drives (bandwidths,
// capacity, local NUMA node), host memory, the memlock limit, and the CPU's fused-AdamW
// throughput. probe_hardware() fills one from this machine (hwloc, CUDA device attributes,
// measured copies, NVMe I/O through the engine, the CPU kernel); the shipped profiles are JSON
// (comments allowed: each figure carries its source).
//
// Plan. Per GPU rank, the state of params / gpus parameters is cut into sub-groups, listed in
// parameter order (id 0 holds the model's first parameters). Backward finishes gradients in
// reverse, so the highest ids are final first and the lowest ids last: the tail of the backward.
// For every sub-group the model chooses one of
//   gpu/gpu    state in GPU memory, stepped by the CUDA kernel (nothing crosses the link);
//   host/cpu   state in host memory, stepped by the CPU (16-bit gradient down, 16-bit params up);
//   host/gpu   state in host memory, stepped by a GPU kernel reading and writing it over the
//              link (only where the GPU can address host memory in place at speed: NVLink-C2C);
//   nvme/cpu   state on NVMe, streamed through host memory and stepped by the CPU;
// and where the 16->32-bit gradient cast happens (in the fused kernel of the device that steps,
// or on the GPU before the copy, ZeRO-Offload's way, which doubles the gradient's link bytes).
// The predicted time comes from a simulation of the step as a pipeline over the resources it
// uses (GPU kernel, CPU kernel, host memory, link per direction, NVMe read and write; host and
// NVMe shared by the node's GPUs): each sub-group's stages run in order, each resource serves
// one stage at a time, NVMe reads run ahead by at most the prefetch depth. With overlap, a
// sub-group's host-side work starts when its gradient is final during the backward (GPU work
// waits for the backward to end); the plan minimizes the step time left after the backward,
// then the step time alone, within the GPU, host (pinned) and NVMe budgets.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tierswap/types.hpp"
#include "tierswap/units.hpp"  // parse_param_count, for plan callers

namespace tierswap {

enum class HostLink : std::uint8_t { pcie, nvlink_c2c };
std::string_view to_string(HostLink l) noexcept;

struct GpuProfile {
  std::string model;
  std::uint64_t memory_bytes = 0;
  double memory_gbps = 0;  ///< achievable device-memory bandwidth (the GPU kernel's bound)
  double bf16_tflops = 0;  ///< dense bf16 tensor throughput (estimates the backward's length)
  HostLink link = HostLink::pcie;
  int pcie_gen = 0;  ///< 0 when not PCIe
  int pcie_width = 0;
  double h2d_gbps = 0;  ///< pinned host -> device copies
  double d2h_gbps = 0;  ///< pinned device -> host copies
  /// A GPU kernel reading / writing host memory in place (0: not worth it or not possible).
  double host_read_gbps = 0;
  double host_write_gbps = 0;
  int numa_node = -1;  ///< the host NUMA node closest to it (-1: unknown)
  std::string pci_bus_id;
};

struct NumaProfile {
  int node = 0;
  std::uint64_t memory_bytes = 0;
  int cores = 0;
};

struct NvmeProfile {
  std::string name;  ///< device or mount path
  double read_gbps = 0;
  double write_gbps = 0;
  std::uint64_t capacity_bytes = 0;
  int numa_node = -1;
};

struct HardwareProfile {
  std::string name;
  std::string description;
  bool measured = false;  ///< from probe_hardware(), not specifications
  std::vector<GpuProfile> gpus;
  std::vector<NumaProfile> numa;
  std::vector<NvmeProfile> nvme;
  std::uint64_t host_memory_bytes = 0;
  std::uint64_t memlock_bytes = 0;  ///< RLIMIT_MEMLOCK; ~0 for unlimited
  int cpu_cores = 0;
  double host_memory_gbps = 0;  ///< all sockets, STREAM-triad-like
  double cpu_adam_gbps = 0;     ///< fused bf16-gradient AdamW, all cores, GB/s at 28 B/param

  /// Throws std::invalid_argument naming the field for a missing or impossible value.
  void validate() const;
  /// JSON (comments allowed); unknown keys and bad values throw std::invalid_argument naming
  /// `origin` and the key.
  static HardwareProfile from_json(std::string_view text, std::string_view origin = "profile");
  /// A shipped profile by name (builtin_profiles()), else a JSON file. std::invalid_argument
  /// naming what was asked for when neither exists.
  static HardwareProfile load(std::string_view name_or_path);
  std::string to_json() const;
};

/// Names of the shipped profiles ("gh200", "h100-pcie-8x", "pcie4-workstation").
std::vector<std::string> builtin_profiles();

struct ProbeOptions {
  std::filesystem::path nvme_dir;  ///< measure NVMe I/O here (empty: skip the NVMe figures)
  std::uint64_t io_bytes = 256ull << 20;
  std::uint64_t copy_bytes = 256ull << 20;  ///< host<->device copies
  std::uint64_t kernel_params = 16ull << 20;
  unsigned threads = 0;  ///< CPU kernel threads (0: all cores)
  bool measure = true;   ///< false: topology only (fast; bandwidths left 0)
};

/// Reads this machine: hwloc topology (NUMA nodes, cores, the NUMA node of each GPU and NVMe
/// controller), CUDA device attributes, memlock limit; and with `measure` the bandwidths: pinned
/// host<->device copies, a STREAM-triad probe, the CPU's fused AdamW, NVMe through the engine.
HardwareProfile probe_hardware(const ProbeOptions& opt = {});

// ---- the plan -----------------------------------------------------------------------------------

enum class StepDevice : std::uint8_t { cpu, gpu };

struct PlanOptions {
  std::uint64_t params = 0;  ///< trainable parameters of the model
  int gpus = 0;              ///< data-parallel GPU ranks on this node (0: all of the profile's)
  std::uint64_t subgroup_size = 0;  ///< elements (0: OptimizerConfig's default, larger if needed)
  OptimizerKind optimizer = OptimizerKind::adamw;
  std::uint32_t prefetch_depth = 2;
  bool overlap = true;  ///< host-side work may start during the backward
  /// The optimizer's OptimizerConfig::persist_resident_state the plan is for. false (memory-only
  /// resident state): no NVMe bytes for it; it steps after the commit of the rest, except, with
  /// overlap, host-resident sub-groups the host budget can also hold an undo copy of (the ones
  /// final first), which step during the backward. true: every sub-group steps during the
  /// backward, and resident state is written to NVMe at every step (GPU state through the link).
  bool persist_resident_state = false;
  /// The optimizer's OptimizerConfig::alternate_step_order the plan is for. true (the default):
  /// without overlap, each step begins with the streamed sub-groups the step before ended with,
  /// and reads none of the state the host memory beside the plan's other bytes still holds.
  /// false, or with overlap (speculation steps them in the order gradients become final, the
  /// same every step): every streamed sub-group reads its state every step.
  bool alternate_step_order = true;
  /// GPU memory kept for the model's 16-bit weights, activations and workspace, per GPU
  /// (~0: 2 B per parameter + 20% of the GPU's memory).
  std::uint64_t gpu_reserve_bytes = ~std::uint64_t{0};
  double host_reserve_fraction = 0.1;  ///< host memory left to the OS and the trainer
  /// The backward's length in seconds (< 0: estimated as 4 * params * tokens_per_gpu FLOPs at
  /// `mfu` of the GPU's bf16 throughput).
  double backward_s = -1;
  std::uint64_t tokens_per_gpu = 16384;
  double mfu = 0.4;
  void validate() const;
};

struct PlanSubgroup {
  std::uint32_t id = 0;
  std::uint64_t numel = 0;
  Tier state_tier = Tier::host;  ///< device (shown as "gpu"), host or nvme
  StepDevice step_device = StepDevice::cpu;
  StepDevice cast_on = StepDevice::cpu;
  Tier grad_tier = Tier::host;  ///< where its 16-bit gradient waits (device, host or nvme)
  /// With overlap: it steps during the backward (speculatively); false: after the verdict.
  bool speculative = false;
  double ready_s = 0;  ///< gradient final (from the start of the backward)
  double done_s = 0;   ///< state written (same clock)
};

struct PlanLinks {                 ///< bytes per step per GPU rank
  std::uint64_t h2d = 0, d2h = 0;  ///< over the GPU's link (copies and in-place access)
  std::uint64_t nvme_read = 0, nvme_write = 0;
  std::uint64_t host_memory = 0;  ///< CPU kernel and in-place GPU traffic in host memory
  std::uint64_t gpu_memory = 0;   ///< GPU kernel traffic in device memory
};

struct Plan {
  std::string profile;
  std::uint64_t params = 0;
  int gpus = 1;
  std::uint64_t subgroup_numel = 0;
  OptimizerKind optimizer = OptimizerKind::adamw;
  bool overlap = true;
  /// The mode it was made for (PlanOptions); unset in a plan file that does not say.
  std::optional<bool> persist_resident_state;
  /// The step order it was made for (PlanOptions::alternate_step_order; what the ordinary step
  /// reads back depends on it); unset in a plan file that does not say.
  std::optional<bool> alternate_step_order;
  double predicted_step_s = 0;  ///< the step alone (no overlap)
  double backward_s = 0;
  double exposed_step_s = 0;  ///< step time left after the backward (overlap), else the step
  std::uint64_t bytes[kTierCount] = {};   ///< state + gradients per GPU rank, by tier
  std::uint64_t budget[kTierCount] = {};  ///< what the tier can give a rank
  PlanLinks links;
  std::vector<PlanSubgroup> subgroups;
  /// {"profile", "params", "gpus", "predicted_step_s", "bytes": {"gpu","host","nvme"},
  ///  "subgroups": [{"id","numel","state_tier","step_device","cast_on", ...}], ...}
  std::string to_json() const;
  /// A plan file (as to_json() writes it, possibly edited): checks its shape and values.
  static Plan from_json(std::string_view text, std::string_view origin = "plan");
  static Plan load(const std::filesystem::path& file);
  /// The decision for an element at fraction `f` in [0, 1) of a rank's parameters.
  const PlanSubgroup& at_fraction(double f) const;
};

/// The cost model: the plan with the shortest step for `opt` on `hw`. std::invalid_argument when
/// the model does not fit (names the tier and the bytes missing).
Plan make_plan(const HardwareProfile& hw, const PlanOptions& opt);

}  // namespace tierswap
