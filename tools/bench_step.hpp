// `tierswap bench step`'s options, and its modes that step one simulated training loop at a
// time (tools/bench_overlap.cpp): the overlapped step against the ordinary one (--overlap), and
// the step's exposed time beside a trainer's forward and backward (--trainer-seconds).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tierswap/optimizer.hpp"
#include "tierswap/tier_manager.hpp"

namespace tierswap::cli {

struct StepOptions {
  std::vector<std::string> dirs;
  std::string params = "256M";
  std::string host_budget = "1GiB";
  std::string sub_group = "auto";
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
  double trainer_seconds = 0;  // > 0: the training-loop mode (a forward and a backward this long)
  bool keep = false;
  bool json = false;
  bool bf16_moments = false;    // also a stack with bf16 moments, alternated with the fp32 one
  bool pinned_grads = false;    // the gradients in the pinned budget (no pageable pool)
  bool lend = false;            // tierswap's gradients lent (lend_grad: read in place), not copied
  std::string tensor;           // elements per parameter (default 64Mi; --overlap: a sub-group)
  bool distinct_grads = false;  // each parameter's gradient in a buffer of its own
  bool ascending = false;       // alternate_step_order off: every step (and io-only pass) ascends
  bool disk_busy = false;       // sample the disks' requests in flight during each pass
};

/// What the loop modes step: the optimizer over `tiers`, its parameters (one sub-group each, in
/// the backward's order) and the bf16 gradient every parameter is handed.
struct LoopBench {
  const StepOptions& o;
  TierManager& tiers;
  ShardedOptimizer& opt;
  const std::vector<ParamId>& ids;
  const std::vector<std::uint16_t>& grad;
  std::uint64_t params = 0;
};

/// --overlap: ordinary vs overlapped step after the same simulated backward.
void run_overlap_bench(const LoopBench& b);
/// --trainer-seconds S: training steps of a forward (S/3) and a backward (2S/3) simulated on the
/// host, the durable commit pipelined beside the forward and the step overlapped with the
/// backward; reports how much of each step the trainer waits for beyond S.
void run_trainer_bench(const LoopBench& b);

}  // namespace tierswap::cli
