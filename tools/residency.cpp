// `tierswap ps` and `tierswap residency`: where every byte of a live process is (through its
// telemetry socket), or what a swap directory's manifest records (offline, checksums verified).
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "tierswap/io_engine.hpp"
#include "tierswap/swap_space.hpp"
#include "tierswap/telemetry.hpp"
#include "tierswap/tier_manager.hpp"
#include "tierswap/units.hpp"
#include "tools/commands.hpp"

#include <fmt/format.h>
#include "tierswap/detail/json.hpp"

namespace tierswap::cli {

namespace {

std::string bytes_of(const nlohmann::json& v) {
  return format_bytes(detail::json_int<std::uint64_t>(v));
}

// A field of a peer's answer: an integer of T's range (json_int: a float such as 1e300 is an
// error, not a cast out of range), 0 when absent.
template <class T>
T int_field(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  return it == j.end() ? T{0} : detail::json_int<T>(*it);
}

std::string bytes_field(const nlohmann::json& j, const char* key) {
  return format_bytes(int_field<std::uint64_t>(j, key));
}

}  // namespace

static void print_service(const nlohmann::json& j, std::FILE* out, const std::string& indent) {
  const auto clients = j.value("clients", nlohmann::json::array());
  fmt::print(out,
             "{}node service (pid {}): {} of {} shared memory granted (+ {} of {} pageable), {} "
             "client{} known\n",
             indent, int_field<int>(j, "pid"), bytes_field(j, "memory_granted"),
             bytes_field(j, "host_budget"), bytes_field(j, "pageable_granted"),
             bytes_field(j, "pageable_budget"), clients.size(), clients.size() == 1 ? "" : "s");
  if (j.contains("shared_memory_pages"))
    fmt::print(out, "{}  shared memory on {}\n", indent, j.value("shared_memory_pages", ""));
  for (const auto& c : clients)
    fmt::print(
        out, "{}  {}.{} ({}): {}, {} of NVMe, {}\n", indent, c.value("job", std::string()),
        int_field<std::uint32_t>(c, "rank"), c.value("raw", false) ? "tier manager" : "blocks",
        c.value("attached", false)
            ? fmt::format("pid {}, {} shared, {} read, {} written", int_field<int>(c, "pid"),
                          bytes_field(c, "memory_bytes"), bytes_field(c, "nvme_read_bytes"),
                          bytes_field(c, "nvme_written_bytes"))
        : c.contains("idle_seconds")
            ? fmt::format("detached for {}", format_duration(static_cast<double>(
                                                 int_field<std::uint64_t>(c, "idle_seconds"))))
            : std::string("detached"),
        bytes_field(c, "region_bytes"),
        c.contains("generation")  // a tier manager commits in its own manifest
            ? fmt::format("generation {}", int_field<std::uint64_t>(c, "generation"))
            : std::string("generations in its swap directory's manifest"));
}

namespace {

// "mlocked (64.00 MiB locked; pinned budget 64.00 MiB + pageable pool 8.00 MiB)": the host
// tier's capacity in its parts, where the snapshot has them (a live process).
std::string host_memory_text(const nlohmann::json& j) {
  std::string text = j.value("host_memory", std::string("-"));
  auto bytes = [&](const char* key) {
    return j.contains(key) ? detail::json_int<std::uint64_t>(j.at(key)) : std::uint64_t{0};
  };
  const std::uint64_t budget = bytes("host_budget_bytes"),
                      pageable = bytes("pageable_budget_bytes");
  if (budget == 0) return text;
  return fmt::format("{} ({} locked; pinned budget {}{})", text,
                     format_bytes(bytes("locked_host_bytes")), format_bytes(budget),
                     pageable > 0 ? " + pageable pool " + format_bytes(pageable) : std::string());
}

// The process, its generation, and a row per tier.
void print_tiers(const nlohmann::json& j, std::FILE* out) {
  const auto& g = j.at("generation");
  fmt::print(out, "{}; host memory {}; gpu tier {}; committed generation {}{}\n",
             j.at("pid").is_null() ? std::string("manifest (offline)")
                                   : fmt::format("pid {}", detail::json_int<int>(j.at("pid"))),
             host_memory_text(j),
             !j.value("device_tier", false)         ? "none"
             : j.at("simulated_device").get<bool>() ? "SIMULATED (host memory)"
                                                    : "GPU",
             detail::json_int<std::uint64_t>(g.at("committed")),
             g.at("checksums_verified").get<bool>() ? " (checksums verified)" : "");
  fmt::print(out, "\n{:<6} {:>12} {:>12} {:>12} {:>12} {:>12}\n", "tier", "capacity", "resident",
             "dirty", "in flight", "in use");
  for (auto& t : j.at("tiers")) {
    std::string name = t.at("tier").get<std::string>();
    if (name == "gpu" && j.at("simulated_device").get<bool>()) name = "gpu*";
    fmt::print(out, "{:<6} {:>12} {:>12} {:>12} {:>12} {:>12}\n", name,
               bytes_of(t.at("capacity_bytes")), bytes_of(t.at("resident_bytes")),
               bytes_of(t.at("dirty_bytes")), bytes_of(t.at("inflight_bytes")),
               t.contains("pinned_bytes") ? bytes_of(t.at("pinned_bytes")) : std::string("-"));
  }
  if (j.at("simulated_device").get<bool>())
    fmt::print(out,
               "(gpu* = simulated device tier: host memory with a capacity and a copy "
               "bandwidth)\n");
}

// Classes as rows, tiers as columns.
void print_classes(const nlohmann::json& j, std::FILE* out) {
  std::map<std::string, std::map<std::string, std::uint64_t>> by_class;
  for (auto& c : j.at("classes"))
    by_class[c.at("class").get<std::string>()][c.at("tier").get<std::string>()] +=
        detail::json_int<std::uint64_t>(c.at("bytes"));
  if (!by_class.empty()) {
    fmt::print(out, "\n{:<16} {:>12} {:>12} {:>12}\n", "class", "gpu", "host", "nvme");
    for (const auto& entry : by_class) {  // named, not bound: the lambda captures m
      const std::string& cls = entry.first;
      const auto& m = entry.second;
      auto cell = [&](const char* t) {
        auto it = m.find(t);
        return it == m.end() ? std::string("-") : format_bytes(it->second);
      };
      fmt::print(out, "{:<16} {:>12} {:>12} {:>12}\n", cls, cell("gpu"), cell("host"),
                 cell("nvme"));
    }
  }
}

// The traffic counters of a live process.
void print_counters(const nlohmann::json& j, std::FILE* out) {
  if (j.contains("counters") && j.at("counters").contains("tiers")) {
    const auto& c = j.at("counters");
    fmt::print(out, "\n{:<6} {:>12} {:>10} {:>12} {:>10}\n", "tier", "bytes in", "GB/s in",
               "bytes out", "GB/s out");
    for (auto& [name, t] : c.at("tiers").items())
      fmt::print(out, "{:<6} {:>12} {:>10.2f} {:>12} {:>10.2f}\n", name, bytes_of(t.at("bytes_in")),
                 t.at("gbps_in").get<double>(), bytes_of(t.at("bytes_out")),
                 t.at("gbps_out").get<double>());
    fmt::print(out,
               "stalls {} ({:.3f} s), prefetch hits {} misses {}, evictions {}, write-behind {}, "
               "commits {}, discards {}, in flight {}, queued prefetches {}\n",
               detail::json_int<std::uint64_t>(c.at("stalls")), c.at("stall_seconds").get<double>(),
               detail::json_int<std::uint64_t>(c.at("prefetch_hits")),
               detail::json_int<std::uint64_t>(c.at("prefetch_misses")),
               detail::json_int<std::uint64_t>(c.at("evictions")),
               detail::json_int<std::uint64_t>(c.at("write_behind")),
               detail::json_int<std::uint64_t>(c.at("commits")),
               detail::json_int<std::uint64_t>(c.at("discards")),
               detail::json_int<std::uint64_t>(c.at("inflight_ops")),
               detail::json_int<std::uint64_t>(c.at("queued_prefetches")));
  }
}

// Where each block of each sub-group is.
void print_subgroups(const nlohmann::json& j, std::FILE* out) {
  if (j.contains("subgroups")) {
    fmt::print(out, "\n{:<14} {:<28} {:<14} {:<5} {:>12} {:<8} {:<8} {:<8}\n", "rank/grp/sub",
               "block", "class", "dtype", "numel", "gpu", "host", "nvme");
    for (auto& sg : j.at("subgroups")) {
      const std::string who = fmt::format("{}/{}/{}", detail::json_int<int>(sg.at("rank")),
                                          detail::json_int<int>(sg.at("group")),
                                          detail::json_int<int>(sg.at("subgroup")));
      for (auto& b : sg.at("blocks"))
        fmt::print(out, "{:<14} {:<28} {:<14} {:<5} {:>12} {:<8} {:<8} {:<8}\n", who,
                   b.at("name").get<std::string>(), b.at("class").get<std::string>(),
                   b.at("dtype").get<std::string>(), detail::json_int<std::uint64_t>(b.at("numel")),
                   b.at("gpu").get<std::string>(), b.at("host").get<std::string>(),
                   b.at("nvme").get<std::string>());
    }
  }
}

}  // namespace

namespace {

// One source's document: a tier manager's snapshot or a service's status.
void print_document(const nlohmann::json& j, std::FILE* out) {
  if (j.is_object() && j.value("service", false)) return print_service(j, out, "");
  if (j.contains("error"))
    throw std::runtime_error("the process answered: " + j.at("error").get<std::string>());
  print_tiers(j, out);
  print_classes(j, out);
  print_counters(j, out);
  print_subgroups(j, out);
}

}  // namespace

void print_residency(const std::string& json_text, std::FILE* out) {
  const auto j = nlohmann::json::parse(json_text);
  if (!(j.is_object() && j.contains("sources"))) return print_document(j, out);
  const auto& sources = j.at("sources");  // several tier managers (or a service) in one process
  for (std::size_t i = 0; i < sources.size(); ++i) {
    fmt::print(out, "{}== {} of {} in process {} ==\n", i ? "\n" : "", i + 1, sources.size(),
               int_field<int>(j, "pid"));
    print_document(sources[i], out);
  }
}

namespace {

struct ResidencyOptions {
  std::string target;  // PID or socket path
  std::vector<std::string> swap_dirs;
  bool json = false;
  double watch = 0;
  double timeout = 10;  // seconds for a live process's snapshot
};

std::filesystem::path socket_for(const std::string& target) {
  if (!target.empty() && target.find_first_not_of("0123456789") == std::string::npos) {
    const auto p = default_runtime_dir() / (target + ".sock");
    if (!std::filesystem::exists(p))
      throw std::invalid_argument(fmt::format(
          "no tierswap telemetry socket for pid {} in {} (is it running, with telemetry on? "
          "`tierswap ps` lists live processes)",
          target, default_runtime_dir().string()));
    return p;
  }
  std::error_code ec;
  const auto st = std::filesystem::status(target, ec);
  if (!std::filesystem::exists(st))
    throw std::invalid_argument(fmt::format(
        "residency: {}: no such PID, socket or directory (`tierswap ps` lists live processes)",
        target));
  if (!std::filesystem::is_socket(st))
    throw std::invalid_argument(fmt::format(
        "residency: {} is not a socket: give a PID, a process's telemetry socket (`tierswap ps`) "
        "or a swap directory",
        target));
  return target;
}

std::string offline_snapshot(const std::vector<std::string>& dirs) {
  std::vector<std::filesystem::path> paths(dirs.begin(), dirs.end());
  const auto manifest = paths.front() / "tierswap.manifest";
  if (!std::filesystem::exists(manifest))
    throw std::invalid_argument(
        fmt::format("swap directory {}: no manifest ({}); nothing was committed there",
                    dirs.front(), manifest.string()));
  const ManifestInfo info = read_manifest(manifest);
  SwapSpace space = SwapSpace::open(paths);
  IoEngine engine(space, IoEngineConfig::from_env());
  TierConfig cfg;
  cfg.shadow_slots = info.shadow_slots;
  cfg.telemetry = false;
  cfg.lock_host_memory = false;
  cfg.device_mode = DeviceTierMode::off;
  cfg.verify_on_open = true;
  TierManager m(space, engine, cfg);  // reads and checks; writes nothing
  auto j = nlohmann::json::parse(m.snapshot().to_json());
  j["pid"] = nullptr;
  j["source"] = manifest.string();
  j["tiers"] = nlohmann::json::array({j["tiers"].back()});  // the nvme row: nothing is resident
  j["counters"] = nlohmann::json::object();                 // nothing has moved: no process
  return j.dump();
}

void run_residency(const ResidencyOptions& o) {
  std::vector<std::string> dirs = o.swap_dirs;
  if (!dirs.empty() && !o.target.empty())
    throw std::invalid_argument("residency: give a PID/socket or --swap-dir, not both");
  if (!o.target.empty() && std::filesystem::is_directory(o.target))
    dirs.push_back(o.target);  // a directory: a swap directory, as with --swap-dir
  if (!dirs.empty()) {
    const std::string snap = offline_snapshot(dirs);
    if (o.json)
      fmt::print("{}\n", nlohmann::json::parse(snap).dump(2));
    else
      print_residency(snap, stdout);
    return;
  }
  if (o.target.empty())
    throw std::invalid_argument("residency: give a PID or socket path, or --swap-dir DIR");
  const auto sock = socket_for(o.target);
  for (bool first = true;; first = false) {
    std::string snap;
    try {
      snap = query_telemetry(sock, o.timeout);
    } catch (const std::system_error& e) {
      if (first) throw;
      if (e.code().value() != ETIMEDOUT) {
        fmt::print(stderr, "tierswap residency: the process is gone ({})\n", e.what());
        return;
      }
      fmt::print(stderr, "tierswap residency: {} (still watching)\n", e.what());  // stopped?
      std::this_thread::sleep_for(std::chrono::duration<double>(o.watch));
      continue;
    }
    if (o.watch > 0 && !o.json) fmt::print("\x1b[H\x1b[2J");
    if (o.json)
      fmt::print("{}\n", nlohmann::json::parse(snap).dump(o.watch > 0 ? -1 : 2));
    else
      print_residency(snap, stdout);
    std::fflush(stdout);
    if (o.watch <= 0) return;
    std::this_thread::sleep_for(std::chrono::duration<double>(o.watch));
  }
}

// A process's line in `ps`: its node-service status (its clients: job.rank, pid, memory, NVMe
// region, generation) when it is a service, and why it gave none when it did not answer.
struct Listed {
  nlohmann::json service;  // null: not a service, or no answer
  std::string no_answer;   // empty: it answered
};

Listed ask_process(const std::filesystem::path& socket, double timeout) {
  std::string answer;
  try {
    answer = query_telemetry(socket, timeout);
  } catch (const std::exception& e) {
    return {nullptr, e.what()};
  }
  const auto j = nlohmann::json::parse(answer, nullptr, false);
  const auto sources =
      j.is_object() && j.contains("sources") ? j.at("sources") : nlohmann::json::array({j});
  for (const auto& s : sources)
    if (s.is_object() && s.value("service", false)) return {s, {}};
  return {};
}

// Every process listed, asked all at once: a stopped one costs the timeout once, not once each.
std::vector<Listed> ask_processes(const std::vector<LiveProcess>& live, double timeout) {
  std::vector<std::future<Listed>> asked;
  for (const auto& p : live)
    asked.push_back(std::async(std::launch::async, ask_process, p.socket, timeout));
  std::vector<Listed> out;
  for (auto& a : asked) out.push_back(a.get());
  return out;
}

}  // namespace

void add_ps(CLI::App& app) {
  auto* ps = app.add_subcommand("ps", "List live tierswap processes (telemetry sockets)");
  auto json = std::make_shared<bool>(false);
  auto timeout = std::make_shared<double>(10);
  ps->add_flag("--json", *json, "Print JSON on stdout instead of a table");
  ps->add_option("--timeout", *timeout,
                 "Seconds to wait for each process's status (a stopped one never answers)")
      ->capture_default_str();
  ps->callback([json, timeout] {
    if (!(*timeout > 0)) throw std::invalid_argument("--timeout: must be > 0 seconds");
    const auto dir = default_runtime_dir();
    const auto live = list_live_processes(dir);
    const auto listed = ask_processes(live, *timeout);
    if (*json) {
      auto arr = nlohmann::json::array();
      for (std::size_t i = 0; i < live.size(); ++i) {
        const auto& p = live[i];
        nlohmann::json e = {{"pid", p.pid}, {"socket", p.socket.string()}, {"command", p.command}};
        if (!listed[i].service.is_null()) e["service"] = listed[i].service;
        if (!listed[i].no_answer.empty()) e["no_answer"] = listed[i].no_answer;
        arr.push_back(std::move(e));
      }
      fmt::print("{}\n", nlohmann::json{{"runtime_dir", dir.string()}, {"processes", arr}}.dump(2));
      return;
    }
    if (live.empty()) {
      fmt::print("no live tierswap processes (runtime directory {})\n", dir.string());
      return;
    }
    fmt::print("{:>8}  {:<40}  {}\n", "PID", "SOCKET", "COMMAND");
    for (std::size_t i = 0; i < live.size(); ++i) {
      const auto& p = live[i];
      fmt::print("{:>8}  {:<40}  {}\n", p.pid, p.socket.string(), p.command);
      if (!listed[i].service.is_null()) print_service(listed[i].service, stdout, "          ");
      if (!listed[i].no_answer.empty()) fmt::print("          {}\n", listed[i].no_answer);
    }
  });
}

void add_residency(CLI::App& app) {
  auto o = std::make_shared<ResidencyOptions>();
  auto* r = app.add_subcommand(
      "residency", "Where every block is: a live process (PID or socket), or a swap directory");
  r->add_option("target", o->target,
                "PID of a live tierswap process, its socket path, or a swap directory");
  r->add_option("--swap-dir", o->swap_dirs,
                "Read a swap directory's manifest offline (repeat for striped spaces)");
  r->add_flag("--json", o->json, "Print JSON on stdout instead of tables");
  r->add_option("--watch", o->watch, "Refresh every SECONDS, like top (live processes)")
      ->expected(0, 1)
      ->default_str("1");
  r->add_option("--timeout", o->timeout,
                "Seconds to wait for a live process's snapshot (a stopped one never answers)")
      ->capture_default_str();
  r->callback([o] {
    if (o->watch < 0) throw std::invalid_argument("--watch: must be > 0 seconds");
    if (!(o->timeout > 0)) throw std::invalid_argument("--timeout: must be > 0 seconds");
    run_residency(*o);
  });
}

}  // namespace tierswap::cli
