// `tierswap tune`: finds the I/O engine's best setting for the drives of a swap space (what
// DeepSpeed's ds_nvme_tune does for its aio handle). It sweeps backend x request size x depth
// (x SQPOLL) over a swap space striped across --dir, writing then reading the same bytes each
// time, chooses the setting that moves equal bytes each way fastest (the harmonic mean of the
// median write and read GB/s: a swap step reads and writes alike), and writes it as an
// IoEngineConfig JSON file that every engine loads when TIERSWAP_IO_CONFIG names it. The sweep is
// drawn as a PNG by src/python/tierswap/plot_tune.py (embedded; matplotlib).
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "tierswap/swap_space.hpp"
#include "tierswap/units.hpp"
#include "tools/commands.hpp"
#include "tools/io_sweep.hpp"
#include "tools/temp_dir.hpp"

#include <fmt/format.h>

namespace tierswap::cli {

/// The text of src/python/tierswap/plot_tune.py (generated/tune_plot.cpp).
extern const char* const kPlotTuneScript;

namespace {

struct TuneOptions {
  std::vector<std::string> dirs;
  std::string size = "512MiB";
  int runs = 3;
  std::vector<std::string> backends = {"uring", "aio", "posix"};
  std::vector<std::string> block_sizes = {"256KiB", "1MiB", "4MiB"};
  std::vector<std::uint32_t> depths = {8, 32, 128};
  bool sqpoll = false;
  std::string out = "tierswap-io.json";
  std::string plot;  // default: --out with .png
  bool no_plot = false;
  bool json = false;
};

// One setting's medians; swap GB/s moves equal bytes each way (harmonic mean).
struct Scored {
  IoCombo combo;
  double write = 0, read = 0;
  double swap() const { return write > 0 && read > 0 ? 2 / (1 / write + 1 / read) : 0; }
};

std::vector<IoCombo> grid(const TuneOptions& o) {
  std::vector<IoCombo> out;
  for (const auto& b : o.backends) {
    const IoBackendKind kind = parse_backend(b);
    if (kind == IoBackendKind::automatic)
      throw std::invalid_argument("--backends: name backends (uring, aio, posix), not auto");
    for (const auto& bs : o.block_sizes) {
      const std::uint64_t block = parse_size(bs, "--block-sizes");
      for (std::uint32_t d : o.depths) {
        IoCombo c{kind, block, d, false};
        c.config().validate();  // names a size or depth out of range before anything runs
        out.push_back(c);
        if (o.sqpoll && kind == IoBackendKind::uring) out.push_back({kind, block, d, true});
      }
    }
  }
  if (out.empty()) throw std::invalid_argument("tune: nothing to sweep");
  return out;
}

std::vector<Scored> score(const std::vector<IoRun>& runs, const std::vector<IoCombo>& combos) {
  std::vector<Scored> out;
  for (const auto& c : combos) {
    const auto w = median_gbps(runs, c, true), r = median_gbps(runs, c, false);
    if (w && r) out.push_back({c, *w, *r});
  }
  return out;
}

nlohmann::json setting_json(const Scored& s) {
  return {{"backend", to_string(s.combo.backend)},  // as parse_backend reads it back
          {"block_size", s.combo.block},
          {"queue_depth", s.combo.depth},
          {"sqpoll", s.combo.sqpoll},
          {"write_gbps", s.write},
          {"read_gbps", s.read},
          {"swap_gbps", s.swap()}};
}

// The chosen setting as an IoEngineConfig file (IoEngineConfig::from_json reads it back), written
// to a temporary name and renamed: an existing file is replaced whole or not at all.
void write_config(const std::string& path, const Scored& s) {
  const nlohmann::json j = {{"backend", to_string(s.combo.backend)},
                            {"block_size", s.combo.block},
                            {"queue_depth", s.combo.depth},
                            {"sqpoll", s.combo.sqpoll}};
  const std::string text = j.dump(2) + "\n";
  IoEngineConfig::from_json(text);  // what the engine will read
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << text;
    f.flush();
    if (!f) throw std::runtime_error(fmt::format("--out {}: cannot write {}", path, tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw std::runtime_error(fmt::format("--out {}: cannot write it: {}", path, ec.message()));
  }
}

// Runs the embedded plot script on the sweep's JSON; a reason on failure (matplotlib missing).
std::optional<std::string> draw(const nlohmann::json& sweep, const std::string& png) {
  TempDir tmp("tierswap-tune");
  const auto json_path = tmp.path / "sweep.json";
  const auto script = tmp.path / "plot_tune.py";
  std::ofstream(json_path) << sweep.dump();
  std::ofstream(script) << kPlotTuneScript;
  const char* python = ::access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
  const std::string cmd =
      fmt::format("'{}' '{}' '{}' '{}' 2>&1", python, script.string(), json_path.string(), png);
  if (png.find('\'') != std::string::npos) return "the plot path contains a quote";
  std::FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return "cannot start " + std::string(python);
  std::string output;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p) != nullptr) output += buf;
  const int status = ::pclose(p);
  if (status == 0) return std::nullopt;
  if (output.find("No module named 'matplotlib'") != std::string::npos)
    return "matplotlib is not installed (Debian: apt-get install python3-matplotlib)";
  return output.empty() ? "the plot script failed" : output;
}

void print_settings(const std::vector<Scored>& scored, const Scored& chosen) {
  fmt::print("{:<9} {:>9} {:>6} {:>7} {:>11} {:>10} {:>10}\n", "backend", "block", "depth",
             "sqpoll", "write GB/s", "read GB/s", "swap GB/s");
  for (const auto& s : scored)
    fmt::print("{:<9} {:>9} {:>6} {:>7} {:>11.3f} {:>10.3f} {:>10.3f}{}\n",
               to_string(s.combo.backend), format_bytes(s.combo.block), s.combo.depth,
               s.combo.sqpoll ? "on" : "off", s.write, s.read, s.swap(),
               s.combo == chosen.combo ? "  <- chosen" : "");
}

// The sweep's plot beside the config file (or at --plot: then a failure is an error), its path
// into `out`.
void plot(const TuneOptions& o, nlohmann::json& out) {
  const std::string png =
      o.plot.empty() ? std::filesystem::path(o.out).replace_extension(".png").string() : o.plot;
  if (const auto why = draw(out, png)) {
    if (!o.plot.empty()) throw std::runtime_error(fmt::format("--plot {}: {}", png, *why));
    fmt::print(stderr, "tune: no plot: {}\n", *why);
  } else {
    out["plot"] = std::filesystem::absolute(png).string();
  }
}

// The swap space the sweep runs on: striped across --dir as the engine's will be (the stripe
// and O_DIRECT mode from TIERSWAP_STRIPE_SIZE / TIERSWAP_DIRECT_IO), so no request crosses one.
SwapSpace tune_space(const TuneOptions& o, std::uint64_t size) {
  SwapSpaceConfig sc = SwapSpaceConfig::from_env();
  sc.dirs.clear();
  for (const auto& d : o.dirs) sc.dirs.emplace_back(d);
  sc.capacity = size;
  return SwapSpace::create(sc);
}

void run_tune(const TuneOptions& o) {
  if (o.dirs.empty()) throw std::invalid_argument("tune: give --dir (once per drive)");
  if (o.runs < 1) throw std::invalid_argument(fmt::format("--runs={}: must be >= 1", o.runs));
  const std::uint64_t size = parse_size(o.size, "--size");
  if (size == 0) throw std::invalid_argument("--size must be > 0");
  const auto combos = grid(o);
  SwapSpace space = tune_space(o, size);
  const SwapFilesGuard files(space);

  SweepOptions so;
  so.size = size;
  so.runs = o.runs;
  so.progress = print_progress;
  nlohmann::json skipped = nlohmann::json::array();
  so.on_skip = [&](const IoCombo& c, const std::string& why) {
    fmt::print(stderr, "tune: skipping {}: {}\n", c.label(), why);
    skipped.push_back({{"setting", c.label()}, {"why", why}});
  };
  if (!o.json)
    fmt::print(stderr, "tune: {} settings x {} runs, {} written then read each, on {}{}\n",
               combos.size(), o.runs, format_bytes(size), fmt::join(o.dirs, ", "),
               space.all_direct() ? " (O_DIRECT)" : " (buffered: O_DIRECT unsupported here)");
  const auto runs = sweep(space, combos, so);
  const auto scored = score(runs, combos);
  if (scored.empty()) throw std::runtime_error("tune: no setting could run (see the lines above)");
  Scored chosen = scored.front();
  for (const auto& s : scored)
    if (s.swap() > chosen.swap()) chosen = s;

  nlohmann::json out = {{"dirs", o.dirs},
                        {"size", size},
                        {"runs_per_setting", o.runs},
                        {"direct_io", space.all_direct()},
                        {"runs", nlohmann::json::array()},
                        {"settings", nlohmann::json::array()},
                        {"skipped", skipped},
                        {"chosen", setting_json(chosen)}};
  for (const auto& r : runs) out["runs"].push_back(r.to_json());
  for (const auto& s : scored) out["settings"].push_back(setting_json(s));
  write_config(o.out, chosen);
  out["config_file"] = std::filesystem::absolute(o.out).string();
  if (!o.no_plot) plot(o, out);
  if (o.json) {
    fmt::print("{}\n", out.dump(2));
    return;
  }
  print_settings(scored, chosen);
  fmt::print("best: {} ({:.3f} GB/s write, {:.3f} read, {:.3f} swap; medians of {})\n",
             chosen.combo.label(), chosen.write, chosen.read, chosen.swap(), o.runs);
  fmt::print("wrote {}{}\nuse it: export TIERSWAP_IO_CONFIG={}\n",
             out["config_file"].get<std::string>(),
             out.contains("plot") ? " and " + out["plot"].get<std::string>() : "",
             out["config_file"].get<std::string>());
}

}  // namespace

void add_tune(CLI::App& app) {
  auto o = std::make_shared<TuneOptions>();
  auto* c = app.add_subcommand(
      "tune",
      "Sweep the I/O engine's settings on these drives and write the best as a config file");
  c->add_option("--dir", o->dirs, "Swap directory, once per drive (striped as the swap space is)")
      ->required()
      ->check(CLI::ExistingDirectory);
  c->add_option("--size", o->size, "Bytes written then read per run")->capture_default_str();
  c->add_option("--runs", o->runs, "Runs per setting (medians)")->capture_default_str();
  c->add_option("--backends", o->backends, "Backends to sweep (uring, aio, posix)")
      ->delimiter(',')
      ->capture_default_str();
  c->add_option("--block-sizes", o->block_sizes, "Request sizes to sweep")
      ->delimiter(',')
      ->capture_default_str();
  c->add_option("--depths", o->depths, "Queue depths to sweep")
      ->delimiter(',')
      ->capture_default_str();
  c->add_flag("--sqpoll", o->sqpoll, "Also sweep io_uring with an SQPOLL thread");
  c->add_option("--out", o->out, "The config file to write (IoEngineConfig JSON)")
      ->capture_default_str()
      ->check(kOutputFile);
  c->add_option("--plot", o->plot, "The PNG plot (default: --out with .png)")->check(kOutputFile);
  c->add_flag("--no-plot", o->no_plot, "Do not draw the plot");
  c->add_flag("--json", o->json, "Print the sweep and the choice as JSON on stdout");
  c->callback([o] { run_tune(*o); });
}

}  // namespace tierswap::cli
