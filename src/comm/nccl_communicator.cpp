// The NCCL communicator (CUDA builds). Collectives run on a private stream and are waited for
// before returning (the optimizer's CPU pipeline consumes the results at once). Host buffers are
// staged through a device buffer that grows as needed; device buffers are used in place.
// Uneven reduce-scatter pieces are padded to the largest; all_gather_v is one broadcast per rank
// inside a group call.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "tierswap/communicator.hpp"
#include "tierswap/device.hpp"

namespace tierswap {
namespace {

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(fmt::format("nccl communicator: {}: {}", what, cudaGetErrorString(e)));
}
void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess)
    throw std::runtime_error(fmt::format("nccl {}: {}", what, ncclGetErrorString(r)));
}

ncclDataType_t nccl_type(Dtype d) {
  switch (d) {
    case Dtype::f32:
      return ncclFloat32;
    case Dtype::bf16:
      return ncclBfloat16;
    case Dtype::f16:
      return ncclFloat16;
  }
  return ncclFloat32;
}

bool is_device(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<Communicator> boot, int device)
      : boot_(std::move(boot)), device_(device) {
    if (const DeviceInfo& d = device_info(); !d.available)
      throw std::runtime_error(fmt::format(
          "nccl communicator: no usable GPU here ({}); NCCL runs between GPUs: use \"mpi\" or "
          "\"single\" (or a gloo process group from Python)",
          d.reason));
    int n = 0;
    cuda_check(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
    if (device < 0 || device >= n)
      throw std::runtime_error(fmt::format("nccl communicator: device {} of {}", device, n));
    cuda_check(cudaSetDevice(device), "cudaSetDevice");
    ncclUniqueId id{};
    if (boot_->rank() == 0) nccl_check(ncclGetUniqueId(&id), "get_unique_id");
    boot_->broadcast(&id, sizeof id, 0);
    nccl_check(ncclCommInitRank(&comm_, boot_->size(), id, boot_->rank()), "comm_init_rank");
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~NcclCommunicator() override {
    if (buf_ != nullptr) cudaFree(buf_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (comm_ != nullptr) ncclCommDestroy(comm_);
  }
  int rank() const noexcept override { return boot_->rank(); }
  int size() const noexcept override { return boot_->size(); }
  std::string_view name() const noexcept override { return "nccl"; }

  void reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts,
                      Dtype dtype) override {
    const std::size_t es = dtype_size(dtype);
    const std::size_t w = counts.size();
    std::size_t piece = 0, total = 0;
    for (auto c : counts) piece = std::max(piece, c), total += c;
    // Padded layout: rank r's piece at r * piece, zeros after it.
    std::byte* d = staging((w + 1) * piece * es);
    cuda_check(cudaMemsetAsync(d, 0, w * piece * es, stream_), "cudaMemsetAsync");
    std::size_t off = 0;
    for (std::size_t r = 0; r < w; ++r) {
      cuda_check(cudaMemcpyAsync(d + r * piece * es, static_cast<const std::byte*>(send) + off * es,
                                 counts[r] * es, cudaMemcpyDefault, stream_),
                 "cudaMemcpyAsync");
      off += counts[r];
    }
    std::byte* out = d + w * piece * es;
    nccl_check(ncclReduceScatter(d, out, piece, nccl_type(dtype), ncclSum, comm_, stream_),
               "reduce_scatter");
    cuda_check(cudaMemcpyAsync(recv, out, counts[rank()] * es, cudaMemcpyDefault, stream_),
               "cudaMemcpyAsync");
    cuda_check(cudaStreamSynchronize(stream_), "reduce_scatter");
    (void)total;
  }
  void all_gather_v(void* buf, std::span<const std::size_t> counts,
                    std::span<const std::size_t> displs, Dtype dtype) override {
    const std::size_t es = dtype_size(dtype);
    std::size_t end = 0;
    for (std::size_t r = 0; r < counts.size(); ++r) end = std::max(end, displs[r] + counts[r]);
    const bool dev = is_device(buf);
    std::byte* d = dev ? static_cast<std::byte*>(buf) : staging(end * es);
    const auto me = static_cast<std::size_t>(rank());
    if (!dev)
      cuda_check(
          cudaMemcpyAsync(d + displs[me] * es, static_cast<std::byte*>(buf) + displs[me] * es,
                          counts[me] * es, cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync");
    nccl_check(ncclGroupStart(), "group_start");
    for (std::size_t r = 0; r < counts.size(); ++r)
      nccl_check(ncclBroadcast(d + displs[r] * es, d + displs[r] * es, counts[r] * es, ncclUint8,
                               static_cast<int>(r), comm_, stream_),
                 "broadcast");
    nccl_check(ncclGroupEnd(), "group_end");
    if (!dev)
      for (std::size_t r = 0; r < counts.size(); ++r)
        if (r != me)
          cuda_check(
              cudaMemcpyAsync(static_cast<std::byte*>(buf) + displs[r] * es, d + displs[r] * es,
                              counts[r] * es, cudaMemcpyDeviceToHost, stream_),
              "cudaMemcpyAsync");
    cuda_check(cudaStreamSynchronize(stream_), "all_gather_v");
  }
  void all_reduce_sum(double* data, std::size_t n) override {
    std::byte* d = staging(n * sizeof(double));
    cuda_check(cudaMemcpyAsync(d, data, n * sizeof(double), cudaMemcpyDefault, stream_), "copy");
    nccl_check(ncclAllReduce(d, d, n, ncclFloat64, ncclSum, comm_, stream_), "all_reduce");
    cuda_check(cudaMemcpyAsync(data, d, n * sizeof(double), cudaMemcpyDefault, stream_), "copy");
    cuda_check(cudaStreamSynchronize(stream_), "all_reduce");
  }
  bool all_reduce_or(bool flag) override {
    double v = flag ? 1 : 0;
    all_reduce_sum(&v, 1);
    return v != 0;
  }
  void broadcast(void* data, std::size_t bytes, int root) override {
    std::byte* d = staging(bytes);
    cuda_check(cudaMemcpyAsync(d, data, bytes, cudaMemcpyDefault, stream_), "copy");
    nccl_check(ncclBroadcast(d, d, bytes, ncclUint8, root, comm_, stream_), "broadcast");
    cuda_check(cudaMemcpyAsync(data, d, bytes, cudaMemcpyDefault, stream_), "copy");
    cuda_check(cudaStreamSynchronize(stream_), "broadcast");
  }
  void barrier() override {
    double v = 0;
    all_reduce_sum(&v, 1);
  }

 private:
  std::byte* staging(std::size_t bytes) {
    if (bytes > cap_) {
      if (buf_ != nullptr) cuda_check(cudaFree(buf_), "cudaFree");
      buf_ = nullptr;
      cuda_check(cudaMalloc(&buf_, bytes), "cudaMalloc");
      cap_ = bytes;
    }
    return static_cast<std::byte*>(buf_);
  }

  std::shared_ptr<Communicator> boot_;
  int device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* buf_ = nullptr;
  std::size_t cap_ = 0;
};

}  // namespace

bool nccl_available() noexcept {
  return true;
}

std::unique_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Communicator> bootstrap,
                                                     int device) {
  if (!bootstrap) throw std::invalid_argument("nccl communicator: no bootstrap communicator");
  return std::make_unique<NcclCommunicator>(std::move(bootstrap), device);
}

}  // namespace tierswap
