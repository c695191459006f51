// What the CUDA sources share (nvcc only): the stream a null argument means, and errors of
// runtime calls and launches thrown as std::runtime_error naming the call.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace tierswap::cuda::detail {

// Null: the calling thread's default stream, never the legacy one (which would serialize the
// tier manager's copy threads with the step).
inline cudaStream_t as_stream(void* s) {
  return s == nullptr ? cudaStreamPerThread : static_cast<cudaStream_t>(s);
}

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("tierswap CUDA ") + what + ": " + cudaGetErrorString(e));
}

// The error of the last launch on this thread, if any.
inline void check_launch(const char* what) {
  check(cudaGetLastError(), what);
}

}  // namespace tierswap::cuda::detail
