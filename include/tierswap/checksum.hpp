// Checksums for on-disk structures (XXH3-64).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tierswap {

/// XXH3 64-bit hash of `n` bytes. Stable across releases: it is stored on disk.
std::uint64_t checksum64(const void* data, std::size_t n) noexcept;
/// A checksum as the manifests store it: 16 lowercase hex digits.
std::string checksum_hex(std::uint64_t sum);

}  // namespace tierswap
