// The CUDA runtime helpers in a build without CUDA (cuda_runtime.hpp): no GPU is usable,
// page-locking fails quietly, there are no devices to describe, and the rest says so.
#include <stdexcept>

#include "tierswap/cuda_runtime.hpp"

namespace tierswap::cuda {
namespace {
[[noreturn]] void no_cuda() {
  throw std::runtime_error("tierswap was built without CUDA (TIERSWAP_WITH_CUDA=OFF or no nvcc)");
}
}  // namespace

bool available() noexcept {
  return false;
}
void* device_alloc(std::size_t) {
  no_cuda();
}
void device_free(void*) noexcept {}
void copy_to_device(void*, const void*, std::size_t, void*) {
  no_cuda();
}
void copy_to_host(void*, const void*, std::size_t, void*) {
  no_cuda();
}
void copy_on_device(void*, const void*, std::size_t, void*) {
  no_cuda();
}
void zero_on_device(void*, std::size_t, void*) {
  no_cuda();
}
void synchronize(void*) {
  no_cuda();
}
void stream_wait_event(void*, void*) {
  no_cuda();
}
bool host_register(void*, std::size_t) noexcept {
  return false;
}
void host_unregister(void*) noexcept {}
std::vector<GpuAttributes> gpu_attributes() {
  return {};
}
double measure_copy_gbps(int, bool, std::size_t, int) {
  no_cuda();
}

}  // namespace tierswap::cuda
