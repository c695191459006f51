// Placement inputs: a hardware profile (`tierswap probe`'s JSON, or a user's) and a plan
// (`tierswap plan --out`, possibly edited); the first byte picks which.
#include <cstdint>
#include <exception>

#include "fuzz_util.hpp"
#include "tierswap/placement.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t n) {
  using namespace tierswap;
  const auto [which, text] = fuzz::split(data, n);
  try {
    if (which % 2 == 0)
      (void)HardwareProfile::from_json(text);
    else
      (void)Plan::from_json(text);
  } catch (const std::exception&) {
  }
  return 0;
}
