// AlignedBuffer: a move-only owner of page-aligned host memory, optionally mlock'ed.
// The pinned pool of the tier manager builds on it; the I/O engine uses it for bounce buffers.
#pragma once

#include <cstddef>
#include <cstdlib>

namespace tierswap {

/// A transparent huge page on x86-64 and aarch64 (4 KiB base pages): buffers of at least this
/// much, aligned to it, ask for huge pages (see AlignedBuffer).
inline constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

/// Allocates `bytes` rounded up to `alignment` (a power of two, >= sizeof(void*)); buffers of
/// at least kHugePageBytes start on a 2 MiB boundary and ask for transparent huge pages (best
/// effort). Free with std::free. Throws std::bad_alloc, std::invalid_argument (alignment).
/// *rounded: the bytes allocated.
void* allocate_aligned(std::size_t bytes, std::size_t alignment, std::size_t* rounded = nullptr);

/// An allocator for large flat arrays a kernel streams through (a group's 16-bit parameters):
/// allocate_aligned()'s memory, so they are on huge pages as the optimizer state is.
template <class T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() noexcept = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}  // NOLINT: rebinding is implicit
  T* allocate(std::size_t n) {
    return static_cast<T*>(allocate_aligned(n * sizeof(T), alignof(T) < 64 ? 64 : alignof(T)));
  }
  void deallocate(T* p, std::size_t) noexcept { std::free(p); }
  friend bool operator==(const HugePageAllocator&, const HugePageAllocator&) noexcept {
    return true;
  }
};

class AlignedBuffer {
 public:
  AlignedBuffer() noexcept = default;
  /// Allocates `bytes` (rounded up to `alignment`) aligned to `alignment` (a power of two,
  /// >= sizeof(void*)). When `lock` is set, tries mlock(2); locked() tells whether it worked.
  /// Throws std::bad_alloc on failure, std::invalid_argument for a bad alignment.
  explicit AlignedBuffer(std::size_t bytes, std::size_t alignment = 4096, bool lock = false);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  bool locked() const noexcept { return locked_; }
  explicit operator bool() const noexcept { return data_ != nullptr; }

 private:
  void reset() noexcept;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  bool locked_ = false;
};

}  // namespace tierswap
