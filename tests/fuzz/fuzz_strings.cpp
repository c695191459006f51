// Size strings and the other textual values read from configs, the environment and the CLI:
// sizes ("8GiB"), parameter counts ("256M"), dtypes, block classes, optimizer kinds, backends.
#include <cstdint>
#include <exception>
#include <string>

#include "tierswap/io_engine.hpp"
#include "tierswap/placement.hpp"
#include "tierswap/tier_manager.hpp"
#include "tierswap/types.hpp"
#include "tierswap/units.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t n) {
  const std::string s(reinterpret_cast<const char*>(data), n);
  using namespace tierswap;
  auto guard = [](auto&& f) {
    try {
      f();
    } catch (const std::exception&) {
    }
  };
  guard([&] { (void)format_bytes(parse_size(s)); });
  guard([&] { (void)parse_param_count(s); });
  guard([&] { (void)parse_dtype(s); });
  guard([&] { (void)parse_block_class(s); });
  guard([&] { (void)parse_optimizer_kind(s); });
  guard([&] { (void)parse_backend(s); });
  return 0;
}
