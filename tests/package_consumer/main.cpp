// A trainer-like consumer of the installed package: every public header (each must compile from
// the installed tree; package_config.cmake checks that none is missing here), an engine round
// trip, and one optimizer step through the one-object setup.
#include <tierswap/aligned_buffer.hpp>
#include <tierswap/checksum.hpp>
#include <tierswap/communicator.hpp>
#include <tierswap/cuda_kernels.hpp>
#include <tierswap/cuda_runtime.hpp>
#include <tierswap/device.hpp>
#include <tierswap/error.hpp>
#include <tierswap/extent_allocator.hpp>
#include <tierswap/io_engine.hpp>
#include <tierswap/kernels.hpp>
#include <tierswap/log.hpp>
#include <tierswap/metrics.hpp>
#include <tierswap/optimizer.hpp>
#include <tierswap/placement.hpp>
#include <tierswap/process_config.hpp>
#include <tierswap/service.hpp>
#include <tierswap/setting.hpp>
#include <tierswap/signal_cleanup.hpp>
#include <tierswap/swap_space.hpp>
#include <tierswap/telemetry.hpp>
#include <tierswap/thread_pool.hpp>
#include <tierswap/tier_manager.hpp>
#include <tierswap/tiered_optimizer.hpp>
#include <tierswap/types.hpp>
#include <tierswap/units.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

namespace {

bool engine_round_trip(const char* dir, std::string* backend) {
  tierswap::SwapSpaceConfig c;
  c.dirs = {dir};
  c.capacity = tierswap::parse_size("4MiB");
  auto space = tierswap::SwapSpace::create(c);
  tierswap::IoEngine engine(space);
  tierswap::AlignedBuffer a(1 << 20), b(1 << 20);
  std::memset(a.data(), 0x5a, a.size());
  engine.write(0, a.data(), a.size()).wait();
  engine.read(0, b.data(), b.size()).wait();
  *backend = engine.backend_description();
  const bool same = std::memcmp(a.data(), b.data(), a.size()) == 0;
  space.remove_files();
  return same;
}

// One AdamW step of a 4096-element parameter: its bf16 values change.
bool one_step(const char* dir) {
  tierswap::TieredOptions o;
  o.swap_dirs = {dir};
  o.host_budget = tierswap::parse_size("8MiB");
  o.communicator = "single";
  o.tiers.telemetry = false;
  tierswap::TieredOptimizer t(o);
  const int g = t.add_group(tierswap::GroupConfig::defaults(tierswap::OptimizerKind::adamw));
  const auto w = t.add_param(g, {"w", {64, 64}, tierswap::Dtype::bf16});
  t.finalize();
  auto& opt = t.optimizer();
  opt.initialize([](tierswap::ParamId, std::uint64_t, float* out, std::uint64_t n) {
    for (std::uint64_t i = 0; i < n; ++i) out[i] = 0.5f;
  });
  const auto before = opt.param16(w)[0];
  std::vector<std::uint16_t> grad(4096, tierswap::float_to_bf16(1.0f));
  opt.begin_backward();
  opt.add_grad(w, grad.data(), tierswap::Dtype::bf16);
  opt.end_backward();
  opt.step();
  return opt.param16(w)[0] != before;
}

}  // namespace

int main() {
  char tmpl[] = "/var/tmp/tierswap-consumer-XXXXXX";
  if (!mkdtemp(tmpl)) return 1;
  int rc = 1;
  try {
    std::string backend;
    if (engine_round_trip(tmpl, &backend) && one_step(tmpl)) {
      std::printf("consumer ok (%s)\n", backend.c_str());
      rc = 0;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
  }
  std::filesystem::remove_all(tmpl);
  return rc;
}
