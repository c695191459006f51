// HardwareProfile: JSON in and out, validation, the shipped profiles.
#include <fmt/format.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "src/placement/json_reader.hpp"
#include "tierswap/detail/file.hpp"
#include "tierswap/detail/json.hpp"
#include "tierswap/placement.hpp"

namespace tierswap {
namespace detail {
const std::vector<std::pair<std::string_view, std::string_view>>& builtin_profile_texts();
}

namespace {

using nlohmann::json;
using placement_json::bad;
using placement_json::kUnlimited;
using placement_json::Reader;

HostLink parse_link(std::string_view origin, const std::string& key, const std::string& v) {
  if (v == "pcie") return HostLink::pcie;
  if (v == "nvlink-c2c") return HostLink::nvlink_c2c;
  bad(origin, key, fmt::format("'{}': expected pcie or nvlink-c2c", v));
}

json bytes_json(std::uint64_t b) {
  return b == kUnlimited ? json("unlimited") : json(b);
}

}  // namespace

std::string_view to_string(HostLink l) noexcept {
  return l == HostLink::nvlink_c2c ? "nvlink-c2c" : "pcie";
}

void HardwareProfile::validate() const {
  auto need = [&](bool ok, const std::string& key, const std::string& why) {
    if (!ok) bad(name.empty() ? "profile" : name, key, why);
  };
  need(!name.empty(), "name", "empty");
  need(host_memory_bytes > 0, "host_memory_bytes", "must be > 0");
  need(cpu_cores > 0, "cpu_cores", "must be > 0");
  need(cpu_adam_gbps > 0, "cpu_adam_gbps", "must be > 0 (the CPU step's throughput)");
  for (std::size_t i = 0; i < gpus.size(); ++i) {
    const auto& g = gpus[i];
    const std::string k = fmt::format("gpus[{}]", i);
    need(g.memory_bytes > 0, k + ".memory_bytes", "must be > 0");
    need(g.memory_gbps > 0, k + ".memory_gbps", "must be > 0");
    need(g.h2d_gbps > 0 && g.d2h_gbps > 0, k + ".h2d_gbps/d2h_gbps", "must be > 0");
    need((g.host_read_gbps > 0) == (g.host_write_gbps > 0), k + ".host_read_gbps/host_write_gbps",
         "both 0 (no in-place access) or both > 0");
  }
  for (std::size_t i = 0; i < nvme.size(); ++i) {
    const auto& d = nvme[i];
    const std::string k = fmt::format("nvme[{}]", i);
    need(d.read_gbps > 0 && d.write_gbps > 0, k + ".read_gbps/write_gbps", "must be > 0");
    need(d.capacity_bytes > 0, k + ".capacity_bytes", "must be > 0");
  }
}

namespace {

NumaProfile numa_from(Reader& n) {
  NumaProfile x;
  x.node = n.integer("node", 0, true);
  x.memory_bytes = n.bytes("memory_bytes", 0);
  x.cores = n.integer("cores", 0);
  return x;
}

GpuProfile gpu_from(std::string_view origin, Reader& g) {
  GpuProfile x;
  x.model = g.str("model", "");
  x.memory_bytes = g.bytes("memory_bytes", 0, true);
  x.memory_gbps = g.num("memory_gbps", 0, true);
  x.bf16_tflops = g.num("bf16_tflops", 0);
  x.link = parse_link(origin, g.key("link"), g.str("link", "pcie"));
  x.pcie_gen = g.integer("pcie_gen", 0);
  x.pcie_width = g.integer("pcie_width", 0);
  x.h2d_gbps = g.num("h2d_gbps", 0, true);
  x.d2h_gbps = g.num("d2h_gbps", 0, true);
  x.host_read_gbps = g.num("host_read_gbps", 0);
  x.host_write_gbps = g.num("host_write_gbps", 0);
  x.numa_node = g.integer("numa_node", -1);
  x.pci_bus_id = g.str("pci_bus_id", "");
  return x;
}

NvmeProfile nvme_from(Reader& d) {
  NvmeProfile x;
  x.name = d.str("name", "");
  x.read_gbps = d.num("read_gbps", 0, true);
  x.write_gbps = d.num("write_gbps", 0, true);
  x.capacity_bytes = d.bytes("capacity_bytes", 0, true);
  x.numa_node = d.integer("numa_node", -1);
  return x;
}

// Each element of the array `key` read by `one`, every key of it known (Reader::finish).
template <typename T, typename F>
std::vector<T> list_from(std::string_view origin, Reader& r, const char* key, F one) {
  std::vector<T> out;
  const json& a = r.array(key);
  for (std::size_t i = 0; i < a.size(); ++i) {
    Reader e(origin, fmt::format("{}[{}]", key, i), a[i]);
    out.push_back(one(e));
    e.finish();
  }
  return out;
}

}  // namespace

HardwareProfile HardwareProfile::from_json(std::string_view text, std::string_view origin) {
  json j;
  try {
    j = json::parse(text, nullptr, true, /*ignore_comments=*/true);
  } catch (const json::parse_error& e) {
    throw std::invalid_argument(fmt::format("{}: not valid JSON: {}", origin, e.what()));
  }
  HardwareProfile p;
  Reader r(origin, "", j);
  p.name = r.str("name", "", true);
  p.description = r.str("description", "");
  p.measured = r.boolean("measured", false);
  p.host_memory_bytes = r.bytes("host_memory_bytes", 0, true);
  p.memlock_bytes = r.bytes("memlock_bytes", kUnlimited);
  p.cpu_cores = r.integer("cpu_cores", 0, true);
  p.host_memory_gbps = r.num("host_memory_gbps", 0);
  p.cpu_adam_gbps = r.num("cpu_adam_gbps", 0, true);
  p.numa = list_from<NumaProfile>(origin, r, "numa", numa_from);
  p.gpus =
      list_from<GpuProfile>(origin, r, "gpus", [origin](Reader& g) { return gpu_from(origin, g); });
  p.nvme = list_from<NvmeProfile>(origin, r, "nvme", nvme_from);
  r.finish();
  p.validate();
  return p;
}

std::string HardwareProfile::to_json() const {
  json j{{"name", name},
         {"description", description},
         {"measured", measured},
         {"host_memory_bytes", host_memory_bytes},
         {"memlock_bytes", bytes_json(memlock_bytes)},
         {"cpu_cores", cpu_cores},
         {"host_memory_gbps", host_memory_gbps},
         {"cpu_adam_gbps", cpu_adam_gbps},
         {"numa", json::array()},
         {"gpus", json::array()},
         {"nvme", json::array()}};
  for (const auto& n : numa)
    j["numa"].push_back({{"node", n.node}, {"memory_bytes", n.memory_bytes}, {"cores", n.cores}});
  for (const auto& g : gpus)
    j["gpus"].push_back({{"model", g.model},
                         {"memory_bytes", g.memory_bytes},
                         {"memory_gbps", g.memory_gbps},
                         {"bf16_tflops", g.bf16_tflops},
                         {"link", to_string(g.link)},
                         {"pcie_gen", g.pcie_gen},
                         {"pcie_width", g.pcie_width},
                         {"h2d_gbps", g.h2d_gbps},
                         {"d2h_gbps", g.d2h_gbps},
                         {"host_read_gbps", g.host_read_gbps},
                         {"host_write_gbps", g.host_write_gbps},
                         {"numa_node", g.numa_node},
                         {"pci_bus_id", g.pci_bus_id}});
  for (const auto& d : nvme)
    j["nvme"].push_back({{"name", d.name},
                         {"read_gbps", d.read_gbps},
                         {"write_gbps", d.write_gbps},
                         {"capacity_bytes", d.capacity_bytes},
                         {"numa_node", d.numa_node}});
  return j.dump(2);
}

std::vector<std::string> builtin_profiles() {
  std::vector<std::string> out;
  for (const auto& [name, text] : detail::builtin_profile_texts()) out.emplace_back(name);
  return out;
}

HardwareProfile HardwareProfile::load(std::string_view what) {
  for (const auto& [name, text] : detail::builtin_profile_texts())
    if (name == what) return from_json(text, fmt::format("profile '{}'", name));
  std::string text;
  try {
    text = detail::read_text_file(std::string(what), what);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("profile '{}': not a shipped profile ({}), and {}",
                                            what, fmt::join(builtin_profiles(), ", "), e.what()));
  }
  return from_json(text, what);
}

}  // namespace tierswap
