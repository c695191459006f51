// Subcommand registration for the tierswap CLI (probe lives beside plan in plan.cpp; every other
// command has a file of its own).
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace tierswap::cli {

/// A failure that exits with `status` instead of 1 (main prints what()): `tierswap serve` exits
/// with kExitNeedsOperator when its configuration or files are wrong, which the systemd unit does
/// not restart (RestartPreventExitStatus), so Restart=on-failure does not loop on them.
struct ExitStatus : std::runtime_error {
  int status;
  ExitStatus(int s, const std::string& what) : std::runtime_error(what), status(s) {}
};
inline constexpr int kExitNeedsOperator = 78;  // EX_CONFIG of sysexits.h

/// The help of every `--params` (read by parse_param_count: decimal, as model sizes are named).
inline constexpr const char* kParamsHelp = "Parameters (decimal suffixes K, M, B, T: 350M = 350e6)";

/// An output file's check at parse time (before a long measurement): its directory exists.
inline const CLI::Validator kOutputFile(
    [](std::string& path) -> std::string {
      const std::filesystem::path dir = std::filesystem::path(path).parent_path();
      std::error_code ec;
      if (dir.empty() || std::filesystem::is_directory(dir, ec)) return {};
      return path + ": its directory " + dir.string() + " does not exist";
    },
    "FILE");

/// A duration option's check: a finite number of seconds, above 0 (or from 0 with `zero_ok`).
inline CLI::Validator seconds_validator(bool zero_ok) {
  return CLI::Validator(
      [zero_ok](std::string& v) -> std::string {
        double x = 0;
        const bool ok =
            CLI::detail::lexical_cast(v, x) && std::isfinite(x) && (zero_ok ? x >= 0 : x > 0);
        return ok ? ""
                  : "'" + v + "': expected a number of seconds " + (zero_ok ? "from 0" : "above 0");
      },
      "SECONDS");
}

/// `tierswap bench io ...`
void add_bench_io(CLI::App& bench);
/// `tierswap bench kernels ...`
void add_bench_kernels(CLI::App& bench);
/// `tierswap bench tier ...`
void add_bench_tier(CLI::App& bench);
void add_bench_step(CLI::App& bench);
/// `tierswap bench resume ...`
void add_bench_resume(CLI::App& bench);
/// `tierswap ps`
void add_ps(CLI::App& app);
/// `tierswap residency ...`
void add_residency(CLI::App& app);
/// `tierswap demo ...` (the embedded default main job)
void add_demo(CLI::App& app);
/// `tierswap plan ...` and `tierswap probe ...` (placement)
void add_plan(CLI::App& app);
void add_probe(CLI::App& app);
/// `tierswap tune --dir DIR ...` (the I/O engine's best setting for these drives)
void add_tune(CLI::App& app);
/// `tierswap serve ...` (the node service)
void add_serve(CLI::App& app);
/// `tierswap release JOB.RANK` (forget a node-service client)
void add_release(CLI::App& app);
/// `tierswap config --from-deepspeed FILE`
void add_config(CLI::App& app);
/// Prints a residency snapshot (the telemetry JSON) as tables; a node service's answer as its
/// clients, one row each (print_service).
void print_residency(const std::string& json, std::FILE* out);

}  // namespace tierswap::cli
