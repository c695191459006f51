// Subcommand registration for the tierswap CLI; each command lives in its own file.
#pragma once

#include <CLI/CLI.hpp>

namespace tierswap::cli {

/// `tierswap bench io ...`
void add_bench_io(CLI::App& bench);
/// `tierswap bench kernels ...`
void add_bench_kernels(CLI::App& bench);

}  // namespace tierswap::cli
