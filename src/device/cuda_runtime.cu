// The CUDA runtime as tierswap uses it (cuda_runtime.hpp): device memory, stream-ordered
// copies, page-locked host memory. Without CUDA: cuda_runtime_none.cpp.
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.hpp"
#include "tierswap/cuda_runtime.hpp"
#include "tierswap/device.hpp"

namespace tierswap::cuda {

using detail::as_stream;
using detail::check;

bool available() noexcept {
  try {
    return device_info().available;
  } catch (...) {
    return false;
  }
}

void* device_alloc(std::size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes == 0 ? 1 : bytes), "cudaMalloc");
  return p;
}
void device_free(void* p) noexcept {
  cudaFree(p);
}
void copy_to_device(void* dst, const void* src, std::size_t bytes, void* stream) {
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, as_stream(stream)),
        "copy_to_device");
}
void copy_to_host(void* dst, const void* src, std::size_t bytes, void* stream) {
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, as_stream(stream)),
        "copy_to_host");
}
void copy_on_device(void* dst, const void* src, std::size_t bytes, void* stream) {
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, as_stream(stream)),
        "copy_on_device");
}
void zero_on_device(void* dst, std::size_t bytes, void* stream) {
  check(cudaMemsetAsync(dst, 0, bytes, as_stream(stream)), "zero_on_device");
}
void synchronize(void* stream) {
  check(cudaStreamSynchronize(as_stream(stream)), "synchronize");
}
void stream_wait_event(void* stream, void* event) {
  check(cudaStreamWaitEvent(as_stream(stream), static_cast<cudaEvent_t>(event), 0),
        "stream_wait_event");
}
bool host_register(void* p, std::size_t bytes) noexcept {
  if (!available()) return false;
  if (cudaHostRegister(p, bytes, cudaHostRegisterDefault) == cudaSuccess) return true;
  cudaGetLastError();  // clear the sticky-free error so later calls do not see it
  return false;
}
void host_unregister(void* p) noexcept {
  cudaHostUnregister(p);
}

}  // namespace tierswap::cuda
