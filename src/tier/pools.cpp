#include <sys/mman.h>
#include <unistd.h>

#include <numa.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <system_error>

#include "tierswap/cuda_runtime.hpp"
#include "tierswap/detail/tier_pools.hpp"
#include "tierswap/device.hpp"
#include "tierswap/io_engine.hpp"
#include "tierswap/log.hpp"
#include "tierswap/process_config.hpp"
#include "tierswap/units.hpp"

#include <fmt/format.h>

namespace tierswap::detail {
namespace {
constexpr std::uint64_t kPiece = 4096;

// Binds future pages of [p, p + bytes) to `node` (libnuma: an mbind MPOL_BIND policy). The slab
// is bound before anything touches it (mlock, cudaHostRegister, I/O), so its pages land there.
bool bind_to_node(void* p, std::uint64_t bytes, int node) noexcept {
  if (numa_available() < 0) return false;
  errno = 0;
  numa_tonode_memory(p, bytes, node);
  return errno == 0;
}
}  // namespace

SlabPool::SlabPool(std::uint64_t budget, std::uint64_t slab_size)
    : budget_(budget), slab_size_(round_up(std::max<std::uint64_t>(slab_size, kPiece), kPiece)) {}

bool SlabPool::could_fit(std::uint64_t bytes) const noexcept {
  return round_up(std::max<std::uint64_t>(bytes, 1), kPiece) <= budget_;
}

std::byte* SlabPool::hand_out(Slab& s, const Extent& e) {
  std::byte* p = s.base + e.offset;
  pieces_[p] = {&s, e.length};
  s.used += e.length;
  used_ += e.length;
  return p;
}

std::byte* SlabPool::try_allocate(std::uint64_t bytes) {
  const std::uint64_t len = round_up(std::max<std::uint64_t>(bytes, 1), kPiece);
  for (auto& s : slabs_)
    if (auto e = s->alloc->try_allocate(len)) return hand_out(*s, *e);
  // A new slab: the usual size, or one just big enough for a larger piece, within the budget.
  std::uint64_t size = std::max(slab_size_, len);
  if (!make_room(size)) {
    size = len;
    if (!make_room(size)) return nullptr;
  }
  auto s = std::make_unique<Slab>();
  make_slab(*s, size);
  s->bytes = size;
  s->alloc = std::make_unique<ExtentAllocator>(size, kPiece);
  reserved_ += size;
  peak_ = std::max(peak_, reserved_);
  Slab& slab = *slabs_.emplace_back(std::move(s));
  return hand_out(slab, slab.alloc->allocate(len));
}

// Slabs made for pieces of odd sizes (the last sub-group of a group is smaller) would otherwise
// hold the budget for good in sizes no later piece fits: every empty one is too small for the
// piece asked for (it would have served it), so the smallest go back first.
bool SlabPool::make_room(std::uint64_t size) {
  if (reserved_ + size <= budget_) return true;
  std::vector<std::size_t> empty;
  std::uint64_t empty_bytes = 0;
  for (std::size_t i = 0; i < slabs_.size(); ++i)
    if (slabs_[i]->used == 0) empty.push_back(i), empty_bytes += slabs_[i]->bytes;
  if (reserved_ - empty_bytes + size > budget_) return false;
  std::sort(empty.begin(), empty.end(),
            [&](std::size_t a, std::size_t b) { return slabs_[a]->bytes < slabs_[b]->bytes; });
  std::vector<const Slab*> gone;
  for (std::size_t i : empty) {
    if (reserved_ + size <= budget_) break;
    drop_slab(*slabs_[i]);
    reserved_ -= slabs_[i]->bytes;
    gone.push_back(slabs_[i].get());
  }
  std::erase_if(slabs_, [&](const std::unique_ptr<Slab>& s) {
    return std::find(gone.begin(), gone.end(), s.get()) != gone.end();
  });
  return true;
}

void SlabPool::free(std::byte* p) noexcept {
  auto it = pieces_.find(p);
  if (it == pieces_.end()) return;
  Slab* s = it->second.first;
  try {
    s->alloc->free({static_cast<std::uint64_t>(p - s->base), it->second.second});
  } catch (...) {
  }
  s->used -= it->second.second;
  used_ -= it->second.second;
  pieces_.erase(it);
}

void SlabPool::release_all() noexcept {
  for (auto& s : slabs_) drop_slab(*s);
  slabs_.clear();
  pieces_.clear();
  reserved_ = used_ = 0;
}

HostPool::HostPool(std::uint64_t budget, std::uint64_t slab_size, bool lock, int numa_node,
                   IoEngine* engine, bool register_buffers)
    : SlabPool(budget, slab_size),
      lock_(lock),
      numa_node_(numa_node),
      engine_(engine),
      register_(register_buffers) {
  if (numa_node >= 0) {
    if (numa_available() < 0)
      throw std::invalid_argument(
          fmt::format("numa_node={}: this system has no NUMA support (numa_available)", numa_node));
    if (numa_node > numa_max_node() || !numa_bitmask_isbitset(numa_all_nodes_ptr, numa_node))
      throw std::invalid_argument(
          fmt::format("numa_node={}: no such NUMA node on this machine (nodes 0..{})", numa_node,
                      numa_max_node()));
  }
}

HostPool::~HostPool() {
  release_all();
}

void HostPool::make_slab(Slab& s, std::uint64_t bytes) {
  if (engine_ != nullptr && engine_->memory_is_shared()) {
    s.base = engine_->allocate_shared(bytes, lock_);
    if (s.base == nullptr)
      throw std::system_error(ENOMEM, std::system_category(),
                              fmt::format("host slab of {}: the memory shared with the node "
                                          "service is exhausted",
                                          format_bytes(bytes)));
    s.shared = any_shared_ = true;
    return;
  }
  s.base = carve(bytes);
  s.carved = s.base != nullptr;
  if (s.base == nullptr) {
    s.host = AlignedBuffer(bytes, 4096, false);
    s.base = s.host.data();
  }
  if (numa_node_ >= 0 && !bind_to_node(s.base, bytes, numa_node_))
    log(LogLevel::warn, fmt::format("host slab: binding {} to NUMA node {} failed: {}",
                                    format_bytes(bytes), numa_node_, std::strerror(errno)));
  if (lock_) {
    if (device_info().available) s.cuda_registered = cuda::host_register(s.base, bytes);
    if (!s.cuda_registered) s.mlocked = ::mlock(s.base, bytes) == 0;
    if (!s.cuda_registered && !s.mlocked && !warned_) {
      warned_ = true;
      log(LogLevel::warn,
          fmt::format("host slab of {}: could not pin it (mlock: {}; raise `ulimit -l`); using "
                      "pageable memory",
                      format_bytes(bytes), std::strerror(errno)));
    }
  }
  any_cuda_ |= s.cuda_registered;
  any_mlocked_ |= s.mlocked;
  any_pageable_ |= !s.cuda_registered && !s.mlocked;
  if (engine_ != nullptr && register_) s.engine_handle = engine_->register_buffer(s.base, bytes);
}

// A slab's range of a chunk (best fit), or of a new chunk (up to 64 MiB, no more than the budget
// left, whole 2 MiB pages, on transparent huge pages: AlignedBuffer). A slab of its own smaller
// than 2 MiB would never be on a huge page, and every NVMe transfer into it would touch scattered
// 4 KiB pages: on the machine of bench/RESULTS.md reads into them ran at about half the speed.
// A slab given back returns its range (uncarve); a chunk with no range left in use is freed.
// Null when huge pages are off or no chunk could be allocated (the slab then gets its own
// memory).
std::byte* HostPool::carve(std::uint64_t bytes) {
  constexpr std::uint64_t kChunk = 64ull << 20;
  if (!ProcessConfig::current().huge_pages) return nullptr;
  const std::uint64_t len = round_up(bytes, kPiece);
  for (auto& c : chunks_)
    if (auto e = c.ranges->try_allocate(len)) return c.mem.data() + e->offset;
  const std::uint64_t left = budget() > reserved() ? budget() - reserved() : 0;
  const std::uint64_t size = round_up(std::max(len, std::min(kChunk, left)), kHugePageBytes);
  try {
    Chunk c{AlignedBuffer(size, kHugePageBytes, false),
            std::make_unique<ExtentAllocator>(size, kPiece)};
    const Extent e = c.ranges->allocate(len);
    return chunks_.emplace_back(std::move(c)).mem.data() + e.offset;
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}

void HostPool::uncarve(const Slab& s) noexcept {
  for (auto it = chunks_.begin(); it != chunks_.end(); ++it) {
    std::byte* base = it->mem.data();
    if (s.base < base || s.base >= base + it->mem.size()) continue;
    try {
      it->ranges->free({static_cast<std::uint64_t>(s.base - base), round_up(s.bytes, kPiece)});
    } catch (...) {
    }
    if (it->ranges->stats().used == 0) chunks_.erase(it);
    return;
  }
}

void HostPool::drop_slab(Slab& s) noexcept {
  if (s.shared) return engine_->free_shared(s.base);
  if (engine_ != nullptr && s.engine_handle >= 0) engine_->unregister_buffer(s.engine_handle);
  if (s.cuda_registered) cuda::host_unregister(s.base);
  if (s.mlocked) ::munlock(s.base, s.bytes);
  if (s.carved) uncarve(s);
  s.host = AlignedBuffer();
}

std::string HostPool::memory_kind() const {
  if (any_shared_) return "service-shared";
  if (any_pageable_) return "pageable";
  if (any_mlocked_) return "mlocked";
  if (any_cuda_) return "cuda-registered";
  if (!lock_) return "pageable";
  return device_info().available ? "cuda-registered" : "mlocked";
}

DevicePool::DevicePool(std::uint64_t budget, std::uint64_t slab_size, bool simulated)
    : SlabPool(budget, slab_size), simulated_(simulated) {
  if (!simulated && !device_info().available)
    throw std::runtime_error("device tier: no usable GPU (" + device_info().reason + ")");
}

DevicePool::~DevicePool() {
  release_all();
}

void DevicePool::make_slab(Slab& s, std::uint64_t bytes) {
  if (simulated_) {
    s.host = AlignedBuffer(bytes, 4096, false);
    s.base = s.host.data();
  } else {
    s.device = cuda::device_alloc(bytes);
    s.base = static_cast<std::byte*>(s.device);
  }
}

void DevicePool::drop_slab(Slab& s) noexcept {
  if (s.device != nullptr) cuda::device_free(s.device);
  s.host = AlignedBuffer();
}

}  // namespace tierswap::detail
