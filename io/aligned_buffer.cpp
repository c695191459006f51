#include "tierswap/aligned_buffer.hpp"

#include <fmt/format.h>
#include <sys/mman.h>

#include <cstdlib>
#include <new>
#include <stdexcept>
#include <string_view>
#include <utility>

#include "tierswap/process_config.hpp"
#include "tierswap/units.hpp"

namespace tierswap {
void* allocate_aligned(std::size_t bytes, std::size_t alignment, std::size_t* rounded) {
  if (alignment < sizeof(void*) || (alignment & (alignment - 1)) != 0)
    throw std::invalid_argument(fmt::format(
        "aligned allocation: alignment {} is not a power of two >= the pointer size", alignment));
  const std::size_t n = round_up(bytes == 0 ? alignment : bytes, alignment);
  // Large buffers start on a 2 MiB boundary and ask for transparent huge pages (best effort;
  // THP is often "madvise" only): streaming kernels over them then miss the TLB 512x less.
  const bool huge = n >= kHugePageBytes && ProcessConfig::current().huge_pages;
  void* p = nullptr;
  if (::posix_memalign(&p, huge && alignment < kHugePageBytes ? kHugePageBytes : alignment, n) != 0)
    throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  if (huge) (void)::madvise(p, n & ~(kHugePageBytes - 1), MADV_HUGEPAGE);
#endif
  if (rounded != nullptr) *rounded = n;
  return p;
}

AlignedBuffer::AlignedBuffer(std::size_t bytes, std::size_t alignment, bool lock) {
  data_ = static_cast<std::byte*>(allocate_aligned(bytes, alignment, &size_));
  if (lock) locked_ = ::mlock(data_, size_) == 0;
}

AlignedBuffer::~AlignedBuffer() {
  reset();
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      locked_(std::exchange(o.locked_, false)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    locked_ = std::exchange(o.locked_, false);
  }
  return *this;
}

void AlignedBuffer::reset() noexcept {
  if (data_ == nullptr) return;
  if (locked_) ::munlock(data_, size_);
  std::free(data_);
  data_ = nullptr;
  size_ = 0;
  locked_ = false;
}

}  // namespace tierswap
