// Memory pools of the tier manager (internal). A pool hands out aligned pieces of large slabs
// under a byte budget that counts whole slabs and is never exceeded. A piece no slab has room
// for gets a new slab; when that would pass the budget, empty slabs are given back first.
//
//   HostPool    page-aligned slabs (huge pages requested), pinned with cudaHostRegister when a GPU
//               is usable, else mlock'ed where the memlock limit allows, else plain memory (one
//               warning); bound to a NUMA node on request; each slab registered once with the
//               I/O engine so swaps into it use fixed buffers.
//   DevicePool  cudaMalloc slabs, or host slabs standing in for them (simulated device tier).
//
// Not thread-safe: the tier manager calls them under its lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tierswap/aligned_buffer.hpp"
#include "tierswap/extent_allocator.hpp"

namespace tierswap {
class IoEngine;
}

namespace tierswap::detail {

class SlabPool {
 public:
  struct Slab {
    std::byte* base = nullptr;
    std::uint64_t bytes = 0;
    std::unique_ptr<ExtentAllocator> alloc;
    AlignedBuffer host;      // host-memory slabs
    void* device = nullptr;  // cudaMalloc slabs
    int engine_handle = -1;  // I/O engine registration
    bool cuda_registered = false;
    bool mlocked = false;
    bool shared = false;     // carved from the memory shared with the node service
    bool carved = false;     // a range of one of HostPool's huge-page chunks
    std::uint64_t used = 0;  // bytes of pieces handed out from it
  };
  virtual ~SlabPool() = default;
  /// A piece of `bytes` (rounded up to 4 KiB), or nullptr when the budget cannot hold it now.
  std::byte* try_allocate(std::uint64_t bytes);
  /// Returns a piece from try_allocate().
  void free(std::byte* p) noexcept;
  std::uint64_t budget() const noexcept { return budget_; }
  std::uint64_t reserved() const noexcept { return reserved_; }   ///< slab bytes
  std::uint64_t used() const noexcept { return used_; }           ///< bytes handed out
  std::uint64_t peak_reserved() const noexcept { return peak_; }  ///< most slab bytes ever
  /// Whether a piece of `bytes` could ever fit (a slab of that size fits the budget).
  bool could_fit(std::uint64_t bytes) const noexcept;
  std::size_t slab_count() const noexcept { return slabs_.size(); }

 protected:
  SlabPool(std::uint64_t budget, std::uint64_t slab_size);
  virtual void make_slab(Slab& s, std::uint64_t bytes) = 0;  // fills base
  virtual void drop_slab(Slab& s) noexcept = 0;
  void release_all() noexcept;

 private:
  /// Whether a new slab of `size` fits the budget, after giving back empty slabs if that makes
  /// it fit (none is given back otherwise).
  bool make_room(std::uint64_t size);
  std::byte* hand_out(Slab& s, const Extent& e);

  std::uint64_t budget_;
  std::uint64_t slab_size_;
  std::uint64_t reserved_ = 0;
  std::uint64_t peak_ = 0;
  std::uint64_t used_ = 0;
  std::vector<std::unique_ptr<Slab>> slabs_;
  std::map<std::byte*, std::pair<Slab*, std::uint64_t>> pieces_;  // piece -> (slab, length)
};

class HostPool final : public SlabPool {
 public:
  /// `engine` may be null. With `register_buffers`, slabs are registered with it (fixed
  /// buffers). When its memory is shared with the node service, slabs are carved from that
  /// memory (the service pins it) and a slab that does not fit throws std::system_error(ENOMEM).
  /// numa_node -1: no binding.
  HostPool(std::uint64_t budget, std::uint64_t slab_size, bool lock, int numa_node,
           IoEngine* engine, bool register_buffers = true);
  ~HostPool() override;
  /// "service-shared" (through the node service), "cuda-registered", "mlocked", "pageable" (the
  /// weakest of the slabs so far; "pinned" ones before any slab exists report what the
  /// configuration asks for).
  std::string memory_kind() const;

 private:
  void make_slab(Slab& s, std::uint64_t bytes) override;
  void drop_slab(Slab& s) noexcept override;
  std::byte* carve(std::uint64_t bytes);
  void uncarve(const Slab& s) noexcept;
  // Slabs are carved from chunks of whole 2 MiB pages (transparent huge pages: see carve()),
  // and a slab given back returns its range to its chunk; a slab owns its memory only when huge
  // pages are off or no chunk could be had.
  struct Chunk {
    AlignedBuffer mem;
    std::unique_ptr<ExtentAllocator> ranges;
  };
  std::vector<Chunk> chunks_;
  bool lock_;
  int numa_node_;
  IoEngine* engine_;
  bool register_;
  bool warned_ = false;
  bool any_pageable_ = false, any_mlocked_ = false, any_cuda_ = false, any_shared_ = false;
};

class DevicePool final : public SlabPool {
 public:
  /// simulated: host slabs; else cudaMalloc (a GPU must be usable).
  DevicePool(std::uint64_t budget, std::uint64_t slab_size, bool simulated);
  ~DevicePool() override;
  bool simulated() const noexcept { return simulated_; }

 private:
  void make_slab(Slab& s, std::uint64_t bytes) override;
  void drop_slab(Slab& s) noexcept override;
  bool simulated_;
};

}  // namespace tierswap::detail
