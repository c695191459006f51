#include <sys/mman.h>
#include <unistd.h>

#include <numa.h>

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

std::byte* SlabPool::try_allocate(std::uint64_t bytes) {
  const std::uint64_t len = round_up(std::max<std::uint64_t>(bytes, 1), kPiece);
  for (auto& s : slabs_) {
    if (auto e = s->alloc->try_allocate(len)) {
      std::byte* p = s->base + e->offset;
      pieces_[p] = {s.get(), e->length};
      used_ += e->length;
      return p;
    }
  }
  // A new slab: the usual size, or one just big enough for a larger piece, within the budget.
  std::uint64_t size = std::max(slab_size_, len);
  if (reserved_ + size > budget_) size = len;
  if (reserved_ + size > budget_) return nullptr;
  auto s = std::make_unique<Slab>();
  make_slab(*s, size);
  s->bytes = size;
  s->alloc = std::make_unique<ExtentAllocator>(size, kPiece);
  reserved_ += size;
  peak_ = std::max(peak_, reserved_);
  const Extent e = s->alloc->allocate(len);
  std::byte* p = s->base + e.offset;
  pieces_[p] = {s.get(), e.length};
  used_ += e.length;
  slabs_.push_back(std::move(s));
  return p;
}

void SlabPool::free(std::byte* p) noexcept {
  auto it = pieces_.find(p);
  if (it == pieces_.end()) return;
  Slab* s = it->second.first;
  try {
    s->alloc->free({static_cast<std::uint64_t>(p - s->base), it->second.second});
  } catch (...) {
  }
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

// A slab from the current chunk, or a new chunk (up to 64 MiB, no more than the budget left,
// whole 2 MiB pages, on transparent huge pages: AlignedBuffer). A slab of its own smaller than
// 2 MiB would never be on a huge page, and every NVMe transfer into it would touch scattered
// 4 KiB pages: on the machine of bench/RESULTS.md reads into them ran at about half the speed.
// Slabs are only ever added until release_all(), so carving in order wastes no touched
// memory (a chunk's tail no slab fits is address space only). Null when
// huge pages are off or no chunk could be allocated (the slab then gets its own memory).
std::byte* HostPool::carve(std::uint64_t bytes) {
  constexpr std::uint64_t kChunk = 64ull << 20;
  if (!ProcessConfig::current().huge_pages) return nullptr;
  if (chunks_.empty() || chunk_used_ + bytes > chunks_.back().size()) {
    const std::uint64_t left = budget() > reserved() ? budget() - reserved() : 0;
    const std::uint64_t size = round_up(std::max(bytes, std::min(kChunk, left)), kHugePageBytes);
    try {
      chunks_.emplace_back(size, kHugePageBytes, false);
    } catch (const std::bad_alloc&) {
      return nullptr;
    }
    chunk_used_ = 0;
  }
  std::byte* p = chunks_.back().data() + chunk_used_;
  chunk_used_ += round_up(bytes, kPiece);
  return p;
}

void HostPool::drop_slab(Slab& s) noexcept {
  if (s.shared) return engine_->free_shared(s.base);
  if (engine_ != nullptr && s.engine_handle >= 0) engine_->unregister_buffer(s.engine_handle);
  if (s.cuda_registered) cuda::host_unregister(s.base);
  if (s.mlocked) ::munlock(s.base, s.bytes);
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
