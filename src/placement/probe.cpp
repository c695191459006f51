// probe_hardware(): this machine as a HardwareProfile. Topology from hwloc (NUMA nodes, cores, the
// NUMA node of each GPU by its PCI address), CUDA device attributes, the memlock limit from
// getrlimit, the NVMe drive's NUMA node from sysfs; bandwidths measured: pinned copies, a
// STREAM-triad probe and the fused AdamW kernel over a thread pool, NVMe write and read through
// the I/O engine in a scratch directory (removed afterwards).
#include <fmt/format.h>
#include <hwloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <system_error>

#include "tierswap/aligned_buffer.hpp"
#include "tierswap/cuda_runtime.hpp"
#include "tierswap/detail/clock.hpp"
#include "tierswap/detail/paths.hpp"
#include "tierswap/io_engine.hpp"
#include "tierswap/kernels.hpp"
#include "tierswap/log.hpp"
#include "tierswap/placement.hpp"
#include "tierswap/swap_space.hpp"
#include "tierswap/thread_pool.hpp"
#include "tierswap/units.hpp"

namespace tierswap {
namespace {

using detail::Clock;
using detail::seconds_since;

// The machine's topology, loaded once per process and kept: it does not change while we run,
// loading it costs milliseconds, and hwloc's PCI plugin (libpciaccess) keeps allocations that are
// only released with the plugin, which a destroy-per-query pattern would unload and report as
// leaked. A loaded topology is safe to query from several threads.
hwloc_topology_t topology() {
  static const hwloc_topology_t topo = [] {
    hwloc_topology_t t = nullptr;
    if (hwloc_topology_init(&t) != 0) throw std::runtime_error("probe: hwloc_topology_init failed");
    hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(t) != 0) {
      hwloc_topology_destroy(t);
      throw std::runtime_error("probe: hwloc_topology_load failed");
    }
    return t;
  }();
  return topo;
}

// CAP_IPC_LOCK in the effective set (root, or granted): mlock is then not bound by RLIMIT_MEMLOCK.
bool has_ipc_lock_capability() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("CapEff:", 0) != 0) continue;
    try {
      return (std::stoull(line.substr(7), nullptr, 16) >> 14) & 1;  // CAP_IPC_LOCK = 14
    } catch (const std::exception&) {
      return false;
    }
  }
  return false;
}

// The first NUMA node of the object's nearest non-I/O ancestor (-1 when unknown).
int numa_of(hwloc_topology_t t, hwloc_obj_t obj) {
  hwloc_obj_t a = hwloc_get_non_io_ancestor_obj(t, obj);
  if (!a || !a->nodeset) return -1;
  const int first = hwloc_bitmap_first(a->nodeset);
  // The whole machine's nodeset says nothing about locality.
  return hwloc_bitmap_isequal(a->nodeset, hwloc_get_root_obj(t)->nodeset) &&
                 hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE) > 1
             ? -1
             : first;
}

int numa_of_pci(hwloc_topology_t t, const std::string& bus_id) {
  unsigned dom = 0, bus = 0, dev = 0, fn = 0;
  if (std::sscanf(bus_id.c_str(), "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4) return -1;
  hwloc_obj_t o = hwloc_get_pcidev_by_busid(t, dom, bus, dev, fn);
  return o ? numa_of(t, o) : -1;
}

// The NUMA node of the block device holding `dir`, from sysfs (-1 when unknown).
int numa_of_path(const std::filesystem::path& dir) {
  std::string why;
  auto p = detail::block_device_sysfs(dir, &why);
  for (int up = 0; !p.empty() && up < 8 && p.has_parent_path(); ++up, p = p.parent_path()) {
    for (const auto& f : {p / "numa_node", p / "device" / "numa_node"}) {
      std::ifstream in(f);
      int n = -1;
      if (in >> n) return n;
    }
  }
  return -1;
}

// STREAM-triad-like: a = b + s * c over three arrays, best of several passes, GB/s.
double triad_gbps(ThreadPool& pool, std::size_t n) {
  AlignedBuffer a(n * 4), b(n * 4), c(n * 4);
  auto* pa = reinterpret_cast<float*>(a.data());
  auto* pb = reinterpret_cast<float*>(b.data());
  auto* pc = reinterpret_cast<float*>(c.data());
  pool.parallel_for(n, 4096, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t i = lo; i < hi; ++i) pa[i] = 0, pb[i] = 1, pc[i] = 2;
  });
  double best = 0;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = Clock::now();
    pool.parallel_for(n, 4096, [&](std::size_t lo, std::size_t hi) {
      for (std::size_t i = lo; i < hi; ++i) pa[i] = pb[i] + 3.0f * pc[i];
    });
    best = std::max(best, 12.0 * static_cast<double>(n) / seconds_since(t0) / 1e9);
  }
  return best;
}

// The fused bf16-gradient AdamW kernel, GB/s at 28 B/param, best of several steps.
double adam_gbps(ThreadPool& pool, std::size_t n) {
  std::vector<float> p(n, 0.5f), m(n, 0.0f), v(n, 0.0f);
  std::vector<std::uint16_t> g(n, float_to_bf16(1e-3f)), p16(n);
  AdamState st;
  st.param = p.data();
  st.exp_avg = m.data();
  st.exp_avg_sq = v.data();
  const CpuKernelContext ctx{default_cpu_isa(), &pool};
  double best = 0;
  for (int r = 1; r <= 5; ++r) {
    const auto t0 = Clock::now();
    adam_step(AdamConfig{}, r, st, {g.data(), Dtype::bf16, 1.0f}, {p16.data(), Dtype::bf16}, n,
              ctx);
    best = std::max(best, 28.0 * static_cast<double>(n) / seconds_since(t0) / 1e9);
  }
  return best;
}

// Sequential 8 MiB writes then reads of `bytes` through the engine, 8 in flight, GB/s.
std::pair<double, double> nvme_gbps(const std::filesystem::path& dir, std::uint64_t bytes) {
  const std::filesystem::path scratch =
      dir / fmt::format("tierswap-probe-{}", static_cast<long>(::getpid()));
  if (!std::filesystem::create_directory(scratch))
    throw std::runtime_error(fmt::format("probe: {} exists", scratch.string()));
  struct Cleanup {
    std::filesystem::path p;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(p, ec);
    }
  } cleanup{scratch};
  constexpr std::uint64_t kChunk = 8ull << 20;
  constexpr int kDepth = 8;
  bytes = std::max(kChunk, bytes / kChunk * kChunk);
  SwapSpaceConfig sc;
  sc.dirs = {scratch};
  sc.capacity = bytes;
  SwapSpace space = SwapSpace::create(sc);
  IoEngine engine(space, IoEngineConfig::from_env());
  AlignedBuffer buf(kChunk * kDepth);
  std::memset(buf.data(), 0x5a, buf.size());
  engine.register_buffer(buf.data(), buf.size());
  auto pass = [&](bool write) {
    std::vector<std::optional<IoTicket>> inflight(kDepth);
    const auto t0 = Clock::now();
    for (std::uint64_t off = 0, i = 0; off < bytes; off += kChunk, ++i) {
      auto& slot = inflight[i % kDepth];
      if (slot) slot->wait();
      std::byte* b = buf.data() + (i % kDepth) * kChunk;
      slot = write ? engine.write(off, b, kChunk) : engine.read(off, b, kChunk);
    }
    for (auto& s : inflight)
      if (s) s->wait();
    return static_cast<double>(bytes) / seconds_since(t0) / 1e9;
  };
  const double w = pass(true);
  const double r = pass(false);
  return {r, w};
}

// Cores, NUMA nodes and their memory (hwloc; the kernel's total where hwloc's nodes add up to
// less), and the memlock limit.
void probe_host(hwloc_topology_t t, HardwareProfile& p) {
  p.cpu_cores = std::max(1, hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE));
  const int nodes = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < nodes; ++i) {
    hwloc_obj_t o = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, i);
    NumaProfile n;
    n.node = static_cast<int>(o->os_index);
    n.memory_bytes = o->attr ? o->attr->numanode.local_memory : 0;
    n.cores = o->cpuset ? hwloc_get_nbobjs_inside_cpuset_by_type(t, o->cpuset, HWLOC_OBJ_CORE) : 0;
    p.host_memory_bytes += n.memory_bytes;
    p.numa.push_back(n);
  }
  // Seen in a Firecracker VM: one node of 4.3 GiB on a machine of 125 GiB; a single node then
  // holds it all.
  const auto total = static_cast<std::uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
                     static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  if (p.host_memory_bytes < total) {
    p.host_memory_bytes = total;
    if (p.numa.size() == 1) p.numa.front().memory_bytes = total;
  }
  rlimit rl{};
  p.memlock_bytes = ::getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
                            !has_ipc_lock_capability()
                        ? static_cast<std::uint64_t>(rl.rlim_cur)
                        : ~std::uint64_t{0};
}

// hwloc's PCI device of a CUDA bus id ("0000:41:00.0"), or null.
hwloc_obj_t pci_device(hwloc_topology_t t, const std::string& bus_id) {
  unsigned dom = 0, bus = 0, dev = 0, fn = 0;
  if (std::sscanf(bus_id.c_str(), "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4) return nullptr;
  return hwloc_get_pcidev_by_busid(t, dom, bus, dev, fn);
}

// What the CUDA runtime and hwloc tell of each GPU: model, memory, link, PCIe generation.
void probe_gpus(hwloc_topology_t t, HardwareProfile& p) {
  for (const auto& a : cuda::gpu_attributes()) {
    GpuProfile g;
    g.model = a.name;
    g.memory_bytes = a.memory_bytes;
    g.memory_gbps = a.peak_memory_gbps * 0.85;  // measured kernels reach ~85% of the peak
    g.pci_bus_id = a.pci_bus_id;
    g.numa_node = numa_of_pci(t, a.pci_bus_id);
    g.link = a.pageable_via_host_page_tables && a.host_native_atomics ? HostLink::nvlink_c2c
                                                                      : HostLink::pcie;
    hwloc_obj_t o = pci_device(t, a.pci_bus_id);
    if (o && o->attr && g.link == HostLink::pcie) {
      const float gbps = o->attr->pcidev.linkspeed;  // GB/s of the link, per direction
      g.pcie_width = 16;
      g.pcie_gen = gbps > 50 ? 5 : gbps > 25 ? 4 : gbps > 12 ? 3 : 0;
    }
    p.gpus.push_back(g);
  }
}

// The rates measured here: memory, the CPU kernel, each GPU's copies, the NVMe directory.
void measure(const ProbeOptions& opt, HardwareProfile& p) {
  ThreadPool pool(opt.threads);
  p.host_memory_gbps = triad_gbps(pool, 32u << 20);
  p.cpu_adam_gbps = adam_gbps(pool, opt.kernel_params);
  for (std::size_t d = 0; d < p.gpus.size(); ++d) {
    auto& g = p.gpus[d];
    g.h2d_gbps = cuda::measure_copy_gbps(static_cast<int>(d), true, opt.copy_bytes, 3);
    g.d2h_gbps = cuda::measure_copy_gbps(static_cast<int>(d), false, opt.copy_bytes, 3);
    // In-place access runs near the copy rates on a coherent link; over PCIe it is left out
    // (the cost model then never steps host-resident state on the GPU).
    if (g.link == HostLink::nvlink_c2c) {
      g.host_read_gbps = g.h2d_gbps;
      g.host_write_gbps = g.d2h_gbps;
    }
  }
  if (opt.nvme_dir.empty()) return;
  NvmeProfile d;
  d.name = opt.nvme_dir.string();
  std::tie(d.read_gbps, d.write_gbps) = nvme_gbps(opt.nvme_dir, opt.io_bytes);
  d.capacity_bytes = std::filesystem::space(opt.nvme_dir).capacity;
  d.numa_node = numa_of_path(opt.nvme_dir);
  p.nvme.push_back(d);
}

}  // namespace

HardwareProfile probe_hardware(const ProbeOptions& opt) {
  HardwareProfile p;
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  p.name = host[0] ? host : "this-machine";
  p.measured = opt.measure;
  hwloc_topology_t t = topology();
  probe_host(t, p);
  probe_gpus(t, p);
  p.description =
      fmt::format("probed: {} cores, {} NUMA node(s), {} of memory, {} GPU(s){}", p.cpu_cores,
                  p.numa.size(), format_bytes(p.host_memory_bytes), p.gpus.size(),
                  p.gpus.empty() ? "" : fmt::format(" ({})", p.gpus.front().model));
  if (opt.measure) measure(opt, p);
  return p;
}

}  // namespace tierswap
