// What a peer sends: the telemetry answer of a live tierswap process (a residency snapshot as
// JSON, read from its socket by `tierswap residency PID`), printed as tables.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>

#include "tools/commands.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t n) {
  static std::FILE* sink = std::fopen("/dev/null", "w");
  try {
    tierswap::cli::print_residency(std::string(reinterpret_cast<const char*>(data), n), sink);
  } catch (const std::exception&) {
  }
  return 0;
}
