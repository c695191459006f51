// Internal: the backend-neutral request and the backend interface.
// Backends never throw on the hot path: they return counts or -errno.
#pragma once

#include <cerrno>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tierswap/io_engine.hpp"

namespace tierswap::detail {

/// One request as a backend sees it. Owned by the engine's fixed pool; a backend may use it
/// (and the spare fields) until it hands back its completion.
struct IoRequest {
  IoOp op = IoOp::read;
  std::uint32_t file = 0;    ///< index into the swap space's files
  std::uint64_t offset = 0;  ///< byte offset in that file
  std::uint32_t length = 0;
  std::byte* buffer = nullptr;
  int buffer_index = -1;  ///< registered (fixed) buffer slot, or -1
  std::uint32_t id = 0;   ///< unique among outstanding requests, < queue_depth
  void* backend_data = nullptr;
};

struct IoCompletion {
  IoRequest* request = nullptr;
  std::int64_t result = 0;  ///< bytes moved, or -errno
};

struct BackendParams {
  std::span<const int> fds;
  std::uint32_t queue_depth = 32;
  bool sqpoll = false;
  std::uint32_t sqpoll_idle_ms = 50;
  std::uint32_t threads = 4;
  std::uint32_t buffer_slots = 4096;  ///< fixed-buffer table size (registered regions are cut
                                      ///< into block-size pieces, one slot each)
  bool single_issuer = true;          ///< io_uring: try SINGLE_ISSUER | DEFER_TASKRUN
};

class IoBackend {
 public:
  virtual ~IoBackend() = default;
  virtual IoBackendKind kind() const noexcept = 0;
  /// Features for the engine's description ("registered files, fixed buffers").
  virtual std::string describe() const = 0;
  /// Queues requests. The engine calls it under its submission lock and never has more than
  /// queue_depth requests outstanding. Returns the number accepted or -errno.
  virtual int submit(std::span<IoRequest* const> requests) noexcept = 0;
  /// Fills `out` with completions. With `wait`, blocks until at least one is there or wake() is
  /// called. Called from one thread only (the engine's reaper). Returns count or -errno.
  virtual int reap(std::span<IoCompletion> out, bool wait) noexcept = 0;
  /// Makes a blocked reap() return. Called under the engine's submission lock (from any thread
  /// when owner_thread_submits()).
  virtual void wake() noexcept = 0;
  /// True when only the engine's reaper thread may touch the submission side (an io_uring ring
  /// set up SINGLE_ISSUER | DEFER_TASKRUN). The engine then queues work for that thread, which
  /// prepares requests with submit() and hands them to the kernel inside reap(wait), in the same
  /// system call that waits for completions; wake() must then work from any thread.
  virtual bool owner_thread_submits() const noexcept { return false; }
  /// Called once at the start of the reaper thread, before any other call from it.
  virtual int attach_reaper_thread() noexcept { return 0; }
  /// Fixed buffers (io_uring): number of slots, 0 when unsupported.
  virtual std::uint32_t buffer_slots() const noexcept { return 0; }
  virtual int register_buffer(std::uint32_t /*slot*/, void* /*data*/, std::size_t /*n*/) noexcept {
    return -EOPNOTSUPP;
  }
  virtual int unregister_buffer(std::uint32_t /*slot*/) noexcept { return -EOPNOTSUPP; }
  /// Makes completed writes durable where the backend, not the swap files, owns the data (the
  /// node service): 0 or -errno; -EOPNOTSUPP: the engine syncs the swap files itself.
  virtual int sync() noexcept { return -EOPNOTSUPP; }
  /// Memory that buffers must come from (the node service's shared memory); see IoEngine.
  virtual bool memory_is_shared() const noexcept { return false; }
  virtual std::byte* allocate_shared(std::uint64_t /*bytes*/, bool /*locked*/) noexcept {
    return nullptr;
  }
  virtual void free_shared(std::byte* /*p*/) noexcept {}
};

/// The parameters a backend over `space`'s files gets under `config`. `fds` is filled with the
/// files' descriptors and must outlive the returned value (it points into it).
BackendParams backend_params(const SwapSpace& space, const IoEngineConfig& config,
                             std::vector<int>& fds);

/// Each returns the backend, or nullptr with *err = -errno and *why set.
std::unique_ptr<IoBackend> make_uring_backend(const BackendParams& p, int* err, std::string* why);
std::unique_ptr<IoBackend> make_aio_backend(const BackendParams& p, int* err, std::string* why);
std::unique_ptr<IoBackend> make_posix_backend(const BackendParams& p, int* err, std::string* why);

/// Picks per config (forced or probed in order uring → aio → posix). Throws std::system_error
/// when a forced backend cannot start. `description` gets the choice and the reasons for skips.
std::unique_ptr<IoBackend> choose_backend(IoBackendKind wanted, const BackendParams& p,
                                          std::string* description);

/// What the fault-injecting wrapper does to one request.
struct Fault {
  enum class Kind { none, error, short_transfer, again, interrupt, zero } kind = Kind::none;
  int error = 0;            ///< errno for Kind::error
  std::uint32_t bytes = 0;  ///< for short_transfer: how many bytes really move
};
/// Decides a fault from the request and its sequence number (0, 1, ...). Called under the
/// engine's submission lock.
using FaultPlan = std::function<Fault(const IoRequest&, std::uint64_t seq)>;

/// Wraps `inner`: errors/EAGAIN/EINTR are completed without doing any I/O; a short transfer
/// really moves only `bytes` (the request is shortened while in flight, then restored).
std::unique_ptr<IoBackend> make_fault_backend(std::unique_ptr<IoBackend> inner, FaultPlan plan);

}  // namespace tierswap::detail
