// The tier manifest. Selector even: the input is the whole file (container: magic, version,
// checksums) for read_manifest. Odd: the input is the payload (the block table as JSON) wrapped
// in a valid container, opened by a TierManager over a real swap space with its checksums
// verified, as `tierswap residency --swap-dir` does, then snapshotted: every field read from
// disk is checked before use. In the payload, fuzz::kUuidToken stands for this space's uuid.
#include <cstdint>
#include <exception>
#include <memory>

#include "fuzz_util.hpp"
#include "tierswap/detail/manifest.hpp"
#include "tierswap/io_engine.hpp"
#include "tierswap/swap_space.hpp"
#include "tierswap/tier_manager.hpp"

using namespace tierswap;

namespace {

struct Space {
  std::filesystem::path dir = fuzz::scratch() / "space";
  std::unique_ptr<SwapSpace> space;
  std::unique_ptr<IoEngine> engine;
  Space() {
    std::filesystem::create_directories(dir);
    SwapSpaceConfig sc;
    sc.dirs = {dir};
    sc.capacity = 8ull << 20;
    sc.direct = DirectIo::off;
    space = std::make_unique<SwapSpace>(SwapSpace::create(sc));
    IoEngineConfig ec;
    ec.backend = IoBackendKind::posix;
    engine = std::make_unique<IoEngine>(*space, ec);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t n) {
  static Space s;
  const auto [which, bytes] = fuzz::split(data, n);
  const auto path = s.dir / detail::kManifestName;
  try {
    if (which % 2 == 0) {
      fuzz::write_file(path, bytes);
      (void)read_manifest(path);
    } else {
      detail::write_manifest_file(path, fuzz::with_uuid(bytes, s.space->uuid()), false);
      TierConfig cfg;
      cfg.telemetry = false;
      cfg.lock_host_memory = false;
      cfg.device_mode = DeviceTierMode::off;
      cfg.host_budget = 16ull << 20;
      TierManager m(*s.space, *s.engine, cfg);
      (void)m.snapshot().to_json();
    }
  } catch (const std::exception&) {
  }
  std::error_code ec;
  std::filesystem::remove(path, ec);
  return 0;
}
