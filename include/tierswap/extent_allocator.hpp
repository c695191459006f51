// ExtentAllocator: hands out aligned extents of a SwapSpace's logical range.
//
// Best fit over a size-ordered free list with coalescing on free, so long-lived mixes of block
// sizes do not fragment the space. Thread-safe (one mutex); O(log n) per call.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>

namespace tierswap {

struct Extent {
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  friend bool operator==(const Extent&, const Extent&) = default;
};

struct ExtentStats {
  std::uint64_t capacity = 0;
  std::uint64_t used = 0;
  std::uint64_t free = 0;
  std::uint64_t largest_free = 0;
  std::uint64_t free_fragments = 0;
};

class ExtentAllocator {
 public:
  /// `capacity` bytes starting at 0, every extent aligned to `alignment` (a power of two) and of a
  /// length rounded up to it. Throws std::invalid_argument on a bad alignment.
  ExtentAllocator(std::uint64_t capacity, std::uint64_t alignment);

  /// Allocates `bytes` (> 0). Throws std::system_error(ENOSPC) whose message names the request,
  /// the free bytes and the largest free extent when nothing fits.
  Extent allocate(std::uint64_t bytes);
  /// As allocate(), but returns nullopt when nothing fits.
  std::optional<Extent> try_allocate(std::uint64_t bytes);
  /// Returns an extent. Throws std::invalid_argument on a double free, an extent that was not
  /// allocated, or one outside the space (nothing is changed then).
  void free(const Extent& extent);
  /// Marks a specific extent used (rebuilding state from a manifest). Throws
  /// std::invalid_argument if any part of it is not free.
  void reserve(const Extent& extent);

  ExtentStats stats() const;
  std::uint64_t alignment() const noexcept { return alignment_; }

 private:
  void insert_free(std::uint64_t offset, std::uint64_t length);
  void erase_free(std::map<std::uint64_t, std::uint64_t>::iterator it);

  mutable std::mutex mu_;
  std::uint64_t capacity_;
  std::uint64_t alignment_;
  std::uint64_t used_ = 0;
  std::map<std::uint64_t, std::uint64_t> free_by_offset_;     // offset -> length
  std::multimap<std::uint64_t, std::uint64_t> free_by_size_;  // length -> offset
  std::map<std::uint64_t, std::uint64_t> used_by_offset_;     // offset -> length
};

}  // namespace tierswap
