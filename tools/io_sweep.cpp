#include "tools/io_sweep.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <random>
#include <span>

#include "tierswap/aligned_buffer.hpp"
#include "tierswap/units.hpp"
#include "tools/timing.hpp"

#include <fmt/format.h>

namespace tierswap::cli {

IoEngineConfig IoCombo::config() const {
  IoEngineConfig c = base;
  c.backend = backend;
  c.block_size = block;
  c.queue_depth = depth;
  c.sqpoll = sqpoll;
  c.submit_batch = submit_batch;
  return c;
}

std::string IoCombo::label() const {
  return fmt::format("{} {} qd{}{}", to_string(backend), format_bytes(block), depth,
                     sqpoll ? " sqpoll" : "");
}

bool operator==(const IoCombo& a, const IoCombo& b) {
  return a.backend == b.backend && a.block == b.block && a.depth == b.depth &&
         a.sqpoll == b.sqpoll && a.submit_batch == b.submit_batch;
}

double IoRun::cpu_s_per_gib() const {
  return bytes ? cpu_seconds / (static_cast<double>(bytes) / static_cast<double>(GiB)) : 0;
}

nlohmann::json IoRun::to_json() const {
  return {{"backend", backend},
          {"mode", write ? "write" : "read"},
          {"block_size", combo.block},
          {"queue_depth", combo.depth},
          {"sqpoll", combo.sqpoll},
          {"submit_batch", combo.submit_batch},
          {"run", run},
          {"bytes", bytes},
          {"seconds", seconds},
          {"gbps", gbps()},
          {"cpu_s_per_gib", cpu_s_per_gib()},
          {"requests", io.requests},
          {"fixed_buffer_requests", io.fixed_requests},
          {"bounce_requests", io.bounce_requests},
          {"retries", io.retries},
          {"short_transfers", io.short_transfers},
          {"latency_p50_us", io.latency_quantile_us(0.5)},
          {"latency_p99_us", io.latency_quantile_us(0.99)}};
}

namespace {

double cpu_now() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

IoStats minus(const IoStats& b, const IoStats& a) {
  IoStats d;
  d.requests = b.requests - a.requests;
  d.fixed_requests = b.fixed_requests - a.fixed_requests;
  d.bounce_requests = b.bounce_requests - a.bounce_requests;
  d.retries = b.retries - a.retries;
  d.short_transfers = b.short_transfers - a.short_transfers;
  for (std::size_t k = 0; k < d.latency_us_log2.size(); ++k)
    d.latency_us_log2[k] = b.latency_us_log2[k] - a.latency_us_log2[k];
  return d;
}

// Moves `size` bytes in one direction through `engine`, cycling through a ring of
// depth x block buffers, and times it.
IoRun run_phase(IoEngine& engine, const IoCombo& c, bool write, std::uint64_t size,
                std::byte* ring) {
  std::vector<IoSegment> segs;
  segs.reserve(size / c.block + 1);
  const IoOp op = write ? IoOp::write : IoOp::read;
  for (std::uint64_t off = 0, i = 0; off < size; off += c.block, ++i)
    segs.push_back({op, off, std::min(c.block, size - off), ring + (i % c.depth) * c.block});
  const IoStats s0 = engine.stats();
  const double c0 = cpu_now();
  const auto t0 = Clock::now();
  engine.submit(segs).wait();
  IoRun r;
  r.seconds = since(t0);
  r.cpu_seconds = cpu_now() - c0;
  r.io = minus(engine.stats(), s0);
  r.combo = c;
  r.backend = std::string(to_string(engine.backend()));
  r.write = write;
  r.bytes = size;
  return r;
}

// One ring for every combination, as large as the largest block x depth, left untouched: the
// first engine registers it before it is filled (fill_ring), as fio does with its buffers. On
// 4 KiB pages that order decides the physical layout: pages the registration's pin faults in come
// in physically contiguous runs of 2-4 pages on the machine of bench/RESULTS.md, pages first
// written by the CPU one at a time, and a virtio disk's speed follows the segment count.
AlignedBuffer make_ring(const std::vector<IoCombo>& combos) {
  return AlignedBuffer(ring_bytes(combos), 4096);
}

void fill_ring(std::span<std::byte> ring) {
  std::mt19937_64 rng(12345);
  auto* w = reinterpret_cast<std::uint64_t*>(ring.data());
  for (std::size_t i = 0; i < ring.size() / 8; ++i) w[i] = rng();
}

// Every repetition of one combination on `engine`; `*has_data` says whether its storage holds
// the bytes a read-only sweep reads (written first, unreported, when not).
void run_combo(IoEngine& engine, const IoCombo& c, std::byte* ring, const SweepOptions& opt,
               bool* has_data, std::size_t* done, std::size_t total, std::vector<IoRun>& out) {
  for (int run = 1; run <= opt.runs; ++run) {
    if (opt.write) {
      out.push_back(run_phase(engine, c, true, opt.size, ring));
      out.back().run = run;
    } else if (!*has_data) {
      run_phase(engine, c, true, opt.size, ring);
    }
    *has_data = true;
    if (opt.read) {
      out.push_back(run_phase(engine, c, false, opt.size, ring));
      out.back().run = run;
    }
    if (opt.progress) opt.progress(++*done, total, c);
  }
}

}  // namespace

std::uint64_t ring_bytes(const std::vector<IoCombo>& combos) {
  std::uint64_t bytes = 0;
  for (const auto& c : combos) bytes = std::max(bytes, c.block * c.depth);
  return bytes;
}

std::vector<IoRun> sweep(const SwapSpace& space, const std::vector<IoCombo>& combos,
                         const SweepOptions& opt) {
  AlignedBuffer own = opt.ring_memory.empty() ? make_ring(combos) : AlignedBuffer();
  const std::span<std::byte> ring =
      opt.ring_memory.empty() ? std::span(own.data(), own.size()) : opt.ring_memory;
  if (ring.size() < ring_bytes(combos))
    throw std::invalid_argument(fmt::format("the ring's memory holds {}, the sweep needs {}",
                                            format_bytes(ring.size()),
                                            format_bytes(ring_bytes(combos))));
  std::vector<IoRun> out;
  const std::size_t total = combos.size() * static_cast<std::size_t>(opt.runs);
  std::size_t done = 0;
  bool has_data = !opt.space_is_new, filled = false;
  for (const auto& c : combos) {
    std::optional<IoEngine> engine;
    try {
      engine.emplace(space, c.config());
    } catch (const std::exception& e) {  // a backend this kernel or build does not offer
      if (!opt.on_skip) throw;
      opt.on_skip(c, e.what());
      done += static_cast<std::size_t>(opt.runs);
      continue;
    }
    const int handle = engine->register_buffer(ring.data(), ring.size());
    if (!filled) fill_ring(ring);
    filled = true;
    if (opt.on_engine) opt.on_engine(*engine, handle >= 0);
    run_combo(*engine, c, ring.data(), opt, &has_data, &done, total, out);
    if (handle >= 0) engine->unregister_buffer(handle);
  }
  return out;
}

std::vector<IoRun> sweep_targets(const std::vector<IoCombo>& combos, const SweepOptions& opt) {
  std::vector<IoRun> out;
  const std::size_t total = combos.size() * static_cast<std::size_t>(opt.runs);
  std::size_t done = 0;
  for (const auto& c : combos) {
    const SweepOptions::Target t = opt.open(c, c.block * c.depth);
    fill_ring(std::span(t.ring, c.block * c.depth));
    if (opt.on_engine) opt.on_engine(*t.engine, false);
    bool has_data = false;
    run_combo(*t.engine, c, t.ring, opt, &has_data, &done, total, out);
  }
  return out;
}

std::optional<double> median_gbps(const std::vector<IoRun>& runs, const IoCombo& c, bool write) {
  std::vector<double> v;
  for (const auto& r : runs)
    if (r.write == write && r.combo == c) v.push_back(r.gbps());
  if (v.empty()) return std::nullopt;
  return median(std::move(v));
}

std::optional<IoBest> best_for(const std::vector<IoRun>& runs, const std::vector<IoCombo>& combos,
                               bool write) {
  std::optional<IoBest> best;
  for (const auto& c : combos) {
    const auto m = median_gbps(runs, c, write);
    if (m && (!best || *m > best->gbps)) best = IoBest{c, *m};
  }
  return best;
}

void print_progress(std::size_t done, std::size_t total, const IoCombo& c) {
  if (::isatty(STDERR_FILENO)) {
    const int width = 40;
    const int filled = static_cast<int>(width * done / total);
    fmt::print(stderr, "\r[{}{}] {}/{} {}   ", std::string(filled, '#'),
               std::string(width - filled, '.'), done, total, c.label());
    if (done == total) fmt::print(stderr, "\n");
  } else {
    fmt::print(stderr, "sweep {}/{}: {}\n", done, total, c.label());
  }
}

void print_run_header() {
  fmt::print("{:>4} {:<9} {:<6} {:>9} {:>6} {:>10} {:>9} {:>8} {:>11}\n", "run", "backend", "mode",
             "block", "depth", "bytes", "seconds", "GB/s", "CPU s/GiB");
}

void print_run_row(int index, const IoRun& r) {
  fmt::print("{:>4} {:<9} {:<6} {:>9} {:>6} {:>10} {:>9.3f} {:>8.3f} {:>11.4f}\n", index,
             r.backend + (r.combo.sqpoll ? "+sq" : ""), r.write ? "write" : "read",
             format_bytes(r.combo.block), r.combo.depth, format_bytes(r.bytes), r.seconds, r.gbps(),
             r.cpu_s_per_gib());
}

}  // namespace tierswap::cli
