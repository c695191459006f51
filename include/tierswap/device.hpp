// Run-time detection of a CUDA device. The library always links (CUDA is compiled in when nvcc is
// found); on a machine without a driver or GPU, this reports why and the CPU paths are used.
#pragma once

#include <string>

namespace tierswap {

struct DeviceInfo {
  bool compiled_with_cuda = false;  ///< the library was built with TIERSWAP_WITH_CUDA
  bool available = false;           ///< a usable GPU and driver were found
  int device_count = 0;
  std::string name;    ///< first device's name when available
  std::string reason;  ///< why not available ("no CUDA driver", "built without CUDA", ...)
};

/// Probes once (thread-safe) and caches the answer.
const DeviceInfo& device_info();

}  // namespace tierswap
