// `tierswap bench io`: writes then reads a given amount through the engine and reports GB/s and
// CPU seconds per GiB moved, per run; `--sweep` runs a grid of block sizes x depths x backends.

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tierswap/io_engine.hpp"
#include "tierswap/swap_space.hpp"
#include "tierswap/units.hpp"
#include "tools/commands.hpp"
#include "tools/io_sweep.hpp"
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

// The swap space of the measurement: --dir (or a temporary directory), --size, --stripe-size,
// --direct; with --keep and --dir, one an earlier --keep run left there (`*created` false then).
SwapSpace open_space(const BenchIoOptions& o, std::uint64_t size,
                     std::vector<std::unique_ptr<TempDir>>& temps, bool* created) {
  SwapSpaceConfig sc;
  if (o.dirs.empty()) {
    temps.push_back(std::make_unique<TempDir>());
    sc.dirs.push_back(temps.back()->path);
  } else {
    for (auto& d : o.dirs) sc.dirs.emplace_back(d);
  }
  sc.capacity = size;
  sc.stripe_size = parse_size(o.stripe_size, "--stripe-size");
  if (o.direct != "on" && o.direct != "off" && o.direct != "auto")
    throw std::invalid_argument(fmt::format("--direct={}: expected auto, on or off", o.direct));
  sc.direct = o.direct == "on"    ? DirectIo::on
              : o.direct == "off" ? DirectIo::off
                                  : DirectIo::automatic;
  *created = true;
  // --keep reuses a space an earlier --keep run left in --dir (same geometry), data included, so
  // a `--mode read` run can read what a `--mode write` run wrote.
  if (o.keep && !o.dirs.empty()) return SwapSpace::open_or_create(sc, created);
  return SwapSpace::create(sc);
}

std::vector<IoCombo> combos_of(const BenchIoOptions& o) {
  std::vector<IoCombo> combos;
  if (!o.sweep)
    return {{parse_backend(o.backend), parse_size(o.block_size, "--block-size"), o.queue_depth,
             o.sqpoll}};
  // ds_nvme_tune sweeps {1M, 8M} x {32, 128}; this grid covers it and more.
  for (auto b : {IoBackendKind::uring, IoBackendKind::aio, IoBackendKind::posix})
    for (std::uint64_t bs : {128 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 8 * MiB})
      for (std::uint32_t d : {8u, 32u, 128u}) combos.push_back({b, bs, d, o.sqpoll});
  return combos;
}

// The best combination per direction: printed, and under "best" in `out`.
void report_best(const BenchIoOptions& o, const std::vector<IoRun>& runs,
                 const std::vector<IoCombo>& combos, const SweepOptions& so, nlohmann::json& out) {
  for (const bool write : {true, false}) {
    if (write ? !so.write : !so.read) continue;
    const auto best = best_for(runs, combos, write);
    if (!best) continue;
    const char* mode = write ? "write" : "read";
    out["best"][mode] = {{"backend", to_string(best->combo.backend)},
                         {"block_size", best->combo.block},
                         {"queue_depth", best->combo.depth},
                         {"median_gbps", best->gbps}};
    if (!o.json)
      fmt::print("best {}: backend {} block {} depth {}: {:.3f} GB/s (median)\n", mode,
                 to_string(best->combo.backend), format_bytes(best->combo.block), best->combo.depth,
                 best->gbps);
  }
}

void run_bench_io(const BenchIoOptions& o) {
  const std::uint64_t size = parse_size(o.size, "--size");
  if (size == 0) throw std::invalid_argument("--size must be > 0");
  if (o.runs < 1) throw std::invalid_argument(fmt::format("--runs={}: must be >= 1", o.runs));
  if (o.mode != "read" && o.mode != "write" && o.mode != "both")
    throw std::invalid_argument(fmt::format("--mode={}: expected read, write or both", o.mode));
  const auto combos = combos_of(o);
  std::vector<std::unique_ptr<TempDir>> temps;
  bool created = true;
  SwapSpace space = open_space(o, size, temps, &created);
  struct Cleanup {
    SwapSpace& s;
    bool keep;
    ~Cleanup() {
      if (!keep) s.remove_files();
    }
  } cleanup{space, o.keep};

  SweepOptions so;
  so.size = size;
  so.runs = o.runs;
  so.write = o.mode != "read";
  so.read = o.mode != "write";
  so.space_is_new = created;
  std::string description;
  so.on_engine = [&](const IoEngine& engine, bool registered) {
    description = engine.backend_description();
    if (o.json || o.sweep) return;
    fmt::print("tierswap bench io: {} of {} in {} file(s), stripe {}\n", format_bytes(size),
               space.all_direct() ? "O_DIRECT" : "buffered", space.files().size(),
               format_bytes(space.stripe_size()));
    fmt::print("backend: {}{}\n", description, registered ? ", benchmark buffers registered" : "");
  };
  if (o.sweep && !o.json) so.progress = print_progress;
  const auto runs = sweep(space, combos, so);

  nlohmann::json out;
  out["runs"] = nlohmann::json::array();
  for (const auto& r : runs) out["runs"].push_back(r.to_json());
  if (!o.json && !o.sweep) {
    print_run_header();
    for (const auto& r : runs) print_run_row(r.run, r);
  }
  report_best(o, runs, combos, so, out);
  if (o.sweep && !o.json) {
    print_run_header();
    int i = 0;
    for (const auto& r : runs) print_run_row(++i, r);
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
