// TierManager: the public API (tier_manager.hpp) and its construction; the work is in
// transfers.cpp, eviction.cpp, schedule.cpp, manifest.cpp and snapshot.cpp (see tier_impl.hpp).
#include <utility>

#include "src/tier/tier_impl.hpp"

namespace tierswap {

Block& TierManager::Impl::blk(BlockId id) {
  if (id >= blocks.size())
    throw std::invalid_argument(fmt::format("block id {}: no such block", id));
  return *blocks[id];
}

detail::SlabPool& TierManager::Impl::pool(const Block& b, int s) {
  return const_cast<detail::SlabPool&>(std::as_const(*this).pool(b, s));
}

const detail::SlabPool& TierManager::Impl::pool(const Block& b, int s) const {
  if (s == kDev) return *device;
  if (b.desc.pageable && pageable) return *pageable;
  return host;
}

std::uint64_t TierManager::Impl::offset_of(const Block& b, int extent) const {
  if (extent < 0 || extent >= b.nextents)  // a memory-only block has none: a bug if it gets here
    throw std::logic_error(
        fmt::format("block '{}': no NVMe extent {} (memory-only blocks have no NVMe copy)",
                    b.desc.name, extent));
  return b.extent[extent].offset;
}

// ---- BlockView -------------------------------------------------------------------------------
BlockView::BlockView(BlockView&& o) noexcept
    : mgr_(std::exchange(o.mgr_, nullptr)),
      data_(o.data_),
      bytes_(o.bytes_),
      id_(o.id_),
      tier_(o.tier_),
      writable_(o.writable_),
      dirty_(std::exchange(o.dirty_, false)) {}

BlockView& BlockView::operator=(BlockView&& o) noexcept {
  if (this != &o) {
    if (mgr_ != nullptr) {
      try {
        mgr_->release(*this, dirty_);
      } catch (...) {
      }
    }
    mgr_ = std::exchange(o.mgr_, nullptr);
    data_ = o.data_;
    bytes_ = o.bytes_;
    id_ = o.id_;
    tier_ = o.tier_;
    writable_ = o.writable_;
    dirty_ = std::exchange(o.dirty_, false);
  }
  return *this;
}

BlockView::~BlockView() {
  if (mgr_ != nullptr) {
    try {
      mgr_->release(*this, dirty_);
    } catch (...) {
    }
  }
}

void BlockView::mark_dirty() {
  if (!writable_) throw std::logic_error("mark_dirty: a read-only view (acquire it for write)");
  dirty_ = true;
}

// ---- TierManager -----------------------------------------------------------------------------
TierManager::TierManager(SwapSpace& space, IoEngine& engine, TierConfig cfg) {
  cfg.validate();
  // Every setting is read before the reaper starts: a throw after it would destroy a joinable
  // thread (std::terminate).
  const TelemetryConfig tc = TelemetryConfig::from_env();
  (void)ProcessConfig::current();  // TIERSWAP_METRICS among them
  impl_ = std::make_unique<Impl>(space, engine, cfg);
  if (std::filesystem::exists(impl_->manifest_path())) {
    impl_->load_manifest();
    if (cfg.verify_on_open) impl_->verify_blocks();
  }
  impl_->instance = MetricsRegistry::process().next_instance();
  impl_->metrics = Impl::register_metrics(*this, impl_->instance);
  impl_->reaper = std::thread([this] { impl_->run_reaper(); });
  try {
    impl_->hasher = std::thread([this] { impl_->run_hasher(); });
  } catch (...) {  // no thread to be had: the reaper stopped, so that the error reaches the caller
    impl_->stop_reaper();
    throw;
  }
  if (cfg.telemetry && tc.enabled) {
    try {
      impl_->telemetry =
          std::make_unique<TelemetryServer>([this] { return snapshot().to_json(); }, tc);
    } catch (const std::exception& e) {
      log(LogLevel::warn, fmt::format("telemetry endpoint not started: {}", e.what()));
    }
  }
}

std::uint64_t TierManager::instance() const noexcept {
  return impl_->instance;
}

std::filesystem::path TierManager::telemetry_socket() const {
  return impl_->telemetry ? impl_->telemetry->socket_path() : std::filesystem::path();
}

TierManager::~TierManager() {
  if (impl_->committer.joinable()) impl_->committer.join();  // a commit nobody waited for
  impl_->metrics = {};
  impl_->telemetry.reset();
  impl_->stop_reaper();
  std::unique_lock lk(impl_->mu);
  impl_->wait_all(lk);
  impl_->stop_hasher = true;
  impl_->hash_cv.notify_all();
  lk.unlock();
  impl_->hasher.join();
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
  b->nextents = d.memory_only ? 0 : m.cfg.shadow_slots ? 2 : 1;
  if (b->nextents >= 1) b->extent[0] = m.alloc.allocate(b->alloc_bytes);
  if (b->nextents == 2) {
    try {
      b->extent[1] = m.alloc.allocate(b->alloc_bytes);
    } catch (...) {
      m.alloc.free(b->extent[0]);
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

void TierManager::set_pageable(BlockId id, bool pageable) {
  std::lock_guard lk(impl_->mu);
  Block& b = impl_->blk(id);
  if (b.desc.pageable == pageable) return;
  if (b.st[kHost] != CopyState::absent)
    throw std::logic_error(fmt::format(
        "set_pageable: block '{}' has a host copy (set it before the block is used)", b.desc.name));
  b.desc.pageable = pageable;
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
  if (b.st[kHost] != CopyState::absent) {  // wanted soon: kept as a copy a prefetch read would be
    b.landed = true;
    b.last_use = ++m.tick;
    return;
  }
  if (b.queued || !b.nvme_has_data()) return;
  b.queued = true;
  m.prefetch_q.push_back(id);
  m.pump_prefetch();
}

void TierManager::Impl::check_no_conflict(const Block& b, bool writes) const {
  if (b.writer)
    throw std::logic_error(
        fmt::format("acquire: block '{}' has a writable view; release it first", b.desc.name));
  if (writes && b.pins[kDev] + b.pins[kHost] > 0)
    throw std::logic_error(fmt::format(
        "acquire(write): block '{}' has {} other view(s); a writable view must be the only one",
        b.desc.name, b.pins[kDev] + b.pins[kHost]));
}

// Access::overwrite: memory for the copy s with nothing read into it (a "fresh" copy,
// kept only if released dirty); a prefetch in flight lands first and is reused. False: the
// block changed meanwhile, look again.
bool TierManager::Impl::overwrite_copy(std::unique_lock<std::mutex>& lk, BlockId id, int s,
                                       bool* waited) {
  wait_not_busy(lk, id);
  if (blocks[id]->st[s] == CopyState::absent) {
    std::byte* p = alloc_copy(lk, s, id);
    Block& b = *blocks[id];
    check_no_conflict(b, true);
    if (b.st[s] != CopyState::absent || b.busy) {
      pool(b, s).free(p);
      return false;
    }
    b.data[s] = p;
    b.st[s] = CopyState::valid;
    b.fresh[s] = true;
  }
  if (blocks[id]->st[s] == CopyState::reading) {
    auto op = blocks[id]->op;
    *waited = true;
    wait_op(lk, op);
    return false;
  }
  return true;
}

// Makes block id's copy s current: the host copy read (or zeros, or copied down), a
// device copy made from it, a write-back in flight waited for when the view writes. False: it
// did one of those, look again.
bool TierManager::Impl::make_current(std::unique_lock<std::mutex>& lk, BlockId id, int s,
                                     bool writes, bool* waited) {
  if (!blocks[id]->fresh[s]) {
    wait_not_busy(lk, id);
    const Block& c = *blocks[id];
    const bool dev_copy = c.st[kDev] == CopyState::valid || c.st[kDev] == CopyState::dirty;
    if (s == kDev && !dev_copy && c.st[kHost] == CopyState::absent && !c.nvme_has_data()) {
      zero_device(lk, id);  // no data anywhere: zeros made in device memory, nothing copied
      return false;
    }
    // A device view of a device copy needs nothing from the host (a device copy, when there is
    // one, is never older than the host's: see release()).
    if (s != kDev || !dev_copy) ensure_host(lk, id, waited);
  }
  Block& b = *blocks[id];
  check_no_conflict(b, writes);
  if (writes && b.st[kHost] == CopyState::writing) {
    auto op = b.op;
    *waited = true;
    wait_op(lk, op);
    return false;
  }
  if (s == kDev && b.st[kDev] == CopyState::absent) {
    make_device_copy(lk, id);
    return false;
  }
  return b.st[s] == CopyState::valid || b.st[s] == CopyState::dirty ||
         b.st[s] == CopyState::writing;
}

// A device copy of block id from its host copy (pinned meanwhile).
void TierManager::Impl::make_device_copy(std::unique_lock<std::mutex>& lk, BlockId id) {
  ++blocks[id]->pins[kHost];
  std::byte* p = nullptr;
  try {
    p = alloc_copy(lk, kDev, id);
  } catch (...) {
    --blocks[id]->pins[kHost];
    throw;
  }
  Block& b = *blocks[id];
  --b.pins[kHost];
  if (b.st[kDev] != CopyState::absent || b.busy) {
    device->free(p);
    return;
  }
  b.data[kDev] = p;
  b.st[kDev] = CopyState::valid;
  copy_between_tiers(lk, id, kHost, kDev);
}

BlockView TierManager::acquire(BlockId id, Tier tier, Access access) {
  std::unique_lock lk(impl_->mu);
  Impl& m = *impl_;
  if (access != Access::read && !m.blk(id).desc.transient) m.wait_not_committing(lk);
  const Block& b0 = m.blk(id);
  if (tier == Tier::nvme)
    throw std::invalid_argument("acquire: the nvme tier has no views; acquire host or gpu");
  if (tier == Tier::device && !m.device)
    throw std::invalid_argument("acquire: no device tier configured");
  const bool writes = access != Access::read;
  m.check_no_conflict(b0, writes);
  const auto t0 = Clock::now();
  bool waited = false;
  const bool was_prefetched = b0.prefetched || (b0.op && b0.op->prefetch);
  const bool needed_read = access != Access::overwrite && b0.st[kHost] == CopyState::absent &&
                           b0.st[kDev] == CopyState::absent && b0.nvme_has_data();
  const int s = copy_of(tier);
  while ((access == Access::overwrite && !m.overwrite_copy(lk, id, s, &waited)) ||
         !m.make_current(lk, id, s, writes, &waited)) {
  }
  Block& b = *m.blocks[id];
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

void TierManager::release(BlockView& v, bool dirty) {
  if (v.mgr_ == nullptr) throw std::logic_error("release: an empty BlockView");
  if (v.mgr_ != this) throw std::logic_error("release: the view belongs to another manager");
  if (dirty && !v.writable_)
    throw std::logic_error(
        "release(dirty=true) of a read-only view: acquire it with Access::write");
  std::unique_lock lk(impl_->mu);
  Impl& m = *impl_;
  Block& b = m.blk(v.id_);
  const int s = copy_of(v.tier_);
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
  if (dirty) m.write_behind();
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
  m.evict_copy(lk, id, copy_of(tier), true);
  m.check_invariants();
}

void TierManager::write_back(BlockId id) {
  std::unique_lock lk(impl_->mu);
  Impl& m = *impl_;
  Block& b = m.blk(id);
  b.last_use = ++m.wb_tick;  // before every other copy once it is clean, after older write-backs
  if (b.st[kHost] == CopyState::dirty && b.st[kDev] != CopyState::dirty && !b.writer && !b.op &&
      !b.busy && !b.desc.transient) {
    m.start_write(id);
    ++m.ctr.write_behind;
  }
  m.check_invariants();
}

void TierManager::trim(BlockId id) {
  std::unique_lock lk(impl_->mu);
  Impl& m = *impl_;
  if (!m.blk(id).desc.transient) m.wait_not_committing(lk);
  for (;;) {
    m.wait_not_busy(lk, id);
    Block& b = *m.blocks[id];
    if (b.pins[kDev] + b.pins[kHost] > 0)
      throw std::logic_error(
          fmt::format("trim: block '{}' has a view; release it first", b.desc.name));
    if (b.op) {
      auto op = b.op;
      m.wait_op_settled(lk, op);
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
  commit_async();
  return wait_commit();
}

void TierManager::commit_async() {
  std::unique_lock lk(impl_->mu);
  Impl& m = *impl_;
  if (m.commit_pending)
    throw std::logic_error("commit: the previous commit_async() was not waited for (wait_commit)");
  for (auto& b : m.blocks)
    if (b->writer)
      throw std::logic_error(
          fmt::format("commit: block '{}' has a writable view; release it first", b->desc.name));
  m.committing = m.commit_pending = true;
  try {
    m.committer = std::thread([&m] {
      std::unique_lock l(m.mu);
      try {
        m.commit_result = m.commit_locked(l);
      } catch (...) {
        m.commit_error = std::current_exception();
      }
      m.committing = false;
      m.cv.notify_all();
    });
  } catch (...) {  // no thread: nothing started
    m.committing = m.commit_pending = false;
    throw;
  }
}

std::uint64_t TierManager::wait_commit() {
  Impl& m = *impl_;
  {
    std::lock_guard lk(m.mu);
    if (!m.commit_pending) return m.committed_gen;
  }
  m.committer.join();
  std::lock_guard lk(m.mu);
  m.commit_pending = false;
  if (m.commit_error) std::rethrow_exception(std::exchange(m.commit_error, nullptr));
  return m.commit_result;
}

bool TierManager::commit_in_flight() const {
  std::lock_guard lk(impl_->mu);
  return impl_->committing;
}

std::uint64_t TierManager::Impl::commit_locked(std::unique_lock<std::mutex>& lk) {
  flush_locked(lk);
  const CommitRecord next = pending_record;  // a set_commit_record() meanwhile is the next one's
  const std::string payload = manifest_payload(record);
  lk.unlock();  // the blocks of the generation cannot change (committing): the hooks' may
  try {
    if (cfg.durable) engine.sync();
    detail::write_manifest_file(manifest_path(), payload, cfg.durable, /*recycle=*/true);
  } catch (...) {
    lk.lock();
    throw;
  }
  lk.lock();
  ++committed_gen;
  prev_record = std::exchange(record, next);
  for (auto& bp : blocks) {
    Block& b = *bp;
    if (b.desc.transient) continue;  // in-process contents only: nothing to commit
    b.prev.valid = cfg.shadow_slots && (b.written || b.trimmed);
    if (b.prev.valid) b.prev = {true, b.committed, b.has_data, b.data_gen, b.checksum};
    if (b.trimmed) {
      b.has_data = false;
      b.trimmed = false;
    }
    if (b.written) {
      b.committed = b.write_extent();
      b.has_data = true;
      b.checksum = b.written_checksum;
      b.data_gen = committed_gen;
      b.written = false;
    }
  }
  ++ctr.commits;
  check_invariants();
  return committed_gen;
}

void TierManager::discard() {
  std::unique_lock lk(impl_->mu);
  Impl& m = *impl_;
  m.wait_not_committing(lk);
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

bool TierManager::roll_back_generation() {
  std::unique_lock lk(impl_->mu);
  Impl& m = *impl_;
  m.wait_not_committing(lk);
  if (!m.cfg.shadow_slots || m.prev_record.empty()) return false;
  for (auto& b : m.blocks)  // transient blocks hold nothing committed: they stay as they are
    if (!b->desc.transient && (b->changed() || b->pins[kDev] + b->pins[kHost] > 0))
      throw std::logic_error(
          fmt::format("roll_back_generation: block '{}' {} since the last commit", b->desc.name,
                      b->changed() ? "was changed" : "has a view"));
  m.wait_all(lk);  // read-ahead of the generation undone
  for (auto& b : m.blocks) m.cv.wait(lk, [&] { return !b->busy; });
  for (auto& bp : m.blocks)  // every previous extent checked before anything changes
    if (bp->prev.valid && bp->prev.has_data)
      m.verify_extent(*bp, bp->prev.extent, bp->prev.checksum, bp->prev.gen);
  m.write_rolled_back_manifest();
  for (auto& bp : m.blocks) {
    Block& b = *bp;
    if (!b.prev.valid) continue;
    for (int s : {kDev, kHost})
      if (b.st[s] != CopyState::absent) m.drop(b, s);  // copies of the generation undone
    b.prev.valid = false;
  }
  ++m.committed_gen;
  m.check_invariants();
  return true;
}

void TierManager::set_commit_record(std::string record) {
  CommitRecord r(std::move(record));  // escaped here, outside the lock
  std::lock_guard lk(impl_->mu);
  impl_->pending_record = std::move(r);
}

std::string TierManager::commit_record() const {
  std::lock_guard lk(impl_->mu);
  return impl_->record.text();
}

std::uint64_t TierManager::committed_generation() const {
  std::lock_guard lk(impl_->mu);
  return impl_->committed_gen;
}

DeviceTierMode TierManager::device_tier() const noexcept {
  if (!impl_->device) return DeviceTierMode::off;
  return impl_->device->simulated() ? DeviceTierMode::simulated : DeviceTierMode::gpu;
}

TierCounters TierManager::Impl::counters_now() const {
  TierCounters c = ctr;
  c.inflight_ops = static_cast<std::uint32_t>(inflight.size());
  c.queued_prefetches = static_cast<std::uint32_t>(prefetch_q.size());
  c.peak_reserved_bytes[static_cast<int>(Tier::host)] = host.peak_reserved();
  c.peak_pageable_bytes = pageable ? pageable->peak_reserved() : 0;
  if (device) c.peak_reserved_bytes[static_cast<int>(Tier::device)] = device->peak_reserved();
  return c;
}

TierCounters TierManager::counters() const {
  std::lock_guard lk(impl_->mu);
  return impl_->counters_now();
}

}  // namespace tierswap
