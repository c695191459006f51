// TieredOptimizer: the one-object setup. It takes what a trainer knows (swap directories, a host
// budget, the optimizer's groups and parameters, which communicator, how many threads) and builds
// the rest in order at finalize(): the swap space, sized from the registered parameters and
// checked against the filesystems' free space; the I/O engine; the tier manager; the thread
// pool; the ShardedOptimizer. Every part stays reachable for experts (optimizer(), tiers(), ...).
//
//   tierswap::TieredOptions o;
//   o.swap_dirs = {"/nvme0/ts", "/nvme1/ts"};   // striped
//   o.host_budget = 8ull << 30;
//   tierswap::TieredOptimizer t(o);
//   int g = t.add_group(tierswap::GroupConfig::defaults(tierswap::OptimizerKind::adamw));
//   auto w = t.add_param(g, {"w", {4096, 4096}, tierswap::Dtype::bf16});
//   t.finalize();
//   t.optimizer().initialize(init);            // then the ShardedOptimizer's step loop
//
// Swap files. Each rank's swap space lives in `<swap_dir>/tierswap-rank<R>/` (created 0700) of
// every swap directory. A directory that already holds one (a run that did not end cleanly) is
// refused with an error naming it, nothing in it touched, unless `resume`: then finalize()
// reopens it and continues from its last committed step (ShardedOptimizer::resume()). The files
// are removed when the TieredOptimizer is destroyed unless `keep_swap_files`; a crash leaves
// them for resume; save() checkpoints are what lasts across versions and world sizes.
//
// Thread-safety: as ShardedOptimizer (one thread drives it).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tierswap/optimizer.hpp"
#include "tierswap/setting.hpp"
#include "tierswap/tier_manager.hpp"

namespace tierswap {

class Communicator;
class IoEngine;
class SwapSpace;
class ThreadPool;

/// How the one-object setup reaches the node service (`tierswap serve`). With a socket, the state
/// lives in a region of the service's swap space, the host pools in memory shared with it
/// (service.hpp's ServiceStorage) instead of swap files of the rank's own; the swap directory then
/// holds only the tier manager's manifest.
struct NodeServiceConfig {
  std::string socket;  ///< the service's socket (TIERSWAP_SERVICE); empty: no service
  /// The job id the service knows this run by ([A-Za-z0-9._-], TIERSWAP_SERVICE_JOB); with the
  /// rank it names the region a restarted run reattaches to. Empty: derived from the first swap
  /// directory's path.
  std::string job;
  /// Seconds each request to the service may wait for its answer (TIERSWAP_SERVICE_TIMEOUT): a
  /// service that does not answer in time (stopped, hung) fails the request, and the connection
  /// is not used again.
  double timeout_seconds = 30;
  /// Seconds attaching waits for a service that is restarting or stopping (its socket missing
  /// or refusing, or a hello refused with ESHUTDOWN; TIERSWAP_SERVICE_WAIT); 0: fail at once.
  double wait_seconds = 0;

  /// Overrides from the environment, each setting's variable as settings() lists it; a value
  /// that does not parse throws std::invalid_argument naming the variable.
  static NodeServiceConfig from_env();
  /// `base` (or the defaults) with the keys of a JSON object applied; unknown keys or bad values
  /// throw naming the key.
  static NodeServiceConfig from_json(std::string_view json, NodeServiceConfig base);
  static NodeServiceConfig from_json(std::string_view json);
  /// Every setting, in the configuration page's order (its table is generated from them).
  static std::vector<Setting> settings();
  void validate() const;
};

struct TieredOptions {
  /// One directory per drive (each gets a file; the space is striped across them). Required.
  std::vector<std::filesystem::path> swap_dirs;
  /// Pinned host bytes (0: tiers.host_budget, which TIERSWAP_HOST_BUDGET may set; 1 GiB). Through
  /// a node service (`service`), 0 takes at most what the service offers this rank: 1/n of
  /// the node's budget for the n ranks on the node (LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE
  /// or MPI_LOCALNRANKS; else 1), within its per-client quota and what is free, less the slab
  /// slack the rank's ask adds. A budget given here is asked for as it is (refused if too large).
  std::uint64_t host_budget = 0;
  /// "auto" | "single" | "mpi" | "nccl" (see make_communicator); ignored when `comm` is given.
  std::string communicator = "auto";
  /// A communicator the trainer made (e.g. over torch.distributed); shared with the trainer.
  std::shared_ptr<Communicator> comm;
  /// Threads for the CPU kernels (0: the machine's hardware threads).
  unsigned threads = 0;
  /// The optimizer's settings. subgroup_size 0 (the default here): chosen from the host budget so
  /// that the read-ahead fits (at most 8M elements).
  OptimizerConfig optimizer = automatic_optimizer_config();
  /// The tier manager's settings (host_budget above wins when non-zero). A host slab larger than
  /// an eighth of the budget is reduced to fit.
  TierConfig tiers = TierConfig::from_env();
  /// The node service to keep the state in (service.socket empty: swap files of the rank's own).
  NodeServiceConfig service = NodeServiceConfig::from_env();
  /// Tune the tier manager to the budget and sub-group size at finalize(), as `tierswap bench
  /// step` does: read-ahead of (prefetch_depth + 1) sub-groups' state blocks
  /// (tiers.lookahead), write-behind from a quarter of the budget (tiers.max_dirty_bytes), host
  /// slabs of 4 sub-groups' fp32 elements up to 64 MiB. false: `tiers` as given.
  bool tune_tiers = true;
  /// Logical swap capacity per rank (0: sized from the parameters at finalize()).
  std::uint64_t swap_capacity = 0;
  /// Keep the swap files when the TieredOptimizer is destroyed.
  bool keep_swap_files = false;
  /// The swap directories go when the run ends, however it ends (the caller's temporary
  /// directories): nothing can resume from them, so through a node service the rank's region is
  /// released when it detaches, kill -9 included (else the service would keep it for a resume),
  /// and a run that fails keeps nothing. Not with resume or keep_swap_files.
  bool temporary_swap_dirs = false;
  /// Continue from the swap space the rank directories hold (a crashed run's, or one kept with
  /// keep_swap_files): finalize() reopens it and calls ShardedOptimizer::resume(); resumed()
  /// says whether there was one (false: a fresh space, initialize() comes next). The parameters
  /// and groups must be the earlier run's; the sub-group size, hyper-parameters, step count and
  /// loss scaler come from the swap directory.
  bool resume = false;

  /// OptimizerConfig::from_env(), with subgroup_size 0 unless TIERSWAP_SUBGROUP_SIZE sets it.
  static OptimizerConfig automatic_optimizer_config();
};

/// Swap bytes a rank needs for `numel` trainable elements per group (kinds as given), at world
/// size `world` with `cfg` (two extent slots per block with shadow slots; gradient blocks too),
/// with headroom for the extent rounding: what finalize() sizes the swap space to.
std::uint64_t swap_bytes_needed(const std::vector<std::pair<GroupConfig, std::uint64_t>>& groups,
                                int world, const OptimizerConfig& cfg, bool shadow_slots);

/// The sub-group size TieredOptimizer picks when subgroup_size is 0: (prefetch_depth + 2)
/// sub-groups of state (`state_bytes_per_param`, 12 for AdamW's fp32 master and moments) fit in a
/// third of the host budget; at most kDefaultSubgroupSize (8M) elements, at least one statistics
/// chunk, a whole number of chunks. `tierswap bench step --sub-group auto` uses it too.
std::uint64_t automatic_subgroup_size(std::uint64_t host_budget, const OptimizerConfig& oc,
                                      std::uint64_t state_bytes_per_param);
/// Tunes `tc` (its host_budget set) to the optimizer's sub-group size and read-ahead: prefetches
/// in flight for the state blocks of (prefetch_depth + 1) sub-groups (`state_blocks` per
/// sub-group), write-behind from a quarter of the budget, host slabs of 4 sub-groups' fp32
/// elements up to 64 MiB. What TieredOptions::tune_tiers applies and `tierswap bench step` uses.
void tune_tier_config(TierConfig& tc, const OptimizerConfig& oc, std::uint64_t state_blocks);
/// Sizes tc.pageable_budget to hold `grad_bytes` of this rank's gradients (plus two host slabs)
/// when they wait on the host (oc.grad_tier) and no pageable budget is set: the gradients of
/// CPU-stepped sub-groups then need no pinned memory. What TieredOptions::tune_tiers applies and
/// `tierswap bench step` uses (its --pinned-grads skips it).
void size_pageable_budget(TierConfig& tc, const OptimizerConfig& oc, std::uint64_t grad_bytes);

class TieredOptimizer {
 public:
  /// Checks the options (std::invalid_argument naming the field) and makes the communicator.
  explicit TieredOptimizer(TieredOptions options);
  ~TieredOptimizer();
  TieredOptimizer(const TieredOptimizer&) = delete;
  TieredOptimizer& operator=(const TieredOptimizer&) = delete;

  // ---- building (before finalize), as ShardedOptimizer's; checked at once ---------------------
  int add_group(const GroupConfig& cfg, std::string name = {});
  ParamId add_param(int group, const ParamSpec& spec);
  /// Sizes and creates the swap space (std::runtime_error naming each directory and the bytes
  /// needed when a filesystem lacks the room, or when a directory holds an earlier run's space),
  /// builds engine, tier manager, pool and optimizer, and finalizes the optimizer. Collective:
  /// a rank whose directory, space or budget is refused makes every rank throw (the others:
  /// "another rank could not set up its swap space and tiers"), each with nothing kept.
  void finalize();
  bool finalized() const noexcept;
  /// Whether finalize() continued an earlier run (TieredOptions::resume and a swap space was
  /// there): then the optimizer holds its state at step_count(); otherwise initialize() it.
  bool resumed() const noexcept;
  /// The run is ending by an error: the destructor keeps the swap files of a run that
  /// committed a step, as a crash leaves them (TieredOptions::resume continues from them),
  /// with a warning naming them. It does so by itself when an exception unwinds it; this is
  /// for callers that end by an error without one (the Python binding, at an exception).
  void mark_failed() noexcept;

  // ---- the parts (std::logic_error before finalize) --------------------------------------------
  ShardedOptimizer& optimizer();
  TierManager& tiers();
  IoEngine& engine();
  SwapSpace& swap_space();
  Communicator& communicator();
  const TieredOptions& options() const noexcept;
  /// Each swap directory's rank subdirectory (where the files are).
  const std::vector<std::filesystem::path>& rank_dirs() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tierswap
