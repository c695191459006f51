// The swap file's header (magic, version, geometry, uuid, checksum) as SwapSpace::open reads it
// from disk: the input is the whole file.
#include <cstdint>
#include <exception>

#include "fuzz_util.hpp"
#include "tierswap/swap_space.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t n) {
  using namespace tierswap;
  const auto dir = fuzz::scratch() / "swap";
  std::filesystem::create_directories(dir);
  fuzz::write_file(dir / SwapSpace::kFileName,
                   std::string_view(reinterpret_cast<const char*>(data), n));
  try {
    SwapSpace s = SwapSpace::open({dir}, DirectIo::off);
    if (s.capacity() > 0) (void)s.map(s.capacity() - 1, 4096);
  } catch (const std::exception&) {
  }
  return 0;
}
