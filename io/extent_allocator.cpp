#include "tierswap/extent_allocator.hpp"

#include <cerrno>
#include <stdexcept>
#include <system_error>

#include "tierswap/units.hpp"

#include <fmt/format.h>

namespace tierswap {

ExtentAllocator::ExtentAllocator(std::uint64_t capacity, std::uint64_t alignment)
    : capacity_(round_down(capacity, alignment == 0 ? 1 : alignment)), alignment_(alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0)
    throw std::invalid_argument(
        fmt::format("ExtentAllocator: alignment={} must be a power of two", alignment));
  if (capacity_ > 0) insert_free(0, capacity_);
}

void ExtentAllocator::insert_free(std::uint64_t offset, std::uint64_t length) {
  free_by_offset_.emplace(offset, length);
  free_by_size_.emplace(length, offset);
}

void ExtentAllocator::erase_free(std::map<std::uint64_t, std::uint64_t>::iterator it) {
  auto [lo, hi] = free_by_size_.equal_range(it->second);
  for (auto s = lo; s != hi; ++s) {
    if (s->second == it->first) {
      free_by_size_.erase(s);
      break;
    }
  }
  free_by_offset_.erase(it);
}

std::optional<Extent> ExtentAllocator::try_allocate(std::uint64_t bytes) {
  if (bytes == 0) throw std::invalid_argument("ExtentAllocator::allocate: bytes=0");
  if (bytes > capacity_) return std::nullopt;
  const std::uint64_t len = round_up(bytes, alignment_);
  std::lock_guard lock(mu_);
  // Best fit: the smallest free extent that holds the request; ties go to the lowest offset
  // (multimap keeps insertion order among equal keys, so prefer scanning equal sizes).
  auto s = free_by_size_.lower_bound(len);
  if (s == free_by_size_.end()) return std::nullopt;
  const std::uint64_t off = s->second;
  const std::uint64_t flen = s->first;
  erase_free(free_by_offset_.find(off));
  if (flen > len) insert_free(off + len, flen - len);
  used_by_offset_.emplace(off, len);
  used_ += len;
  return Extent{off, len};
}

Extent ExtentAllocator::allocate(std::uint64_t bytes) {
  if (auto e = try_allocate(bytes)) return *e;
  ExtentStats st = stats();
  throw std::system_error(
      ENOSPC, std::system_category(),
      fmt::format(
          "swap space full: asked {} ({} B), free {} in {} fragments, largest free extent {}",
          format_bytes(bytes), bytes, format_bytes(st.free), st.free_fragments,
          format_bytes(st.largest_free)));
}

void ExtentAllocator::free(const Extent& e) {
  std::lock_guard lock(mu_);
  auto u = used_by_offset_.find(e.offset);
  if (u == used_by_offset_.end() || u->second != e.length)
    throw std::invalid_argument(fmt::format(
        "ExtentAllocator::free: extent @{}+{} is not allocated (double free or foreign extent)",
        e.offset, e.length));
  used_by_offset_.erase(u);
  used_ -= e.length;
  std::uint64_t off = e.offset, len = e.length;
  auto next = free_by_offset_.lower_bound(off);
  if (next != free_by_offset_.end() && next->first == off + len) {
    len += next->second;
    auto n = next++;
    erase_free(n);
  }
  if (next != free_by_offset_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      off = prev->first;
      len += prev->second;
      erase_free(prev);
    }
  }
  insert_free(off, len);
}

void ExtentAllocator::reserve(const Extent& e) {
  if (e.length == 0 || e.offset % alignment_ != 0 || e.length % alignment_ != 0)
    throw std::invalid_argument(
        fmt::format("ExtentAllocator::reserve: extent @{}+{} is not aligned to {}", e.offset,
                    e.length, alignment_));
  std::lock_guard lock(mu_);
  auto it = free_by_offset_.upper_bound(e.offset);
  if (it == free_by_offset_.begin())
    throw std::invalid_argument(
        fmt::format("ExtentAllocator::reserve: extent @{}+{} is not free", e.offset, e.length));
  --it;
  const std::uint64_t foff = it->first, flen = it->second;
  if (e.offset + e.length > foff + flen)
    throw std::invalid_argument(
        fmt::format("ExtentAllocator::reserve: extent @{}+{} is not free", e.offset, e.length));
  erase_free(it);
  if (e.offset > foff) insert_free(foff, e.offset - foff);
  if (foff + flen > e.offset + e.length)
    insert_free(e.offset + e.length, foff + flen - e.offset - e.length);
  used_by_offset_.emplace(e.offset, e.length);
  used_ += e.length;
}

ExtentStats ExtentAllocator::stats() const {
  std::lock_guard lock(mu_);
  ExtentStats st;
  st.capacity = capacity_;
  st.used = used_;
  st.free = capacity_ - used_;
  st.free_fragments = free_by_offset_.size();
  st.largest_free = free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
  return st;
}

}  // namespace tierswap
