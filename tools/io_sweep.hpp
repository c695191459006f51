// The engine measured over a grid of settings, shared by `tierswap bench io` and `tierswap tune`:
// each combination (backend, request size, depth, SQPOLL) writes then reads the same bytes of one
// swap space through a fresh engine, `runs` times; the best combination per direction is the one
// with the highest median GB/s.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tierswap/io_engine.hpp"
#include "tierswap/swap_space.hpp"

namespace tierswap::cli {

struct IoCombo {
  IoBackendKind backend = IoBackendKind::uring;
  std::uint64_t block = 0;
  std::uint32_t depth = 0;
  bool sqpoll = false;
  std::uint32_t submit_batch = IoEngineConfig{}.submit_batch;  ///< requests per system call
  IoEngineConfig base{};          ///< every other setting (bench io: the environment's)
  IoEngineConfig config() const;  ///< this combination as an engine config
  std::string label() const;      ///< "io_uring 1 MiB qd32 sqpoll"
};

/// One timed phase (all of `bytes` in one direction) of one combination.
struct IoRun {
  IoCombo combo;
  std::string backend;  ///< the engine's own name of the backend it ran on
  bool write = false;
  int run = 0;  ///< 1-based repetition
  std::uint64_t bytes = 0;
  double seconds = 0;
  double cpu_seconds = 0;  ///< this process's user + system CPU over the phase
  IoStats io;              ///< the engine's counters for this phase alone
  double gbps() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }
  double cpu_s_per_gib() const;
  nlohmann::json to_json() const;
};

struct SweepOptions {
  std::uint64_t size = 0;  ///< bytes per phase
  int runs = 1;
  bool write = true, read = true;
  /// A read-only sweep over a space that holds no data yet writes it first (not reported).
  bool space_is_new = true;
  /// sweep(): the memory the ring is carved from (at least the largest block x depth), as it is:
  /// a caller's buffer (`bench io --buffer-file`) whose pages are already placed. Empty: a ring
  /// of the sweep's own, registered before it is first written.
  std::span<std::byte> ring_memory;
  /// Called after each repetition of each combination (for progress).
  std::function<void(std::size_t done, std::size_t total, const IoCombo&)> progress;
  /// Called once per combination, with the engine built for it, before its first run.
  std::function<void(const IoEngine&, bool registered)> on_engine;
  /// Called for a combination whose engine cannot be built (a backend this kernel or build does
  /// not offer); without it that error ends the sweep.
  std::function<void(const IoCombo&, const std::string& why)> on_skip;
  /// What a combination runs on: an engine and a ring of depth x block bytes it moves data
  /// through, both kept alive by `keep`.
  struct Target {
    IoEngine* engine = nullptr;
    std::byte* ring = nullptr;
    std::shared_ptr<void> keep;
  };
  /// sweep_targets(): builds each combination's target, whose storage holds no data yet.
  std::function<Target(const IoCombo&, std::uint64_t ring_bytes)> open;
};

/// The ring a sweep of `combos` moves data through: the largest block x depth.
std::uint64_t ring_bytes(const std::vector<IoCombo>& combos);

/// Runs every combination `runs` times on `space`; the runs in order.
std::vector<IoRun> sweep(const SwapSpace& space, const std::vector<IoCombo>& combos,
                         const SweepOptions& opt);

/// The same over targets opt.open builds (`bench io --service`: an engine through the node
/// service, its ring in the shared memory), each filled before its runs.
std::vector<IoRun> sweep_targets(const std::vector<IoCombo>& combos, const SweepOptions& opt);

/// The median GB/s of one combination's runs in one direction (nullopt when it has none).
std::optional<double> median_gbps(const std::vector<IoRun>& runs, const IoCombo& c, bool write);

struct IoBest {
  IoCombo combo;
  double gbps = 0;  ///< median
};
/// The combination with the highest median GB/s in one direction.
std::optional<IoBest> best_for(const std::vector<IoRun>& runs, const std::vector<IoCombo>& combos,
                               bool write);

/// A progress line on stderr: a bar redrawn in place on a terminal, else one line per call.
void print_progress(std::size_t done, std::size_t total, const IoCombo& c);

void print_run_header();
void print_run_row(int index, const IoRun& r);

bool operator==(const IoCombo& a, const IoCombo& b);

}  // namespace tierswap::cli
