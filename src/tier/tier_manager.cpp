#include "tierswap/tier_manager.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <system_error>
#include <thread>

#include "tierswap/aligned_buffer.hpp"
#include "tierswap/checksum.hpp"
#include "tierswap/cuda_kernels.hpp"
#include "tierswap/detail/manifest.hpp"
#include "tierswap/detail/tier_pools.hpp"
#include "tierswap/device.hpp"
#include "tierswap/extent_allocator.hpp"
#include "tierswap/io_engine.hpp"
#include "tierswap/log.hpp"
#include "tierswap/swap_space.hpp"
#include "tierswap/telemetry.hpp"
#include "tierswap/units.hpp"

#include <fmt/format.h>

namespace tierswap {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kDev = 0, kHost = 1;  // copy slots of a block (the NVMe tier is the home)

int slot_of(Tier t) {
  return t == Tier::device ? kDev : kHost;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Op {
  enum Kind { read, write } kind = read;
  BlockId id = 0;
  IoTicket ticket;
  bool done = false;
  bool prefetch = false;
  bool stale = false;          // read: a newer copy was released meanwhile; drop what arrives
  std::uint64_t checksum = 0;  // write: of the data written
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
  Extent slot[2];
  int nslots = 2;
  int committed = 0;
  bool has_data = false;  // the committed slot holds data (else the block is all zeros)
  std::uint64_t checksum = 0;
  std::uint64_t data_gen = 0;
  bool written = false;  // the write slot holds data newer than the committed one
  bool trimmed = false;  // trim()med since the last commit: reads as zeros
  std::uint64_t written_checksum = 0;
  bool prefetched = false;  // landed by a prefetch (counts a hit when acquired)
  bool landed = false;      // a read landed and its acquirer has not pinned it yet
  bool queued = false;
  std::shared_ptr<Op> op;  // in-flight transfer of the host copy
  std::uint64_t last_use = 0;

  int write_slot() const { return nslots == 2 ? 1 - committed : committed; }
  bool nvme_has_data() const { return (has_data && !trimmed) || written; }
  int nvme_slot() const { return written ? write_slot() : committed; }
  bool dirty_anywhere() const {
    return st[kDev] == CopyState::dirty || st[kHost] == CopyState::dirty ||
           st[kHost] == CopyState::writing;
  }
  // The other memory tier holds a settled copy as new as this one (valid or dirty there).
  bool copy_elsewhere(int s) const {
    const CopyState o = st[1 - s];
    return o == CopyState::dirty || (o == CopyState::valid && st[s] != CopyState::dirty);
  }
  // Some copy differs from the committed data: dirty somewhere, or written back but not committed.
  bool changed() const { return written || trimmed || dirty_anywhere(); }
};

void validate_name(const std::string& n) {
  if (n.empty() || n.size() > 255)
    throw std::invalid_argument(
        fmt::format("block name '{}': must be 1..255 bytes (is {})", n, n.size()));
  for (unsigned char c : n)
    if (c < 0x20 || c == 0x7f)
      throw std::invalid_argument(fmt::format("block name '{}': control characters", n));
}

}  // namespace

struct TierManager::Impl {
  SwapSpace& space;
  IoEngine& engine;
  TierConfig cfg;
  std::uint64_t align;
  ExtentAllocator alloc;
  detail::HostPool host;
  std::unique_ptr<detail::DevicePool> device;

  mutable std::mutex mu;
  std::condition_variable cv;
  std::vector<std::unique_ptr<Block>> blocks;
  std::map<std::string, BlockId, std::less<>> names;
  std::deque<std::shared_ptr<Op>> inflight;
  std::deque<BlockId> prefetch_q;
  std::uint32_t inflight_prefetch = 0;
  std::uint64_t tick = 0;
  TierCounters ctr;
  std::uint64_t committed_gen = 0;
  bool checksums_verified = false;
  bool stop = false;
  std::thread reaper;
  std::unique_ptr<TelemetryServer> telemetry;  // declared last: stopped first

  Impl(SwapSpace& s, IoEngine& e, const TierConfig& c)
      : space(s),
        engine(e),
        cfg(c),
        align(std::max<std::uint64_t>(4096, s.alignment())),
        alloc(s.capacity() / std::max<std::uint64_t>(4096, s.alignment()) *
                  std::max<std::uint64_t>(4096, s.alignment()),
              std::max<std::uint64_t>(4096, s.alignment())),
        host(c.host_budget, c.host_slab_size, c.lock_host_memory, c.numa_node, &e) {
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

  Block& blk(BlockId id) {
    if (id >= blocks.size())
      throw std::invalid_argument(fmt::format("block id {}: no such block", id));
    return *blocks[id];
  }

  detail::SlabPool& pool(int s) {
    if (s == kDev) return *device;
    return host;
  }

  std::uint64_t offset_of(const Block& b, int slot) const {
    if (slot < 0 || slot >= b.nslots)  // a memory-only block has none: a bug if it gets here
      throw std::logic_error(fmt::format(
          "block '{}': no NVMe slot {} (memory-only blocks have no NVMe copy)", b.desc.name, slot));
    return b.slot[slot].offset;
  }

  // ---- transfers ---------------------------------------------------------------------------
  void count(Tier from, Tier to, std::uint64_t bytes, double secs) {
    const int f = static_cast<int>(from), t = static_cast<int>(to);
    ctr.bytes_out[f] += bytes;
    ctr.ops_out[f] += 1;
    ctr.busy_seconds_out[f] += secs;
    ctr.bytes_in[t] += bytes;
    ctr.ops_in[t] += 1;
    ctr.busy_seconds_in[t] += secs;
  }

  void finalize(Op& op) {
    if (op.done) return;
    op.done = true;
    for (auto it = inflight.begin(); it != inflight.end(); ++it)
      if (it->get() == &op) {
        inflight.erase(it);
        break;
      }
    op.error = op.ticket.error();
    Block& b = *blocks[op.id];
    const double secs = seconds_since(op.start);
    if (op.kind == Op::read) {
      if (op.prefetch) --inflight_prefetch;
      if (op.error || op.stale) {
        host.free(b.data[kHost]);
        b.data[kHost] = nullptr;
        b.st[kHost] = CopyState::absent;
      } else {
        b.st[kHost] = CopyState::valid;
        b.prefetched = op.prefetch;
        // About to be used (by a prefetcher's acquire, or the demand reader waiting for it): not
        // the first to go, and never dropped to make room for another prefetch meanwhile.
        b.landed = true;
        b.last_use = ++tick;
        count(Tier::nvme, Tier::host, op.bytes, secs);
      }
    } else {
      if (op.stale) {  // a newer copy was released meanwhile: this one and its write are moot
        host.free(b.data[kHost]);
        b.data[kHost] = nullptr;
        b.st[kHost] = CopyState::absent;
      } else if (op.error) {
        b.st[kHost] = CopyState::dirty;
      } else {
        b.st[kHost] = CopyState::valid;
        b.written = true;
        b.written_checksum = op.checksum;
        count(Tier::host, Tier::nvme, op.bytes, secs);
      }
    }
    if (b.op.get() == &op) b.op.reset();
    pump_prefetch();
    check_invariants();
    cv.notify_all();
  }

  // Waits for `op` (finalizing it if nobody has) and rethrows its error.
  void wait_op(std::unique_lock<std::mutex>& lk, const std::shared_ptr<Op>& op) {
    while (!op->done) {
      lk.unlock();
      try {
        op->ticket.wait();
      } catch (...) {
      }
      lk.lock();
      finalize(*op);
    }
    if (op->error) std::rethrow_exception(op->error);
  }

  void wait_not_busy(std::unique_lock<std::mutex>& lk, BlockId id) {
    cv.wait(lk, [&] { return !blocks[id]->busy; });
  }

  std::shared_ptr<Op> start_read(BlockId id, std::byte* into, bool prefetch) {
    Block& b = *blocks[id];
    auto op = std::make_shared<Op>();
    op->kind = Op::read;
    op->id = id;
    op->prefetch = prefetch;
    op->bytes = b.alloc_bytes;
    op->start = Clock::now();
    b.data[kHost] = into;
    b.st[kHost] = CopyState::reading;
    b.op = op;
    if (prefetch) ++inflight_prefetch;
    try {
      op->ticket = engine.read(offset_of(b, b.nvme_slot()), into, b.alloc_bytes);
    } catch (...) {
      if (prefetch) --inflight_prefetch;
      b.op.reset();
      b.st[kHost] = CopyState::absent;
      b.data[kHost] = nullptr;
      host.free(into);
      throw;
    }
    inflight.push_back(op);
    cv.notify_all();
    return op;
  }

  // Starts writing block id's dirty host copy back. Its checksum is computed with the lock
  // released (the block is busy meanwhile: nobody else touches its copies), so that transfers
  // keep landing and memory keeps being freed while a large block is hashed.
  std::shared_ptr<Op> start_write(std::unique_lock<std::mutex>& lk, BlockId id) {
    Block& b = *blocks[id];
    b.busy = true;
    const std::byte* data = b.data[kHost];
    const std::uint64_t n = b.bytes;
    lk.unlock();
    const std::uint64_t sum = checksum64(data, n);
    lk.lock();
    b.busy = false;
    cv.notify_all();
    auto op = std::make_shared<Op>();
    op->kind = Op::write;
    op->id = id;
    op->bytes = b.alloc_bytes;
    op->checksum = sum;
    op->start = Clock::now();
    op->ticket = engine.write(offset_of(b, b.write_slot()), b.data[kHost], b.alloc_bytes);
    b.st[kHost] = CopyState::writing;
    b.op = op;
    inflight.push_back(op);
    cv.notify_all();
    return op;
  }

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
  void copy_copy(std::unique_lock<std::mutex>& lk, BlockId id, int from, int to) {
    const Block& b = *blocks[id];
    std::byte* src = b.data[from];
    std::byte* dst = b.data[to];
    const std::uint64_t n = b.bytes;
    const bool simulated = device && device->simulated();
    double secs = 0;
    while_busy(lk, id, [&] {
      const auto t0 = Clock::now();
      if (simulated) {
        std::memcpy(dst, src, n);
        const double want = static_cast<double>(n) / (cfg.simulated_device_gbps * 1e9);
        const double spent = seconds_since(t0);
        if (want > spent) std::this_thread::sleep_for(std::chrono::duration<double>(want - spent));
      } else if (to == kDev) {
        cuda::copy_to_device(dst, src, n, nullptr);
        cuda::synchronize(nullptr);
      } else {
        cuda::copy_to_host(dst, src, n, nullptr);
        cuda::synchronize(nullptr);
      }
      secs = seconds_since(t0);
    });
    count(from == kDev ? Tier::device : Tier::host, to == kDev ? Tier::device : Tier::host, n,
          secs);
  }

  // A device copy of zeros for block id, which has no data anywhere (a trimmed gradient, a new
  // block): made in device memory with the lock released (the block busy meanwhile). Returns
  // having done nothing when the block changed while memory was found (the caller looks again).
  void zero_device(std::unique_lock<std::mutex>& lk, BlockId id) {
    std::byte* p = alloc_slot(lk, kDev, id);
    Block& b = *blocks[id];
    if (b.busy || b.st[kDev] != CopyState::absent || b.st[kHost] != CopyState::absent ||
        b.nvme_has_data()) {
      device->free(p);
      return;
    }
    const std::uint64_t n = b.alloc_bytes;
    const bool simulated = device->simulated();
    try {
      while_busy(lk, id, [&] {
        if (simulated) {
          std::memset(p, 0, n);
        } else {
          cuda::zero_on_device(p, n, nullptr);
          cuda::synchronize(nullptr);
        }
      });
    } catch (...) {
      device->free(p);
      throw;
    }
    b.data[kDev] = p;
    b.st[kDev] = CopyState::valid;
  }

  // ---- memory ------------------------------------------------------------------------------
  void drop(Block& b, int s) {
    pool(s).free(b.data[s]);
    b.data[s] = nullptr;
    b.st[s] = CopyState::absent;
    if (s == kHost) b.prefetched = b.landed = false;
  }

  std::uint64_t pinned_bytes(int s) const {
    std::uint64_t n = 0;
    for (auto& b : blocks)
      if (b->pins[s] > 0) n += b->alloc_bytes;
    return n;
  }

  [[noreturn]] void budget_error(int s, const Block& b) const {
    const auto& p = s == kDev ? static_cast<const detail::SlabPool&>(*device)
                              : static_cast<const detail::SlabPool&>(host);
    throw std::runtime_error(fmt::format(
        "{} tier budget exhausted: block '{}' needs {}, the budget is {}, {} is in use ({} of it "
        "pinned by views) and nothing more can be evicted",
        s == kDev ? (device->simulated() ? "simulated gpu" : "gpu") : "host", b.desc.name,
        format_bytes(b.alloc_bytes), format_bytes(p.budget()), format_bytes(p.used()),
        format_bytes(pinned_bytes(s))));
  }

  // The least recently used settled copy in slot `s` (valid or dirty, unpinned, no transfer, no
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
  Block* victim(int s, BlockId exclude, bool clean_only) {
    return lru(s, [&](const Block& b) {
      return b.id != exclude && !(clean_only && (b.st[s] == CopyState::dirty || b.landed));
    });
  }

  // Frees one copy in slot `s` (writing it down first when dirty). False when none can go.
  bool evict_one(std::unique_lock<std::mutex>& lk, int s, BlockId exclude) {
    Block* v = victim(s, exclude, false);
    if (v == nullptr) return false;
    evict_copy(lk, v->id, s, false);
    return true;
  }

  // Drops block `id`'s copy in slot s, preserving its data below. A pinned copy is an error for
  // an explicit evict (strict), and is left alone when making room (it got pinned meanwhile).
  void evict_copy(std::unique_lock<std::mutex>& lk, BlockId id, int s, bool strict) {
    for (;;) {
      wait_not_busy(lk, id);
      Block& b = *blocks[id];
      if (b.writer) {  // its copies are being rewritten: not now
        if (!strict) return;
        throw std::logic_error(
            fmt::format("evict: block '{}' has a writable view; release it first", b.desc.name));
      }
      if (b.desc.memory_only && b.st[s] != CopyState::absent && !b.copy_elsewhere(s)) {
        if (!strict) return;
        throw std::logic_error(
            fmt::format("evict: block '{}' is memory-only: its {} copy is its only copy",
                        b.desc.name, s == kDev ? "gpu" : "host"));
      }
      if (b.pins[s] > 0) {
        if (!strict) return;
        throw std::logic_error(fmt::format("evict: block '{}' is pinned in the {} tier by a view",
                                           b.desc.name, s == kDev ? "gpu" : "host"));
      }
      if (s == kHost && b.op) {  // a read or write-back in flight: let it land
        auto op = b.op;
        try {
          wait_op(lk, op);
        } catch (...) {
        }
        continue;
      }
      if (b.st[s] == CopyState::absent) return;
      if (s == kDev && b.st[kDev] == CopyState::dirty) {  // the newest data: down to host first
        copy_down(lk, id);
        continue;
      }
      if (s == kHost && b.st[kHost] == CopyState::dirty && b.st[kDev] != CopyState::dirty) {
        auto op = start_write(lk, id);
        wait_op(lk, op);
        continue;
      }
      drop(b, s);
      ++ctr.evictions;
      cv.notify_all();
      return;
    }
  }

  // Memory for block b in slot s if the pool has it now; the bytes past the block's end (up to
  // its NVMe extent's length) are zeroed, so what is written to NVMe is deterministic.
  std::byte* try_take(int s, const Block& b) {
    std::byte* p = pool(s).try_allocate(b.alloc_bytes);
    if (p != nullptr && b.alloc_bytes > b.bytes)
      std::memset(p + b.bytes, 0, b.alloc_bytes - b.bytes);
    return p;
  }

  // Memory for block `id` in slot s, evicting others (LRU) as needed.
  std::byte* alloc_slot(std::unique_lock<std::mutex>& lk, int s, BlockId id) {
    for (;;) {
      Block& b = *blocks[id];
      if (std::byte* p = try_take(s, b)) return p;
      if (!pool(s).could_fit(b.alloc_bytes)) budget_error(s, b);
      // Cheapest first: a clean copy that nobody is about to use goes at once; else a
      // write-back in flight (write-behind) lands; only then does anything else go (a dirty copy
      // written back here, or a prefetched one).
      if (Block* v = lru(s, [&](const Block& c) {
            return c.id != id && c.st[s] == CopyState::valid && !c.landed;
          })) {
        evict_copy(lk, v->id, s, false);
        continue;
      }
      if (s == kHost) {
        std::shared_ptr<Op> w;
        for (auto& op : inflight)
          if (op->kind == Op::write) {
            w = op;
            break;
          }
        if (w) {
          try {
            wait_op(lk, w);
          } catch (...) {
          }
          continue;
        }
      }
      // A clean prefetched copy (read again later) before a dirty one (written, then read).
      if (Block* v =
              lru(s, [&](const Block& c) { return c.id != id && c.st[s] == CopyState::valid; })) {
        evict_copy(lk, v->id, s, false);
        continue;
      }
      if (evict_one(lk, s, id)) continue;
      // Nothing evictable now; transfers in flight may settle into evictable copies.
      if (!inflight.empty()) {
        auto op = inflight.front();
        try {
          wait_op(lk, op);
        } catch (...) {
        }
        continue;
      }
      budget_error(s, b);
    }
  }

  // ---- residency ---------------------------------------------------------------------------
  // Makes the host copy valid/dirty/writing. `stalled` reports whether it waited on I/O.
  void ensure_host(std::unique_lock<std::mutex>& lk, BlockId id, bool* waited) {
    for (;;) {
      wait_not_busy(lk, id);
      Block& b = *blocks[id];
      switch (b.st[kHost]) {
        case CopyState::valid:
        case CopyState::dirty:
        case CopyState::writing:
          return;
        case CopyState::reading: {
          auto op = b.op;
          *waited = true;
          wait_op(lk, op);
          continue;
        }
        case CopyState::absent:
          break;
      }
      if (b.st[kDev] == CopyState::valid || b.st[kDev] == CopyState::dirty) {
        if (copy_down(lk, id)) return;
        continue;  // the block changed while memory was found: look again
      }
      std::byte* p = alloc_slot(lk, kHost, id);
      Block& b2 = *blocks[id];
      if (b2.st[kHost] != CopyState::absent || b2.busy) {
        host.free(p);
        continue;
      }
      if (!b2.nvme_has_data()) {
        std::memset(p, 0, b2.alloc_bytes);
        b2.data[kHost] = p;
        b2.st[kHost] = CopyState::valid;
        return;
      }
      auto op = start_read(id, p, false);
      *waited = true;
      wait_op(lk, op);
    }
  }

  void pump_prefetch() {
    while (inflight_prefetch < cfg.lookahead && !prefetch_q.empty()) {
      const BlockId id = prefetch_q.front();
      Block& b = *blocks[id];
      if (b.st[kHost] != CopyState::absent || b.busy || !b.nvme_has_data() || b.writer ||
          b.st[kDev] == CopyState::dirty) {
        b.queued = false;
        prefetch_q.pop_front();
        continue;
      }
      std::byte* p = try_take(kHost, b);
      while (p == nullptr) {
        Block* v = victim(kHost, id, true);  // never waits: only clean copies go
        if (v == nullptr) return;            // stays queued until memory frees up
        drop(*v, kHost);
        ++ctr.evictions;
        p = try_take(kHost, b);
      }
      b.queued = false;
      prefetch_q.pop_front();
      try {
        start_read(id, p, true);
      } catch (const std::exception& e) {
        log(LogLevel::warn, fmt::format("prefetch of '{}' failed: {}", b.desc.name, e.what()));
      }
    }
  }

  std::uint64_t dirty_host_bytes() const {
    std::uint64_t n = 0;
    for (auto& b : blocks)
      if (b->st[kHost] == CopyState::dirty && !b->desc.transient) n += b->alloc_bytes;
    return n;
  }

  void write_behind(std::unique_lock<std::mutex>& lk) {
    std::uint64_t dirty = dirty_host_bytes();
    while (dirty > cfg.max_dirty_bytes) {
      Block* v = lru(kHost, [](const Block& b) {
        return b.st[kHost] == CopyState::dirty && b.st[kDev] != CopyState::dirty &&
               !b.desc.transient;
      });
      if (v == nullptr) return;
      start_write(lk, v->id);
      ++ctr.write_behind;
      dirty -= v->alloc_bytes;
    }
  }

  void flush_locked(std::unique_lock<std::mutex>& lk) {
    for (BlockId id = 0; id < blocks.size(); ++id) {
      wait_not_busy(lk, id);
      Block& b = *blocks[id];
      while (b.st[kDev] == CopyState::dirty && !b.writer && !b.desc.transient &&
             !copy_down(lk, id)) {
      }
    }
    for (BlockId id = 0; id < blocks.size(); ++id) {
      wait_not_busy(lk, id);
      Block& b = *blocks[id];
      if (b.st[kHost] == CopyState::dirty && !b.writer && !b.op && !b.desc.transient)
        start_write(lk, id);
    }
    std::exception_ptr first;
    while (true) {
      std::shared_ptr<Op> w;
      for (auto& op : inflight)
        if (op->kind == Op::write) {
          w = op;
          break;
        }
      if (!w) break;
      try {
        wait_op(lk, w);
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    if (first) std::rethrow_exception(first);
  }

  // Copies the device copy into host memory so that the host holds the newest data: host dirty
  // and device valid when the device copy was dirty, both valid otherwise. Waits for a transfer
  // of the host copy first. False when the block changed meanwhile (the caller looks again).
  bool copy_down(std::unique_lock<std::mutex>& lk, BlockId id) {
    wait_not_busy(lk, id);
    Block& b = *blocks[id];
    if (b.op) {
      auto op = b.op;
      try {
        wait_op(lk, op);
      } catch (...) {
      }
      return false;
    }
    if (b.writer || (b.st[kDev] != CopyState::valid && b.st[kDev] != CopyState::dirty))
      return false;
    if (b.st[kHost] == CopyState::absent) {
      std::byte* p = alloc_slot(lk, kHost, id);
      Block& b2 = *blocks[id];
      if (b2.st[kHost] != CopyState::absent || b2.busy || b2.op || b2.writer ||
          (b2.st[kDev] != CopyState::valid && b2.st[kDev] != CopyState::dirty)) {
        host.free(p);
        return false;
      }
      b2.data[kHost] = p;
      b2.st[kHost] = CopyState::valid;
    }
    const bool dev_dirty = blocks[id]->st[kDev] == CopyState::dirty;
    copy_copy(lk, id, kDev, kHost);
    if (dev_dirty) {
      blocks[id]->st[kHost] = CopyState::dirty;
      blocks[id]->st[kDev] = CopyState::valid;
    }
    return true;
  }

  void wait_all(std::unique_lock<std::mutex>& lk) {
    while (!inflight.empty()) {
      auto op = inflight.front();
      try {
        wait_op(lk, op);
      } catch (...) {
      }
    }
  }

  // Debug builds (and the sanitizer builds, which define TIERSWAP_DEBUG_INVARIANTS) check the
  // residency invariants after every state change; a violation is a bug in this file.
  void check_invariants() const {
#if !defined(NDEBUG) || defined(TIERSWAP_DEBUG_INVARIANTS)
    auto fail = [](const Block& b, const char* what) {
      log(LogLevel::error,
          fmt::format("tier manager invariant broken for '{}': {}", b.desc.name, what));
      std::abort();
    };
    std::uint64_t used[2] = {0, 0};
    for (auto& bp : blocks) {
      const Block& b = *bp;
      if (b.st[kDev] == CopyState::dirty &&
          (b.st[kHost] == CopyState::dirty || b.st[kHost] == CopyState::writing))
        fail(b, "two dirty copies (one of them is stale)");
      if (b.writer && b.pins[kDev] + b.pins[kHost] != 1) fail(b, "a writer that is not alone");
      for (int s : {kDev, kHost}) {
        if (b.pins[s] > 0 && b.st[s] == CopyState::absent) fail(b, "a view of an absent copy");
        if ((b.st[s] == CopyState::absent) != (b.data[s] == nullptr))
          fail(b, "copy state and memory disagree");
        if (b.data[s] != nullptr) used[s] += b.alloc_bytes;
      }
      if ((b.st[kHost] == CopyState::reading || b.st[kHost] == CopyState::writing) && !b.op)
        fail(b, "a transfer state without a transfer");
      if (b.op && b.op->done) fail(b, "a finished transfer still attached");
    }
    if (used[kHost] > host.budget() || (device && used[kDev] > device->budget()))
      log(LogLevel::error, "tier manager: a budget is exceeded"), std::abort();
#endif
  }

  // ---- manifest ----------------------------------------------------------------------------
  std::filesystem::path manifest_path() const {
    return space.files().front().path.parent_path() / detail::kManifestName;
  }

  // The block table as it will be once the open generation is committed.
  std::string manifest_payload() const {
    nlohmann::json j;
    j["format"] = "tierswap-manifest";
    j["space_uuid"] = space.uuid();
    j["generation"] = committed_gen + 1;
    j["shadow_slots"] = cfg.shadow_slots;
    j["alignment"] = align;
    auto arr = nlohmann::json::array();
    for (auto& bp : blocks) {
      const Block& b = *bp;
      const bool w = b.written && !b.desc.transient;
      const bool data = !b.desc.transient && !b.trimmed && (w || b.has_data);
      nlohmann::json e;
      e["name"] = b.desc.name;
      e["class"] = std::string(to_string(b.desc.cls));
      e["dtype"] = std::string(to_string(b.desc.dtype));
      e["numel"] = b.desc.numel;
      e["owner"] = {b.desc.owner.rank, b.desc.owner.group, b.desc.owner.subgroup};
      auto slots = nlohmann::json::array();
      for (int s = 0; s < b.nslots; ++s) slots.push_back({b.slot[s].offset, b.slot[s].length});
      e["slots"] = slots;
      e["committed_slot"] = w ? b.write_slot() : b.committed;
      e["has_data"] = data;
      if (b.desc.transient) e["transient"] = true;
      if (b.desc.memory_only) e["memory_only"] = true;
      e["generation"] = w ? committed_gen + 1 : b.data_gen;
      e["checksum"] = checksum_hex(w ? b.written_checksum : b.checksum);
      arr.push_back(std::move(e));
    }
    j["blocks"] = std::move(arr);
    return j.dump();
  }

  void load_manifest() {
    const auto path = manifest_path();
    const ManifestInfo info = read_manifest(path);
    auto bad = [&](const std::string& why) {
      return std::runtime_error(fmt::format("manifest {}: {}", path.string(), why));
    };
    if (info.space_uuid != space.uuid())
      throw bad(fmt::format("belongs to swap space {}, not to this one ({})", info.space_uuid,
                            space.uuid()));
    if (info.shadow_slots != cfg.shadow_slots)
      throw bad(fmt::format("written with shadow_slots={}, opened with shadow_slots={}",
                            info.shadow_slots, cfg.shadow_slots));
    committed_gen = info.generation;
    for (const auto& m : info.blocks) {
      auto b = std::make_unique<Block>();
      b->desc = {m.name,       m.cls, m.dtype, m.numel, m.owner, m.transient || m.memory_only,
                 m.memory_only};
      b->bytes = b->desc.bytes();
      b->alloc_bytes = round_up(b->bytes, align);
      b->nslots = static_cast<int>(m.slots.size());
      for (int s = 0; s < b->nslots; ++s) {
        b->slot[s] = m.slots[s];
        if (b->slot[s].length < b->alloc_bytes)
          throw bad(fmt::format("block '{}': slot {} is {} bytes, the block needs {}", m.name, s,
                                b->slot[s].length, b->alloc_bytes));
        try {
          alloc.reserve(b->slot[s]);
        } catch (const std::exception& x) {
          throw bad(fmt::format("block '{}': slot {}: {}", m.name, s, x.what()));
        }
      }
      b->committed = m.committed_slot;
      b->has_data = m.has_data;
      b->data_gen = m.generation;
      b->checksum = m.checksum;
      if (names.count(m.name) != 0) throw bad(fmt::format("block '{}' listed twice", m.name));
      b->id = static_cast<BlockId>(blocks.size());
      names.emplace(m.name, b->id);
      blocks.push_back(std::move(b));
    }
  }

  void verify_blocks() {
    for (auto& bp : blocks) {
      Block& b = *bp;
      if (!b.has_data) continue;
      AlignedBuffer buf(b.alloc_bytes, std::max<std::uint64_t>(4096, space.memory_alignment()));
      engine.read(offset_of(b, b.committed), buf.data(), b.alloc_bytes).wait();
      const std::uint64_t got = checksum64(buf.data(), b.bytes);
      if (got != b.checksum)
        throw std::runtime_error(fmt::format(
            "manifest {}: block '{}' (generation {}): data checksum {} does not match the "
            "manifest's {} (extent @{}+{}): the swap file is corrupt",
            manifest_path().string(), b.desc.name, b.data_gen, checksum_hex(got),
            checksum_hex(b.checksum), b.slot[b.committed].offset, b.alloc_bytes));
    }
    checksums_verified = true;
  }
};

// ---- BlockView -------------------------------------------------------------------------------
BlockView::BlockView(BlockView&& o) noexcept
    : mgr_(std::exchange(o.mgr_, nullptr)),
      data_(o.data_),
      bytes_(o.bytes_),
      id_(o.id_),
      tier_(o.tier_),
      writable_(o.writable_) {}

BlockView& BlockView::operator=(BlockView&& o) noexcept {
  if (this != &o) {
    if (mgr_ != nullptr) {
      try {
        mgr_->release(*this, false);
      } catch (...) {
      }
    }
    mgr_ = std::exchange(o.mgr_, nullptr);
    data_ = o.data_;
    bytes_ = o.bytes_;
    id_ = o.id_;
    tier_ = o.tier_;
    writable_ = o.writable_;
  }
  return *this;
}

BlockView::~BlockView() {
  if (mgr_ != nullptr) {
    try {
      mgr_->release(*this, false);
    } catch (...) {
    }
  }
}

// ---- TierManager -----------------------------------------------------------------------------
TierManager::TierManager(SwapSpace& space, IoEngine& engine, TierConfig cfg) {
  cfg.validate();
  // Every setting is read before the reaper starts: a throw after it would destroy a joinable
  // thread (std::terminate).
  const TelemetryConfig tc = TelemetryConfig::from_env();
  impl_ = std::make_unique<Impl>(space, engine, cfg);
  if (std::filesystem::exists(impl_->manifest_path())) {
    impl_->load_manifest();
    if (cfg.verify_on_open) impl_->verify_blocks();
  }
  impl_->reaper = std::thread([this] {
    Impl& m = *impl_;
    std::unique_lock lk(m.mu);
    for (;;) {
      m.cv.wait(lk, [&] { return m.stop || !m.inflight.empty(); });
      if (m.stop) return;
      // Whichever transfer lands first is finalized first (a write-back that frees memory
      // must not wait behind a slower read).
      std::vector<std::shared_ptr<Op>> ops(m.inflight.begin(), m.inflight.end());
      std::vector<IoTicket*> tickets;
      for (auto& op : ops) tickets.push_back(&op->ticket);
      lk.unlock();
      m.engine.wait_any(tickets);
      lk.lock();
      for (auto& op : ops)
        if (op->ticket.ready()) m.finalize(*op);
    }
  });
  if (cfg.telemetry && tc.enabled) {
    try {
      impl_->telemetry =
          std::make_unique<TelemetryServer>([this] { return snapshot().to_json(); }, tc);
    } catch (const std::exception& e) {
      log(LogLevel::warn, fmt::format("telemetry endpoint not started: {}", e.what()));
    }
  }
}

std::filesystem::path TierManager::telemetry_socket() const {
  return impl_->telemetry ? impl_->telemetry->socket_path() : std::filesystem::path();
}

TierManager::~TierManager() {
  impl_->telemetry.reset();
  {
    std::unique_lock lk(impl_->mu);
    impl_->stop = true;
    impl_->cv.notify_all();
  }
  impl_->reaper.join();
  std::unique_lock lk(impl_->mu);
  impl_->wait_all(lk);
}

const TierConfig& TierManager::config() const noexcept {
  return impl_->cfg;
}

std::filesystem::path TierManager::manifest_path() const {
  return impl_->manifest_path();
}

BlockId TierManager::create(const BlockDesc& d) {
  validate_name(d.name);
  if (d.numel == 0)
    throw std::invalid_argument(fmt::format("block '{}': numel must be > 0", d.name));
  std::unique_lock lk(impl_->mu);
  Impl& m = *impl_;
  if (m.names.count(d.name) != 0)
    throw std::invalid_argument(fmt::format("block '{}': a block of that name exists", d.name));
  auto b = std::make_unique<Block>();
  b->desc = d;
  b->desc.transient |= d.memory_only;
  b->bytes = d.bytes();
  b->alloc_bytes = round_up(b->bytes, m.align);
  // A memory-only block never has an NVMe copy: no extents for it.
  b->nslots = d.memory_only ? 0 : m.cfg.shadow_slots ? 2 : 1;
  if (b->nslots >= 1) b->slot[0] = m.alloc.allocate(b->alloc_bytes);
  if (b->nslots == 2) {
    try {
      b->slot[1] = m.alloc.allocate(b->alloc_bytes);
    } catch (...) {
      m.alloc.free(b->slot[0]);
      throw;
    }
  }
  b->last_use = ++m.tick;
  const auto id = static_cast<BlockId>(m.blocks.size());
  b->id = id;
  m.names.emplace(d.name, id);
  m.blocks.push_back(std::move(b));
  return id;
}

std::optional<BlockId> TierManager::find(std::string_view name) const {
  std::lock_guard lk(impl_->mu);
  auto it = impl_->names.find(name);
  if (it == impl_->names.end()) return std::nullopt;
  return it->second;
}

BlockDesc TierManager::desc(BlockId id) const {
  std::lock_guard lk(impl_->mu);
  return impl_->blk(id).desc;
}

std::size_t TierManager::block_count() const {
  std::lock_guard lk(impl_->mu);
  return impl_->blocks.size();
}

void TierManager::prefetch(BlockId id, Tier tier) {
  std::unique_lock lk(impl_->mu);
  Impl& m = *impl_;
  Block& b = m.blk(id);
  if (tier == Tier::nvme) return;
  if (tier == Tier::device && !m.device)
    throw std::invalid_argument("prefetch: no device tier configured");
  if (b.st[kHost] != CopyState::absent || b.queued || !b.nvme_has_data()) return;
  b.queued = true;
  m.prefetch_q.push_back(id);
  m.pump_prefetch();
}

BlockView TierManager::acquire(BlockId id, Tier tier, Access access) {
  std::unique_lock lk(impl_->mu);
  Impl& m = *impl_;
  Block& b0 = m.blk(id);
  if (tier == Tier::nvme)
    throw std::invalid_argument("acquire: the nvme tier has no views; acquire host or gpu");
  if (tier == Tier::device && !m.device)
    throw std::invalid_argument("acquire: no device tier configured");
  const bool writes = access != Access::read;
  auto conflict = [&](const Block& b) {
    if (b.writer)
      throw std::logic_error(
          fmt::format("acquire: block '{}' has a writable view; release it first", b.desc.name));
    if (writes && b.pins[kDev] + b.pins[kHost] > 0)
      throw std::logic_error(fmt::format(
          "acquire(write): block '{}' has {} other view(s); a writable view must be the only one",
          b.desc.name, b.pins[kDev] + b.pins[kHost]));
  };
  conflict(b0);
  const auto t0 = Clock::now();
  bool waited = false;
  const bool was_prefetched = b0.prefetched || (b0.op && b0.op->prefetch);
  const bool needed_read = access != Access::overwrite && b0.st[kHost] == CopyState::absent &&
                           b0.st[kDev] == CopyState::absent && b0.nvme_has_data();
  const int s = slot_of(tier);
  for (;;) {
    if (access == Access::overwrite) {
      m.wait_not_busy(lk, id);
      Block& b = *m.blocks[id];
      if (b.st[s] == CopyState::absent) {  // no copy here: take memory, read nothing
        std::byte* p = m.alloc_slot(lk, s, id);
        Block& b2 = *m.blocks[id];
        conflict(b2);
        if (b2.st[s] != CopyState::absent || b2.busy) {
          m.pool(s).free(p);
          continue;
        }
        b2.data[s] = p;
        b2.st[s] = CopyState::valid;
        b2.fresh[s] = true;
      }
      if (b.st[s] == CopyState::reading) {  // a prefetch in flight: let it land, then reuse it
        auto op = b.op;
        waited = true;
        m.wait_op(lk, op);
        continue;
      }
    }
    if (!m.blocks[id]->fresh[s]) {
      m.wait_not_busy(lk, id);
      const Block& c = *m.blocks[id];
      const bool dev_copy = c.st[kDev] == CopyState::valid || c.st[kDev] == CopyState::dirty;
      if (s == kDev && !dev_copy && c.st[kHost] == CopyState::absent && !c.nvme_has_data()) {
        m.zero_device(lk, id);  // no data anywhere: zeros made in device memory, nothing copied
        continue;
      }
      // A device view of a device copy needs nothing from the host (a device copy, when there is
      // one, is never older than the host's: see release()).
      if (s != kDev || !dev_copy) m.ensure_host(lk, id, &waited);
    }
    Block& b = *m.blocks[id];
    conflict(b);
    if (writes && b.st[kHost] == CopyState::writing) {
      auto op = b.op;
      waited = true;
      m.wait_op(lk, op);
      continue;
    }
    if (s == kDev && b.st[kDev] == CopyState::absent) {
      // Pin the host copy while the device copy is made from it.
      ++b.pins[kHost];
      std::byte* p = nullptr;
      try {
        p = m.alloc_slot(lk, kDev, id);
      } catch (...) {
        --m.blocks[id]->pins[kHost];
        throw;
      }
      Block& b2 = *m.blocks[id];
      --b2.pins[kHost];
      if (b2.st[kDev] != CopyState::absent || b2.busy) {
        m.device->free(p);
        continue;
      }
      b2.data[kDev] = p;
      b2.st[kDev] = CopyState::valid;
      m.copy_copy(lk, id, kHost, kDev);
      continue;
    }
    if (b.st[s] != CopyState::valid && b.st[s] != CopyState::dirty && b.st[s] != CopyState::writing)
      continue;
    ++b.pins[s];
    b.writer = writes;
    b.prefetched = false;
    b.landed = false;
    b.last_use = ++m.tick;
    if (b.nvme_has_data()) {
      if (was_prefetched)
        ++m.ctr.prefetch_hits;
      else if (needed_read)
        ++m.ctr.prefetch_misses;
    }
    if (waited) {
      ++m.ctr.stalls;
      m.ctr.stall_seconds += seconds_since(t0);
    }
    m.check_invariants();
    BlockView v;
    v.mgr_ = this;
    v.data_ = b.data[s];
    v.bytes_ = b.bytes;
    v.id_ = id;
    v.tier_ = tier;
    v.writable_ = writes;
    return v;
  }
}

void TierManager::release(BlockView& v, bool dirty) {
  if (v.mgr_ == nullptr) throw std::logic_error("release: an empty BlockView");
  if (v.mgr_ != this) throw std::logic_error("release: the view belongs to another manager");
  if (dirty && !v.writable_)
    throw std::logic_error(
        "release(dirty=true) of a read-only view: acquire it with Access::write");
  std::unique_lock lk(impl_->mu);
  Impl& m = *impl_;
  Block& b = m.blk(v.id_);
  const int s = slot_of(v.tier_);
  --b.pins[s];
  if (v.writable_) b.writer = false;
  if (b.fresh[s]) {  // an overwrite view's own copy: kept only with new data in it
    b.fresh[s] = false;
    if (!dirty) m.drop(b, s);
  }
  if (dirty) {
    const int o = s == kDev ? kHost : kDev;
    if (b.st[o] == CopyState::valid || b.st[o] == CopyState::dirty) m.drop(b, o);
    // A transfer of the other copy in flight is moot now: dropped when it lands.
    if ((b.st[o] == CopyState::reading || b.st[o] == CopyState::writing) && b.op)
      b.op->stale = true;
    b.st[s] = CopyState::dirty;
    b.written = false;
  }
  b.last_use = ++m.tick;
  v.mgr_ = nullptr;
  if (dirty) m.write_behind(lk);
  m.pump_prefetch();
  m.check_invariants();
  m.cv.notify_all();
}

void TierManager::evict(BlockId id, Tier tier) {
  std::unique_lock lk(impl_->mu);
  Impl& m = *impl_;
  m.blk(id);
  if (tier == Tier::nvme) throw std::invalid_argument("evict: the nvme tier is the home of data");
  if (tier == Tier::device && !m.device) return;
  m.evict_copy(lk, id, slot_of(tier), true);
  m.check_invariants();
}

void TierManager::write_back(BlockId id) {
  std::unique_lock lk(impl_->mu);
  Impl& m = *impl_;
  Block& b = m.blk(id);
  b.last_use = 0;  // the first copy to go once it is clean
  if (b.st[kHost] == CopyState::dirty && b.st[kDev] != CopyState::dirty && !b.writer && !b.op &&
      !b.busy && !b.desc.transient) {
    m.start_write(lk, id);
    ++m.ctr.write_behind;
  }
  m.check_invariants();
}

void TierManager::trim(BlockId id) {
  std::unique_lock lk(impl_->mu);
  Impl& m = *impl_;
  m.blk(id);
  for (;;) {
    m.wait_not_busy(lk, id);
    Block& b = *m.blocks[id];
    if (b.pins[kDev] + b.pins[kHost] > 0)
      throw std::logic_error(
          fmt::format("trim: block '{}' has a view; release it first", b.desc.name));
    if (b.op) {
      auto op = b.op;
      try {
        m.wait_op(lk, op);
      } catch (...) {
      }
      continue;
    }
    if (!b.desc.transient && !m.cfg.shadow_slots && b.has_data)
      throw std::logic_error(fmt::format(
          "trim: block '{}' holds committed data and in-place mode cannot keep it until the "
          "next commit",
          b.desc.name));
    for (int s : {kDev, kHost})
      if (b.st[s] != CopyState::absent) m.drop(b, s);
    b.written = false;
    if (b.desc.transient)
      b.has_data = false;
    else if (b.has_data)
      b.trimmed = true;
    m.pump_prefetch();  // the memory may let a queued prefetch start
    m.check_invariants();
    m.cv.notify_all();
    return;
  }
}

void TierManager::flush() {
  std::unique_lock lk(impl_->mu);
  impl_->flush_locked(lk);
}

std::uint64_t TierManager::commit() {
  std::unique_lock lk(impl_->mu);
  Impl& m = *impl_;
  for (auto& b : m.blocks)
    if (b->writer)
      throw std::logic_error(
          fmt::format("commit: block '{}' has a writable view; release it first", b->desc.name));
  m.flush_locked(lk);
  if (m.cfg.durable) m.space.sync();
  detail::write_manifest_file(m.manifest_path(), m.manifest_payload(), m.cfg.durable);
  ++m.committed_gen;
  for (auto& bp : m.blocks) {
    Block& b = *bp;
    if (b.desc.transient) continue;  // in-process contents only: nothing to commit
    if (b.trimmed) {
      b.has_data = false;
      b.trimmed = false;
    }
    if (b.written) {
      b.committed = b.write_slot();
      b.has_data = true;
      b.checksum = b.written_checksum;
      b.data_gen = m.committed_gen;
      b.written = false;
    }
  }
  ++m.ctr.commits;
  m.check_invariants();
  return m.committed_gen;
}

void TierManager::discard() {
  std::unique_lock lk(impl_->mu);
  Impl& m = *impl_;
  if (!m.cfg.shadow_slots)
    throw std::logic_error("discard: in-place mode (shadow_slots=false) keeps no committed copy");
  for (auto& b : m.blocks)
    if (b->pins[kDev] + b->pins[kHost] > 0)
      throw std::logic_error(
          fmt::format("discard: block '{}' has a view; release every view first", b->desc.name));
  m.wait_all(lk);
  for (auto& b : m.blocks) m.cv.wait(lk, [&] { return !b->busy; });
  for (auto& bp : m.blocks) {
    Block& b = *bp;
    if (b.desc.transient || !b.changed()) continue;
    for (int s : {kDev, kHost})
      if (b.st[s] != CopyState::absent) m.drop(b, s);
    b.written = false;
    b.trimmed = false;
  }
  ++m.ctr.discards;
  m.check_invariants();
}

std::uint64_t TierManager::committed_generation() const {
  std::lock_guard lk(impl_->mu);
  return impl_->committed_gen;
}

DeviceTierMode TierManager::device_tier() const noexcept {
  if (!impl_->device) return DeviceTierMode::off;
  return impl_->device->simulated() ? DeviceTierMode::simulated : DeviceTierMode::gpu;
}

TierCounters TierManager::counters() const {
  std::lock_guard lk(impl_->mu);
  TierCounters c = impl_->ctr;
  c.inflight_ops = static_cast<std::uint32_t>(impl_->inflight.size());
  c.queued_prefetches = static_cast<std::uint32_t>(impl_->prefetch_q.size());
  c.peak_reserved_bytes[static_cast<int>(Tier::host)] = impl_->host.peak_reserved();
  if (impl_->device)
    c.peak_reserved_bytes[static_cast<int>(Tier::device)] = impl_->device->peak_reserved();
  return c;
}

ResidencySnapshot TierManager::snapshot() const {
  std::lock_guard lk(impl_->mu);
  const Impl& m = *impl_;
  ResidencySnapshot r;
  r.pid = static_cast<int>(::getpid());
  r.device_tier = m.device != nullptr;
  r.simulated_device = m.device && m.device->simulated();
  r.host_memory = m.host.memory_kind();
  r.committed_generation = m.committed_gen;
  r.checksums_verified = m.checksums_verified;
  r.counters = m.ctr;
  r.counters.inflight_ops = static_cast<std::uint32_t>(m.inflight.size());
  r.counters.queued_prefetches = static_cast<std::uint32_t>(m.prefetch_q.size());
  r.counters.peak_reserved_bytes[static_cast<int>(Tier::host)] = m.host.peak_reserved();
  if (m.device)
    r.counters.peak_reserved_bytes[static_cast<int>(Tier::device)] = m.device->peak_reserved();
  ResidencySnapshot::TierRow rows[kTierCount];
  rows[0].tier = Tier::device;
  rows[0].capacity_bytes = m.device ? m.device->budget() : 0;
  rows[1].tier = Tier::host;
  rows[1].capacity_bytes = m.host.budget();
  rows[2].tier = Tier::nvme;
  rows[2].capacity_bytes = m.alloc.stats().capacity;
  std::map<std::pair<BlockClass, Tier>, std::uint64_t> by_class;
  for (auto& bp : m.blocks) {
    const Block& b = *bp;
    ResidencySnapshot::BlockRow row;
    row.name = b.desc.name;
    row.cls = b.desc.cls;
    row.dtype = b.desc.dtype;
    row.numel = b.desc.numel;
    row.owner = b.desc.owner;
    row.pins = b.pins[kDev] + b.pins[kHost];
    for (int s : {kDev, kHost}) {
      const int t = s == kDev ? 0 : 1;
      row.state[t] = b.st[s];
      switch (b.st[s]) {
        case CopyState::dirty:
          rows[t].dirty_bytes += b.bytes;
          [[fallthrough]];
        case CopyState::valid:
          rows[t].resident_bytes += b.bytes;
          by_class[{b.desc.cls, s == kDev ? Tier::device : Tier::host}] += b.bytes;
          break;
        case CopyState::writing:
          rows[t].resident_bytes += b.bytes;
          rows[t].dirty_bytes += b.bytes;
          rows[t].inflight_bytes += b.bytes;
          rows[2].inflight_bytes += b.bytes;
          by_class[{b.desc.cls, Tier::host}] += b.bytes;
          break;
        case CopyState::reading:
          rows[t].inflight_bytes += b.bytes;
          rows[2].inflight_bytes += b.bytes;
          break;
        case CopyState::absent:
          break;
      }
      if (b.pins[s] > 0) rows[t].pinned_bytes += b.bytes;
    }
    const bool on_nvme = b.nvme_has_data();
    row.state[2] = b.st[kHost] == CopyState::writing ? CopyState::writing
                   : on_nvme                         ? CopyState::valid
                                                     : CopyState::absent;
    if (on_nvme) {
      rows[2].resident_bytes += b.bytes;
      by_class[{b.desc.cls, Tier::nvme}] += b.bytes;
    }
    if (b.written) rows[2].dirty_bytes += b.bytes;  // written, not committed yet
    r.blocks.push_back(std::move(row));
  }
  for (int t = 0; t < kTierCount; ++t)
    if (t != 0 || r.device_tier) r.tiers.push_back(rows[t]);
  for (auto& [k, v] : by_class) r.classes.push_back({k.first, k.second, v});
  return r;
}

std::string ResidencySnapshot::to_json() const {
  nlohmann::json j;
  j["pid"] = pid;
  j["simulated_device"] = simulated_device;
  j["device_tier"] = device_tier;
  j["host_memory"] = host_memory;
  auto tiers_j = nlohmann::json::array();
  for (auto& t : tiers)
    tiers_j.push_back({{"tier", std::string(to_string(t.tier))},
                       {"capacity_bytes", t.capacity_bytes},
                       {"resident_bytes", t.resident_bytes},
                       {"dirty_bytes", t.dirty_bytes},
                       {"inflight_bytes", t.inflight_bytes},
                       {"pinned_bytes", t.pinned_bytes}});
  j["tiers"] = tiers_j;
  auto classes_j = nlohmann::json::array();
  for (auto& c : classes)
    classes_j.push_back({{"class", std::string(to_string(c.cls))},
                         {"tier", std::string(to_string(c.tier))},
                         {"bytes", c.bytes}});
  j["classes"] = classes_j;
  j["generation"] = {{"committed", committed_generation},
                     {"checksums_verified", checksums_verified}};
  const auto& c = counters;
  nlohmann::json per_tier = nlohmann::json::object();
  for (Tier t : {Tier::device, Tier::host, Tier::nvme}) {
    const int i = static_cast<int>(t);
    per_tier[std::string(to_string(t))] = {
        {"bytes_in", c.bytes_in[i]},
        {"bytes_out", c.bytes_out[i]},
        {"ops_in", c.ops_in[i]},
        {"ops_out", c.ops_out[i]},
        {"gbps_in", c.busy_seconds_in[i] > 0 ? c.bytes_in[i] / c.busy_seconds_in[i] / 1e9 : 0.0},
        {"gbps_out",
         c.busy_seconds_out[i] > 0 ? c.bytes_out[i] / c.busy_seconds_out[i] / 1e9 : 0.0}};
  }
  j["counters"] = {{"tiers", per_tier},
                   {"stalls", c.stalls},
                   {"stall_seconds", c.stall_seconds},
                   {"prefetch_hits", c.prefetch_hits},
                   {"prefetch_misses", c.prefetch_misses},
                   {"evictions", c.evictions},
                   {"write_behind", c.write_behind},
                   {"commits", c.commits},
                   {"discards", c.discards},
                   {"inflight_ops", c.inflight_ops},
                   {"peak_host_bytes", c.peak_reserved_bytes[static_cast<int>(Tier::host)]},
                   {"queued_prefetches", c.queued_prefetches}};
  // Per sub-group: where each block is.
  std::map<std::tuple<int, int, int>, nlohmann::json> groups;
  for (auto& b : blocks) {
    auto& g = groups[{b.owner.rank, b.owner.group, b.owner.subgroup}];
    if (g.is_null()) g = nlohmann::json::array();
    g.push_back({{"name", b.name},
                 {"class", std::string(to_string(b.cls))},
                 {"dtype", std::string(to_string(b.dtype))},
                 {"numel", b.numel},
                 {"pins", b.pins},
                 {"gpu", std::string(to_string(b.state[0]))},
                 {"host", std::string(to_string(b.state[1]))},
                 {"nvme", std::string(to_string(b.state[2]))}});
  }
  auto sg = nlohmann::json::array();
  for (auto& [k, v] : groups)
    sg.push_back({{"rank", std::get<0>(k)},
                  {"group", std::get<1>(k)},
                  {"subgroup", std::get<2>(k)},
                  {"blocks", v}});
  j["subgroups"] = sg;
  return j.dump();
}

namespace {

// A block's fields against each other, before anything uses them (a checksum proves the file is
// as written, not that what was written is consistent): its size fits each of its extents
// (numel x dtype size, without overflow), both extents are the same size and do not wrap.
template <class Bad>
void check_block_fields(const ManifestInfo::Block& b, const Bad& bad) {
  if (b.name.empty()) throw bad("a block with an empty name");
  if (b.numel == 0) throw bad(fmt::format("block '{}': numel is 0", b.name));
  const std::uint64_t es = dtype_size(b.dtype);
  for (std::size_t s = 0; s < b.slots.size(); ++s) {
    const Extent& x = b.slots[s];
    if (x.length == 0 || x.offset + x.length < x.offset)
      throw bad(fmt::format("block '{}': slot {} is @{}+{}", b.name, s, x.offset, x.length));
    if (b.numel > x.length / es)
      throw bad(fmt::format("block '{}': numel {} of {} ({} bytes) does not fit slot {} of {} "
                            "bytes",
                            b.name, b.numel, to_string(b.dtype),
                            b.numel <= UINT64_MAX / es ? std::to_string(b.numel * es)
                                                       : std::string("over 2^64"),
                            s, x.length));
  }
  if (b.slots.size() == 2 && b.slots[0].length != b.slots[1].length)
    throw bad(fmt::format("block '{}': slots of {} and {} bytes", b.name, b.slots[0].length,
                          b.slots[1].length));
}

}  // namespace

ManifestInfo read_manifest(const std::filesystem::path& path) {
  const std::string payload = detail::read_manifest_file(path);
  auto bad = [&](const std::string& why) {
    return std::runtime_error(fmt::format("manifest {}: {}", path.string(), why));
  };
  ManifestInfo info;
  std::set<std::string> names;
  try {
    const auto j = nlohmann::json::parse(payload);
    if (j.at("format") != "tierswap-manifest") throw bad("not a tierswap manifest");
    info.space_uuid = j.at("space_uuid").get<std::string>();
    info.generation = j.at("generation").get<std::uint64_t>();
    info.shadow_slots = j.at("shadow_slots").get<bool>();
    for (auto& e : j.at("blocks")) {
      ManifestInfo::Block b;
      b.name = e.at("name").get<std::string>();
      b.cls = parse_block_class(e.at("class").get<std::string>());
      b.dtype = parse_dtype(e.at("dtype").get<std::string>());
      b.numel = e.at("numel").get<std::uint64_t>();
      const auto& o = e.at("owner");
      b.owner = {o.at(0).get<int>(), o.at(1).get<int>(), o.at(2).get<int>()};
      for (auto& x : e.at("slots"))
        b.slots.push_back({x.at(0).get<std::uint64_t>(), x.at(1).get<std::uint64_t>()});
      b.memory_only = e.value("memory_only", false);
      // Memory-only blocks have no NVMe extents (earlier manifests listed unused ones).
      if (b.slots.size() != (info.shadow_slots ? 2u : 1u) && !(b.memory_only && b.slots.empty()))
        throw bad(fmt::format("block '{}': {} slots", b.name, b.slots.size()));
      b.committed_slot = e.at("committed_slot").get<int>();
      if (!b.slots.empty() &&
          (b.committed_slot < 0 || b.committed_slot >= static_cast<int>(b.slots.size())))
        throw bad(fmt::format("block '{}': committed slot {}", b.name, b.committed_slot));
      b.has_data = e.at("has_data").get<bool>();
      if (b.has_data && b.slots.empty())
        throw bad(fmt::format("block '{}': committed data but no NVMe slot", b.name));
      b.generation = e.at("generation").get<std::uint64_t>();
      b.checksum = std::stoull(e.at("checksum").get<std::string>(), nullptr, 16);
      b.transient = e.value("transient", false);
      check_block_fields(b, bad);
      if (!names.insert(b.name).second)
        throw bad(fmt::format("block '{}' listed twice", b.name));
      info.blocks.push_back(std::move(b));
    }
  } catch (const std::runtime_error&) {
    throw;
  } catch (const std::exception& e) {
    throw bad(std::string("malformed block table: ") + e.what());
  }
  return info;
}

}  // namespace tierswap
