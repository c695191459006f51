// Google Benchmark: each CPU kernel per instruction set, on 4M parameters, one thread.
// Bytes/s use the bytes each kernel must move per parameter (reads + writes):
// AdamW bf16 28, Lion bf16 20, statistics 2, bf16->f32 cast 6, f32->bf16 cast 6, triad 12.
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "tierswap/aligned_buffer.hpp"
#include "tierswap/kernels.hpp"

using namespace tierswap;

namespace {

constexpr std::size_t kN = 4u << 20;

struct Buffers {
  AlignedBuffer p{kN * 4}, m{kN * 4}, v{kN * 4}, g32{kN * 4}, g16{kN * 2}, p16{kN * 2};
  Buffers() {
    auto* pf = reinterpret_cast<float*>(p.data());
    auto* g = reinterpret_cast<std::uint16_t*>(g16.data());
    for (std::size_t i = 0; i < kN; ++i) {
      pf[i] = 0.001f * static_cast<float>(i % 1000);
      g[i] = float_to_bf16(0.01f * static_cast<float>(i % 7));
    }
    std::memset(m.data(), 0, m.size());
    std::memset(v.data(), 0, v.size());
    std::memset(g32.data(), 0, g32.size());
  }
  float* f(AlignedBuffer& b) { return reinterpret_cast<float*>(b.data()); }
};

Buffers& buffers() {
  static Buffers b;
  return b;
}

bool skip_unsupported(benchmark::State& state, CpuIsa isa) {
  if (cpu_isa_supported(isa)) return false;
  state.SkipWithError("ISA not supported on this CPU or build");
  return true;
}

void BM_AdamwFusedBf16(benchmark::State& state, CpuIsa isa) {
  if (skip_unsupported(state, isa)) return;
  auto& b = buffers();
  AdamConfig c;
  c.weight_decay = 0.01;
  std::int64_t step = 0;
  for (auto _ : state)
    adam_step(c, ++step, {b.f(b.p), b.f(b.m), b.f(b.v), nullptr, Dtype::f32},
              {b.g16.data(), Dtype::bf16, 1.0f}, {b.p16.data(), Dtype::bf16}, kN, {isa});
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kN * 28));
}

void BM_LionFusedBf16(benchmark::State& state, CpuIsa isa) {
  if (skip_unsupported(state, isa)) return;
  auto& b = buffers();
  LionConfig c;
  for (auto _ : state)
    lion_step(c, b.f(b.p), b.f(b.m), Dtype::f32, {b.g16.data(), Dtype::bf16, 1.0f},
              {b.p16.data(), Dtype::bf16}, kN, {isa});
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kN * 20));
}

void BM_GradStatsBf16(benchmark::State& state, CpuIsa isa) {
  if (skip_unsupported(state, isa)) return;
  auto& b = buffers();
  for (auto _ : state) benchmark::DoNotOptimize(grad_stats(b.g16.data(), Dtype::bf16, kN, {isa}));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kN * 2));
}

void BM_CastBf16ToF32(benchmark::State& state, CpuIsa isa) {
  if (skip_unsupported(state, isa)) return;
  auto& b = buffers();
  for (auto _ : state) cast(b.g16.data(), Dtype::bf16, b.g32.data(), Dtype::f32, kN, {isa});
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kN * 6));
}

void BM_CastF32ToBf16(benchmark::State& state, CpuIsa isa) {
  if (skip_unsupported(state, isa)) return;
  auto& b = buffers();
  for (auto _ : state) cast(b.p.data(), Dtype::f32, b.p16.data(), Dtype::bf16, kN, {isa});
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kN * 6));
}

void BM_StreamTriad(benchmark::State& state, CpuIsa isa) {
  if (skip_unsupported(state, isa)) return;
  auto& b = buffers();
  for (auto _ : state) stream_triad(b.f(b.g32), b.f(b.m), b.f(b.v), 0.5f, kN, {isa});
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kN * 12));
}

}  // namespace

#define TIERSWAP_PER_ISA(fn)                                    \
  BENCHMARK_CAPTURE(fn, scalar, CpuIsa::scalar)->UseRealTime(); \
  BENCHMARK_CAPTURE(fn, avx2, CpuIsa::avx2)->UseRealTime();     \
  BENCHMARK_CAPTURE(fn, avx512, CpuIsa::avx512)->UseRealTime();

TIERSWAP_PER_ISA(BM_AdamwFusedBf16)
TIERSWAP_PER_ISA(BM_LionFusedBf16)
TIERSWAP_PER_ISA(BM_GradStatsBf16)
BENCHMARK_CAPTURE(BM_GradStatsBf16, avx512bf16, CpuIsa::avx512bf16)->UseRealTime();
TIERSWAP_PER_ISA(BM_CastBf16ToF32)
TIERSWAP_PER_ISA(BM_CastF32ToBf16)
TIERSWAP_PER_ISA(BM_StreamTriad)

BENCHMARK_MAIN();
