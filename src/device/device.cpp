#include "tierswap/device.hpp"

namespace tierswap {

#if defined(TIERSWAP_HAVE_CUDA)
namespace detail {
DeviceInfo probe_cuda_device();  // cuda_probe.cu
}
#endif

const DeviceInfo& device_info() {
  static const DeviceInfo info = [] {
#if defined(TIERSWAP_HAVE_CUDA)
    return detail::probe_cuda_device();
#else
    DeviceInfo d;
    d.reason = "built without CUDA (TIERSWAP_WITH_CUDA=OFF or nvcc not found)";
    return d;
#endif
  }();
  return info;
}

}  // namespace tierswap
