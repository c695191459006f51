// Public kernel entry points: validation, per-step constants, ISA choice, thread split.
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/convert.hpp"
#include "kernels/cpu/kernel_table.hpp"
#include "tierswap/error.hpp"
#include "tierswap/kernels.hpp"
#include "tierswap/process_config.hpp"
#include "tierswap/thread_pool.hpp"

namespace tierswap {

using kernels::KernelTable;

std::string_view to_string(Dtype d) noexcept {
  switch (d) {
    case Dtype::f32:
      return "f32";
    case Dtype::bf16:
      return "bf16";
    case Dtype::f16:
      return "f16";
  }
  return "?";
}

Dtype parse_dtype(std::string_view s) {
  if (s == "f32" || s == "fp32" || s == "float32") return Dtype::f32;
  if (s == "bf16" || s == "bfloat16") return Dtype::bf16;
  if (s == "f16" || s == "fp16" || s == "float16") return Dtype::f16;
  throw_invalid("dtype", s, "expected f32, bf16 or f16");
}

std::string_view to_string(CpuIsa isa) noexcept {
  switch (isa) {
    case CpuIsa::scalar:
      return "scalar";
    case CpuIsa::avx2:
      return "avx2";
    case CpuIsa::avx512:
      return "avx512";
    case CpuIsa::avx512bf16:
      return "avx512bf16";
    case CpuIsa::neon:
      return "neon";
    case CpuIsa::sve:
      return "sve";
  }
  return "?";
}

CpuIsa parse_isa(std::string_view s) {
  if (s == "scalar") return CpuIsa::scalar;
  if (s == "avx2") return CpuIsa::avx2;
  if (s == "avx512") return CpuIsa::avx512;
  if (s == "avx512bf16") return CpuIsa::avx512bf16;
  if (s == "neon") return CpuIsa::neon;
  if (s == "sve") return CpuIsa::sve;
  throw_invalid("isa", s, "expected scalar, avx2, avx512, avx512bf16, neon or sve");
}

namespace {
const KernelTable* table_of(CpuIsa isa) noexcept {
  switch (isa) {
    case CpuIsa::scalar:
      return &kernels::scalar_table();
    case CpuIsa::avx2:
      return kernels::avx2_table();
    case CpuIsa::avx512:
      return kernels::avx512_table();
    case CpuIsa::avx512bf16:
      return kernels::avx512bf16_table();
    case CpuIsa::neon:
      return kernels::neon_table();
    case CpuIsa::sve:
      return kernels::sve_table();
  }
  return nullptr;
}

#if defined(__x86_64__)
// F16C from CPUID leaf 1 (ECX bit 29): __builtin_cpu_supports("f16c") is GCC's, not clang 14's.
bool has_f16c() noexcept {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}
#endif

// What the CPU can run, from its feature flags alone: nothing compiled for the ISA runs here.
bool cpu_runs(CpuIsa isa) noexcept {
  switch (isa) {
    case CpuIsa::scalar:
      return true;
#if defined(__x86_64__)
    case CpuIsa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
    case CpuIsa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && has_f16c();
    case CpuIsa::avx512bf16:
      return cpu_runs(CpuIsa::avx512) && __builtin_cpu_supports("avx512bf16");
#endif
#if defined(__aarch64__)
    case CpuIsa::neon:
      return true;
    case CpuIsa::sve:
      return true;  // sve_table() is null unless HWCAP_SVE and an instance for the vector length
#endif
    default:
      return false;
  }
}
}  // namespace

// The CPU's flags first: a table is built by code compiled for its ISA (the compiler may copy it
// with that ISA's instructions), so asking an AVX2-only CPU for the AVX-512 table would fault.
// Asked once per ISA and kept: every kernel call checks its ISA, and CPUID (F16C) makes a
// virtual machine exit to its hypervisor (measured: 38% of a step over 5,000 small parameters).
bool cpu_isa_supported(CpuIsa isa) noexcept {
  constexpr std::array kAll = {CpuIsa::scalar,     CpuIsa::avx2, CpuIsa::avx512,
                               CpuIsa::avx512bf16, CpuIsa::neon, CpuIsa::sve};
  static const std::array<bool, kAll.size()> supported = [&] {
    std::array<bool, kAll.size()> s{};
    for (CpuIsa i : kAll) s.at(static_cast<std::size_t>(i)) = cpu_runs(i) && table_of(i) != nullptr;
    return s;
  }();
  const auto i = static_cast<std::size_t>(isa);
  return i < supported.size() && supported[i];
}

std::vector<CpuIsa> supported_cpu_isas() {
  std::vector<CpuIsa> out;
  for (CpuIsa i : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512, CpuIsa::avx512bf16, CpuIsa::neon,
                   CpuIsa::sve})
    if (cpu_isa_supported(i)) out.push_back(i);
  return out;
}

CpuIsa default_cpu_isa() {
  static const CpuIsa isa = [] {
    const std::string& name = ProcessConfig::current().cpu_isa;
    if (name != "auto") {
      CpuIsa want{};
      try {
        want = parse_isa(name);
      } catch (const std::invalid_argument&) {
        throw_invalid("TIERSWAP_CPU_ISA", name,
                      "expected auto, scalar, avx2, avx512, avx512bf16, neon or sve");
      }
      if (!cpu_isa_supported(want))
        throw_invalid("TIERSWAP_CPU_ISA", name, "not supported by this CPU or this build");
      return want;
    }
    for (CpuIsa c : {CpuIsa::avx512bf16, CpuIsa::avx512, CpuIsa::avx2, CpuIsa::sve, CpuIsa::neon})
      if (cpu_isa_supported(c)) return c;
    return CpuIsa::scalar;
  }();
  return isa;
}

namespace {

const KernelTable& table_for(const CpuKernelContext& ctx) {
  if (!cpu_isa_supported(ctx.isa))
    throw_invalid("isa", to_string(ctx.isa), "not supported by this CPU or this build");
  return *table_of(ctx.isa);
}

// Contiguous ranges of whole cache lines per thread; any split gives the same results.
template <class Fn>
void run_split(const CpuKernelContext& ctx, std::size_t n, Fn&& fn) {
  if (ctx.pool == nullptr || ctx.pool->size() == 1 || n < 65536) {
    fn(std::size_t{0}, n);
    return;
  }
  ctx.pool->parallel_for(n, 64, fn);
}

using kernels::need;

}  // namespace

void AdamConfig::validate() const {
  if (!(lr >= 0)) throw_invalid("lr", std::to_string(lr), "must be >= 0");
  if (!(eps >= 0)) throw_invalid("eps", std::to_string(eps), "must be >= 0");
  if (!(beta1 >= 0 && beta1 < 1))
    throw_invalid("beta1", std::to_string(beta1), "must be in [0, 1)");
  if (!(beta2 >= 0 && beta2 < 1))
    throw_invalid("beta2", std::to_string(beta2), "must be in [0, 1)");
  if (!(weight_decay >= 0))
    throw_invalid("weight_decay", std::to_string(weight_decay), "must be >= 0");
}

void LionConfig::validate() const {
  if (!(lr >= 0)) throw_invalid("lr", std::to_string(lr), "must be >= 0");
  if (!(beta1 >= 0 && beta1 <= 1))
    throw_invalid("beta1", std::to_string(beta1), "must be in [0, 1]");
  if (!(beta2 >= 0 && beta2 <= 1))
    throw_invalid("beta2", std::to_string(beta2), "must be in [0, 1]");
  if (!(weight_decay >= 0))
    throw_invalid("weight_decay", std::to_string(weight_decay), "must be >= 0");
}

void SgdConfig::validate() const {
  if (!(lr >= 0)) throw_invalid("lr", std::to_string(lr), "must be >= 0");
  if (!(momentum >= 0)) throw_invalid("momentum", std::to_string(momentum), "must be >= 0");
  if (!(weight_decay >= 0))
    throw_invalid("weight_decay", std::to_string(weight_decay), "must be >= 0");
  if (nesterov && (momentum <= 0 || dampening != 0))
    throw_invalid("nesterov", "true", "requires momentum > 0 and dampening = 0");
}

void adam_step(const AdamConfig& cfg, std::int64_t step, const AdamState& st, const GradView& g,
               const Param16View& p16, std::size_t n, const CpuKernelContext& ctx) {
  const kernels::AdamArgs a = kernels::adam_args(cfg, step, st, g, p16, n);
  if (n == 0) return;
  const KernelTable& t = table_for(ctx);
  run_split(ctx, n, [&](std::size_t b, std::size_t e) { t.adam(a, b, e); });
}

void lion_step(const LionConfig& cfg, float* param, void* exp_avg, Dtype moment_dtype,
               const GradView& g, const Param16View& p16, std::size_t n,
               const CpuKernelContext& ctx) {
  const kernels::LionArgs a = kernels::lion_args(cfg, param, exp_avg, moment_dtype, g, p16, n);
  if (n == 0) return;
  const KernelTable& t = table_for(ctx);
  run_split(ctx, n, [&](std::size_t b, std::size_t e) { t.lion(a, b, e); });
}

void sgd_step(const SgdConfig& cfg, bool first_step, float* param, float* momentum_buffer,
              const GradView& g, const Param16View& p16, std::size_t n,
              const CpuKernelContext& ctx) {
  const kernels::SgdArgs a = kernels::sgd_args(cfg, first_step, param, momentum_buffer, g, p16, n);
  if (n == 0) return;
  const KernelTable& t = table_for(ctx);
  run_split(ctx, n, [&](std::size_t b, std::size_t e) { t.sgd(a, b, e); });
}

void grad_chunk_sums(const void* grad, Dtype dtype, std::size_t n, double* sums,
                     const CpuKernelContext& ctx) {
  if (n == 0) return;
  need(grad, "grad");
  need(sums, "sums");
  const KernelTable& t = table_for(ctx);
  const std::size_t chunks = (n + kernels::kStatsChunk - 1) / kernels::kStatsChunk;
  const std::size_t full = n / kernels::kStatsChunk;  // chunks of kStatsChunk values
  const int streams = dtype == Dtype::f32 ? 1 : t.stats16_streams;
  // Chunks [cb, ce): the full ones as `streams` contiguous runs summed in lockstep (chunk j of
  // each run together), the rest and a ragged last chunk one by one.
  auto run = [&](std::size_t cb, std::size_t ce) {
    const std::size_t fe = std::min(ce, full);
    const std::size_t per = fe > cb ? (fe - cb) / streams : 0;
    std::size_t b[kernels::kMaxStatsStreams];
    for (std::size_t j = 0; j < per && streams > 1; ++j) {
      for (int k = 0; k < streams; ++k) b[k] = (cb + k * per + j) * kernels::kStatsChunk;
      double s[kernels::kMaxStatsStreams];
      kernels::chunk_sums_sq(t, grad, dtype, b, kernels::kStatsChunk, streams, s);
      for (int k = 0; k < streams; ++k) sums[cb + k * per + j] = s[k];
    }
    for (std::size_t c = streams > 1 ? cb + per * streams : cb; c < ce; ++c) {
      b[0] = c * kernels::kStatsChunk;
      kernels::chunk_sums_sq(t, grad, dtype, b, std::min(n - b[0], kernels::kStatsChunk), 1,
                             &sums[c]);
    }
  };
  if (ctx.pool == nullptr || ctx.pool->size() == 1 || chunks < 8)
    run(0, chunks);
  else
    ctx.pool->parallel_for(chunks, 1, run);
}

GradStats grad_stats(const void* grad, Dtype dtype, std::size_t n, const CpuKernelContext& ctx) {
  GradStats out;
  if (n == 0) return out;
  need(grad, "grad");
  std::vector<double> partial((n + kernels::kStatsChunk - 1) / kernels::kStatsChunk);
  grad_chunk_sums(grad, dtype, n, partial.data(), ctx);
  // A non-finite fast sum was recomputed exactly; exact squares are >= 0 and cannot overflow an
  // fp64 chunk sum, so a non-finite chunk sum means a non-finite value in the chunk.
  for (double c : partial) {
    out.sum_sq += c;
    out.nonfinite |= !std::isfinite(c);
  }
  return out;
}

void cast(const void* src, Dtype sd, void* dst, Dtype dd, std::size_t n,
          const CpuKernelContext& ctx) {
  if (n == 0) return;
  need(src, "src");
  need(dst, "dst");
  const KernelTable& t = table_for(ctx);
  run_split(ctx, n, [&](std::size_t b, std::size_t e) { t.cast(src, sd, dst, dd, b, e); });
}

void accumulate(void* acc, Dtype ad, const void* grad, Dtype gd, std::size_t n,
                const CpuKernelContext& ctx) {
  if (n == 0) return;
  need(acc, "acc");
  need(grad, "grad");
  const KernelTable& t = table_for(ctx);
  run_split(ctx, n, [&](std::size_t b, std::size_t e) { t.accumulate(acc, ad, grad, gd, b, e); });
}

void stream_triad(float* a, const float* b, const float* c, float s, std::size_t n,
                  const CpuKernelContext& ctx) {
  if (n == 0) return;
  need(a, "a");
  need(b, "b");
  need(c, "c");
  const KernelTable& t = table_for(ctx);
  run_split(ctx, n, [&](std::size_t i, std::size_t e) { t.triad(a, b, c, s, i, e); });
}

std::uint16_t float_to_bf16(float f) noexcept {
  return kernels::to_bf16(f);
}
float bf16_to_float(std::uint16_t h) noexcept {
  return kernels::from_bf16(h);
}
std::uint16_t float_to_f16(float f) noexcept {
  return kernels::to_f16(f);
}
float f16_to_float(std::uint16_t h) noexcept {
  return kernels::from_f16(h);
}

}  // namespace tierswap

namespace tierswap::kernels {

void need(const void* p, const char* what) {
  if (p == nullptr) throw std::invalid_argument(std::string(what) + " is null");
}

void check_p16(const Param16View& p16) {
  if (p16.data != nullptr && p16.dtype == Dtype::f32)
    throw_invalid("param16.dtype", "f32", "the 16-bit parameter copy must be bf16 or f16");
}

void check_moment(Dtype d) {
  if (d == Dtype::f16)
    throw_invalid("moment_dtype", "f16", "moments are stored in f32 or bf16 (f16 overflows)");
}

void check_adam(const AdamConfig& cfg, std::int64_t step, const AdamState& st, const GradView& g,
                const Param16View& p16, std::size_t n) {
  cfg.validate();
  if (step < 1) throw_invalid("step", std::to_string(step), "the step count starts at 1");
  check_p16(p16);
  check_moment(st.moment_dtype);
  if (n == 0) return;
  need(st.param, "param");
  need(st.exp_avg, "exp_avg");
  need(st.exp_avg_sq, "exp_avg_sq");
  need(g.data, "grad");
  if (cfg.amsgrad) need(st.max_exp_avg_sq, "max_exp_avg_sq (amsgrad)");
}

AdamScalars adam_scalars(const AdamConfig& cfg, std::int64_t step, float grad_multiplier) {
  // As torch: Python floats (double) for the derived constants, rounded to fp32 where they meet
  // the tensors.
  const double bc1 = 1.0 - std::pow(cfg.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(cfg.beta2, static_cast<double>(step));
  AdamScalars s{};
  s.beta1 = static_cast<float>(cfg.beta1);
  s.beta2 = static_cast<float>(cfg.beta2);
  s.one_minus_beta1 = static_cast<float>(1.0 - cfg.beta1);
  s.one_minus_beta2 = static_cast<float>(1.0 - cfg.beta2);
  s.eps = static_cast<float>(cfg.eps);
  s.weight_decay = static_cast<float>(cfg.weight_decay);
  s.decay = static_cast<float>(1.0 - cfg.lr * cfg.weight_decay);
  s.neg_step_size = static_cast<float>(-(cfg.lr / bc1));
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bc2));
  s.grad_multiplier = grad_multiplier;
  s.decoupled = cfg.decoupled;
  s.amsgrad = cfg.amsgrad;
  s.maximize = cfg.maximize;
  return s;
}

LionScalars lion_scalars(const LionConfig& cfg, float grad_multiplier) {
  LionScalars s{};
  s.lr = static_cast<float>(cfg.lr);
  s.neg_lr = static_cast<float>(-cfg.lr);
  s.beta1 = static_cast<float>(cfg.beta1);
  s.beta2 = static_cast<float>(cfg.beta2);
  s.one_minus_beta1 = static_cast<float>(1.0 - cfg.beta1);
  s.one_minus_beta2 = static_cast<float>(1.0 - cfg.beta2);
  s.weight_decay = static_cast<float>(cfg.weight_decay);
  s.decay = static_cast<float>(1.0 - cfg.lr * cfg.weight_decay);
  s.grad_multiplier = grad_multiplier;
  s.maximize = cfg.maximize;
  return s;
}

SgdScalars sgd_scalars(const SgdConfig& cfg, bool first_step, float grad_multiplier) {
  SgdScalars s{};
  s.lr = static_cast<float>(cfg.lr);
  s.neg_lr = static_cast<float>(-cfg.lr);
  s.momentum = static_cast<float>(cfg.momentum);
  s.one_minus_dampening = static_cast<float>(1.0 - cfg.dampening);
  s.weight_decay = static_cast<float>(cfg.weight_decay);
  s.grad_multiplier = grad_multiplier;
  s.nesterov = cfg.nesterov;
  s.maximize = cfg.maximize;
  s.first_step = first_step;
  return s;
}

AdamArgs adam_args(const AdamConfig& cfg, std::int64_t step, const AdamState& st, const GradView& g,
                   const Param16View& p16, std::size_t n) {
  check_adam(cfg, step, st, g, p16, n);
  AdamArgs a{};
  a.s = adam_scalars(cfg, step, g.multiplier);
  a.param = st.param;
  a.exp_avg = st.exp_avg;
  a.exp_avg_sq = st.exp_avg_sq;
  a.max_exp_avg_sq = st.max_exp_avg_sq;
  a.moment_dtype = st.moment_dtype;
  a.grad = g.data;
  a.grad_dtype = g.dtype;
  a.param16 = p16.data;
  a.param16_dtype = p16.dtype;
  return a;
}

LionArgs lion_args(const LionConfig& cfg, float* param, void* exp_avg, Dtype moment_dtype,
                   const GradView& g, const Param16View& p16, std::size_t n) {
  cfg.validate();
  check_p16(p16);
  check_moment(moment_dtype);
  if (n != 0) {
    need(param, "param");
    need(exp_avg, "exp_avg");
    need(g.data, "grad");
  }
  LionArgs a{};
  a.s = lion_scalars(cfg, g.multiplier);
  a.param = param;
  a.exp_avg = exp_avg;
  a.moment_dtype = moment_dtype;
  a.grad = g.data;
  a.grad_dtype = g.dtype;
  a.param16 = p16.data;
  a.param16_dtype = p16.dtype;
  return a;
}

SgdArgs sgd_args(const SgdConfig& cfg, bool first_step, float* param, float* momentum_buffer,
                 const GradView& g, const Param16View& p16, std::size_t n) {
  cfg.validate();
  check_p16(p16);
  if (n != 0) {
    need(param, "param");
    need(g.data, "grad");
    if (cfg.momentum != 0) need(momentum_buffer, "momentum_buffer");
  }
  SgdArgs a{};
  a.s = sgd_scalars(cfg, first_step, g.multiplier);
  a.param = param;
  a.momentum_buffer = momentum_buffer;
  a.grad = g.data;
  a.grad_dtype = g.dtype;
  a.param16 = p16.data;
  a.param16_dtype = p16.dtype;
  return a;
}

#if !defined(TIERSWAP_KERNELS_AVX2)
const KernelTable* avx2_table() {
  return nullptr;
}
#endif
#if !defined(TIERSWAP_KERNELS_AVX512)
const KernelTable* avx512_table() {
  return nullptr;
}
const KernelTable* avx512bf16_table() {
  return nullptr;
}
#endif
#if !defined(TIERSWAP_KERNELS_NEON)
const KernelTable* neon_table() {
  return nullptr;
}
#endif
#if !defined(TIERSWAP_KERNELS_SVE)
const KernelTable* sve128_table() {
  return nullptr;
}
const KernelTable* sve256_table() {
  return nullptr;
}
const KernelTable* sve512_table() {
  return nullptr;
}
#endif
const KernelTable* sve_table() {
  static const KernelTable* const t = sve_table_for_bits(sve_vector_bits());
  return t;
}
}  // namespace tierswap::kernels
