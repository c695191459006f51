// AlignedBuffer: a move-only owner of page-aligned host memory, optionally mlock'ed.
// The pinned pool of the tier manager builds on it; the I/O engine uses it for bounce buffers.
#pragma once

#include <cstddef>

namespace tierswap {

/// A transparent huge page on x86-64 and aarch64 (4 KiB base pages): buffers of at least this
/// much, aligned to it, ask for huge pages (see AlignedBuffer).
inline constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

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
