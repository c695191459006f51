// The JSON configs a user hands over: optimizer, tier manager, swap space, I/O engine, node
// service (the first byte picks which), each checked field by field.
#include <cstdint>
#include <exception>
#include <string>

#include "fuzz_util.hpp"
#include "tierswap/io_engine.hpp"
#include "tierswap/optimizer.hpp"
#include "tierswap/swap_space.hpp"
#include "tierswap/tier_manager.hpp"
#include "tierswap/tiered_optimizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t n) {
  using namespace tierswap;
  const auto [which, text] = fuzz::split(data, n);
  try {
    switch (which % 5) {
      case 0:
        OptimizerConfig::from_json(text).validate();
        break;
      case 1:
        TierConfig::from_json(text).validate();
        break;
      case 2:
        (void)SwapSpaceConfig::from_json(text);
        break;
      case 3:
        (void)IoEngineConfig::from_json(text);
        break;
      default:
        (void)NodeServiceConfig::from_json(text);
        break;
    }
  } catch (const std::exception&) {
  }
  return 0;
}
