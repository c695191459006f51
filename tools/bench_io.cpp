// `tierswap bench io`: writes then reads a given amount through the engine and reports GB/s and
// CPU seconds per GiB moved, per run; `--sweep` runs a grid of block sizes x depths x backends.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "tierswap/aligned_buffer.hpp"
#include "tierswap/io_engine.hpp"
#include "tierswap/swap_space.hpp"
#include "tierswap/units.hpp"
#include "tools/commands.hpp"
#include "tools/temp_dir.hpp"

#include <fmt/format.h>

namespace tierswap::cli {
namespace {

struct BenchIoOptions {
  std::vector<std::string> dirs;
  std::string size = "1GiB";
  std::string block_size = "1MiB";
  std::string stripe_size = "1MiB";
  std::uint32_t queue_depth = 32;
  std::string backend = "auto";
  std::string mode = "both";
  std::string direct = "auto";
  int runs = 3;
  bool json = false;
  bool sweep = false;
  bool sqpoll = false;
  bool keep = false;
};

struct RunResult {
  std::string backend;
  std::string mode;
  std::uint64_t block_size = 0;
  std::uint32_t queue_depth = 0;
  std::uint64_t bytes = 0;
  double seconds = 0;
  double cpu_seconds = 0;
  IoStats io;  // the engine's counters for this phase alone
  double gbps() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }
  double cpu_s_per_gib() const {
    return bytes ? cpu_seconds / (static_cast<double>(bytes) / static_cast<double>(GiB)) : 0;
  }
};

double cpu_now() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

// Moves `size` bytes in one direction through `engine`, cycling through a ring of
// queue_depth x block_size buffers, and times it.
RunResult run_phase(IoEngine& engine, IoOp op, std::uint64_t size, std::byte* ring,
                    std::uint64_t block, std::uint32_t depth) {
  std::vector<IoSegment> segs;
  segs.reserve(size / block + 1);
  for (std::uint64_t off = 0, i = 0; off < size; off += block, ++i)
    segs.push_back({op, off, std::min(block, size - off), ring + (i % depth) * block});
  const IoStats s0 = engine.stats();
  const double c0 = cpu_now();
  const auto t0 = std::chrono::steady_clock::now();
  IoTicket t = engine.submit(segs);
  t.wait();
  const auto t1 = std::chrono::steady_clock::now();
  const IoStats s1 = engine.stats();
  RunResult r;
  r.io.requests = s1.requests - s0.requests;
  r.io.fixed_requests = s1.fixed_requests - s0.fixed_requests;
  r.io.bounce_requests = s1.bounce_requests - s0.bounce_requests;
  r.io.retries = s1.retries - s0.retries;
  r.io.short_transfers = s1.short_transfers - s0.short_transfers;
  for (std::size_t k = 0; k < r.io.latency_us_log2.size(); ++k)
    r.io.latency_us_log2[k] = s1.latency_us_log2[k] - s0.latency_us_log2[k];
  r.backend = std::string(to_string(engine.backend()));
  r.mode = op == IoOp::read ? "read" : "write";
  r.block_size = block;
  r.queue_depth = depth;
  r.bytes = size;
  r.seconds = std::chrono::duration<double>(t1 - t0).count();
  r.cpu_seconds = cpu_now() - c0;
  return r;
}

nlohmann::json to_json(const RunResult& r) {
  return {{"backend", r.backend},
          {"mode", r.mode},
          {"block_size", r.block_size},
          {"queue_depth", r.queue_depth},
          {"bytes", r.bytes},
          {"seconds", r.seconds},
          {"gbps", r.gbps()},
          {"cpu_s_per_gib", r.cpu_s_per_gib()},
          {"requests", r.io.requests},
          {"fixed_buffer_requests", r.io.fixed_requests},
          {"bounce_requests", r.io.bounce_requests},
          {"retries", r.io.retries},
          {"short_transfers", r.io.short_transfers},
          {"latency_p50_us", r.io.latency_quantile_us(0.5)},
          {"latency_p99_us", r.io.latency_quantile_us(0.99)}};
}

void print_header() {
  fmt::print("{:>4} {:<9} {:<6} {:>9} {:>6} {:>10} {:>9} {:>8} {:>11}\n", "run", "backend", "mode",
             "block", "depth", "bytes", "seconds", "GB/s", "CPU s/GiB");
}
void print_row(int run, const RunResult& r) {
  fmt::print("{:>4} {:<9} {:<6} {:>9} {:>6} {:>10} {:>9.3f} {:>8.3f} {:>11.4f}\n", run, r.backend,
             r.mode, format_bytes(r.block_size), r.queue_depth, format_bytes(r.bytes), r.seconds,
             r.gbps(), r.cpu_s_per_gib());
}

void run_bench_io(const BenchIoOptions& o) {
  const std::uint64_t size = parse_size(o.size, "--size");
  const std::uint64_t block = parse_size(o.block_size, "--block-size");
  if (size == 0) throw std::invalid_argument("--size must be > 0");
  if (o.runs < 1) throw std::invalid_argument(fmt::format("--runs={}: must be >= 1", o.runs));
  if (o.mode != "read" && o.mode != "write" && o.mode != "both")
    throw std::invalid_argument(fmt::format("--mode={}: expected read, write or both", o.mode));

  std::vector<std::unique_ptr<TempDir>> temps;
  SwapSpaceConfig sc;
  if (o.dirs.empty()) {
    temps.push_back(std::make_unique<TempDir>());
    sc.dirs.push_back(temps.back()->path);
  } else {
    for (auto& d : o.dirs) sc.dirs.emplace_back(d);
  }
  sc.capacity = size;
  sc.stripe_size = parse_size(o.stripe_size, "--stripe-size");
  sc.direct = o.direct == "on"    ? DirectIo::on
              : o.direct == "off" ? DirectIo::off
                                  : DirectIo::automatic;
  if (o.direct != "on" && o.direct != "off" && o.direct != "auto")
    throw std::invalid_argument(fmt::format("--direct={}: expected auto, on or off", o.direct));
  // --keep reuses a space an earlier --keep run left in --dir (same geometry), data included, so
  // a `--mode read` run can read what a `--mode write` run wrote.
  const bool reuse = o.keep && !o.dirs.empty();
  bool created = true;
  SwapSpace space = reuse ? SwapSpace::open_or_create(sc, &created) : SwapSpace::create(sc);
  struct Cleanup {
    SwapSpace& s;
    bool keep;
    ~Cleanup() {
      if (!keep) s.remove_files();
    }
  } cleanup{space, o.keep};

  struct Combo {
    IoBackendKind backend;
    std::uint64_t block;
    std::uint32_t depth;
  };
  std::vector<Combo> combos;
  if (o.sweep) {
    // ds_nvme_tune sweeps {1M, 8M} x {32, 128}; this grid covers it and more.
    for (auto b : {IoBackendKind::uring, IoBackendKind::aio, IoBackendKind::posix})
      for (std::uint64_t bs : {128 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 8 * MiB})
        for (std::uint32_t d : {8u, 32u, 128u}) combos.push_back({b, bs, d});
  } else {
    combos.push_back({parse_backend(o.backend), block, o.queue_depth});
  }

  std::uint64_t max_block = 0;
  std::uint32_t max_depth = 0;
  for (auto& c : combos) {
    max_block = std::max(max_block, c.block);
    max_depth = std::max(max_depth, c.depth);
  }
  AlignedBuffer ring(max_block * max_depth, 4096);
  {
    std::mt19937_64 rng(12345);
    auto* w = reinterpret_cast<std::uint64_t*>(ring.data());
    for (std::size_t i = 0; i < ring.size() / 8; ++i) w[i] = rng();
  }

  nlohmann::json out;
  out["runs"] = nlohmann::json::array();
  std::vector<RunResult> all;
  std::string description;
  const bool do_write = o.mode != "read", do_read = o.mode != "write";
  bool header = false;
  const std::size_t total_steps = combos.size() * static_cast<std::size_t>(o.runs);
  std::size_t step = 0;
  for (const auto& c : combos) {
    IoEngineConfig ec;
    ec.backend = c.backend;
    ec.block_size = c.block;
    ec.queue_depth = c.depth;
    ec.sqpoll = o.sqpoll;
    IoEngine engine(space, ec);
    const int handle = engine.register_buffer(ring.data(), ring.size());
    if (description.empty() || o.sweep) description = engine.backend_description();
    if (!o.json && !o.sweep) {
      fmt::print("tierswap bench io: {} of {} in {} file(s), stripe {}\n", format_bytes(size),
                 space.all_direct() ? "O_DIRECT" : "buffered", space.files().size(),
                 format_bytes(space.stripe_size()));
      fmt::print("backend: {}{}\n", engine.backend_description(),
                 handle >= 0 ? ", benchmark buffers registered" : "");
    }
    for (int run = 1; run <= o.runs; ++run) {
      std::vector<RunResult> rs;
      // A read-only run still needs data on disk; that write is not reported.
      if (do_write)
        rs.push_back(run_phase(engine, IoOp::write, size, ring.data(), c.block, c.depth));
      else if (run == 1 && created)
        run_phase(engine, IoOp::write, size, ring.data(), c.block, c.depth);
      if (do_read) rs.push_back(run_phase(engine, IoOp::read, size, ring.data(), c.block, c.depth));
      for (auto& r : rs) {
        all.push_back(r);
        out["runs"].push_back(to_json(r));
        if (!o.json && !o.sweep) {
          if (!header) print_header();
          header = true;
          print_row(run, r);
        }
      }
      ++step;
      if (o.sweep && !o.json && ::isatty(STDERR_FILENO)) {
        const int width = 40;
        const int filled = static_cast<int>(width * step / total_steps);
        fmt::print(stderr, "\r[{}{}] {}/{} {} {} qd{}   ", std::string(filled, '#'),
                   std::string(width - filled, '.'), step, total_steps, to_string(c.backend),
                   format_bytes(c.block), c.depth);
      } else if (o.sweep && !o.json) {
        fmt::print(stderr, "sweep {}/{}: {} {} qd{}\n", step, total_steps, to_string(c.backend),
                   format_bytes(c.block), c.depth);
      }
    }
    if (handle >= 0) engine.unregister_buffer(handle);
  }
  if (o.sweep && !o.json && ::isatty(STDERR_FILENO)) fmt::print(stderr, "\n");

  // Best configuration per mode, by median GB/s over the runs of each combination.
  for (const char* mode : {"write", "read"}) {
    if ((std::string(mode) == "write" && !do_write) || (std::string(mode) == "read" && !do_read))
      continue;
    const RunResult* best = nullptr;
    double best_gbps = -1;
    for (const auto& c : combos) {
      std::vector<double> v;
      const RunResult* any = nullptr;
      for (const auto& r : all)
        if (r.mode == mode && r.block_size == c.block && r.queue_depth == c.depth &&
            r.backend == to_string(c.backend)) {
          v.push_back(r.gbps());
          any = &r;
        }
      if (v.empty()) continue;
      std::sort(v.begin(), v.end());
      double med = v[v.size() / 2];
      if (med > best_gbps) {
        best_gbps = med;
        best = any;
      }
    }
    if (!best) continue;
    out["best"][mode] = {{"backend", best->backend},
                         {"block_size", best->block_size},
                         {"queue_depth", best->queue_depth},
                         {"median_gbps", best_gbps}};
    if (!o.json)
      fmt::print("best {}: backend {} block {} depth {}: {:.3f} GB/s (median)\n", mode,
                 best->backend, format_bytes(best->block_size), best->queue_depth, best_gbps);
  }
  if (o.sweep && !o.json) {
    print_header();
    int i = 0;
    for (auto& r : all) print_row(++i, r);
  }
  out["backend_description"] = description;
  out["direct_io"] = space.all_direct();
  out["files"] = space.files().size();
  if (o.json) fmt::print("{}\n", out.dump(2));
}

}  // namespace

void add_bench_io(CLI::App& bench) {
  auto opts = std::make_shared<BenchIoOptions>();
  auto* io =
      bench.add_subcommand("io", "Swap I/O throughput through the engine (write, then read)");
  io->add_option("--dir", opts->dirs,
                 "Swap directory, once per drive (default: a temporary directory under $TMPDIR "
                 "or /var/tmp)");
  io->add_option("--size", opts->size, "Bytes to move per phase (suffixes: KiB, MiB, GiB)")
      ->capture_default_str();
  io->add_option("--block-size", opts->block_size, "Request size")->capture_default_str();
  io->add_option("--queue-depth", opts->queue_depth, "Requests in flight")->capture_default_str();
  io->add_option("--backend", opts->backend, "auto|uring|aio|posix")->capture_default_str();
  io->add_option("--mode", opts->mode, "read|write|both")->capture_default_str();
  io->add_option("--runs", opts->runs, "Repetitions")->capture_default_str();
  io->add_option("--stripe-size", opts->stripe_size, "Stripe unit across --dir files")
      ->capture_default_str();
  io->add_option("--direct", opts->direct, "O_DIRECT: auto|on|off")->capture_default_str();
  io->add_flag("--sqpoll", opts->sqpoll, "io_uring SQPOLL thread");
  io->add_flag("--sweep", opts->sweep,
               "Grid of block sizes x depths x backends; prints the best configuration");
  io->add_flag("--keep", opts->keep,
               "Leave the swap file in --dir, and reuse one left there (its data too: a --mode "
               "read run then reads what an earlier --mode write run wrote)");
  io->add_flag("--json", opts->json, "Print every run's figures as JSON on stdout");
  io->callback([opts] { run_bench_io(*opts); });
}

}  // namespace tierswap::cli
