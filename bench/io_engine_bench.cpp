// Google Benchmark: the engine's per-request overhead, per backend.
//
// What it measures: one ticket of N requests of a given size against a small buffered
// (page-cache resident) swap file, so the disk is out of the picture and the time is the engine's
// splitting, submission, completion path and wake-ups plus the backend's syscalls. Bytes/s are
// reported with SetBytesProcessed; divide the request count by the time for requests/s.
#include <benchmark/benchmark.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <memory>

#include "tierswap/aligned_buffer.hpp"
#include "tierswap/io_engine.hpp"
#include "tierswap/swap_space.hpp"
#include "tierswap/units.hpp"

using namespace tierswap;

namespace {

struct Fixture {
  std::filesystem::path dir;
  std::unique_ptr<SwapSpace> space;
  Fixture() {
    char tmpl[] = "/var/tmp/tierswap-bench-XXXXXX";
    if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp");
    dir = tmpl;
    SwapSpaceConfig c;
    c.dirs = {dir};
    c.capacity = 64 * MiB;
    c.direct = DirectIo::off;
    space = std::make_unique<SwapSpace>(SwapSpace::create(c));
  }
  ~Fixture() {
    space->remove_files();
    std::filesystem::remove_all(dir);
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

void BM_EngineRequests(benchmark::State& state, IoBackendKind kind, IoOp op) {
  const std::uint64_t req = static_cast<std::uint64_t>(state.range(0));
  const std::uint64_t total = 16 * MiB;
  IoEngineConfig c;
  c.backend = kind;
  c.queue_depth = 32;
  c.block_size = std::max<std::uint64_t>(req, 4096);
  std::unique_ptr<IoEngine> e;
  try {
    e = std::make_unique<IoEngine>(*fixture().space, c);
  } catch (const std::exception& x) {
    state.SkipWithError(x.what());
    return;
  }
  AlignedBuffer buf(total);
  std::memset(buf.data(), 1, buf.size());
  e->write(0, buf.data(), total).wait();
  for (auto _ : state) {
    auto t = op == IoOp::read ? e->read(0, buf.data(), total) : e->write(0, buf.data(), total);
    t.wait();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * total));
  state.counters["requests/s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * (total / req)), benchmark::Counter::kIsRate);
}

}  // namespace

BENCHMARK_CAPTURE(BM_EngineRequests, uring_read, IoBackendKind::uring, IoOp::read)
    ->Arg(4096)
    ->Arg(64 * 1024)
    ->Arg(1 << 20)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_EngineRequests, aio_read, IoBackendKind::aio, IoOp::read)
    ->Arg(4096)
    ->Arg(64 * 1024)
    ->Arg(1 << 20)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_EngineRequests, posix_read, IoBackendKind::posix, IoOp::read)
    ->Arg(4096)
    ->Arg(64 * 1024)
    ->Arg(1 << 20)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_EngineRequests, uring_write, IoBackendKind::uring, IoOp::write)
    ->Arg(4096)
    ->Arg(1 << 20)
    ->UseRealTime();

BENCHMARK_MAIN();
