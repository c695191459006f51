// Checksums for on-disk structures (XXH3-64).
#pragma once

#include <cstddef>
#include <cstdint>

namespace tierswap {

/// XXH3 64-bit hash of `n` bytes. Stable across releases: it is stored on disk.
std::uint64_t checksum64(const void* data, std::size_t n) noexcept;

}  // namespace tierswap
