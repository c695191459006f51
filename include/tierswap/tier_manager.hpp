// TierManager: owns every byte of training state and knows where it is. A block (a named, typed
// buffer: fp32 master weights, a moment, a 16-bit gradient, ...) lives in up to three tiers:
//
//   device  GPU memory (cudaMalloc slabs), or a *simulated* device tier on a machine without a
//           GPU: host memory with a capacity and a copy bandwidth, labelled "simulated" everywhere
//   host    pinned host slabs (cudaHostRegister with a GPU, else mlock where the memlock limit
//           allows, else page-aligned memory with a warning), registered with the io_uring ring
//   nvme    extents of a SwapSpace, read and written through an IoEngine
//
// NVMe is the home of every block; host and device hold copies. Each copy has a state (absent,
// valid, dirty, reading, writing); "dirty" means newer than the tiers below it.
//
// Generations (shadow paging). Every block has two NVMe extent slots (one in in-place mode). Data
// written back during the open generation goes to the uncommitted slot; commit() makes it durable
// (data synced, then a manifest naming the new slots written to a temp file, fsynced and renamed)
// and flips the slots of every block written in the generation; discard() drops everything
// written or dirtied since the last commit, leaving the committed state bit for bit. Reopening a
// swap directory after a crash yields the last committed generation with every block's checksum
// verified.
//
// Thread-safety: every member may be called from any number of threads. A BlockView keeps its
// block resident (pinned) in its tier until it is released; two writable views of one block never
// coexist, and a block with views can be neither evicted nor discarded. Two threads of its own:
// a reaper finalizes transfers as they land, and a hasher checksums (XXH3-64) each block written
// back while its write runs, so that the thread releasing a dirty block (a step) never hashes.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tierswap/extent_allocator.hpp"
#include "tierswap/setting.hpp"
#include "tierswap/types.hpp"

namespace tierswap {

class SwapSpace;
class IoEngine;

// Tier, kTierCount, to_string(Tier), parse_tier: tierswap/types.hpp.

enum class BlockClass : std::uint8_t {
  master,
  exp_avg,
  exp_avg_sq,
  max_exp_avg_sq,
  momentum,
  grad16,
  param16,
  other
};
std::string_view to_string(BlockClass c) noexcept;
/// The names above; std::invalid_argument otherwise.
BlockClass parse_block_class(std::string_view text);

enum class CopyState : std::uint8_t { absent, valid, dirty, reading, writing };
std::string_view to_string(CopyState s) noexcept;

/// Who a block belongs to: rank, parameter group, sub-group (-1: not applicable).
struct BlockOwner {
  int rank = 0;
  int group = -1;
  int subgroup = -1;
  friend bool operator==(const BlockOwner&, const BlockOwner&) = default;
};

struct BlockDesc {
  std::string name;  ///< unique, non-empty, at most 255 bytes, no control characters
  BlockClass cls = BlockClass::other;
  Dtype dtype = Dtype::f32;
  std::uint64_t numel = 0;  ///< > 0
  BlockOwner owner;
  /// Contents that live only in this process until trim() (16-bit gradients): never written
  /// behind, flushed or committed; written to NVMe only when evicted under memory pressure
  /// (spilled), and untouched by commit() and discard(). After reopening it reads as zeros.
  bool transient = false;
  /// Transient (everything above), and never spilled either: a copy in the host or device tier
  /// is evicted only while the other memory tier holds the same data, so the block never loses
  /// its last in-memory copy (no NVMe I/O ever) until trim(). For state that lives in memory
  /// only; a budget that cannot hold it is an error at acquire(), and evict() of its last copy is
  /// a std::logic_error. Implies `transient`.
  bool memory_only = false;
  /// The host copy needs no pinning (16-bit gradients waiting for a CPU step): it lives in the
  /// pageable host pool (TierConfig::pageable_budget) when the manager has one, else in the
  /// pinned one like every other block.
  bool pageable = false;
  std::uint64_t bytes() const noexcept { return numel * dtype_size(dtype); }
};

using BlockId = std::uint32_t;

enum class DeviceTierMode : std::uint8_t {
  automatic,  ///< the GPU when one is usable, else simulated when device_budget > 0
  gpu,        ///< a GPU is required
  simulated,  ///< host memory standing in for the GPU
  off         ///< no device tier
};

/// Slab granularity of the device pool.
inline constexpr std::uint64_t kDeviceSlabSize = 64ull << 20;

struct TierConfig {
  std::uint64_t host_budget = std::uint64_t{1} << 30;  ///< pinned host bytes, never exceeded
  std::uint64_t host_slab_size = 64ull << 20;          ///< slab granularity of the host pool
  /// Host bytes, beside the pinned budget, for the host copies of blocks marked `pageable`:
  /// ordinary (unlocked, unregistered) memory, never exceeded either; under pressure such
  /// copies spill to NVMe. 0: no pageable pool (those blocks share the pinned budget).
  std::uint64_t pageable_budget = 0;
  bool lock_host_memory = true;  ///< pin host slabs (cudaHostRegister / mlock) when allowed
  int numa_node = -1;            ///< bind host slabs to this node (-1: no binding)
  DeviceTierMode device_mode = DeviceTierMode::automatic;
  std::uint64_t device_budget = 0;               ///< device tier bytes (0: no device tier)
  double simulated_device_gbps = 25.0;           ///< copy bandwidth of the simulated device tier
  std::uint64_t max_dirty_bytes = 256ull << 20;  ///< write-behind starts above this
  std::uint32_t lookahead = 2;  ///< prefetches in flight at once (demand reads go first)
  bool shadow_slots = true;     ///< two NVMe slots per block; false: in place (no rollback)
  bool durable = true;          ///< fdatasync + fsync'd manifest at each commit
  bool verify_on_open = true;   ///< read back and checksum every committed block when opening
  /// Serve snapshot() on a Unix socket for `tierswap ps` / `tierswap residency` (telemetry.hpp;
  /// TIERSWAP_TELEMETRY=0 turns it off too). A socket that cannot be set up is a warning.
  bool telemetry = true;
  /// Overrides from the environment: each setting's variable as settings() lists it (the
  /// configuration page, tools/docs/configuration.md). A value that does not parse throws naming
  /// the variable.
  static TierConfig from_env();
  static TierConfig from_env(TierConfig base);
  /// Loads a JSON object of the keys settings() lists; sizes as numbers or strings ("2GiB").
  /// Unknown keys or bad values throw std::invalid_argument naming the key (and, for an unknown
  /// one, every known key).
  static TierConfig from_json(std::string_view json);
  /// Every setting, in the configuration page's order (its table is generated from them).
  static std::vector<Setting> settings();
  void validate() const;
  /// Bytes of the host or device budget to leave free when planning blocks that are never
  /// evicted (memory-only): the pool hands out whole slabs (up to two partly used) and
  /// transient blocks leave holes in them: min(2 slabs, budget / 4) + budget / 16.
  std::uint64_t slab_slack(Tier tier) const;
};

/// Counters since the manager was created. Bytes and operations per tier and direction
/// ("in" = into that tier), time stalled waiting for I/O, prefetch hits and misses.
struct TierCounters {
  std::uint64_t bytes_in[kTierCount] = {};
  std::uint64_t bytes_out[kTierCount] = {};
  std::uint64_t ops_in[kTierCount] = {};
  std::uint64_t ops_out[kTierCount] = {};
  double busy_seconds_in[kTierCount] = {};  ///< summed transfer time (per-tier bandwidth)
  double busy_seconds_out[kTierCount] = {};
  std::uint64_t stalls = 0;         ///< acquires that waited for a transfer
  double stall_seconds = 0;         ///< time those waits took
  std::uint64_t prefetch_hits = 0;  ///< acquires served by a prefetch (done or in flight)
  std::uint64_t prefetch_misses = 0;
  std::uint64_t evictions = 0;
  std::uint64_t write_behind = 0;  ///< write-backs started by the dirty-bytes bound
  std::uint64_t commits = 0;
  std::uint64_t discards = 0;
  /// Most pool memory (whole slabs) the host and device tiers ever held: never above the budget.
  std::uint64_t peak_reserved_bytes[kTierCount] = {};
  std::uint64_t peak_pageable_bytes = 0;  ///< the same for the pageable host pool
  std::uint32_t inflight_ops = 0;         ///< now
  std::uint32_t queued_prefetches = 0;
};

/// Where everything is, now.
struct ResidencySnapshot {
  struct TierRow {
    Tier tier;
    std::uint64_t capacity_bytes = 0;  ///< the budget (host: pinned + TierConfig::pageable_budget)
    std::uint64_t resident_bytes = 0;  ///< blocks with a valid or dirty copy in the tier
    std::uint64_t dirty_bytes = 0;
    std::uint64_t inflight_bytes = 0;  ///< copies being read into or written from the tier
    std::uint64_t pinned_bytes = 0;    ///< blocks with views (in use; not page-locking)
    std::uint64_t reserved_bytes = 0;  ///< memory the tier's pools hold now (whole slabs)
  };
  struct ClassRow {
    BlockClass cls;
    Tier tier;
    std::uint64_t bytes = 0;
  };
  struct BlockRow {
    std::string name;
    BlockClass cls;
    Dtype dtype;
    std::uint64_t numel = 0;
    BlockOwner owner;
    CopyState state[kTierCount] = {};
    std::uint32_t pins = 0;
  };
  int pid = 0;
  bool simulated_device = false;
  bool device_tier = false;
  std::string host_memory;  ///< "cuda-registered", "mlocked" or "pageable"
  /// Page-locked host memory held now (the pinned pool's slabs; 0 when it is not locked).
  std::uint64_t locked_host_bytes = 0;
  /// The host tier's capacity in its two parts: the pinned budget (TierConfig::host_budget) and
  /// the pageable pool beside it (TierConfig::pageable_budget; 0: none).
  std::uint64_t host_budget_bytes = 0;
  std::uint64_t pageable_budget_bytes = 0;
  std::vector<TierRow> tiers;
  std::vector<ClassRow> classes;
  std::vector<BlockRow> blocks;
  std::uint64_t committed_generation = 0;
  bool checksums_verified = false;
  TierCounters counters;
  /// The JSON the CLI prints (its schema: tools/docs/cli.md).
  std::string to_json() const;
};

class TierManager;

/// A resident copy of a block, pinned in its tier until released or destroyed. Destroying an
/// unreleased view releases it: dirty after mark_dirty(), else clean. Move-only; must not outlive
/// its manager.
class BlockView {
 public:
  BlockView() noexcept = default;
  BlockView(BlockView&& o) noexcept;
  BlockView& operator=(BlockView&& o) noexcept;
  BlockView(const BlockView&) = delete;
  BlockView& operator=(const BlockView&) = delete;
  ~BlockView();
  explicit operator bool() const noexcept { return mgr_ != nullptr; }
  /// Host pointer for the host tier, a device pointer for the GPU tier (host memory when the
  /// device tier is simulated).
  std::byte* data() const noexcept { return data_; }
  std::uint64_t bytes() const noexcept { return bytes_; }
  BlockId id() const noexcept { return id_; }
  Tier tier() const noexcept { return tier_; }
  bool writable() const noexcept { return writable_; }
  /// The caller wrote new contents: the view is released dirty when it goes (as
  /// TierManager::release(view, true)). std::logic_error on a read-only view.
  void mark_dirty();
  bool dirty() const noexcept { return dirty_; }

 private:
  friend class TierManager;
  TierManager* mgr_ = nullptr;
  std::byte* data_ = nullptr;
  std::uint64_t bytes_ = 0;
  BlockId id_ = 0;
  Tier tier_ = Tier::host;
  bool writable_ = false;
  bool dirty_ = false;
};

/// read: a shared view. write: the only view of the block, its current contents in place.
/// overwrite: as write, but the caller replaces every byte: when the tier holds no copy, memory
/// is taken without reading anything (contents unspecified). Release it dirty; released clean (or
/// destroyed unreleased), such a fresh copy is dropped and the block keeps its previous data.
enum class Access : std::uint8_t { read, write, overwrite };

class TierManager {
 public:
  /// Opens the manager on a swap space and engine (both must outlive it). If the space's first
  /// directory holds a manifest, its blocks are restored at the committed generation (their
  /// checksums verified when cfg.verify_on_open); a manifest of another space, or a corrupt or
  /// truncated one, or a block whose data does not match its checksum, throws
  /// std::runtime_error naming the file and the problem (nothing is changed on disk then).
  TierManager(SwapSpace& space, IoEngine& engine, TierConfig cfg = {});
  /// Waits for in-flight transfers. Uncommitted changes are dropped (not written).
  ~TierManager();
  TierManager(const TierManager&) = delete;
  TierManager& operator=(const TierManager&) = delete;

  /// Registers a block (all zeros, no copy anywhere) and reserves its NVMe slots. Throws
  /// std::invalid_argument for a bad descriptor or a duplicate name, std::system_error(ENOSPC)
  /// when the swap space cannot hold it.
  BlockId create(const BlockDesc& desc);
  std::optional<BlockId> find(std::string_view name) const;
  BlockDesc desc(BlockId id) const;
  /// Sets BlockDesc::pageable of a block (not stored in the manifest: a reopened block's owner
  /// says again where its host copy lives). Throws std::logic_error while it has a host copy.
  void set_pageable(BlockId id, bool pageable);
  std::size_t block_count() const;

  /// Starts bringing the block into `tier` (queued behind demand reads, at most
  /// TierConfig::lookahead in flight). When it is already there or on its way nothing is read;
  /// a host copy already there is kept as a copy the prefetch had read would be (just used, and
  /// never dropped to make room for another prefetch), so a caller's read-ahead window keeps
  /// what the budget holds of it.
  void prefetch(BlockId id, Tier tier);
  /// Makes the block resident in `tier` (host or device) and pins it there; waits for an
  /// in-flight read rather than issuing a second one. Access::write requires that no other view of
  /// the block exists (std::logic_error otherwise). Running out of the tier's budget evicts
  /// unpinned blocks (written back first when dirty); when nothing can be evicted it throws
  /// std::runtime_error naming the budget, the request and what is in use.
  BlockView acquire(BlockId id, Tier tier, Access access = Access::read);
  /// Unpins. `dirty` (writable views only) marks the copy newer than every other: the other
  /// tiers' copies are dropped and the block counts toward the write-behind bound.
  void release(BlockView& view, bool dirty);
  /// Drops the block's copy in `tier` (host or device), writing it down first when it is dirty.
  /// Throws std::logic_error when the block is pinned there.
  void evict(BlockId id, Tier tier);
  /// Write-behind for a block the caller is done with: starts writing its dirty host copy to
  /// NVMe (into the open generation's slot) without waiting, and makes the copy one of the first
  /// to be evicted once it is clean: before every copy not written back, after those written back
  /// before it (a caller that walks its blocks in one order and then back keeps the ones it
  /// finished last). A write error surfaces at the next flush()/commit().
  void write_back(BlockId id);
  /// Declares the block's contents dead: every copy is dropped without being written, and the
  /// block reads as zeros until written again. Committed data stays on NVMe until the next
  /// commit (discard() brings it back); a transient block simply empties. Throws
  /// std::logic_error while the block has a view, or in in-place mode for committed data.
  void trim(BlockId id);
  /// Writes every dirty copy (transient blocks excepted) to NVMe (device via host) and waits.
  void flush();

  /// flush(), then makes the open generation the committed one (see the header comment) and
  /// returns its number. In in-place mode the data is overwritten in place and only the manifest
  /// is atomic. Throws std::logic_error while a writable view exists.
  std::uint64_t commit();
  /// commit() on a thread of the manager's, so the caller goes on (a trainer's forward while its
  /// step's state is written and made durable). Until it ends, a writable acquire of a
  /// non-transient block, its trim(), discard(), roll_back_generation() and commit() wait for it;
  /// reads and transient blocks do not. Throws std::logic_error while a writable view exists or
  /// while an earlier commit_async() was not waited for.
  void commit_async();
  /// Waits for the commit_async() in flight and returns its generation, or rethrows what it threw
  /// (the open generation then stays open, as after a failed commit()). Without one, returns the
  /// committed generation.
  std::uint64_t wait_commit();
  /// Whether a commit_async() is still running.
  bool commit_in_flight() const;
  /// Drops every change since the last commit (copies dirtied or written back). Throws
  /// std::logic_error in in-place mode, or while any block has a view.
  void discard();
  std::uint64_t committed_generation() const;
  /// The owner's record of what the blocks hold (the optimizer's layout, step count and loss
  /// scale, as JSON): written into the manifest by the next commit(), so it is committed
  /// atomically with the generation it describes, and restored when a manifest is opened. Any
  /// UTF-8 text; other bytes are std::invalid_argument (the record already set stays).
  void set_commit_record(std::string record);
  /// The record of the committed generation (empty when none was set or opened).
  std::string commit_record() const;
  /// Makes the generation before the committed one the committed one again, on disk: every
  /// block the last commit changed returns to its previous extent (read back and checked
  /// against its checksum first), the previous commit record with it. For a group of processes
  /// whose commits of one step did not all happen (a job killed between them, or one process's
  /// commit failed): the ones ahead step back. Only while no block (transient ones aside) has a
  /// view or a change since the last commit: right after opening a manifest or right after a
  /// commit; transfers in flight (read-ahead) are waited for. With shadow slots, and once (the
  /// generation before that is gone). Returns false when there is no previous generation to
  /// return to; throws std::runtime_error naming the block when its previous data no longer
  /// matches (overwritten), std::logic_error naming a block in use, std::system_error when the
  /// manifest cannot be written. Whatever it throws, the generation it would have undone is
  /// still the committed one in memory, and on disk too unless the error says the new manifest
  /// is in place (its earlier state could not be put back); it may be tried again.
  bool roll_back_generation();

  ResidencySnapshot snapshot() const;
  /// The NVMe tier's extents now (capacity, reserved by blocks, free, the largest free extent),
  /// without a snapshot's pass over the blocks.
  ExtentStats swap_extents() const;
  TierCounters counters() const;
  const TierConfig& config() const noexcept;
  /// The device tier this manager runs: DeviceTierMode::gpu (GPU memory), DeviceTierMode::simulated
  /// (host memory standing in for it), or DeviceTierMode::off when there is none (no budget, or
  /// switched off).
  DeviceTierMode device_tier() const noexcept;
  /// Path of the manifest ("<first swap dir>/tierswap.manifest").
  std::filesystem::path manifest_path() const;
  /// The telemetry socket, or empty when telemetry is off or could not start.
  std::filesystem::path telemetry_socket() const;
  /// Unique in this process: the `manager` label of this manager's Prometheus samples (and of
  /// the optimizer's above it). See metrics.hpp.
  std::uint64_t instance() const noexcept;

 private:
  friend class BlockView;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The manifest as stored (what TierManager opens, and `tierswap residency --swap-dir` shows).
/// Verifies the manifest's own checksums, version and the block table's shape (slot count,
/// committed slot); throws std::runtime_error naming the file and the problem otherwise.
struct ManifestInfo {
  struct Block {
    std::string name;
    BlockClass cls;
    Dtype dtype;
    std::uint64_t numel = 0;
    BlockOwner owner;
    std::vector<Extent> slots;  ///< NVMe extents (2 with shadow slots, else 1)
    int committed_slot = 0;     ///< index into slots
    bool has_data = false;
    std::uint64_t generation = 0;  ///< generation that wrote the committed data
    std::uint64_t checksum = 0;    ///< XXH3-64 of the committed data
    bool transient = false;
    bool memory_only = false;
    /// The committed data the last commit replaced (shadow slots; absent when it left the block
    /// as it was): what TierManager::roll_back_generation() returns to.
    struct Previous {
      int slot = 0;
      bool has_data = false;
      std::uint64_t generation = 0;
      std::uint64_t checksum = 0;
    };
    std::optional<Previous> previous;
  };
  std::string space_uuid;
  std::uint64_t generation = 0;
  bool shadow_slots = true;
  std::vector<Block> blocks;
  std::string record;           ///< the owner's commit record (TierManager::commit_record)
  std::string previous_record;  ///< the record of the generation before (empty: none)
};
ManifestInfo read_manifest(const std::filesystem::path& path);

}  // namespace tierswap
