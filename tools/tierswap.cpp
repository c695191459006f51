// tierswap: command-line entry point.
#include <cstdio>
#include <exception>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tierswap/device.hpp"
#include "tierswap/io_engine.hpp"
#include "tierswap/kernels.hpp"
#include "tools/commands.hpp"

#include <fmt/format.h>

namespace {
// The names of the CPU kernel sets this CPU and this build can run.
std::vector<std::string> runnable_isas() {
  std::vector<std::string> out;
  for (tierswap::CpuIsa i : tierswap::supported_cpu_isas())
    out.emplace_back(tierswap::to_string(i));
  return out;
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tierswap: NVMe-tiered memory manager and swap engine for large-model training"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("tierswap 0.1.0"));

  auto* info = app.add_subcommand("info", "Show what this machine offers: GPU, CPU kernels");
  bool info_json = false;
  info->add_flag("--json", info_json, "Print JSON on stdout instead of text");
  info->callback([&] {
    const auto& d = tierswap::device_info();
    nlohmann::json j{{"cuda_compiled", d.compiled_with_cuda},
                     {"gpu_available", d.available},
                     {"gpu_count", d.device_count},
                     {"gpu_name", d.name},
                     {"gpu_reason", d.reason},
                     {"cpu_isa", tierswap::to_string(tierswap::default_cpu_isa())},
                     {"cpu_isas", runnable_isas()}};
    if (info_json) {
      fmt::print("{}\n", j.dump(2));
      return;
    }
    fmt::print("CUDA compiled in: {}\n", d.compiled_with_cuda ? "yes" : "no");
    if (d.available)
      fmt::print("GPU: {} device(s), first: {}\n", d.device_count, d.name);
    else
      fmt::print("GPU: none ({}); CPU paths are used\n", d.reason);
    fmt::print("CPU kernels: {} (this CPU and build run: {})\n", j["cpu_isa"].get<std::string>(),
               fmt::join(runnable_isas(), ", "));
  });

  auto* bench = app.add_subcommand("bench", "Benchmarks: io, kernels, tier, step, resume");
  bench->require_subcommand(1);
  tierswap::cli::add_bench_io(*bench);
  tierswap::cli::add_bench_kernels(*bench);
  tierswap::cli::add_bench_tier(*bench);
  tierswap::cli::add_bench_step(*bench);
  tierswap::cli::add_bench_resume(*bench);
  tierswap::cli::add_demo(app);
  tierswap::cli::add_ps(app);
  tierswap::cli::add_residency(app);
  tierswap::cli::add_plan(app);
  tierswap::cli::add_probe(app);
  tierswap::cli::add_config(app);
  tierswap::cli::add_tune(app);
  tierswap::cli::add_serve(app);
  tierswap::cli::add_release(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const tierswap::cli::ExitStatus& e) {
    fmt::print(stderr, "tierswap: error: {}\n", e.what());
    return e.status;
  } catch (const std::exception& e) {
    fmt::print(stderr, "tierswap: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
