#include "tierswap/checksum.hpp"

#include <fmt/format.h>
#include <xxhash.h>

namespace tierswap {

std::uint64_t checksum64(const void* data, std::size_t n) noexcept {
  return XXH3_64bits(data, n);
}

std::string checksum_hex(std::uint64_t sum) {
  return fmt::format("{:016x}", sum);
}

}  // namespace tierswap
