// The optimizer's layout: its groups, parameters and this rank's sub-groups, as finalize() lays
// them out (a group added between steps appends to them). What a sub-group holds for the step in
// progress (its gradient's bookkeeping, its speculative result) sits beside the fixed part.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tierswap/aligned_buffer.hpp"
#include "tierswap/optimizer.hpp"
#include "tierswap/tier_manager.hpp"

namespace tierswap {

inline constexpr BlockId kNoBlock = ~BlockId{0};

/// The state blocks of one sub-group, by BlockClass (kNoBlock where the optimizer has none).
enum StateSlot : int { kMaster, kExpAvg, kExpAvgSq, kMaxExpAvgSq, kMomentum, kStateSlots };
BlockClass state_class(int slot);
/// The name of a state slot's class ("master", "exp_avg", ...), as records store it.
std::string slot_name(int slot);
/// Whether a group with `cfg` keeps state slot `slot`.
bool keeps_slot(const GroupConfig& cfg, int slot);
/// Same kind and the same state slots (what may change between steps: everything else).
bool same_state_layout(const GroupConfig& a, const GroupConfig& b);

struct OptParam {
  ParamSpec spec;
  int group = 0;
  std::uint32_t nsubs = 0;  // this rank's sub-groups holding a piece of it
  std::uint64_t numel = 0;
  std::uint64_t offset = 0;  // in the group's flat space (trainable parameters)
};

struct OptSub {
  int group = 0;
  int index = 0;
  std::uint64_t begin = 0, numel = 0;  // group flat space
  BlockId state[kStateSlots] = {kNoBlock, kNoBlock, kNoBlock, kNoBlock, kNoBlock};
  BlockId grad = kNoBlock;
  bool streaming =
      true;             // state on NVMe: read ahead, written behind (else resident in host memory)
  bool on_gpu = false;  // state in GPU memory (a plan's choice)
  // State in host or GPU memory only (persist_resident_state off, not streamed): memory-only
  // blocks, stepped after the commit, unless `undo`.
  bool memory_only = false;
  // Overlapped mode, memory-only state its tier's budget can double: a speculative step first
  // copies the state into these memory-only blocks (undo_saved), and a discarded step copies it
  // back, so it steps during the backward and still rolls back bit for bit.
  bool undo = false;
  bool undo_saved = false;  // the undo blocks hold the state from before this step's speculation
  BlockId undo_block[kStateSlots] = {kNoBlock, kNoBlock, kNoBlock, kNoBlock, kNoBlock};
  bool step_gpu = false;  // stepped by the CUDA kernels (state on the GPU, or in place in host
                          // memory over a coherent link)
  // Its gradient is accumulated (add_grad_device) and stepped in the device tier: a sub-group the
  // GPU steps, when there is a device tier with room for it (finalize()). Gradients from host
  // memory still go to the host copy.
  bool grad_gpu = false;
  std::vector<ParamId> pids;  // which (group order: increasing ids)
  std::size_t slice_of(ParamId id) const {
    return static_cast<std::size_t>(std::lower_bound(pids.begin(), pids.end(), id) - pids.begin());
  }
};

struct OptGroup {
  GroupConfig cfg;
  std::string name;
  Dtype dtype16 = Dtype::bf16;
  bool has_dtype = false;
  std::vector<ParamId> params;      // all, registration order
  std::uint64_t numel = 0;          // trainable elements
  std::uint64_t part = 0;           // elements per rank partition (multiple of kGradStatsChunk)
  std::uint64_t lo = 0, hi = 0;     // this rank's partition
  std::uint64_t subs_per_part = 0;  // sub-groups per partition: ceil(part / subgroup size)
  // the whole group's 16-bit parameters (flat; on huge pages, as the state the kernels stream)
  std::vector<std::uint16_t, HugePageAllocator<std::uint16_t>> p16;
  std::vector<std::byte> local_grad;  // world size > 1: unreduced local gradient (flat)
  bool local_dirty = false;
  std::size_t chunk_base = 0;            // first statistics chunk in the optimizer's chunk vector
  std::size_t first_sub = 0, nsubs = 0;  // this rank's sub-groups in Impl::subs
  std::string params_record;  // its parameters as groups_json() lists them, as text: made by
                              // finalize() (fixed since), spliced into every commit record
  // The optimizer's step count when the group was added between steps (0 for the others): the
  // group's own step count, its kernels' t, is step_count - step_base.
  std::uint64_t step_base = 0;
  bool has_slot(int slot) const;
  /// The state slot holding `cls`, or -1 when this group keeps no such state.
  int slot_for(BlockClass cls) const;
};

/// The part of parameter p in sub-group s: [b, e) in the group's flat space (b >= e: none).
inline std::pair<std::uint64_t, std::uint64_t> slice(const OptParam& p, const OptSub& s) {
  return {std::max(p.offset, s.begin), std::min(p.offset + p.numel, s.begin + s.numel)};
}

}  // namespace tierswap
