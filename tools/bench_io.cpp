// `tierswap bench io`: writes then reads a given amount through the engine and reports GB/s and
// CPU seconds per GiB moved, per run; `--sweep` runs a grid of block sizes x depths x backends.

#include <array>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tierswap/detail/file.hpp"
#include "tierswap/io_engine.hpp"
#include "tierswap/service.hpp"
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
  std::string service;      // a node service's socket: measure through it
  std::string buffer_file;  // the ring: this file's first bytes, mapped shared
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
  std::uint32_t submit_batch = IoEngineConfig{}.submit_batch;
  std::set<std::string> given;  // the engine's options given on the command line
};

// The engine options that, when not given, come from the environment as every tierswap engine's.
constexpr std::array<const char*, 5> kEngineOptions = {"--backend", "--block-size", "--queue-depth",
                                                       "--sqpoll", "--submit-batch"};

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

// --block-size as a request size the engine takes (its rule, named by the option).
std::uint64_t block_size_of(const BenchIoOptions& o) {
  IoEngineConfig c;
  c.block_size = parse_size(o.block_size, "--block-size");
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("--block-size {}: {}", o.block_size, e.what()));
  }
  return c.block_size;
}

// Without --sweep, one setting: the engine's as every tierswap engine starts (TIERSWAP_IO_CONFIG,
// then the TIERSWAP_* variables: so it measures what `tierswap tune` chose), the options given
// over it. Through the service only the request size and depth are the client's.
IoCombo single_combo(const BenchIoOptions& o) {
  const IoEngineConfig env = IoEngineConfig::from_env();
  IoCombo c{env.backend, env.block_size, env.queue_depth, env.sqpoll, env.submit_batch, env};
  if (!o.service.empty()) c = {.block = env.block_size, .depth = env.queue_depth};
  auto given = [&](const char* option) { return o.given.count(option) > 0; };
  if (given("--backend")) c.backend = parse_backend(o.backend);
  if (given("--block-size")) c.block = block_size_of(o);
  if (given("--queue-depth")) c.depth = o.queue_depth;
  if (given("--sqpoll")) c.sqpoll = o.sqpoll;
  if (given("--submit-batch")) c.submit_batch = o.submit_batch;
  return c;
}

std::vector<IoCombo> combos_of(const BenchIoOptions& o) {
  std::vector<IoCombo> combos;
  if (!o.sweep) return {single_combo(o)};
  // ds_nvme_tune sweeps {1M, 8M} x {32, 128}; this grid covers it and more.
  for (auto b : {IoBackendKind::uring, IoBackendKind::aio, IoBackendKind::posix})
    for (std::uint64_t bs : {128 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 8 * MiB})
      for (std::uint32_t d : {8u, 32u, 128u})
        combos.push_back({b, bs, d, o.sqpoll, o.submit_batch});
  return combos;
}

// The best combination per direction: printed, and under "best" in `out`.
void report_best(const BenchIoOptions& o, const std::vector<IoRun>& runs,
                 const std::vector<IoCombo>& combos, nlohmann::json& out) {
  for (const bool write : {true, false}) {
    if (o.mode == (write ? "read" : "write")) continue;
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

// --service: the options that belong to the service's own engine and drives are refused.
void check_service_options(const BenchIoOptions& o) {
  const char* bad = !o.dirs.empty()                                   ? "--dir"
                    : o.sweep                                         ? "--sweep"
                    : o.keep                                          ? "--keep"
                    : !o.buffer_file.empty()                          ? "--buffer-file"
                    : o.sqpoll                                        ? "--sqpoll"
                    : o.backend != "auto"                             ? "--backend"
                    : o.direct != "auto"                              ? "--direct"
                    : o.stripe_size != "1MiB"                         ? "--stripe-size"
                    : o.submit_batch != IoEngineConfig{}.submit_batch ? "--submit-batch"
                                                                      : nullptr;
  if (bad)
    throw std::invalid_argument(fmt::format(
        "--service with {}: the service's drives and engine are its own (set them on `tierswap "
        "serve`)",
        bad));
}

// Each combination through the node service: a fresh raw client (job bench-io-PID) whose region
// holds `size` bytes and whose locked shared memory holds the ring, released at the end.
SweepOptions::Target open_service_target(const BenchIoOptions& o, std::uint64_t size,
                                         const IoCombo& c, std::uint64_t ring_bytes) {
  struct Held {
    TempDir manifests{"tierswap-bench-io"};
    std::unique_ptr<ServiceStorage> storage;
  };
  auto h = std::make_shared<Held>();
  ServiceClientConfig cfg;
  cfg.socket = o.service;
  cfg.job = fmt::format("bench-io-{}", ::getpid());
  cfg.memory_bytes = (ring_bytes + 4095) / 4096 * 4096;
  cfg.region_bytes = size;
  h->storage = std::make_unique<ServiceStorage>(cfg, h->manifests.path, c.config());
  h->storage->release_on_close();
  std::byte* ring = h->storage->engine().allocate_shared(ring_bytes, /*locked=*/true);
  if (ring == nullptr)
    throw std::runtime_error(fmt::format("bench io --service: no {} of shared memory for the ring",
                                         format_bytes(ring_bytes)));
  return {&h->storage->engine(), ring, h};
}

// --buffer-file: the first `bytes` of an existing file, mapped shared and read-write, with its
// pages where they already are (a file in /dev/shm written before: the same physical pages for
// every process that maps it, as a shared-memory tensor a caller hands in).
class MappedFile {
 public:
  MappedFile(const std::string& path, std::uint64_t bytes) : bytes_(bytes) {
    const detail::File f = open_file(path);
    struct stat st {};
    if (::fstat(f.fd(), &st) != 0) fail(path, "cannot stat it", errno);
    if (!S_ISREG(st.st_mode) || static_cast<std::uint64_t>(st.st_size) < bytes)
      throw std::invalid_argument(
          fmt::format("--buffer-file {}: {}; the ring needs {} ({} B)", path,
                      S_ISREG(st.st_mode) ? fmt::format("it holds {} B", st.st_size)
                                          : std::string("not a regular file"),
                      format_bytes(bytes), bytes));
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, f.fd(), 0);
    if (p == MAP_FAILED) fail(path, "cannot map it", errno);
    data_ = static_cast<std::byte*>(p);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() { ::munmap(data_, bytes_); }
  std::span<std::byte> span() const { return {data_, bytes_}; }

 private:
  static detail::File open_file(const std::string& path) {
    try {
      return detail::File::open(path, O_RDWR);
    } catch (const std::system_error& e) {
      fail(path, "cannot open it", e.code().value());
    }
  }
  [[noreturn]] static void fail(const std::string& path, const char* what, int err) {
    throw std::invalid_argument(
        fmt::format("--buffer-file {}: {} ({})", path, what, std::strerror(err)));
  }
  std::byte* data_ = nullptr;
  std::uint64_t bytes_ = 0;
};

struct Measured {
  std::vector<IoRun> runs;
  std::string description;  // the engine's backend
  nlohmann::json storage;   // where the bytes went
};

SweepOptions sweep_options(const BenchIoOptions& o, std::uint64_t size, Measured& m,
                           std::function<void()> header) {
  SweepOptions so;
  so.size = size;
  so.runs = o.runs;
  so.write = o.mode != "read";
  so.read = o.mode != "write";
  so.on_engine = [&o, &m, header](const IoEngine& engine, bool registered) {
    m.description = engine.backend_description();
    if (o.json || o.sweep) return;
    header();
    fmt::print("backend: {}{}\n", m.description,
               registered ? ", benchmark buffers registered" : "");
    if (const std::string file = IoEngineConfig::file_from_env(); !file.empty())
      fmt::print("settings: TIERSWAP_IO_CONFIG={}, under the options given\n", file);
  };
  if (o.sweep && !o.json) so.progress = print_progress;
  return so;
}

Measured measure_local(const BenchIoOptions& o, std::uint64_t size,
                       const std::vector<IoCombo>& combos) {
  std::vector<std::unique_ptr<TempDir>> temps;
  bool created = true;
  SwapSpace space = open_space(o, size, temps, &created);
  const SwapFilesGuard files(space, o.keep);
  Measured m;
  SweepOptions so = sweep_options(o, size, m, [&] {
    fmt::print("tierswap bench io: {} of {} in {} file(s), stripe {}\n", format_bytes(size),
               space.all_direct() ? "O_DIRECT" : "buffered", space.files().size(),
               format_bytes(space.stripe_size()));
  });
  so.space_is_new = created;
  std::optional<MappedFile> buffer;
  if (!o.buffer_file.empty()) {
    buffer.emplace(o.buffer_file, ring_bytes(combos));
    so.ring_memory = buffer->span();
  }
  m.runs = sweep(space, combos, so);
  m.storage = {{"direct_io", space.all_direct()}, {"files", space.files().size()}};
  return m;
}

Measured measure_service(const BenchIoOptions& o, std::uint64_t size,
                         const std::vector<IoCombo>& combos) {
  check_service_options(o);
  Measured m;
  SweepOptions so = sweep_options(o, size, m, [&] {
    fmt::print("tierswap bench io: {} through the node service at {}\n", format_bytes(size),
               o.service);
  });
  so.open = [&](const IoCombo& c, std::uint64_t ring_bytes) {
    return open_service_target(o, size, c, ring_bytes);
  };
  m.runs = sweep_targets(combos, so);
  m.storage = {{"service", o.service}};
  return m;
}

void run_bench_io(const BenchIoOptions& o) {
  const std::uint64_t size = parse_size(o.size, "--size");
  if (size == 0) throw std::invalid_argument("--size must be > 0");
  if (o.runs < 1) throw std::invalid_argument(fmt::format("--runs={}: must be >= 1", o.runs));
  if (o.mode != "read" && o.mode != "write" && o.mode != "both")
    throw std::invalid_argument(fmt::format("--mode={}: expected read, write or both", o.mode));
  const auto combos = combos_of(o);
  const Measured m =
      o.service.empty() ? measure_local(o, size, combos) : measure_service(o, size, combos);

  nlohmann::json out = m.storage;
  out["runs"] = nlohmann::json::array();
  for (const auto& r : m.runs) out["runs"].push_back(r.to_json());
  if (!o.json && !o.sweep) {
    print_run_header();
    for (const auto& r : m.runs) print_run_row(r.run, r);
  }
  report_best(o, m.runs, combos, out);
  if (o.sweep && !o.json) {
    print_run_header();
    int i = 0;
    for (const auto& r : m.runs) print_run_row(++i, r);
  }
  out["backend_description"] = m.description;
  const std::string file = IoEngineConfig::file_from_env();
  out["io_config"] = !file.empty() && !o.sweep ? nlohmann::json(file) : nullptr;
  if (o.json) fmt::print("{}\n", out.dump(2));
}

}  // namespace

void add_bench_io(CLI::App& bench) {
  auto opts = std::make_shared<BenchIoOptions>();
  auto* io =
      bench.add_subcommand("io", "Swap I/O throughput through the engine (write, then read)");
  io->add_option("--dir", opts->dirs,
                 "Swap directory, once per drive (default: a temporary directory under $TMPDIR "
                 "or /var/tmp)")
      ->check(CLI::ExistingDirectory);
  io->add_option("--service", opts->service,
                 "Measure through the node service at this socket (a raw client of its own: the "
                 "service's drives and engine; --block-size and --queue-depth are the client's)");
  io->add_option("--buffer-file", opts->buffer_file,
                 "Move the data through this existing file's first block-size x queue-depth "
                 "bytes, mapped shared, its pages as they are (e.g. a file in /dev/shm: the same "
                 "physical pages as another program given that file)");
  io->add_option("--size", opts->size, "Bytes to move per phase (suffixes: KiB, MiB, GiB)")
      ->capture_default_str();
  io->add_option("--block-size", opts->block_size,
                 "Request size (when not given, and for --queue-depth, --backend, --sqpoll and "
                 "--submit-batch: the engine's setting from TIERSWAP_IO_CONFIG and the TIERSWAP_* "
                 "variables, as every tierswap engine reads them; else the default shown)")
      ->capture_default_str();
  io->add_option("--queue-depth", opts->queue_depth, "Requests in flight")
      ->capture_default_str()
      ->check(CLI::Range(1u, 4096u));
  io->add_option("--backend", opts->backend, "auto|uring|aio|posix")->capture_default_str();
  io->add_option("--mode", opts->mode, "read|write|both")->capture_default_str();
  io->add_option("--runs", opts->runs, "Repetitions")->capture_default_str();
  io->add_option("--stripe-size", opts->stripe_size, "Stripe unit across --dir files")
      ->capture_default_str();
  io->add_option("--direct", opts->direct, "O_DIRECT: auto|on|off")->capture_default_str();
  io->add_flag("--sqpoll", opts->sqpoll, "io_uring SQPOLL thread");
  io->add_option("--submit-batch", opts->submit_batch,
                 "Requests per submission system call (0: all ready at once; from 3 on Linux "
                 "merges requests adjacent on disk)")
      ->capture_default_str()
      ->check(CLI::Range(0, 4096));
  io->add_flag("--sweep", opts->sweep,
               "Grid of block sizes x depths x backends; prints the best configuration");
  io->add_flag("--keep", opts->keep,
               "Leave the swap file in --dir, and reuse one left there (its data too: a --mode "
               "read run then reads what an earlier --mode write run wrote)");
  io->add_flag("--json", opts->json, "Print every run's figures as JSON on stdout");
  io->callback([opts, io] {
    for (const char* option : kEngineOptions)
      if (io->count(option) > 0) opts->given.insert(option);
    run_bench_io(*opts);
  });
}

}  // namespace tierswap::cli
