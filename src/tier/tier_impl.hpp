// TierManager's internals, shared by its files (private to src/tier/): the in-flight transfer
// (Op), a block's state in every tier (Block), and the Impl with its members by concern:
//   tier_manager.cpp  the public API, construction, accessors
//   transfers.cpp     NVMe reads and writes, their completion, copies between memory tiers
//   eviction.cpp      the eviction policy: which copy goes, taking memory for a new one
//   schedule.cpp      the swap scheduler: bringing copies in, prefetch, write-behind, flush
//   manifest.cpp      the manifest: its file, its schema, reading it back and verifying blocks
//   snapshot.cpp      the residency snapshot (telemetry, `tierswap residency`)
#pragma once

#include "tierswap/tier_manager.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <system_error>
#include <thread>

#include "tierswap/aligned_buffer.hpp"
#include "tierswap/checksum.hpp"
#include "tierswap/cuda_runtime.hpp"
#include "tierswap/detail/clock.hpp"
#include "tierswap/detail/manifest.hpp"
#include "tierswap/detail/tier_pools.hpp"
#include "tierswap/device.hpp"
#include "tierswap/extent_allocator.hpp"
#include "tierswap/io_engine.hpp"
#include "tierswap/log.hpp"
#include "tierswap/metrics.hpp"
#include "tierswap/process_config.hpp"
#include "tierswap/swap_space.hpp"
#include "tierswap/telemetry.hpp"
#include "tierswap/units.hpp"

#include <fmt/format.h>

namespace tierswap {
namespace tier_internal {

using detail::Clock;
using detail::seconds_since;
constexpr int kDev = 0, kHost = 1;  // a block's copies: device and host (NVMe is its home)

inline int copy_of(Tier t) {
  return t == Tier::device ? kDev : kHost;
}

struct Op {
  enum Kind { read, write } kind = read;
  BlockId id = 0;
  IoTicket ticket;
  bool done = false;
  bool prefetch = false;
  bool stale = false;          // read: a newer copy was released meanwhile; drop what arrives
  std::uint64_t checksum = 0;  // write: of the data written
  // A write ends when its I/O has landed and the hasher has checksummed its buffer (both read
  // the same immutable copy at once); whichever comes second finalizes it.
  bool hashed = true;              // write: checksum computed (false until the hasher is done)
  bool io_landed = false;          // its ticket is ready; finalizing waits for the checksum
  const std::byte* src = nullptr;  // write: the buffer to hash
  std::uint64_t hash_bytes = 0;    // write: how much of it (the block's bytes)
  std::uint64_t bytes = 0;
  Clock::time_point start;
  std::exception_ptr error;
};

struct Block {
  BlockId id = 0;
  BlockDesc desc;
  std::uint64_t bytes = 0;        // desc.bytes()
  std::uint64_t alloc_bytes = 0;  // rounded to the extent alignment: what moves to/from NVMe
  CopyState st[2] = {CopyState::absent, CopyState::absent};
  std::byte* data[2] = {nullptr, nullptr};
  std::uint32_t pins[2] = {0, 0};
  bool writer = false;
  bool fresh[2] = {false, false};  // an overwrite view's copy, not yet released dirty
  bool busy = false;               // a host<->device copy is running without the lock
  Extent extent[2];  // its NVMe extents: committed and write (one without shadow slots)
  int nextents = 2;
  int committed = 0;
  bool has_data = false;  // the committed extent holds data (else the block is all zeros)
  std::uint64_t checksum = 0;
  std::uint64_t data_gen = 0;
  bool written = false;  // the write extent holds data newer than the committed one
  bool trimmed = false;  // trim()med since the last commit: reads as zeros
  std::uint64_t written_checksum = 0;
  bool prefetched = false;  // landed by a prefetch (counts a hit when acquired)
  bool landed = false;      // a read landed (or a prefetch found the copy there) and its acquirer
                            // has not pinned it yet: wanted soon, kept from a prefetch's eviction
  bool queued = false;
  std::shared_ptr<Op> op;  // in-flight transfer of the host copy
  std::uint64_t last_use = 0;
  // The committed data the last commit replaced (shadow slots), for roll_back_generation():
  // still in its extent until the next generation writes there. Not valid when the last commit
  // left the block as it was.
  struct Previous {
    bool valid = false;
    int extent = 0;
    bool has_data = false;
    std::uint64_t gen = 0, checksum = 0;
  } prev;

  int write_extent() const { return nextents == 2 ? 1 - committed : committed; }
  bool nvme_has_data() const { return (has_data && !trimmed) || written; }
  int nvme_extent() const { return written ? write_extent() : committed; }
  bool dirty_anywhere() const {
    return st[kDev] == CopyState::dirty || st[kHost] == CopyState::dirty ||
           st[kHost] == CopyState::writing;
  }
  // The other memory tier holds a settled copy as new as this one (valid or dirty there). Two
  // settled copies hold the same data (a dirty release drops the other), so for a memory-only
  // block, which is never written to NVMe, any settled copy there will do: dropping a dirty one
  // moves its mark there (evict_copy).
  bool copy_elsewhere(int s) const {
    const CopyState o = st[1 - s];
    if (desc.memory_only) return o == CopyState::dirty || o == CopyState::valid;
    return o == CopyState::dirty || (o == CopyState::valid && st[s] != CopyState::dirty);
  }
  // Some copy differs from the committed data: dirty somewhere, or written back but not committed.
  bool changed() const { return written || trimmed || dirty_anywhere(); }
};

inline void validate_name(const std::string& n) {
  if (n.empty() || n.size() > 255)
    throw std::invalid_argument(
        fmt::format("block name '{}': must be 1..255 bytes (is {})", n, n.size()));
  for (unsigned char c : n)
    if (c < 0x20 || c == 0x7f)
      throw std::invalid_argument(fmt::format("block name '{}': control characters", n));
}

// A commit record (text the tier manager keeps with a generation, for its user: the optimizer's
// layout and step) and the same text as a JSON string, escaped once: each record goes into two
// manifests, as "record" and then as "previous_record", and a model's record lists its every
// parameter, so the two are shared, not copied, as a record moves from pending to committed to
// previous. Text that is not UTF-8 (a JSON manifest cannot hold it) is std::invalid_argument.
class CommitRecord {
 public:
  CommitRecord() = default;
  explicit CommitRecord(std::string record);
  bool empty() const noexcept { return !d_; }
  const std::string& text() const noexcept { return d_ ? d_->text : kNone; }
  const std::string& quoted() const noexcept { return d_ ? d_->quoted : kNone; }

 private:
  struct Data {
    std::string text, quoted;
  };
  static inline const std::string kNone;
  std::shared_ptr<const Data> d_;  // null when empty
};

}  // namespace tier_internal

using namespace tier_internal;

struct TierManager::Impl {
  SwapSpace& space;
  IoEngine& engine;
  TierConfig cfg;
  std::uint64_t align;
  ExtentAllocator alloc;
  detail::HostPool host;                       // pinned: the host budget
  std::unique_ptr<detail::HostPool> pageable;  // BlockDesc::pageable host copies, when configured
  std::unique_ptr<detail::DevicePool> device;

  mutable std::mutex mu;
  std::condition_variable cv;
  std::vector<std::unique_ptr<Block>> blocks;
  std::map<std::string, BlockId, std::less<>> names;
  std::deque<std::shared_ptr<Op>> inflight;
  std::deque<BlockId> prefetch_q;
  std::uint32_t inflight_prefetch = 0;
  // Recency for the LRU: every use takes ++tick; write_back() takes ++wb_tick instead, below
  // every use, so written-back copies go first, the one written back first before the others.
  static constexpr std::uint64_t kUseTicks = std::uint64_t{1} << 62;
  std::uint64_t tick = kUseTicks;
  std::uint64_t wb_tick = 0;
  TierCounters ctr;
  std::uint64_t committed_gen = 0;
  CommitRecord record;          // commit record of the committed generation
  CommitRecord pending_record;  // written by the next commit
  CommitRecord prev_record;     // the record of the generation before the committed one
  bool checksums_verified = false;
  bool stop = false;
  // The reaper waits on a condition of its own, told only of a new transfer (and of stop): on
  // `cv`, every release() of a view would wake it for nothing (a futex wake and a switch per
  // gradient handed over, most of the cost of a hook over a small parameter).
  std::condition_variable reaper_cv;
  std::thread reaper;
  // Checksums the writes' buffers off the threads that start them (the step's among them),
  // while their I/O runs; stopped last (~TierManager), once nothing is in flight.
  std::deque<std::shared_ptr<Op>> hash_q;
  std::condition_variable hash_cv;
  bool stop_hasher = false;
  std::thread hasher;
  // A commit on a thread of its own (commit_async): while `committing`, a writable view of a
  // non-transient block, a trim of one, discard(), roll_back_generation() and another commit wait
  // (on cv), so the generation being made durable cannot change under it. wait_commit() joins it.
  bool committing = false;
  bool commit_pending = false;  // started and not yet waited for
  std::thread committer;
  std::uint64_t commit_result = 0;
  std::exception_ptr commit_error;
  void wait_not_committing(std::unique_lock<std::mutex>& lk) {
    cv.wait(lk, [&] { return !committing; });
  }
  /// Under lk, `committing` set: commit()'s work (flush, sync, manifest, the flip); the lock is
  /// released around the sync and the manifest's write. The new generation's number.
  std::uint64_t commit_locked(std::unique_lock<std::mutex>& lk);
  std::uint64_t instance = 0;                  // the `manager` label of its metrics
  MetricsRegistry::Source metrics;             // unregistered first (~TierManager)
  std::unique_ptr<TelemetryServer> telemetry;  // declared last: stopped first
  /// Registers the manager's Prometheus samples (src/tier/metrics.cpp).
  static MetricsRegistry::Source register_metrics(const TierManager& self, std::uint64_t instance);

  Impl(SwapSpace& s, IoEngine& e, const TierConfig& c)
      : space(s),
        engine(e),
        cfg(c),
        align(std::max<std::uint64_t>(4096, s.alignment())),
        alloc(s.capacity() / std::max<std::uint64_t>(4096, s.alignment()) *
                  std::max<std::uint64_t>(4096, s.alignment()),
              std::max<std::uint64_t>(4096, s.alignment())),
        host(c.host_budget, c.host_slab_size, c.lock_host_memory, c.numa_node, &e) {
    // Unlocked and unregistered with the engine (a registration would pin it after all).
    if (c.pageable_budget > 0)
      pageable = std::make_unique<detail::HostPool>(c.pageable_budget, c.host_slab_size, false,
                                                    c.numa_node, &e, false);
    const bool gpu = device_info().available;
    bool want = false, simulated = false;
    switch (c.device_mode) {
      case DeviceTierMode::automatic:
        want = c.device_budget > 0;
        simulated = !gpu;
        break;
      case DeviceTierMode::gpu:
        if (!gpu)
          throw std::runtime_error("device tier: device_mode=gpu but no usable GPU (" +
                                   device_info().reason + ")");
        want = c.device_budget > 0;
        break;
      case DeviceTierMode::simulated:
        want = simulated = true;
        break;
      case DeviceTierMode::off:
        break;
    }
    if (want)
      device = std::make_unique<detail::DevicePool>(c.device_budget, kDeviceSlabSize, simulated);
  }

  Block& blk(BlockId id);

  // The pool copy s of b lives in: the device pool, the pageable host pool (a pageable block,
  // when there is one) or the pinned host pool.
  detail::SlabPool& pool(const Block& b, int s);
  const detail::SlabPool& pool(const Block& b, int s) const;
  // Whether copies s of a and b come from the same pool (only such a copy can make room).
  bool same_pool(const Block& a, const Block& b, int s) const { return &pool(a, s) == &pool(b, s); }

  std::uint64_t offset_of(const Block& b, int extent) const;

  // ---- transfers ---------------------------------------------------------------------------
  void count(Tier from, Tier to, std::uint64_t bytes, double secs);

  void complete_op(Op& op);

  // Waits for `op` (finalizing it if nobody has) and rethrows its error.
  void wait_op(std::unique_lock<std::mutex>& lk, const std::shared_ptr<Op>& op);
  /// wait_op, whatever the transfer's outcome: its error is recorded with the op and reported
  /// to its owner; the caller only needs the transfer to have ended (the block no longer busy).
  void wait_op_settled(std::unique_lock<std::mutex>& lk, const std::shared_ptr<Op>& op) noexcept;
  /// wait_op, its error kept in *first unless one is there already.
  void wait_op_noting(std::unique_lock<std::mutex>& lk, const std::shared_ptr<Op>& op,
                      std::exception_ptr* first);

  void wait_not_busy(std::unique_lock<std::mutex>& lk, BlockId id);

  std::shared_ptr<Op> start_read(BlockId id, std::byte* into, bool prefetch);

  // Starts writing block id's dirty host copy back; its checksum is computed by the hasher
  // thread while the write runs (the copy is immutable until the op ends), so that the thread
  // that starts it (a step releasing blocks) does not spend the time.
  std::shared_ptr<Op> start_write(BlockId id);
  /// The hasher thread's loop (checksums queued writes, finalizes those whose I/O landed).
  void run_hasher();
  /// The reaper thread's loop (finalizes transfers as their I/O lands).
  void run_reaper();
  /// Tells the reaper to stop and joins it (~TierManager, and the constructor when the hasher
  /// cannot be started).
  void stop_reaper();

  // Runs fn() with the lock released and block id marked busy (nobody else touches its copies
  // meanwhile); an exception from fn() is rethrown once the block is settled again.
  template <class Fn>
  void while_busy(std::unique_lock<std::mutex>& lk, BlockId id, Fn&& fn) {
    Block& b = *blocks[id];
    b.busy = true;
    lk.unlock();
    std::exception_ptr err;
    try {
      fn();
    } catch (...) {
      err = std::current_exception();
    }
    lk.lock();
    b.busy = false;
    cv.notify_all();
    if (err) std::rethrow_exception(err);
  }

  // Copies a block between its host and device copies with the lock released (the block is
  // marked busy: nobody else touches its copies meanwhile).
  void copy_between_tiers(std::unique_lock<std::mutex>& lk, BlockId id, int from, int to);

  // A device copy of zeros for block id, which has no data anywhere (a trimmed gradient, a new
  // block): made in device memory with the lock released (the block busy meanwhile). Returns
  // having done nothing when the block changed while memory was found (the caller looks again).
  void zero_device(std::unique_lock<std::mutex>& lk, BlockId id);

  // ---- memory ------------------------------------------------------------------------------
  void drop(Block& b, int s);

  std::uint64_t pinned_bytes(int s) const;
  // The counters with the live figures (transfers, queue, pool peaks) filled in; under `mu`.
  TierCounters counters_now() const;

  [[noreturn]] void budget_error(int s, const Block& b) const {
    const auto& p = pool(b, s);
    throw std::runtime_error(fmt::format(
        "{} tier budget exhausted: block '{}' needs {}, the budget is {}, {} is in use ({} of it "
        "pinned by views) and nothing more can be evicted",
        s == kDev     ? (device->simulated() ? "simulated gpu" : "gpu")
        : &p == &host ? "host"
                      : "pageable host",
        b.desc.name, format_bytes(b.alloc_bytes), format_bytes(p.budget()), format_bytes(p.used()),
        format_bytes(pinned_bytes(s))));
  }

  // The least recently used settled copy `s` (valid or dirty, unpinned, no transfer, no
  // writer) that `ok` accepts, or null.
  template <class Pred>
  Block* lru(int s, Pred ok) {
    Block* best = nullptr;
    for (auto& bp : blocks) {
      Block& b = *bp;
      if (b.busy || b.pins[s] > 0 || b.op || b.writer) continue;
      if (b.desc.memory_only && !b.copy_elsewhere(s)) continue;  // its last copy stays
      if (b.st[s] != CopyState::valid && b.st[s] != CopyState::dirty) continue;
      if (!ok(b)) continue;
      if (best == nullptr || b.last_use < best->last_use) best = &b;
    }
    return best;
  }

  // A copy that may go to make room for block `exclude`. Making room for a prefetch
  // (clean_only) never waits for a write-back and never drops another prefetched copy.
  Block* victim(int s, BlockId exclude, bool clean_only);

  // Frees one copy `s` (writing it down first when dirty). False when none can go.
  bool evict_one(std::unique_lock<std::mutex>& lk, int s, BlockId exclude);

  // Drops block `id`'s copy s, preserving its data below. A pinned copy is an error for
  // an explicit evict (strict), and is left alone when making room (it got pinned meanwhile).
  void evict_copy(std::unique_lock<std::mutex>& lk, BlockId id, int s, bool strict);

  // Memory for block b as copy s if the pool has it now; the bytes past the block's end (up to
  // its NVMe extent's length) are zeroed, so what is written to NVMe is deterministic.
  std::byte* try_take(int s, const Block& b);

  // Memory for block `id` as copy s, evicting others (LRU) as needed.
  std::byte* alloc_copy(std::unique_lock<std::mutex>& lk, int s, BlockId id);

  // ---- residency ---------------------------------------------------------------------------
  // acquire()'s parts: misuse checks, an overwrite view's own copy, the copy made current.
  void check_no_conflict(const Block& b, bool writes) const;
  bool overwrite_copy(std::unique_lock<std::mutex>& lk, BlockId id, int s, bool* waited);
  bool make_current(std::unique_lock<std::mutex>& lk, BlockId id, int s, bool writes, bool* waited);
  void make_device_copy(std::unique_lock<std::mutex>& lk, BlockId id);
  // Makes the host copy valid/dirty/writing. `stalled` reports whether it waited on I/O.
  void ensure_host(std::unique_lock<std::mutex>& lk, BlockId id, bool* waited);

  void pump_prefetch();

  std::uint64_t dirty_host_bytes() const;

  void write_behind();

  void flush_locked(std::unique_lock<std::mutex>& lk);
  std::exception_ptr wait_writes(std::unique_lock<std::mutex>& lk);

  // Copies the device copy into host memory so that the host holds the newest data: host dirty
  // and device valid when the device copy was dirty, both valid otherwise. Waits for a transfer
  // of the host copy first. False when the block changed meanwhile (the caller looks again).
  bool copy_down(std::unique_lock<std::mutex>& lk, BlockId id);

  void wait_all(std::unique_lock<std::mutex>& lk);

  // Debug builds (and the sanitizer builds, which define TIERSWAP_DEBUG_INVARIANTS) check the
  // residency invariants after every state change; a violation is a bug in this file.
  void check_invariants() const;

  // ---- manifest ----------------------------------------------------------------------------
  std::filesystem::path manifest_path() const;

  /// The block table as it will be once the open generation is committed; `previous_record`:
  /// the record of the generation it replaces (empty: none to roll back to).
  std::string manifest_payload(const CommitRecord& previous_record) const;
  /// roll_back_generation()'s write: every block with a previous generation takes it back, the
  /// previous record with it, and the manifest says so. A write that throws leaves every field
  /// as it was (and write_manifest_file the file as it was): the committed generation stays.
  void write_rolled_back_manifest();
  /// Reads NVMe extent `extent` of b and compares its checksum with `sum`; throws naming the block
  /// otherwise.
  void verify_extent(const Block& b, int extent, std::uint64_t sum, std::uint64_t gen);

  void load_manifest();

  void verify_blocks();
};

}  // namespace tierswap
