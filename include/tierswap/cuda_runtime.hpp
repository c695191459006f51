// The CUDA runtime as tierswap uses it, apart from the kernels (cuda_kernels.hpp): whether a GPU
// is usable, device memory, stream-ordered copies, page-locked host memory, the buffers built on
// them, and what the placement probe reads of each device. `stream` is a cudaStream_t passed as
// void*; null means the calling thread's default stream (cudaStreamPerThread). Errors are thrown
// as std::runtime_error naming the call. In a build without CUDA, available() is false,
// host_register() fails quietly, gpu_attributes() is empty and the rest throws saying so
// (src/device/cuda_runtime_none.cpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tierswap/aligned_buffer.hpp"

namespace tierswap::cuda {

/// True when built with CUDA and a device is usable (see device_info()).
bool available() noexcept;

/// Minimal device memory helpers (used by tests and benchmarks; the tier manager owns pools).
void* device_alloc(std::size_t bytes);
void device_free(void* p) noexcept;
void copy_to_device(void* dst, const void* src, std::size_t bytes, void* stream);
void copy_to_host(void* dst, const void* src, std::size_t bytes, void* stream);
void copy_on_device(void* dst, const void* src, std::size_t bytes, void* stream);
/// Sets `bytes` of device memory at `dst` to zero (cudaMemsetAsync).
void zero_on_device(void* dst, std::size_t bytes, void* stream);
void synchronize(void* stream);
/// Makes later work on `stream` wait for `event` (cudaStreamWaitEvent) without blocking the host.
void stream_wait_event(void* stream, void* event);
/// Device memory owned by one object (device_alloc / device_free), move-only; empty until sized.
/// reserve(n) makes it at least n bytes (growing drops the contents) and returns it.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) { reserve(bytes); }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~DeviceBuffer() { device_free(p_); }
  void* reserve(std::size_t bytes) {
    if (p_ != nullptr && bytes_ >= bytes) return p_;
    device_free(p_);
    p_ = nullptr;
    bytes_ = 0;  // stays so if the allocation throws
    p_ = device_alloc(bytes);
    bytes_ = bytes;
    return p_;
  }
  void* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return bytes_; }

 private:
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
};

/// Page-locks host memory for the GPU (cudaHostRegister). False when it fails or no GPU is usable;
/// never throws. host_unregister undoes a successful host_register.
bool host_register(void* p, std::size_t bytes) noexcept;
void host_unregister(void* p) noexcept;

/// Host memory grown on demand (page-aligned, at least doubling, so a growing use registers
/// rarely) and page-locked for the GPU while held when a GPU is usable: the staging of copies
/// between device memory and host memory the caller does not own. Copies from or to pageable
/// memory go through the driver's bounce buffer at a fraction of the link's bandwidth and block
/// the host. Without a GPU it is plain host memory (registered() false).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() { release(); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  /// At least `bytes` (contents not kept when it grows).
  std::byte* reserve(std::size_t bytes) {
    if (buf_.size() >= bytes && buf_) return buf_.data();
    release();
    buf_ = AlignedBuffer(std::max(bytes, 2 * size_), 4096);
    size_ = buf_.size();
    registered_ = host_register(buf_.data(), buf_.size());
    return buf_.data();
  }
  std::byte* data() const noexcept { return buf_.data(); }
  std::size_t size() const noexcept { return buf_.size(); }
  bool registered() const noexcept { return registered_; }

 private:
  void release() noexcept {
    if (registered_) host_unregister(buf_.data());
    registered_ = false;
    buf_ = AlignedBuffer();
  }
  AlignedBuffer buf_;
  std::size_t size_ = 0;  // the last size, kept across release() for the doubling
  bool registered_ = false;
};

/// What the placement probe reads of each device (empty without a usable GPU).
struct GpuAttributes {
  std::string name;
  std::uint64_t memory_bytes = 0;
  double peak_memory_gbps = 0;  ///< 2 x memory clock x bus width
  std::string pci_bus_id;       ///< "dddd:bb:dd.f"
  /// Pageable host memory is accessed through the host's page tables, and the link carries
  /// native atomics: a hardware-coherent link (NVLink-C2C on a Grace-Hopper superchip).
  bool pageable_via_host_page_tables = false;
  bool host_native_atomics = false;
};
std::vector<GpuAttributes> gpu_attributes();
/// Pinned-memory copy bandwidth of device `device` in GB/s (best of `reps` copies of `bytes`),
/// host->device or device->host. Throws std::runtime_error without a usable GPU.
double measure_copy_gbps(int device, bool to_device, std::size_t bytes, int reps);

}  // namespace tierswap::cuda
