#include "tierswap/checksum.hpp"

#include <xxhash.h>

namespace tierswap {

std::uint64_t checksum64(const void* data, std::size_t n) noexcept {
  return XXH3_64bits(data, n);
}

}  // namespace tierswap
