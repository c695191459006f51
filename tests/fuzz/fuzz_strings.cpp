// Size strings and the other textual values read from configs, the environment and the CLI:
// sizes ("8GiB"), parameter counts ("256M"), dtypes, block classes, optimizer kinds, backends;
// and any text as a JSON string literal (detail::json_quoted, which must write what nlohmann
// writes, or refuse what it refuses).
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <nlohmann/json.hpp>
#include <string>

#include "tierswap/detail/json.hpp"
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
  std::string quoted, reference;
  guard([&] { quoted = detail::json_quoted(s); });
  guard([&] { reference = nlohmann::json(s).dump(); });
  if (quoted != reference) std::abort();  // empty both when the text is not UTF-8
  return 0;
}
