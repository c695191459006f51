// TierManager swap scheduler: bringing a copy into host memory, prefetch ahead, write-behind of
// dirty data above the threshold, flush, and the residency invariants checked in debug builds.
#include "src/tier/tier_impl.hpp"

namespace tierswap {

// Makes the host copy valid/dirty/writing. `stalled` reports whether it waited on I/O.
void TierManager::Impl::ensure_host(std::unique_lock<std::mutex>& lk, BlockId id, bool* waited) {
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
    std::byte* p = alloc_copy(lk, kHost, id);
    Block& b2 = *blocks[id];
    if (b2.st[kHost] != CopyState::absent || b2.busy) {
      pool(b2, kHost).free(p);
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

void TierManager::Impl::pump_prefetch() {
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

std::uint64_t TierManager::Impl::dirty_host_bytes() const {
  std::uint64_t n = 0;
  for (auto& b : blocks)
    if (b->st[kHost] == CopyState::dirty && !b->desc.transient) n += b->alloc_bytes;
  return n;
}

void TierManager::Impl::write_behind() {
  std::uint64_t dirty = dirty_host_bytes();
  while (dirty > cfg.max_dirty_bytes) {
    Block* v = lru(kHost, [](const Block& b) {
      return b.st[kHost] == CopyState::dirty && b.st[kDev] != CopyState::dirty && !b.desc.transient;
    });
    if (v == nullptr) return;
    start_write(v->id);
    ++ctr.write_behind;
    dirty -= v->alloc_bytes;
  }
}

// Writes every dirty host copy down and waits for every write in flight; the first error is
// rethrown. A write-behind that failed with nobody waiting for it (the reaper finalized it) left
// its copy dirty and its error unseen: such copies are written again here, so that a commit never
// records a block whose newest data is only in memory.
void TierManager::Impl::flush_locked(std::unique_lock<std::mutex>& lk) {
  for (BlockId id = 0; id < blocks.size(); ++id) {
    wait_not_busy(lk, id);
    Block& b = *blocks[id];
    while (b.st[kDev] == CopyState::dirty && !b.writer && !b.desc.transient && !copy_down(lk, id)) {
    }
  }
  const auto needs_write = [](const Block& b) {
    return b.st[kHost] == CopyState::dirty && !b.writer && !b.desc.transient;
  };
  for (;;) {
    std::vector<std::shared_ptr<Op>> mine;
    for (BlockId id = 0; id < blocks.size(); ++id) {
      wait_not_busy(lk, id);
      if (needs_write(*blocks[id]) && !blocks[id]->op) mine.push_back(start_write(id));
    }
    std::exception_ptr first = wait_writes(lk);            // the write-behind's too
    for (auto& op : mine) wait_op_noting(lk, op, &first);  // (finalized ones are not in flight)
    if (first) std::rethrow_exception(first);
    if (std::none_of(blocks.begin(), blocks.end(), [&](auto& b) { return needs_write(*b); }))
      return;
  }
}

// Waits for every write in flight; the first error.
std::exception_ptr TierManager::Impl::wait_writes(std::unique_lock<std::mutex>& lk) {
  std::exception_ptr first;
  for (;;) {
    std::shared_ptr<Op> w;
    for (auto& op : inflight)
      if (op->kind == Op::write) {
        w = op;
        break;
      }
    if (!w) return first;
    wait_op_noting(lk, w, &first);
  }
}

// Copies the device copy into host memory so that the host holds the newest data: host dirty
// and device valid when the device copy was dirty, both valid otherwise. Waits for a transfer
// of the host copy first. False when the block changed meanwhile (the caller looks again).
bool TierManager::Impl::copy_down(std::unique_lock<std::mutex>& lk, BlockId id) {
  wait_not_busy(lk, id);
  Block& b = *blocks[id];
  if (b.op) {
    auto op = b.op;
    wait_op_settled(lk, op);
    return false;
  }
  if (b.writer || (b.st[kDev] != CopyState::valid && b.st[kDev] != CopyState::dirty)) return false;
  if (b.st[kHost] == CopyState::absent) {
    std::byte* p = alloc_copy(lk, kHost, id);
    Block& b2 = *blocks[id];
    if (b2.st[kHost] != CopyState::absent || b2.busy || b2.op || b2.writer ||
        (b2.st[kDev] != CopyState::valid && b2.st[kDev] != CopyState::dirty)) {
      pool(b2, kHost).free(p);
      return false;
    }
    b2.data[kHost] = p;
    b2.st[kHost] = CopyState::valid;
  }
  const bool dev_dirty = blocks[id]->st[kDev] == CopyState::dirty;
  copy_between_tiers(lk, id, kDev, kHost);
  if (dev_dirty) {
    blocks[id]->st[kHost] = CopyState::dirty;
    blocks[id]->st[kDev] = CopyState::valid;
  }
  return true;
}

void TierManager::Impl::wait_all(std::unique_lock<std::mutex>& lk) {
  while (!inflight.empty()) {
    auto op = inflight.front();
    wait_op_settled(lk, op);
  }
}

// Debug builds (and the sanitizer builds, which define TIERSWAP_DEBUG_INVARIANTS) check the
// residency invariants after every state change; a violation is a bug in this file.
void TierManager::Impl::check_invariants() const {
#if !defined(NDEBUG) || defined(TIERSWAP_DEBUG_INVARIANTS)
  auto fail = [](const Block& b, const char* what) {
    log(LogLevel::error,
        fmt::format("tier manager invariant broken for '{}': {}", b.desc.name, what));
    std::abort();
  };
  std::uint64_t used[2] = {0, 0}, used_pageable = 0;
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
      if (b.data[s] != nullptr)
        (&pool(b, s) == pageable.get() ? used_pageable : used[s]) += b.alloc_bytes;
    }
    if ((b.st[kHost] == CopyState::reading || b.st[kHost] == CopyState::writing) && !b.op)
      fail(b, "a transfer state without a transfer");
    if (b.op && b.op->done) fail(b, "a finished transfer still attached");
  }
  if (used[kHost] > host.budget() || (device && used[kDev] > device->budget()) ||
      (pageable && used_pageable > pageable->budget()))
    log(LogLevel::error, "tier manager: a budget is exceeded"), std::abort();
#endif
}

}  // namespace tierswap
