// ShardedOptimizer::Impl: the code that decides (layout, hand-over, step, checkpoints), over the
// parts that own their state: the layout's records (layout.hpp), each sub-group's gradient of
// this step (sub_grad.hpp), the overlapped step's worker (spec_worker.hpp), the 16-bit
// publication (param16_publisher.hpp), the commit in flight (commit_pipeline.hpp) and the
// Prometheus samples (step_metrics.hpp). Included by the optimizer's .cpp files only.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "src/optim/commit_pipeline.hpp"
#include "src/optim/layout.hpp"
#include "src/optim/param16_publisher.hpp"
#include "src/optim/spec_worker.hpp"
#include "src/optim/step_metrics.hpp"
#include "src/optim/sub_grad.hpp"
#include "tierswap/communicator.hpp"
#include "tierswap/cuda_runtime.hpp"
#include "tierswap/metrics.hpp"
#include "tierswap/optimizer.hpp"
#include "tierswap/placement.hpp"
#include "tierswap/tier_manager.hpp"

namespace tierswap {

struct ShardedOptimizer::Impl {
  TierManager& tiers;
  Communicator& comm;
  OptimizerConfig cfg;
  ThreadPool* pool;
  int rank = 0, world = 1;
  std::uint64_t sub_size = 0;
  bool finalized = false;
  std::optional<Plan> plan;    // set_plan() or OptimizerConfig::plan_file
  bool gpu_simulated = false;  // the device tier is simulated: "GPU" sub-groups use CPU kernels
  std::uint32_t depth = 0;     // sub-groups read ahead: prefetch_depth, or fewer where the budget
                               // cannot hold them beside the gradients and a write-behind
  std::vector<OptGroup> groups;
  std::vector<OptParam> params;
  std::unordered_set<std::string> param_names;  // add_param's check (not a pass over params)
  std::vector<OptSub> subs;
  std::vector<SubGrad> books;  // this step's gradient of each sub-group (sub_grad.hpp)
  std::size_t index_of(const OptSub& s) const { return static_cast<std::size_t>(&s - subs.data()); }
  SubGrad& book(const OptSub& s) { return books[index_of(s)]; }
  const SubGrad& book(const OptSub& s) const { return books[index_of(s)]; }
  /// s's speculation (SpecWorker::per_sub).
  SubSpec& spec_of(const OptSub& s) { return spec.per_sub[index_of(s)]; }
  const SubSpec& spec_of(const OptSub& s) const { return spec.per_sub[index_of(s)]; }
  std::size_t chunks = 0;
  std::uint64_t step_count = 0;
  double scale = 1.0;
  std::uint32_t growth_tracker = 0;
  bool in_backward = false, final_backward = false;
  // leave_alone(): the trainable parameters the next step leaves as they are (by ParamId).
  std::vector<char> left_alone;
  bool any_left_alone = false;
  void clear_left_alone() noexcept;
  // The runs of sub-group s that a step updates, as [begin, end) offsets in it: all of it, less
  // the parameters left alone.
  using Runs = std::vector<std::pair<std::uint64_t, std::uint64_t>>;
  Runs active_runs(const OptSub& s) const;
  // The state pointers of the slots in `ptr`, `at` elements on.
  void offset_slots(void* const* ptr, std::uint64_t at, void** out) const;

  // ---- overlapped step (cfg.overlap) ----------------------------------------------------------
  // One background thread steps the sub-groups whose gradient became final during the final
  // backward, with the hyper-parameters, step number and multiplier (1 / loss scale: no clip
  // factor yet) snapshotted when that backward began. step() drains it and decides.
  // The background thread and what it shares with the driving thread (SpecWorker above);
  // declared last among the members that outlive it, and stopped first by ~Impl.

  // ---- 16-bit parameters handed to the trainer as they become final -------------------------
  // The callback, the bound device copies and the page-locked buffers (param16_publisher.hpp).
  Param16Publisher p16out{groups, params, subs};
  // Pointers the trainer hands over as device memory are GPU memory (a usable GPU and no
  // simulated device tier), else host memory standing in for it (a simulated device tier, also
  // on a machine with a GPU). Set at finalize().
  bool device_ptrs = false;
  /// After writing block b of s in host memory: memory-only GPU state moves up at once (its host
  /// copy could not be evicted while it is the only one).
  void promote_memory_only_gpu(const OptSub& s, BlockId b);

  // Prometheus samples of the steps (step_metrics.hpp).
  StepMetrics step_metrics;

  Impl(TierManager& t, Communicator& c, OptimizerConfig o, ThreadPool* p);
  ~Impl();

  Dtype acc_dtype(const OptGroup& g) const { return cfg.accumulate_fp32 ? Dtype::f32 : g.dtype16; }
  Dtype moment_dtype() const { return cfg.bf16_moments ? Dtype::bf16 : Dtype::f32; }
  Dtype slot_dtype(int slot) const {
    return slot == kMaster || slot == kMomentum ? Dtype::f32 : moment_dtype();
  }
  /// Bytes of a sub-group's state blocks (each rounded to 4 KiB, as the pools allocate).
  std::uint64_t state_block_bytes(const OptSub& s) const;
  /// Bytes of a sub-group's gradient block (rounded as above).
  std::uint64_t grad_block_bytes(const OptSub& s) const;
  /// This rank's sub-groups holding a piece of trainable parameter p, found by binary search
  /// (a group's are in the order of their place in it): a step's hand-over of a model of many
  /// parameters in many sub-groups does not pass over every sub-group for every parameter.
  std::span<OptSub> subs_holding(const OptParam& p);
  std::span<const OptSub> subs_holding(const OptParam& p) const;
  CpuKernelContext ctx() const {
    CpuKernelContext c;
    c.pool = pool;
    return c;
  }
  /// Rank r's piece of slot k of group g: [begin, begin + count) in the group's flat space.
  std::pair<std::uint64_t, std::uint64_t> piece(const OptGroup& g, int r, std::uint64_t k) const;
  std::pair<std::uint64_t, std::uint64_t> rank_range(const OptGroup& g, int r) const;
  void require_finalized(const char* what) const;
  void require_state(const char* what) const;  // finalized, and initialized, loaded or resumed
  void layout();
  /// One group's partitions and this rank's sub-groups (appended to subs), statistics chunks.
  void layout_group(OptGroup& g);
  /// Decides every sub-group's placement and read-ahead and creates its blocks (the pieces below,
  /// in order; layout.cpp).
  void create_blocks();
  using TierBytes = std::array<std::uint64_t, kTierCount>;
  /// Bytes of all sub-groups' state and of their gradients.
  std::pair<std::uint64_t, std::uint64_t> state_and_grad_bytes() const;
  /// Whether state streams from NVMe when no plan says otherwise (OptimizerConfig::state_tier).
  bool default_streaming(std::uint64_t state, std::uint64_t grads) const;
  /// Of `grads` (all gradient bytes), those held in the pinned host budget.
  std::uint64_t pinned_grad_bytes(std::uint64_t grads) const;
  /// Each sub-group's tier and step device (the plan's, else `streaming`); whether any streams.
  bool apply_placement(bool streaming);
  void place_by_plan(OptSub& s, const PlanSubgroup& d);
  std::uint64_t largest_state_bytes() const;
  /// The memory tier whose budget holds s's memory-only state.
  static int memory_tier(const OptSub& s) {
    return static_cast<int>(s.on_gpu ? Tier::device : Tier::host);
  }
  /// Memory-only state per tier (into *mem) against the budgets (std::invalid_argument when it
  /// does not fit); returns what stays in each memory tier.
  TierBytes check_memory_only_budgets(std::uint64_t grads, TierBytes* mem) const;
  void assign_undo_copies(TierBytes held, std::uint64_t per_sub, bool any_streaming);
  void choose_device_gradients();
  void warn_plan_mismatch(std::uint64_t grads) const;
  /// finalize(), with streamed state: throws std::invalid_argument when the host budget cannot
  /// hold one sub-group's state (`per`) beside the host-resident gradients.
  void check_streaming_budget(std::uint64_t grads, std::uint64_t per) const;
  void fit_prefetch_depth(std::uint64_t grads, std::uint64_t per_sub, bool any_streaming);
  /// The blocks of sub-groups [from, end).
  void create_state_blocks(std::size_t from = 0);
  /// tiers.create(d); when resuming, the stored block of that name instead (checked against d).
  BlockId make_block(const BlockDesc& d);
  /// A failed step's rollback: this rank's 16-bit parameters recomputed from the master weights
  /// (each sub-group's read tried a few times: a second fault may hit it), then all-gathered; if
  /// a read still fails, param16 is left stale (p16_stale).
  void restore_param16();
  /// Stale 16-bit parameters (p16_stale) are restored first (world size 1; with several ranks
  /// it throws asking for a restart and resume); then `what` throws, since the
  /// trainer's forward pass ran on them.
  void require_current_param16(const char* what);
  /// Refreshes this rank's sub-groups (or one), each read tried kRestoreAttempts times; the
  /// last error.
  std::exception_ptr refresh_own_param16_retrying();
  std::exception_ptr refresh_sub16_retrying(const OptSub& s);
  void mark_param16_stale(std::exception_ptr why);  // logs it
  static constexpr int kRestoreAttempts = 3;
  std::exception_ptr p16_stale;  // why param16 no longer matches the committed masters
  /// Set on every rank when a collective call left the ranks' committed states apart or
  /// unfinished (a step's commit that could not be undone, a commit of initialize(), load() or
  /// import_state() that failed on a rank): why, and what to do. Every call needing the state
  /// refuses with it (require_state) until initialize() or load() succeeds.
  std::string unusable;
  void gather_param16();
  /// Collective: this rank's local gradients of `g` reduce-scattered into its sub-groups. A rank
  /// that fails to take its part (an I/O error reading a spilled gradient) still takes part in
  /// every reduction; then the ranks agree, and on a failure every rank drops its gradients and
  /// throws.
  void reduce_local(OptGroup& g);
  /// drop_grads() without its checks: speculative results discarded, every gradient dropped.
  void drop_grads_now();
  /// The unreduced local gradients (world size > 1) zeroed, none pending.
  void clear_local_grads() noexcept;
  /// add_grad_device's part for sub-group s (world size 1): accumulated in the device tier where
  /// the GPU steps it, else brought to host memory by `to_host(offset, count)` and added there.
  template <class ToHost>
  void add_device_slice(OptSub& s, const OptParam& p, ParamId id, const std::byte* src, Dtype dtype,
                        ToHost& to_host);
  /// Runs `take` (a gradient's hand-over to the tiers); if it throws, the backward is abandoned
  /// (abandon_backward) and the error rethrown, saying so.
  template <class F>
  void taking_grads(const char* what, F&& take) {
    try {
      take();
    } catch (const std::exception& e) {
      abandon_backward();
      rethrow_abandoned(what, e);
    }
  }
  /// A backward whose gradients the tiers could not all take: what it took is incomplete, and
  /// sub-groups may have stepped on it speculatively. Discards those steps, drops every
  /// gradient and ends the backward.
  void abandon_backward() noexcept;
  [[noreturn]] static void rethrow_abandoned(const char* what, const std::exception& e);
  /// At the end of a sub-group's ingest in a final backward: its statistics (view: its
  /// gradient, in `tier`), which also mark the gradient final.
  /// Returns whether the gradient is final (and finite) and so may be stepped speculatively.
  bool take_grad_stats(OptSub& s, const BlockView& grad, Tier tier = Tier::host);
  /// The statistics chunk sums of s's gradient (a view in `tier`: the CUDA pass on a GPU's
  /// memory, the CPU one elsewhere; the same bits) into out[0, ceil(numel / kGradStatsChunk)).
  void chunk_sums(const OptSub& s, const BlockView& grad, Tier tier, double* out);
  /// Where the step reads s's gradient (add_grad_device accumulates it in the device tier only
  /// when s.grad_gpu).
  Tier grad_tier_of(const OptSub& s) const {
    return s.grad_gpu || s.on_gpu ? Tier::device : Tier::host;
  }
  /// A trainable parameter's slice of gradient into s: `add(view bytes)` accumulates into its
  /// gradient acquired for write in `tier`; the last slice of the backward marks it done, as does
  /// a `whole` one (reduce_local: a reduce-scatter's result holds every parameter's share).
  template <class Add>
  void ingest(OptSub& s, Tier tier, Access access, Add&& add, bool whole = false);
  /// lend_grad()'s parts (lend.cpp; step_lent in step.cpp): whether s may read a slice of a
  /// gradient in `dtype` from the caller's memory; s's lent slices copied into its gradient block
  /// (nothing lent afterwards); the same for every sub-group, on a step that throws (a slice that
  /// cannot be copied drops that gradient, logged); the statistics chunk sums of all-lent s into
  /// out, each chunk that spans two slices gathered first; and the fused kernel over each lent
  /// slice.
  bool may_lend(const OptSub& s, Dtype dtype) const;
  void materialize_lent(OptSub& s);
  void materialize_all_lent() noexcept;
  void lent_chunk_sums(const OptSub& s, double* out);
  /// lend_grad's part for sub-group s: lent where it may be, else copied in (add_slice).
  void lend_slice(OptSub& s, const OptParam& p, ParamId id, const void* grad, Dtype dtype);
  void step_runs(const OptSub& s, const GroupConfig& gc, void* const* ptr, const GradView& grad,
                 std::uint64_t t, std::uint16_t* p16, const CpuKernelContext& kc);
  void step_lent(const OptSub& s, const GroupConfig& gc, void* const* ptr, float multiplier,
                 std::uint64_t t, std::uint16_t* p16, const CpuKernelContext& kc);
  /// add_grad() at world size 1, one sub-group: parameter id's slice [b, e) of `grad` (the whole
  /// parameter, host memory) copied or added into s's gradient block (s's lent slices copied in
  /// first).
  void add_slice(OptSub& s, ParamId id, std::uint64_t b, std::uint64_t e, const void* grad,
                 Dtype dtype);
  /// Drops s's gradient (the block trimmed: zeros again, no I/O), what it lent, its statistics
  /// and the written-slice marks: the one way a step, a rollback, initialize() and load() end a
  /// gradient.
  void drop_grad(OptSub& s);
  /// The checks add_grad and add_grad_device share (finalized, in a backward, a trainable
  /// parameter, a non-null gradient); returns the parameter.
  const OptParam& grad_param(const char* what, ParamId id, const void* grad) const;
  /// After a sub-group's ingest: queues the speculative step (overlap, `final`), else spills the
  /// gradient to NVMe when grad_tier is nvme.
  void after_ingest(OptSub& s, bool final);
  /// The fused kernel on one sub-group: state acquired for write, 16-bit output to `p16`; the
  /// state is written behind when streaming. `*wrote16` becomes true once `p16` was written to.
  void step_sub(OptSub& s, const GroupConfig& cfg, float multiplier, std::uint64_t t,
                std::uint16_t* p16, bool* wrote16 = nullptr, bool speculative = false);
  /// Steps sub-groups `ks` in order: `step(k, wrote16)` steps one, `after(k)` does its
  /// bookkeeping on this thread once it is done. With concurrent_gpu_step and both kinds in
  /// `ks`, the GPU's sub-groups step on a GpuLane meanwhile (their `after` runs here as they
  /// finish; `*wrote16` is set up front) and streamed state is read ahead of the CPU's. The
  /// first failure is rethrown once the lane stopped; r.gpu_subgroups / gpu_seconds add up.
  template <class Step, class After>
  void run_steps(const std::vector<std::size_t>& ks, Step&& step, After&& after, bool* wrote16,
                 StepResult& r);
  /// Where a speculative step of s writes its 16-bit output: param16() itself
  /// (overlap_param16_in_place) or s.spec16.
  std::uint16_t* spec_out16(OptSub& s);
  /// Drops the speculative generation: undo copies back, the tier manager's discard, the 16-bit
  /// values a speculation wrote in place recomputed from the restored master weights, and the
  /// speculative bookkeeping reset.
  void spec_discard();
  /// Recomputes s's 16-bit parameters from its master weights (this rank's part of param16()).
  void refresh_sub16(const OptSub& s);
  /// The CUDA kernels on one sub-group (pointers the device can address); 16-bit output copied
  /// to `p16` in host memory.
  void gpu_step(OptSub& s, const GroupConfig& cfg, const GradView& grad, void* const* ptr,
                std::uint64_t t, std::uint16_t* p16, bool speculative);
  // Device memory grown on demand (GPU steps and statistics; empty without a GPU).
  cuda::DeviceBuffer gpu_p16;   // the 16-bit output of a GPU step (the step's thread)
  cuda::DeviceBuffer gpu_sums;  // statistics chunk sums of a device-resident gradient (ingest)
  // add_grad_device's slices of device memory for host-side accumulation (the caller's thread).
  cuda::PinnedBuffer grad_staging;
  /// step() and step(clip_factor): the caller's clip factor, if any, instead of max_grad_norm.
  /// A step that throws copies the gradients still lent into their blocks (materialize_all_lent).
  StepResult run_step(std::optional<double> given_clip);
  StepResult step_once(std::optional<double> given_clip);
  // ---- step(), in pieces (step.cpp) ----------------------------------------------------------
  struct Speculation {
    std::exception_ptr error;  // the first failure of a speculative step
    bool any = false;          // some sub-group was stepped speculatively
    bool keep = false;         // and its results may be kept (nothing invalidated them)
  };
  /// Waits for the speculative steps (overlapped mode) and says what they left.
  Speculation drain_speculation();
  /// Reads streamed sub-group s's state blocks ahead into host memory (nothing for resident state).
  void prefetch_state(const OptSub& s) {
    if (!s.streaming) return;
    for (BlockId b : s.state)
      if (b != kNoBlock) tiers.prefetch(b, Tier::host);
  }
  /// drop_grad() for every sub-group.
  void drop_all_grads();
  // ---- checkpoints (checkpoint.cpp) -------------------------------------------------------------
  /// What happens to the 16-bit parameters after commit_replaced_state()'s commit: nothing,
  /// this rank's (already computed) all-gathered, or recomputed from the masters and gathered.
  enum class Param16 { keep, gather, refresh };
  /// The last phase of initialize(), load() and import_state(): commits the new state, runs
  /// `more` (load's memory-only state), recomputes this rank's 16-bit parameters if asked, and
  /// agrees; then gathers them. A failure on any rank throws on every rank and leaves every
  /// rank unusable (`what` again, or initialize() or load()). Collective.
  void commit_replaced_state(const std::string& what, Param16 p16,
                             const std::function<void()>& more = {});
  /// finalize()'s work on this rank (layout, blocks), before the ranks agree.
  void finalize_local();
  /// initialize()'s writes on this rank (masters from `init`, zeroed moments, the 16-bit copy).
  void write_initial_state(const ParamInit& init, std::size_t from = 0);
  /// import_state(), before anything is written: every entry trainable, of a kept slot, of the
  /// right length, given once (std::invalid_argument naming it).
  void check_import(std::span<const StateTensor> tensors) const;
  /// import_state(): the values into a new generation; whether master weights were among them.
  bool write_imported(std::span<const StateTensor> tensors);
  /// save() and load(): finalized, no backward under way, no speculative step waiting.
  void require_checkpointable(const char* what);
  /// save(): this rank's state, group by group and slot by slot, into `path` (synced), checksummed
  /// piece by piece; returns the sections' table (the rank index's) and the bytes written.
  std::pair<nlohmann::json, std::uint64_t> write_rank_state(const std::filesystem::path& path);
  /// save(): this rank's data file and index, `<dir>/<tag>.bin` and `.json`, after making `dir`,
  /// locking it (when `lock_fd` is given: rank 0) and checking that its filesystem has room for
  /// the data; returns the index's payload.
  std::string write_rank_files(const std::filesystem::path& dir, const std::string& tag,
                               int* lock_fd);
  /// Bytes of this rank's state (ShardedOptimizer::state_bytes).
  std::uint64_t state_bytes() const;
  /// save(), collective: every rank's index checksum to rank 0, which writes the manifest that
  /// binds them (the commit point of a save).
  void write_checkpoint_manifest(const std::filesystem::path& dir, std::uint64_t id,
                                 const std::string& index_payload);
  /// Elements [b, e) of (group, slot) in dtype dt from a checkpoint, verified, copied to dst
  /// (unless null: verified only).
  using ReadState = std::function<void(std::size_t group, int slot, Dtype dt, std::uint64_t b,
                                       std::uint64_t e, std::byte* dst)>;
  /// load(): pass 0 copies the state kept in generations and only verifies memory-only state;
  /// pass 1 copies the memory-only state (after the commit).
  void load_state_pass(int pass, const ReadState& read);
  // ---- records of the state (records.cpp): the layout as JSON, shared by checkpoints and the
  // commit record that resume() reads back -------------------------------------------------------
  /// Each group: name, config, numel, part, state slots, parameters (name, shape, dtype,
  /// requires_grad).
  nlohmann::json groups_json() const;
  /// groups_json() as text, each group's parameters from OptGroup::params_record once
  /// finalized (the commit record is written at every step; a model's parameter list, its
  /// every name, shape and dtype, is dumped once).
  std::string groups_record() const;
  /// finalize(): each group's params_record.
  void keep_params_records();
  using Bad = std::function<std::runtime_error(const std::string&)>;
  /// Checks stored groups_json() against this optimizer's groups and parameters (throws bad(why)
  /// naming the first difference); returns the stored hyper-parameters and, in *part, each
  /// group's stored partition size (in *step_base, when given, each group's step_base).
  std::vector<GroupConfig> check_groups(const nlohmann::json& groups, const Bad& bad,
                                        std::vector<std::uint64_t>* part,
                                        std::vector<std::uint64_t>* step_base = nullptr) const;
  /// Each group's step_base from a record at step `step` (bad(why) for one above it).
  void set_step_bases(const std::vector<std::uint64_t>& bases, std::uint64_t step, const Bad& bad);
  /// What this generation holds, for resume(): format, version, world size, rank, sub-group
  /// size, dtypes, groups_json(), step count, loss scaler.
  std::string commit_record() const;
  /// tiers.commit() with commit_record(): every commit of the optimizer goes through here.
  std::uint64_t commit();
  /// Whether the last commit's record says memory-only state (memory_only_state): a swap
  /// directory resume() refuses, whatever step a later record would name.
  bool memory_only_on_record = false;
  /// A step of memory-only state only (world size 1, no overlapped mode, the record on disk
  /// already saying so): its commit would write no data, only a record resume() refuses, so the
  /// step commits nothing.
  bool commit_adds_nothing() const;
  /// resume(): the checks of the swap directory's commit record against this optimizer that
  /// need no layout (format, version, world size, rank, dtypes); takes its sub-group size.
  void check_record(const nlohmann::json& rec);
  /// resume(), after layout(): the record's groups against the layout.
  void check_record_layout();
  /// resume(): every rank at the same step; a rank one step ahead of the others rolls its tier
  /// manager back a generation (a job killed between the ranks' commits).
  void agree_on_step();
  /// resume(), after the blocks: hyper-parameters, step count and loss scaler from the record,
  /// the ranks' steps agreed, the 16-bit parameters recomputed from the master weights.
  void restore_from_record();
  /// restore_from_record()'s part on this rank, before the ranks agree (the gather follows).
  void restore_local();
  std::string resume_record;  // resume(): the record being resumed from (empty otherwise)
  bool adopt_blocks = false;  // resume(): make_block() takes the stored blocks
  bool adding_group = false;  // add_group_between_steps(): make_block() takes orphaned blocks
  // ---- groups added between steps (add_group.cpp) ---------------------------------------------
  /// add_param()'s checks and registration (before or after finalize()).
  ParamId register_param(int group, const ParamSpec& spec);
  /// What a failed add_group_between_steps() takes back: the sizes before it.
  struct Added {
    std::size_t groups = 0, params = 0, subs = 0, chunks = 0;
    std::uint32_t depth = 0;
  };
  Added mark_added() const;
  void take_back(const Added& a) noexcept;
  /// The new group's layout, placement, budget checks, blocks and initial state (this rank).
  void add_group_local(const Added& a, const ParamInit& init);
  /// Swap bytes sub-groups [from, end) reserve; the error when the swap space cannot hold them;
  /// that error unless it can.
  std::uint64_t swap_bytes_of(std::size_t from) const;
  std::invalid_argument no_swap_room(std::size_t from, const std::string& why) const;
  void check_swap_room(std::size_t from) const;
  /// Places sub-groups [from, end) by OptimizerConfig::state_tier over the whole state.
  void place_added(std::size_t from);
  struct GradStats {
    double sum_sq = 0;
    bool nonfinite = false;        // any value on any rank
    bool failed_anywhere = false;  // *failed on any rank
  };
  /// The step's first collective: the gradients' sum of squares and whether any is non-finite,
  /// over every rank, and whether any rank failed before it (*failed: this rank's failure so far,
  /// or in reading its gradients here), so that no rank steps when another cannot.
  GradStats global_grad_stats(std::exception_ptr* failed);
  /// This rank's gradient statistics per chunk (GradStats, before the sum over ranks).
  void local_grad_stats(std::vector<double>& chunk);
  /// Every group's hyper-parameters (what a speculative step is checked against).
  std::vector<GroupConfig> group_configs() const;
  struct StepPlan {
    float multiplier = 1;                 // loss-scale inverse x clip factor
    std::uint64_t t = 0;                  // the step number being taken
    std::vector<std::size_t> todo, late;  // stepped before the commit; memory-only, after it
  };
  // ---- the pipelined commit (commit_pipeline.hpp, pipelined_commit.cpp) ----
  CommitPipeline commits{tiers};
  /// Whether step sp's commit may be left running (see OptimizerConfig::pipelined_commit).
  bool may_pipeline_commit(const StepPlan& sp) const;
  /// Starts step sp.t's commit on the tier manager's thread (step_count is sp.t).
  void start_pipelined_commit(const StepPlan& sp, std::pair<double, std::uint32_t> scaler,
                              StepResult& r);
  /// Waits for a pending commit; if it failed, rolls its step back and throws, naming it.
  void settle_commit();
  /// A sub-group lent in part takes the rest of its gradient (zeros) into its block; returns how
  /// many sub-groups are lent whole.
  std::uint32_t settle_lent();
  /// The step's clip factor: the caller's, else max_grad_norm's (at most 1), else 1.
  double clip_factor_for(std::optional<double> given_clip, double grad_norm) const;
  /// Non-finite gradients: nothing steps (speculative results discarded), a dynamic scale backs
  /// off.
  void skip_step(bool spec_any);
  void partition_todo_late(bool keep, std::uint64_t t, std::vector<std::size_t>* todo,
                           std::vector<std::size_t>* late) const;
  void keep_speculative_param16(StepResult& r, bool* p16_changed);
  void roll_back_failed_step(bool p16_changed);
  /// Collective (after a rollback every rank took part in): p16_stale on any rank makes it
  /// stale on every rank.
  void agree_on_stale_param16();
  /// Whether `flag` is true on any rank (collective; true too when the ranks cannot agree): in
  /// run_pipeline_and_commit(), whether any rank's pipeline failed, then whether any rank's
  /// commit failed, then whether any rank's 16-bit parameters changed.
  bool any_rank_failed(bool flag);
  /// `scaler`: the loss scaler before this step (a pipelined commit's failure puts it back).
  void run_pipeline_and_commit(const StepPlan& sp, bool keep, std::vector<BlockView>* late_grads,
                               StepResult& r, std::pair<double, std::uint32_t> scaler);
  void commit_agreed(std::uint64_t t, bool* committed, bool* all_roll_back);
  void undo_commit_agreed(std::uint64_t t, bool committed);
  /// run_pipeline_and_commit() with the loss scaler as it is after this step (it goes into the
  /// commit record); a failure restores the scaler.
  void commit_step(const StepPlan& sp, bool keep, std::vector<BlockView>* late_grads,
                   StepResult& r);
  void step_memory_only_after_commit(const StepPlan& sp, std::vector<BlockView>* late_grads,
                                     StepResult& r);
  void finish_result(StepResult& r, const TierCounters& c0,
                     std::chrono::steady_clock::time_point t0);
  void spec_loop();
  /// Waits until no speculative step is queued or running.
  void spec_drain();
  /// Before more gradient goes into `s`: a speculative result for it can no longer be kept.
  void spec_touch(OptSub& s);
  /// Whether any sub-group is queued or stepped speculatively.
  bool spec_pending();
  /// Forgets every speculative result (after the tier manager discarded them, or committed).
  void spec_reset();
  /// At the end of an overlapped step: starts reading the state of the sub-groups whose
  /// gradients became final first in this step's backward (the next backward's first, in the
  /// same order), as many as the read-ahead depth; they arrive during the trainer's forward.
  void read_ahead_next();
  // Undo copies (memory-only state stepped speculatively): save before the step; restore every
  // saved one (a discarded speculative generation).
  void undo_save(OptSub& s);
  void undo_copy(const OptSub& s, BlockId from, BlockId to);
  void undo_restore();
  // Last: destroyed first (after ~Impl's body stopped it already).
  SpecWorker spec;
};

// ---- helpers shared by the optimizer's files ----
inline AdamConfig adam_config(const GroupConfig& c) {
  AdamConfig a;
  a.lr = c.lr;
  a.beta1 = c.beta1;
  a.beta2 = c.beta2;
  a.eps = c.eps;
  a.weight_decay = c.weight_decay;
  a.decoupled = c.kind == OptimizerKind::adamw;
  a.amsgrad = c.amsgrad;
  a.maximize = c.maximize;
  return a;
}

inline LionConfig lion_config(const GroupConfig& c) {
  LionConfig l;
  l.lr = c.lr;
  l.beta1 = c.beta1;
  l.beta2 = c.beta2;
  l.weight_decay = c.weight_decay;
  l.maximize = c.maximize;
  return l;
}

inline SgdConfig sgd_config(const GroupConfig& c) {
  SgdConfig s;
  s.lr = c.lr;
  s.momentum = c.momentum;
  s.dampening = c.dampening;
  s.weight_decay = c.weight_decay;
  s.nesterov = c.nesterov;
  s.maximize = c.maximize;
  return s;
}

}  // namespace tierswap
