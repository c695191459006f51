// TierManager eviction policy: which copy leaves a memory tier under its budget (least recently
// used, clean first, never a pinned or busy one), and taking memory for a new copy.
#include "src/tier/tier_impl.hpp"

namespace tierswap {

void TierManager::Impl::drop(Block& b, int s) {
  pool(b, s).free(b.data[s]);
  b.data[s] = nullptr;
  b.st[s] = CopyState::absent;
  if (s == kHost) b.prefetched = b.landed = false;
}

std::uint64_t TierManager::Impl::pinned_bytes(int s) const {
  std::uint64_t n = 0;
  for (auto& b : blocks)
    if (b->pins[s] > 0) n += b->alloc_bytes;
  return n;
}

// A copy that may go to make room for block `exclude`. Making room for a prefetch
// (clean_only) never waits for a write-back and never drops another prefetched copy.
Block* TierManager::Impl::victim(int s, BlockId exclude, bool clean_only) {
  const Block& x = *blocks[exclude];
  return lru(s, [&](const Block& b) {
    return b.id != exclude && same_pool(b, x, s) &&
           !(clean_only && (b.st[s] == CopyState::dirty || b.landed));
  });
}

// Frees one copy `s` (writing it down first when dirty). False when none can go.
bool TierManager::Impl::evict_one(std::unique_lock<std::mutex>& lk, int s, BlockId exclude) {
  Block* v = victim(s, exclude, false);
  if (v == nullptr) return false;
  evict_copy(lk, v->id, s, false);
  return true;
}

// Drops block `id`'s copy s, preserving its data below. A pinned copy is an error for
// an explicit evict (strict), and is left alone when making room (it got pinned meanwhile).
void TierManager::Impl::evict_copy(std::unique_lock<std::mutex>& lk, BlockId id, int s,
                                   bool strict) {
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
          fmt::format("evict: block '{}' is memory-only: its {} copy is its only copy", b.desc.name,
                      s == kDev ? "gpu" : "host"));
    }
    if (b.pins[s] > 0) {
      if (!strict) return;
      throw std::logic_error(fmt::format("evict: block '{}' is pinned in the {} tier by a view",
                                         b.desc.name, s == kDev ? "gpu" : "host"));
    }
    if (s == kHost && b.op) {  // a read or write-back in flight: let it land
      auto op = b.op;
      wait_op_settled(lk, op);
      continue;
    }
    if (b.st[s] == CopyState::absent) return;
    if (b.desc.memory_only) {  // the other copy holds the same data (checked above): it stays
      if (b.st[s] == CopyState::dirty) b.st[1 - s] = CopyState::dirty;
      drop(b, s);
      ++ctr.evictions;
      cv.notify_all();
      return;
    }
    if (s == kDev && b.st[kDev] == CopyState::dirty) {  // the newest data: down to host first
      copy_down(lk, id);
      continue;
    }
    if (s == kHost && b.st[kHost] == CopyState::dirty && b.st[kDev] != CopyState::dirty) {
      auto op = start_write(id);
      wait_op(lk, op);
      continue;
    }
    drop(b, s);
    ++ctr.evictions;
    cv.notify_all();
    return;
  }
}

// Memory for block b as copy s if the pool has it now; the bytes past the block's end (up to
// its NVMe extent's length) of a host copy are zeroed, so what is written to NVMe is
// deterministic. A real GPU's copy is left alone: the host cannot address it, and only its
// first b.bytes ever cross to the host.
std::byte* TierManager::Impl::try_take(int s, const Block& b) {
  std::byte* p = pool(b, s).try_allocate(b.alloc_bytes);
  const bool gpu_memory = s == kDev && !device->simulated();
  if (p != nullptr && b.alloc_bytes > b.bytes && !gpu_memory)
    std::memset(p + b.bytes, 0, b.alloc_bytes - b.bytes);
  return p;
}

// Memory for block `id` as copy s, evicting others (LRU) as needed. Null when the block got a
// copy s while this waited (its prefetch landed): the caller, which finds the copy there, looks
// again. (Else that copy, which this must not evict, could leave no room for a second one.)
std::byte* TierManager::Impl::alloc_copy(std::unique_lock<std::mutex>& lk, int s, BlockId id) {
  for (;;) {
    Block& b = *blocks[id];
    if (b.st[s] != CopyState::absent) return nullptr;
    if (std::byte* p = try_take(s, b)) return p;
    if (!pool(b, s).could_fit(b.alloc_bytes)) budget_error(s, b);
    // Cheapest first: a clean copy that nobody is about to use goes at once; else a
    // write-back in flight (write-behind) lands; only then does anything else go (a dirty copy
    // written back here, or a prefetched one).
    if (Block* v = lru(s, [&](const Block& c) {
          return c.id != id && same_pool(c, b, s) && c.st[s] == CopyState::valid && !c.landed;
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
        wait_op_settled(lk, w);
        continue;
      }
    }
    // A clean prefetched copy (read again later) before a dirty one (written, then read).
    if (Block* v = lru(s, [&](const Block& c) {
          return c.id != id && same_pool(c, b, s) && c.st[s] == CopyState::valid;
        })) {
      evict_copy(lk, v->id, s, false);
      continue;
    }
    if (evict_one(lk, s, id)) continue;
    // Nothing evictable now; transfers in flight may promote_memory_only_gpu into evictable copies.
    if (!inflight.empty()) {
      auto op = inflight.front();
      wait_op_settled(lk, op);
      continue;
    }
    budget_error(s, b);
  }
}

}  // namespace tierswap
