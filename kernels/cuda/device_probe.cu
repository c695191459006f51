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
