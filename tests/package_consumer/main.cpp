// A trainer-like consumer of the installed package: every public header, one round trip.
#include <tierswap/aligned_buffer.hpp>
#include <tierswap/checksum.hpp>
#include <tierswap/device.hpp>
#include <tierswap/error.hpp>
#include <tierswap/extent_allocator.hpp>
#include <tierswap/io_engine.hpp>
#include <tierswap/log.hpp>
#include <tierswap/swap_space.hpp>
#include <tierswap/units.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

int main() {
  char tmpl[] = "/var/tmp/tierswap-consumer-XXXXXX";
  if (!mkdtemp(tmpl)) return 1;
  int rc = 1;
  {
    tierswap::SwapSpaceConfig c;
    c.dirs = {tmpl};
    c.capacity = tierswap::parse_size("4MiB");
    auto space = tierswap::SwapSpace::create(c);
    tierswap::IoEngine engine(space);
    tierswap::AlignedBuffer a(1 << 20), b(1 << 20);
    std::memset(a.data(), 0x5a, a.size());
    engine.write(0, a.data(), a.size()).wait();
    engine.read(0, b.data(), b.size()).wait();
    if (std::memcmp(a.data(), b.data(), a.size()) == 0) {
      std::printf("consumer ok (%s)\n", engine.backend_description().c_str());
      rc = 0;
    }
    space.remove_files();
  }
  std::filesystem::remove_all(tmpl);
  return rc;
}
