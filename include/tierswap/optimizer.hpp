// ShardedOptimizer: the ZeRO-style optimizer whose state lives on the tiers. This is what a
// trainer links.
//
// Life cycle:
//   1. add_group() per parameter group (own hyper-parameters), add_param() per parameter (name,
//      shape, 16-bit dtype, requires_grad). Frozen parameters get no gradient or state slot.
//   2. finalize(): each group's trainable parameters are flattened (registration order) and cut
//      into one contiguous partition per rank (a multiple of kGradStatsChunk elements, the last
//      rank's ragged; padding never exists in memory), and each partition into sub-groups of
//      OptimizerConfig::subgroup_size elements. Every sub-group has one TierManager block per
//      state (fp32 master, moments) and one transient 16-bit (or fp32) gradient block.
//   3. initialize() (or load()) writes the master weights and commits generation 1.
//   4. Per step: begin_backward(); add_grad() per parameter (or add_grad_bucket(), or lend_grad():
//      no copy); end_backward();
//      repeated for gradient accumulation; then step().
//
// Gradients. The trainer hands each rank's *local* (unreduced) gradient of every trainable
// parameter, 16-bit (or fp32), from host memory or, in CUDA builds, from device memory with the
// events of every stream that produced it (all are waited for before reading). At world size 1
// they are accumulated straight into the sub-groups' gradient blocks. At world size > 1 they are
// accumulated into a local flat buffer (accumulation dtype, one element per trainable parameter
// of the model: the memory cost of data parallelism before the reduction) and reduce-scattered
// per sub-group: at every end_backward(), or once per step with `coalesce` (several backward
// passes, one reduction: the unreduced buffer then lives for the whole step, and 16-bit sums
// round once instead of once per backward).
//
// The step. The only stored gradient is the 16-bit one: the statistics pass gives the global
// norm (bit-identical for every world size: chunk sums are gathered, then added in one order) and
// the non-finite flag; a step with a non-finite gradient is skipped (dynamic loss scaling shrinks
// the scale); max-norm clipping and the loss-scale inverse fold into the kernel's gradient
// multiplier. Sub-groups are stepped as a pipeline: the state of the next `prefetch_depth`
// sub-groups is read ahead while the fused kernel runs on the current one, and the previous one
// is written behind, so pinned memory stays within the host budget whatever the model size
// (in ascending and descending order on alternate steps: a step starts where the last one
// ended, on the state the budget still holds). The
// new state is written as a new generation and committed at the end of the step: an error
// mid-step leaves the previous step's state intact (discarded) and drops the step's gradients
// (the trainer redoes the backward).
//
// Overlapped step (OptimizerConfig::overlap). A sub-group whose gradient becomes final during the
// final backward is stepped at once, on a background thread, with the loss-scale inverse as its
// multiplier, into the open (uncommitted) generation; its 16-bit parameters are held aside. The
// verdict in step() then commits those results (stepping only the rest), or discards them (the
// committed state is untouched, bit for bit) when a gradient is non-finite, or discards them and
// steps everything again when clipping applies or a hyper-parameter, the loss scale or a
// gradient changed after the speculative step. Results are bit-identical to the ordinary step.
// When an overlapped step ends, the state of the sub-groups whose gradients became final first
// (the next backward's first, as the backward's order repeats) is read ahead, as many as the
// read-ahead depth, so that it arrives during the trainer's forward.
//
// 16-bit parameters. The kernel writes this rank's share of the 16-bit parameters; step()
// all-gathers them, so param16(id) on every rank holds the whole model's updated 16-bit weights.
//
// Thread-safety: one thread drives an optimizer (MPI semantics: every rank calls the same
// functions in the same order). The TierManager and Communicator must outlive it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tierswap/kernels.hpp"
#include "tierswap/setting.hpp"
#include "tierswap/tier_manager.hpp"

namespace tierswap {

class Communicator;
class ThreadPool;
struct Plan;

// OptimizerKind, to_string(OptimizerKind), parse_optimizer_kind: tierswap/types.hpp.

/// One parameter group's hyper-parameters (torch.optim names). The member defaults are
/// torch.optim.AdamW's; defaults(kind) gives each kind its own torch defaults. Changeable between
/// steps (schedulers) except `kind`, `amsgrad`, and whether SGD has momentum, which fix the set
/// of state blocks at finalize().
struct GroupConfig {
  OptimizerKind kind = OptimizerKind::adamw;
  double lr = 1e-3;
  double beta1 = 0.9;  ///< Adam/AdamW/Lion
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;  ///< decoupled for adamw and lion, L2 for adam and sgd
  bool amsgrad = false;
  bool maximize = false;
  double momentum = 0.0;  ///< SGD
  double dampening = 0.0;
  bool nesterov = false;
  /// Throws std::invalid_argument naming the field for values torch also rejects.
  void validate() const;
  /// The defaults of torch.optim for `kind`: AdamW lr 1e-3, betas (0.9, 0.999), eps 1e-8,
  /// weight_decay 1e-2; Adam the same with weight_decay 0; SGD lr 1e-3 (torch >= 2.0), no
  /// momentum, weight_decay 0; Lion (lion-pytorch) lr 1e-4, betas (0.9, 0.99), weight_decay 0.
  static GroupConfig defaults(OptimizerKind kind);
  friend bool operator==(const GroupConfig&, const GroupConfig&) = default;
};

enum class LossScaling : std::uint8_t {
  none,     ///< bf16 / fp32 gradients: no scaling (non-finite gradients still skip the step)
  fixed,    ///< a static scale
  dynamic,  ///< torch.cuda.amp.GradScaler: halve on overflow, double after `growth_interval`
};

struct LossScalerConfig {
  LossScaling mode = LossScaling::none;
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::uint32_t growth_interval = 2000;
  void validate() const;
};

struct OptimizerConfig {
  /// Elements per sub-group (rounded up to a multiple of kGradStatsChunk): the unit of the
  /// step pipeline, of prefetch and of write-behind.
  std::uint64_t subgroup_size = kDefaultSubgroupSize;
  /// Sub-groups whose state is read ahead of the one being stepped.
  std::uint32_t prefetch_depth = 2;
  /// Step the sub-groups in ascending order on odd steps and in descending order on even ones,
  /// so that a step begins with the sub-groups the last one ended with: the state the host
  /// budget still holds from it is used instead of read again. With the state streamed from
  /// NVMe under a budget that holds a fraction f of it, a step reads about (1 - f) of the state
  /// instead of all of it (least-recently-used eviction against a cyclic order keeps nothing).
  /// The order changes no bits (each sub-group's update depends only on its own state and
  /// gradient, the norm is summed in one fixed order). false: always ascending.
  bool alternate_step_order = true;
  /// Gradient accumulation dtype: the 16-bit dtype of each group's parameters (default, 2 bytes
  /// per parameter), or f32 (exact accumulation over micro-steps, 4 bytes).
  bool accumulate_fp32 = false;
  /// Moments stored in bf16 (halves their bytes; opt-in, changes results).
  bool bf16_moments = false;
  /// Where state lives between steps: nvme (streamed through the host budget, written behind
  /// after each sub-group), host (kept resident; the tier manager still commits it to NVMe each
  /// step), or automatic: host when all state and gradients fit in half the host budget.
  enum class StateTier : std::uint8_t { automatic, host, nvme } state_tier = StateTier::automatic;
  /// host: gradient blocks stay in pinned memory (spilled to NVMe only under pressure);
  /// nvme: each gradient block is written to NVMe once its ingest is done.
  Tier grad_tier = Tier::host;
  /// One reduce-scatter per step for all backward passes (world size > 1).
  bool coalesce = true;
  /// Clip the global gradient norm to this (0: off), folded into the kernel's multiplier.
  double max_grad_norm = 0.0;
  LossScalerConfig loss_scaler;
  /// Overlapped step: a sub-group steps speculatively, on a background thread, as soon as its
  /// gradient is final (during the final backward), writing a new generation; step() then
  /// commits it, discards it on a non-finite gradient, or discards it and steps again with the
  /// clip factor (or a hyper-parameter changed in between). The result is bit-identical to the
  /// ordinary step. Needs shadow slots (TierConfig::shadow_slots). Costs 2 bytes per parameter
  /// of (unpinned) host memory for the speculative 16-bit parameters.
  bool overlap = false;
  /// A placement plan file (`tierswap plan --out`, possibly edited): finalize() takes each
  /// sub-group's state tier (gpu | host | nvme) and step device from it, by the sub-group's
  /// position in the rank's parameters. Empty: state_tier decides for all.
  std::string plan_file;
  /// true: host- and GPU-resident state is also committed to NVMe at every step (written
  /// behind; GPU state through host memory), so a failed or discarded step and a crash recover
  /// it exactly. false: it lives in memory only (memory-only blocks: no NVMe I/O for it at all)
  /// and must fit its tier's budget (host state beside the host-resident gradients, with
  /// TierConfig::slab_slack() to spare); the ordinary step steps it after committing the rest
  /// (resident state, gradients pinned before the commit), so a step failing before the commit
  /// leaves it bit for bit. The overlapped mode (overlap at finalize) gives resident
  /// sub-groups an undo copy where their tier's budget holds one (the sub-groups final first get
  /// them first): those step speculatively during the backward (the copy is taken first and put
  /// back if the step is discarded); the others step after the verdict.
  /// A crash loses it: save() checkpoints are its durability. NVMe-resident state is unaffected.
  /// When every sub-group's state is memory-only (world size 1, overlap off), step() writes
  /// nothing to the swap directory: its record already says the state cannot be resumed.
  bool persist_resident_state = true;
  /// Overlapped mode: a speculative step writes its 16-bit output straight into param16()
  /// instead of a scratch copy that step() copies into place after the verdict (2 B/param read
  /// and written after the backward, the largest part of what is left of a fully speculated
  /// step). The price: param16() may show speculative values between the moment a sub-group's
  /// gradient is final and step(), and a discarded speculation (overflow, clipping redo, a
  /// failure) recomputes them from the restored master weights (the same bits). Safe for a
  /// trainer that does not read param16() during the backward for parameters whose gradients
  /// are already final; on_param16_ready still fires only for kept values. Default off.
  bool overlap_param16_in_place = false;
  /// A step whose placement has sub-groups stepped by the GPU and others by the CPU (a plan's
  /// split): the GPU's sub-groups step on a thread of their own, in order, while step()'s thread
  /// steps the CPU's, so the two parts overlap as the plan's cost model assumes (its predicted
  /// time takes the longer part, not their sum). on_param16_ready still runs on step()'s thread.
  /// false: one after the other on step()'s thread (the same bits either way). Default on.
  bool concurrent_gpu_step = true;
  /// The commit of step t runs on the tier manager's thread while the trainer goes on (its next
  /// forward): step() returns once the state is stepped and its writes are started. The next
  /// call that touches the state (step, begin_backward, a gradient hand-over, save, gather, ...)
  /// first waits for it; if it failed, step t is rolled back (state, 16-bit parameters, loss
  /// scaler) and that call throws, naming step t. A crash before it lands resumes from step
  /// t - 1 (one step redone). Taken with one rank, shadow slots and no memory-only state (their
  /// step could not be undone); otherwise, and with false, the commit runs inside step().
  /// Default off here (a step's failure is that step()'s); tierswap.torch turns it on.
  bool pipelined_commit = false;
  void validate() const;
  /// Overrides from the environment: each setting's variable as settings() lists it (TIERSWAP_...;
  /// tools/docs/configuration.md). A value that does not parse throws naming the variable.
  static OptimizerConfig from_env();
  static OptimizerConfig from_env(OptimizerConfig base);
  /// Loads a JSON object of the keys settings() lists (loss_scaler an object of mode, init_scale,
  /// growth_factor, backoff_factor, growth_interval); unknown keys or bad values throw
  /// std::invalid_argument naming the key (and, for an unknown one, every known key).
  static OptimizerConfig from_json(std::string_view json);
  /// Every setting, in the configuration page's order (its table is generated from them).
  static std::vector<Setting> settings();
};

using ParamId = std::uint32_t;

struct ParamSpec {
  std::string name;                 ///< unique, non-empty
  std::vector<std::int64_t> shape;  ///< numel = product (> 0)
  Dtype dtype = Dtype::bf16;        ///< the 16-bit dtype of the model's copy (bf16 or f16)
  bool requires_grad = true;
  std::uint64_t numel() const;
};

/// A sub-group of this rank: a contiguous range of its group's flat parameter space.
struct SubgroupInfo {
  int group = 0;
  int index = 0;            ///< within the group's partition of this rank
  std::uint64_t begin = 0;  ///< element offset in the group's flat space
  std::uint64_t numel = 0;
};

/// What step() did.
struct StepResult {
  bool skipped = false;        ///< a non-finite gradient: state unchanged, scale backed off
  std::uint64_t step = 0;      ///< optimizer steps taken so far (skipped ones not counted)
  double grad_norm = 0;        ///< global norm of the unscaled gradient (inf/nan when skipped)
  double clip_factor = 1;      ///< <= 1
  double loss_scale = 1;       ///< the scale the gradients of this step carried
  double next_loss_scale = 1;  ///< the scale for the next step
  std::uint64_t bytes_in[kTierCount] = {};  ///< moved into each tier during the step
  std::uint64_t bytes_out[kTierCount] = {};
  /// Time the step's acquires waited for a transfer (a read landing, or a block's own
  /// write-back before a writable view); not the commit's wait (commit_seconds).
  double io_wait_seconds = 0;
  /// The commit: waiting for the step's write-backs to land and writing the manifest (0 when it
  /// was left running: pipelined_commit).
  double commit_seconds = 0;
  /// Time this step waited at its start for the previous step's pipelined commit to land.
  double commit_wait_seconds = 0;
  /// Whether this step's commit was left running (pipelined_commit): `generation` is the one it
  /// makes, durable once the next call that touches the state returns.
  bool commit_pending = false;
  double seconds = 0;  ///< wall time of step()
  /// The committed generation holding the new state; unchanged by a step whose state is all
  /// memory-only (persist_resident_state off, world size 1, no overlapped mode): such a step
  /// commits nothing, since nothing of its state is on NVMe.
  std::uint64_t generation = 0;
  /// Overlapped mode: sub-groups stepped during the backward whose result was kept.
  std::uint32_t overlapped_subgroups = 0;
  /// Overlapped mode: speculative results were discarded and stepped again (clipping was needed,
  /// or a hyper-parameter or a gradient changed after its sub-group was stepped).
  bool redone = false;
  /// Sub-groups the GPU stepped in this step (a plan's GPU part), and the time its part took
  /// from the first to the last of them; with concurrent_gpu_step it overlapped the CPU's part.
  std::uint32_t gpu_subgroups = 0;
  double gpu_seconds = 0;
  /// Sub-groups whose gradient the step read where the trainer left it (lend_grad), no copy.
  std::uint32_t lent_subgroups = 0;
};

/// Fills `count` fp32 values of parameter `param` starting at element `offset`.
using ParamInit =
    std::function<void(ParamId param, std::uint64_t offset, float* out, std::uint64_t count)>;

class ShardedOptimizer {
 public:
  /// `pool` (may be null) runs the CPU kernels; `comm` gives rank and world size.
  ShardedOptimizer(TierManager& tiers, Communicator& comm, OptimizerConfig cfg = {},
                   ThreadPool* pool = nullptr);
  ~ShardedOptimizer();
  ShardedOptimizer(const ShardedOptimizer&) = delete;
  ShardedOptimizer& operator=(const ShardedOptimizer&) = delete;

  // ---- building (before finalize) --------------------------------------------------------
  /// Returns the group's index.
  int add_group(const GroupConfig& cfg, std::string name = {});
  /// Every parameter of a group must have the same 16-bit dtype.
  ParamId add_param(int group, const ParamSpec& spec);
  /// Lays out partitions and sub-groups and creates the state blocks. The swap space must not
  /// hold this rank's blocks already (resume() continues from them; load() restores a
  /// checkpoint). Collective: a rank whose layout or budget is refused makes every rank throw
  /// (the others: "another rank's finalize failed"), none left waiting in what follows.
  void finalize();
  /// finalize() that continues from the swap space after a crash (kill -9, power loss, an OOM
  /// kill) or a clean stop with the swap files kept. Every commit writes a record of the state
  /// (layout, sub-group size, hyper-parameters, step count, loss scaler) into the tier manager's
  /// manifest, atomically with the generation.
  /// Returns: true when the swap space holds a record: resume() lays out with the stored
  ///   sub-group size, takes the stored blocks, restores hyper-parameters, step count and loss
  ///   scaler and recomputes the 16-bit parameters from the master weights; the next step is
  ///   step_count() + 1 (a step that was running at the crash never committed and is redone).
  ///   false when it holds none: it was finalize() (initialize() or load() comes next).
  /// Throws: std::runtime_error naming the difference when the record is of another optimizer
  ///   (groups and parameters, world size, rank, moment dtype, tierswap version), or when the
  ///   state was not on NVMe (persist_resident_state off).
  /// Collective. The ranks commit a step one after another: after a job killed between their
  ///   commits, the ranks one step ahead roll back to the generation before
  ///   (TierManager::roll_back_generation(); its data is intact, since no rank writes the next
  ///   step's state before every rank has reduced its gradients), so all resume the same step;
  ///   ranks further apart are an error.
  /// Not restored: the loss-scale back-off of a skipped step (the redone step skips again).
  bool resume();
  bool finalized() const noexcept;
  /// Places sub-groups by `plan` (see OptimizerConfig::plan_file) at finalize(). Sub-groups the
  /// plan steps on the GPU need a usable GPU (std::invalid_argument at finalize() otherwise).
  void set_plan(const Plan& plan);
  /// Where sub-group k's state lives and which processor steps it.
  struct Placement {
    Tier state_tier = Tier::nvme;  ///< Tier::device (GPU memory), host or nvme
    bool gpu_steps = false;        ///< the CUDA kernels step it (else the CPU's)
  };
  Placement placement(std::size_t k) const;
  /// Whether sub-group k's gradients from add_grad_device are accumulated in the device tier (a
  /// GPU-stepped sub-group, when that tier can hold them beside a step's views; see finalize()).
  bool gradient_on_device(std::size_t k) const;
  /// Writes every master weight (the caller's init), zeroes the state, computes the 16-bit
  /// copies and commits. Collective: the ranks agree after writing and after committing, so a
  /// rank's failure throws on every rank. One in the commit (the state written on some ranks
  /// and not on others) leaves every rank refusing to step or save until initialize() or
  /// load() succeeds again; so does such a failure of load() or import_state().
  void initialize(const ParamInit& init);
  /// Adds a parameter group between steps (torch's add_param_group: progressive unfreezing): lays
  /// out the new group alone (its own partitions and sub-groups after the others'), places its
  /// sub-groups by OptimizerConfig::state_tier (a plan covers the groups it was made for), checks
  /// the budgets with them, creates their blocks, writes their master weights from `init` (moments
  /// zero) and commits. The other groups' state, placement and gradients are untouched. The
  /// group's step count starts at 0 (group_step_count(): torch counts steps per parameter), and
  /// the commit record and checkpoints hold it: a resumed run passes the group to add_group()
  /// before resume(), in the same order. Returns the new parameters' ids, in order.
  /// Throws: std::logic_error before the state exists, during a backward or with speculative
  ///   results pending; std::invalid_argument for a bad group or parameter (as add_group() and
  ///   add_param()), a budget that cannot hold the new state, or a swap space with no room for
  ///   it (it is sized at construction: TieredOptions::swap_capacity leaves room). Nothing
  ///   changes then. Collective.
  std::vector<ParamId> add_group_between_steps(const GroupConfig& cfg, std::string name,
                                               std::span<const ParamSpec> params,
                                               const ParamInit& init);
  /// Steps group `group` took: step_count() less the step at which it was added.
  std::uint64_t group_step_count(int group) const;

  // ---- hyper-parameters ------------------------------------------------------------------
  int group_count() const;
  const GroupConfig& group_config(int group) const;
  /// Takes effect at the next step. Throws std::invalid_argument for a bad value or a change of
  /// kind/amsgrad/momentum-ness after finalize().
  void set_group_config(int group, const GroupConfig& cfg);
  void set_lr(int group, double lr);

  // ---- gradients -------------------------------------------------------------------------
  /// Starts a backward pass (a micro-step). `final`: the last one before step(); sub-groups whose
  /// gradients are complete then report gradient_final().
  void begin_backward(bool final = true);
  /// Adds this rank's local gradient of a trainable parameter (param.numel() values of `dtype`,
  /// host memory) to the accumulated gradient. Bad arguments throw std::invalid_argument (or
  /// std::logic_error outside a backward) and change nothing. When the tiers cannot take the
  /// gradient (a read or write of the swap files fails, the budget cannot hold it) the backward
  /// is abandoned before the error is rethrown: every gradient since the last step is dropped,
  /// speculative steps taken from them are discarded (the committed state, bit for bit), and
  /// the backward is over (in_backward() is false): begin the step's backward passes again.
  /// The same holds for add_grad_device, add_grad_bucket and lend_grad.
  void add_grad(ParamId param, const void* grad, Dtype dtype);
  /// The same from device memory, ordered after every event in `events` (cudaEvent_t as void*:
  /// one per producing stream) with cudaStreamWaitEvent, so the host does not block on them. At
  /// world size 1 the slices for sub-groups a GPU steps are accumulated in the device tier, where
  /// the step reads them (nothing goes down to the host and back); the rest comes down to the
  /// host. On a simulated device tier (with or without a GPU in the machine) `d_grad` is host
  /// memory standing in for the GPU's and `events` must be empty (std::invalid_argument
  /// otherwise); with neither a GPU nor a simulated device tier it throws std::runtime_error.
  void add_grad_device(ParamId param, const void* d_grad, Dtype dtype,
                       std::span<void* const> events);
  /// A bucket: consecutive trainable parameters of one group, starting at `first`, their
  /// gradients back to back in `grad` (`count` parameters).
  void add_grad_bucket(ParamId first, std::size_t count, const void* grad, Dtype dtype);
  /// add_grad without the copy where it can: the step reads the gradient where it is. Lent are
  /// the slices of a final backward at world size 1, without the overlapped mode, in the
  /// accumulation dtype, for sub-groups the CPU steps, whose gradient is still empty; the rest
  /// (and a second gradient of a lent slice) is copied as add_grad copies it. The statistics are
  /// taken from the caller's memory once a sub-group's slices are all lent; a sub-group lent in
  /// part is copied in at step(). The caller keeps `grad` alive and unchanged until the step
  /// that takes it returns or throws (a step that throws before it stepped copies the lent
  /// gradients in first, so they are still there for the next one), or the gradients are
  /// dropped (load, initialize). Bit-identical to add_grad.
  void lend_grad(ParamId param, const void* grad, Dtype dtype);
  /// Ends the backward pass (reduces now unless `coalesce`).
  void end_backward();
  /// Whether a backward pass is in progress: begun, not ended, not abandoned by a failure.
  bool in_backward() const noexcept;
  /// Drops every gradient handed over since the last step (a hand-over that failed part-way,
  /// a trainer's zero_grad between steps): speculative steps taken from them are discarded, the
  /// committed state stays as it is. Between backward passes (std::logic_error during one).
  void drop_grads();
  /// Leaves `params` (trainable parameters) as they are in the next step(): their master
  /// weights, moments and 16-bit values are not updated (a gradient they were given still counts
  /// in the norm and the non-finite check) (torch.optim's step for a parameter whose .grad is None;
  /// without this call a parameter given no gradient steps on zeros: its moments decay, its weight
  /// decay applies). The others step as usual; the step count is the optimizer's one. Call it after
  /// the step's last end_backward() and before step(); the set holds for that step() only, and the
  /// next begin_backward() or drop_grads() clears it. Speculative results of the overlapped mode
  /// are redone when the set is not empty. Every rank passes the same set (a collective's caller
  /// agrees on it first). std::invalid_argument naming an unknown or frozen parameter, and
  /// nothing changes; std::logic_error during a backward.
  void leave_alone(std::span<const ParamId> params);
  /// Whether sub-group k's gradient is final for this step (the hook for stepping a sub-group as
  /// soon as its gradients are complete).
  bool gradient_final(std::size_t k) const;

  // ---- the step --------------------------------------------------------------------------
  /// The scale the trainer multiplies the loss by (1 without loss scaling).
  double loss_scale() const;
  /// Steps every sub-group of this rank and commits the new generation. Collective. A step that
  /// fails (an I/O error) rolls back; the ranks agree before committing, so one rank's failure
  /// makes every rank throw with no rank stepped (the others: "another rank's step failed").
  /// So do the commits: a commit that fails on one rank (its sync or manifest write) makes every
  /// rank throw, and the ranks whose commit of the step happened undo it (their previous
  /// generation is intact), so all stay at the step before. Should that undo fail too, every
  /// later call refuses: restart and resume(), which steps the ranks ahead back.
  StepResult step();
  /// step() clipped by the factor the caller computed from its own norm of the same unscaled
  /// gradients, in (0, 1], instead of by max_grad_norm (which must be 0: clipping twice throws
  /// std::invalid_argument, as a factor out of range does). For torch.nn.utils.clip_grad_norm_'s
  /// fp32 coefficient: the fused kernel multiplies each fp32 gradient by it as torch's g.mul_()
  /// does, so without loss scaling a torch recipe is reproduced bit for bit.
  StepResult step(double clip_factor);
  std::uint64_t step_count() const;
  /// Switches the overlapped step on or off (between steps: not during a backward, nor while
  /// speculative results wait for step()). std::logic_error otherwise, or in in-place mode.
  void set_overlap(bool on);
  bool overlap() const noexcept;
  /// Whether speculative results of an overlapped backward wait for step(): the state is then
  /// not the committed one, and gather() and save() refuse to read it until step() settles it.
  bool speculation_pending();

  // ---- parameters and layout --------------------------------------------------------------
  /// The model's 16-bit copy of a trainable parameter (every rank holds all of it after a step).
  /// A frozen parameter has none (the trainer keeps its values; tierswap stores nothing for it):
  /// std::invalid_argument naming it.
  std::span<const std::uint16_t> param16(ParamId param) const;
  /// Called by step(), on its thread, with a trainable parameter's 16-bit values as soon as they
  /// are final, so a trainer can start their copy to the GPU while the rest of the step runs.
  /// When: at world size 1 right after the last sub-group holding a piece of the parameter was
  ///   stepped (or, in the overlapped mode, once the speculative result is kept), in step order
  ///   and before the generation is committed; at world size > 1, after the all-gather, for
  ///   every parameter. A skipped step (non-finite gradients) calls nothing. If the step fails
  ///   after it changed 16-bit values, it calls again, for every trainable parameter, with the
  ///   restored values before rethrowing; the last call for a parameter always gives param16().
  /// Lifetime: the span stays valid and unchanged until the next step() (with
  ///   overlap_param16_in_place, until the next final backward's speculation). On a CUDA build
  ///   with a usable GPU the values live in page-locked memory (cudaHostRegister), so
  ///   asynchronous copies from them do not stage through a bounce buffer.
  /// Throws: an exception thrown by the callback is an error of the step (rolled back at world
  ///   size 1; at world size > 1 the step is already committed when it propagates).
  /// An empty function removes the callback.
  using Param16Ready = std::function<void(ParamId, std::span<const std::uint16_t>)>;
  void on_param16_ready(Param16Ready fn);
  /// Binds the trainer's device copy of a trainable parameter's 16-bit values (param.numel()
  /// values of the group's 16-bit dtype in GPU memory; on a simulated device tier, with or
  /// without a GPU in the machine, host memory standing in for it), which the optimizer then
  /// keeps equal to param16().
  /// When: filled now, and at every step each sub-group's new values start going there as soon
  ///   as the sub-group is done, before on_param16_ready is called for the parameter (from its
  ///   GPU step's output device to device, nothing crossing the link, or from host memory for
  ///   the CPU's sub-groups), after the all-gather at world size > 1, and after a rolled-back
  ///   step, initialize() and load().
  /// Thread-safety: copies to GPU memory are stream-ordered on the step thread's default stream
  ///   (cudaStreamPerThread), so work the trainer queues there after the callback sees them;
  ///   step() returns after they completed.
  /// Throws: std::invalid_argument for a frozen or unknown parameter; std::runtime_error with
  ///   neither a usable GPU nor a simulated device tier. nullptr unbinds.
  void bind_param16_device(ParamId param, void* d_param16);
  /// This rank's state of `param` (fp32 master weights, or a moment: exp_avg, exp_avg_sq,
  /// max_exp_avg_sq, momentum), the part that falls in its partition, as runs of (offset in the
  /// parameter, values). Reads through the tiers. std::invalid_argument for a state the
  /// parameter's group does not keep.
  std::vector<std::pair<std::uint64_t, std::vector<float>>> shard(
      ParamId param, BlockClass cls = BlockClass::master);
  /// The whole of a trainable parameter's `cls` state (fp32 master weights or a moment) on every
  /// rank: each rank's shard(), all-gathered (values exact; bf16 moments widened to fp32).
  /// Collective: every rank calls it with the same arguments. std::invalid_argument for a frozen
  /// or unknown parameter, or a state the parameter's group does not keep.
  std::vector<float> gather(ParamId param, BlockClass cls = BlockClass::master);
  /// One whole parameter's state for import_state(): `values` holds param.numel() fp32 values.
  struct StateTensor {
    ParamId param = 0;
    BlockClass cls = BlockClass::master;
    std::span<const float> values;
  };
  /// Replaces state with whole-parameter values (every rank passes the same; each keeps its
  /// part, rounded to the stored dtype), sets the step count when `step` is given, recomputes the
  /// 16-bit parameters where master weights changed and commits a generation: how a
  /// torch.optim state dict comes in. Between steps only (std::logic_error during a backward or
  /// with speculative results pending). Every entry is checked before anything is written
  /// (std::invalid_argument naming the parameter: unknown, frozen, a state its group does not
  /// keep, a wrong length, or given twice); an I/O error while writing discards the partial
  /// generation (shadow slots), so the committed state stays as it was. Collective.
  /// `group_steps` (one per group, none above `step`, which it needs) gives each group its own
  /// step count (group_step_count()), as a torch state dict of groups added at different steps.
  void import_state(std::span<const StateTensor> tensors, std::optional<std::uint64_t> step,
                    std::span<const std::uint64_t> group_steps = {});
  const ParamSpec& param(ParamId id) const;
  std::size_t param_count() const;
  std::size_t subgroup_count() const;  ///< this rank's
  SubgroupInfo subgroup(std::size_t k) const;
  /// Elements of `group` owned by `rank`: [begin, end) of the group's flat space.
  std::pair<std::uint64_t, std::uint64_t> partition(int group, int rank) const;
  /// Bytes of state of this rank.
  std::uint64_t state_bytes() const;
  const OptimizerConfig& config() const noexcept;

  // ---- checkpoints -----------------------------------------------------------------------
  /// Writes this rank's committed state (master, moments), and on rank 0 the checkpoint
  /// manifest (format version, world size, layout, hyper-parameters, step count, loss scaler,
  /// XXH3 checksums), every file written to a temporary name, fsynced and renamed; the manifest
  /// last. Collective. Reads the state through the tiers: NVMe-resident state stays where it is.
  /// Each rank first checks that its filesystem has room for its state; rank 0 locks the
  /// directory (flock) for the save's length (until every rank has removed its earlier save's
  /// files), so a second save into it at once fails naming the holder. A save that fails on any
  /// rank (no room, an I/O error, the lock) throws std::runtime_error on every rank, naming the
  /// directory and the cause (a refused directory: std::invalid_argument); the partial files are
  /// removed and the checkpoint already there still loads.
  void save(const std::filesystem::path& dir);
  /// Restores a checkpoint written at any world size into this optimizer's layout (same groups
  /// and parameters, any world size and sub-group size). Hyper-parameters, step count and loss
  /// scaler come from the checkpoint. Commits a generation. A missing, truncated, corrupt or
  /// mismatched checkpoint throws std::runtime_error naming the file and the problem, and the
  /// state already stored is untouched (with shadow slots: a corrupt piece found mid-copy
  /// discards the partial generation; in-place mode cannot). Collective: every rank verifies its
  /// part before any commits; one that fails makes every rank throw with the state unchanged.
  /// Rank 0 holds a shared lock on the directory: a save into it meanwhile is refused, and a load
  /// while a save writes it fails at once.
  void load(const std::filesystem::path& dir);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tierswap
