// Device detection through the CUDA runtime. Linked statically, so it loads on machines without a
// driver; cudaGetDeviceCount then reports cudaErrorNoDevice / cudaErrorInsufficientDriver.
#include <cuda_runtime_api.h>

#include <string>

#include "tierswap/device.hpp"

namespace tierswap::detail {

DeviceInfo probe_cuda_device() {
  DeviceInfo d;
  d.compiled_with_cuda = true;
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    d.reason = std::string("no usable CUDA device: ") + cudaGetErrorString(err);
    cudaGetLastError();  // clear the sticky error
    return d;
  }
  if (n == 0) {
    d.reason = "no CUDA device present";
    return d;
  }
  d.device_count = n;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) d.name = prop.name;
  d.available = true;
  return d;
}

}  // namespace tierswap::detail

// ---- attributes and copy bandwidth for the placement probe ----------------------------------
#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <vector>

#include "tierswap/cuda_runtime.hpp"
#include "tierswap/detail/clock.hpp"

namespace tierswap::cuda {

std::vector<GpuAttributes> gpu_attributes() {
  std::vector<GpuAttributes> out;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return out;
  }
  for (int d = 0; d < n; ++d) {
    GpuAttributes a;
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) continue;
    a.name = prop.name;
    a.memory_bytes = prop.totalGlobalMem;
    int clock_khz = 0, bus_bits = 0, pageable = 0, atomics = 0;
    cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, d);
    cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, d);
    cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccessUsesHostPageTables, d);
    cudaDeviceGetAttribute(&atomics, cudaDevAttrHostNativeAtomicSupported, d);
    a.peak_memory_gbps = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;
    a.pageable_via_host_page_tables = pageable != 0;
    a.host_native_atomics = atomics != 0;
    char bus[32] = {};
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, d) == cudaSuccess) a.pci_bus_id = bus;
    out.push_back(a);
  }
  cudaGetLastError();
  return out;
}

double measure_copy_gbps(int device, bool to_device, std::size_t bytes, int reps) {
  auto check = [](cudaError_t e, const char* what) {
    if (e != cudaSuccess)
      throw std::runtime_error(std::string("copy bandwidth probe: ") + what + ": " +
                               cudaGetErrorString(e));
  };
  check(cudaSetDevice(device), "cudaSetDevice");
  void* host = nullptr;
  void* dev = nullptr;
  check(cudaMallocHost(&host, bytes), "cudaMallocHost");
  cudaError_t e = cudaMalloc(&dev, bytes);
  if (e != cudaSuccess) {
    cudaFreeHost(host);
    check(e, "cudaMalloc");
  }
  double best = 0;
  for (int r = 0; r < reps + 1; ++r) {  // the first copy warms up
    const auto t0 = detail::Clock::now();
    e = to_device ? cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice)
                  : cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) break;
    const double s = detail::seconds_since(t0);
    if (r > 0) best = std::max(best, static_cast<double>(bytes) / s / 1e9);
  }
  cudaFree(dev);
  cudaFreeHost(host);
  check(e, "cudaMemcpy");
  return best;
}

}  // namespace tierswap::cuda
