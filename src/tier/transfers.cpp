// TierManager transfers: NVMe reads and writes through the engine, their completion (checked,
// counted, checksummed), and copies between the memory tiers with the lock released.
#include "src/tier/tier_impl.hpp"

namespace tierswap {

void TierManager::Impl::count(Tier from, Tier to, std::uint64_t bytes, double secs) {
  const int f = static_cast<int>(from), t = static_cast<int>(to);
  ctr.bytes_out[f] += bytes;
  ctr.ops_out[f] += 1;
  ctr.busy_seconds_out[f] += secs;
  ctr.bytes_in[t] += bytes;
  ctr.ops_in[t] += 1;
  ctr.busy_seconds_in[t] += secs;
}

void TierManager::Impl::complete_op(Op& op) {
  if (op.done) return;
  if (!op.hashed) {  // the hasher finalizes it once the checksum is known
    op.io_landed = true;
    return;
  }
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
      pool(b, kHost).free(b.data[kHost]);
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
      pool(b, kHost).free(b.data[kHost]);
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
void TierManager::Impl::wait_op(std::unique_lock<std::mutex>& lk, const std::shared_ptr<Op>& op) {
  while (!op->done) {
    if (op->io_landed) {  // waits for the hasher
      cv.wait(lk);
      continue;
    }
    lk.unlock();
    try {
      op->ticket.wait();
    } catch (...) {
    }
    lk.lock();
    complete_op(*op);
  }
  if (op->error) std::rethrow_exception(op->error);
}

void TierManager::Impl::wait_not_busy(std::unique_lock<std::mutex>& lk, BlockId id) {
  cv.wait(lk, [&] { return !blocks[id]->busy; });
}

std::shared_ptr<Op> TierManager::Impl::start_read(BlockId id, std::byte* into, bool prefetch) {
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
    op->ticket = engine.read(offset_of(b, b.nvme_extent()), into, b.alloc_bytes);
  } catch (...) {
    if (prefetch) --inflight_prefetch;
    b.op.reset();
    b.st[kHost] = CopyState::absent;
    b.data[kHost] = nullptr;
    pool(b, kHost).free(into);
    throw;
  }
  inflight.push_back(op);
  reaper_cv.notify_one();  // `cv`'s waiters wait for a block not busy or a transfer done
  return op;
}

std::shared_ptr<Op> TierManager::Impl::start_write(BlockId id) {
  Block& b = *blocks[id];
  auto op = std::make_shared<Op>();
  op->kind = Op::write;
  op->id = id;
  op->bytes = b.alloc_bytes;
  op->src = b.data[kHost];
  op->hash_bytes = b.bytes;
  op->start = Clock::now();
  op->ticket = engine.write(offset_of(b, b.write_extent()), b.data[kHost], b.alloc_bytes);
  op->hashed = false;
  hash_q.push_back(op);
  hash_cv.notify_one();
  b.st[kHost] = CopyState::writing;
  b.op = op;
  inflight.push_back(op);
  reaper_cv.notify_one();  // `cv`'s waiters wait for a block not busy or a transfer done
  return op;
}

void TierManager::Impl::run_hasher() {
  std::unique_lock lk(mu);
  for (;;) {
    hash_cv.wait(lk, [&] { return stop_hasher || !hash_q.empty(); });
    if (hash_q.empty()) return;  // stopped, and nothing left to hash
    const std::shared_ptr<Op> op = hash_q.front();
    hash_q.pop_front();
    lk.unlock();
    const std::uint64_t sum = checksum64(op->src, op->hash_bytes);
    lk.lock();
    op->checksum = sum;
    op->hashed = true;
    if (op->io_landed) complete_op(*op);
  }
}

void TierManager::Impl::run_reaper() {
  std::unique_lock lk(mu);
  const auto unlanded = [&] {
    return std::any_of(inflight.begin(), inflight.end(), [](auto& op) { return !op->io_landed; });
  };
  for (;;) {
    reaper_cv.wait(lk, [&] { return stop || unlanded(); });
    if (stop) return;
    // Whichever transfer lands first is finalized first (a write-back that frees memory must
    // not wait behind a slower read).
    std::vector<std::shared_ptr<Op>> ops;
    std::vector<IoTicket*> tickets;
    for (auto& op : inflight)
      if (!op->io_landed) {
        ops.push_back(op);
        tickets.push_back(&op->ticket);
      }
    lk.unlock();
    engine.wait_any(tickets);
    lk.lock();
    for (auto& op : ops)
      if (op->ticket.ready()) complete_op(*op);
  }
}

void TierManager::Impl::stop_reaper() {
  {
    std::lock_guard lk(mu);
    stop = true;
  }
  reaper_cv.notify_one();
  reaper.join();
}

// Copies a block between its host and device copies with the lock released (the block is
// marked busy: nobody else touches its copies meanwhile).
void TierManager::Impl::copy_between_tiers(std::unique_lock<std::mutex>& lk, BlockId id, int from,
                                           int to) {
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
  count(from == kDev ? Tier::device : Tier::host, to == kDev ? Tier::device : Tier::host, n, secs);
}

// A device copy of zeros for block id, which has no data anywhere (a trimmed gradient, a new
// block): made in device memory with the lock released (the block busy meanwhile). Returns
// having done nothing when the block changed while memory was found (the caller looks again).
void TierManager::Impl::zero_device(std::unique_lock<std::mutex>& lk, BlockId id) {
  std::byte* p = alloc_copy(lk, kDev, id);
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

void TierManager::Impl::wait_op_noting(std::unique_lock<std::mutex>& lk,
                                       const std::shared_ptr<Op>& op, std::exception_ptr* first) {
  try {
    wait_op(lk, op);
  } catch (...) {
    if (!*first) *first = std::current_exception();
  }
}

void TierManager::Impl::wait_op_settled(std::unique_lock<std::mutex>& lk,
                                        const std::shared_ptr<Op>& op) noexcept {
  try {
    wait_op(lk, op);
  } catch (...) {
  }
}

}  // namespace tierswap
