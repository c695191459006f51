// IoEngine: asynchronous reads and writes against a SwapSpace through one of three backends
// (io_uring, libaio, a pread/pwrite thread pool), chosen by probing at start-up.
//
// * One backend-neutral request type and one completion path (detail/io_backend.hpp).
// * Transfers are cut into block_size requests, kept queue_depth deep; excess waits in a FIFO.
// * Every completion is checked: short transfers are resubmitted for the remainder, EAGAIN and
//   EINTR are retried (bounded), anything else fails the ticket with a std::system_error naming
//   "<op> <path> @<offset>+<len>". Nothing is silently truncated.
// * Unaligned offsets, lengths or buffers on O_DIRECT files go through engine-owned bounce buffers
//   (read-modify-write for partial blocks; concurrent partial writes to one block are serialized).
// * Buffers registered with register_buffer() are used as io_uring fixed buffers.
//
// Thread-safety: submit(), wait_any(), register_buffer() and stats() may be called from any
// number of threads concurrently.
#pragma once

#include <array>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tierswap/setting.hpp"
#include "tierswap/swap_space.hpp"

namespace tierswap {

/// `service`: the requests are carried out by the node service (`tierswap serve`) in memory shared
/// with it (service.hpp's ServiceStorage builds such an engine; never probed or chosen).
enum class IoBackendKind { automatic, uring, aio, posix, service };
std::string_view to_string(IoBackendKind kind) noexcept;
/// "auto" | "uring" | "io_uring" | "aio" | "libaio" | "posix"; std::invalid_argument otherwise.
IoBackendKind parse_backend(std::string_view text);

struct IoEngineConfig {
  IoBackendKind backend = IoBackendKind::automatic;  ///< forced backend, or probe in order
  std::uint32_t queue_depth = 32;                    ///< requests in flight, 1..4096
  std::uint64_t block_size = 1024 * 1024;            ///< largest request, 4 KiB..64 MiB
  bool sqpoll = false;                               ///< io_uring SQPOLL kernel thread
  std::uint32_t sqpoll_idle_ms = 50;
  std::uint32_t posix_threads = 4;  ///< workers of the posix backend
  std::uint32_t max_retries = 64;   ///< EAGAIN/EINTR/no-progress retries per request
  /// Requests handed to the kernel per system call (0: all that are ready at once). Linux plugs
  /// a submission of 3 or more and merges requests adjacent on disk into larger ones (up to the
  /// device's max_sectors_kb): block_size would not be the size the device sees. At 2 it is.
  std::uint32_t submit_batch = 2;

  /// Overrides from the environment: first the keys of the JSON file TIERSWAP_IO_CONFIG names
  /// (what `tierswap tune` writes), then each setting's variable as settings() lists it (the
  /// configuration page, tools/docs/configuration.md). A value that does not parse throws naming
  /// the variable or the file.
  static IoEngineConfig from_env();
  static IoEngineConfig from_env(IoEngineConfig base);
  /// The file TIERSWAP_IO_CONFIG names, empty when it is unset or empty.
  static std::string file_from_env();
  /// Loads a JSON object of the keys settings() lists (block_size a number or "1MiB"); unknown keys
  /// or bad values throw std::invalid_argument naming the key (and, for an unknown one, every known
  /// key).
  static IoEngineConfig from_json(std::string_view json);
  /// Every setting, in the configuration page's order (its table is generated from them).
  static std::vector<Setting> settings();
  void validate() const;
};

enum class IoOp : std::uint8_t { read, write };

/// One transfer of a batch: `length` bytes at logical `offset` of the swap space.
struct IoSegment {
  IoOp op = IoOp::read;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  void* buffer = nullptr;
};

struct IoStats {
  std::uint64_t bytes_read = 0;
  std::uint64_t bytes_written = 0;
  std::uint64_t requests = 0;         ///< requests handed to the backend (retries included)
  std::uint64_t short_transfers = 0;  ///< completions that moved less than asked
  std::uint64_t retries = 0;          ///< EAGAIN/EINTR resubmissions
  std::uint64_t bounce_requests = 0;  ///< requests that went through a bounce buffer
  std::uint64_t fixed_requests = 0;   ///< io_uring fixed-buffer requests
  std::uint64_t failed_tickets = 0;
  /// Completed requests by latency from first submission to completion (retries and
  /// read-modify-write phases included): bucket k counts [2^k, 2^(k+1)) microseconds, bucket 0
  /// everything under 2 us.
  std::array<std::uint64_t, 32> latency_us_log2{};

  /// Upper bound (us) of the bucket holding quantile q (0..1) of latency_us_log2; 0 when empty.
  std::uint64_t latency_quantile_us(double q) const noexcept {
    std::uint64_t total = 0;
    for (auto c : latency_us_log2) total += c;
    if (total == 0) return 0;
    const double want = q * static_cast<double>(total);
    std::uint64_t seen = 0;
    for (std::size_t k = 0; k < latency_us_log2.size(); ++k) {
      seen += latency_us_log2[k];
      if (static_cast<double>(seen) >= want) return std::uint64_t{2} << k;
    }
    return std::uint64_t{2} << (latency_us_log2.size() - 1);
  }
};

namespace detail {
struct TicketState;
class IoBackend;
}  // namespace detail

class IoEngine;

/// Handle on a submitted batch. Move-only. The buffers of its segments must stay valid until it
/// is ready(). Destroying a ticket that is not ready waits for it (errors are then dropped), so a
/// buffer never outlives its I/O. A ticket must not outlive its engine.
class IoTicket {
 public:
  IoTicket() noexcept = default;
  IoTicket(IoTicket&&) noexcept;
  IoTicket& operator=(IoTicket&&) noexcept;
  IoTicket(const IoTicket&) = delete;
  IoTicket& operator=(const IoTicket&) = delete;
  ~IoTicket();

  bool valid() const noexcept { return state_ != nullptr; }
  /// True once every request of the batch finished (successfully or not). Never blocks.
  bool ready() const noexcept;
  /// Blocks until ready; rethrows the batch's first error (std::system_error).
  void wait();
  /// Bytes of the batch transferred so far.
  std::uint64_t bytes_done() const noexcept;
  /// The batch's error once ready, or null.
  std::exception_ptr error() const noexcept;

 private:
  friend class IoEngine;
  IoTicket(IoEngine* engine, std::shared_ptr<detail::TicketState> state) noexcept;
  IoEngine* engine_ = nullptr;
  std::shared_ptr<detail::TicketState> state_;
};

class IoEngine {
 public:
  /// Probes and starts the backend. `space` must outlive the engine. Throws
  /// std::invalid_argument for a bad config, std::system_error when a forced backend is
  /// unavailable.
  explicit IoEngine(const SwapSpace& space, IoEngineConfig config = {});
  /// For tests and wrappers: run over a given backend (e.g. the fault-injecting one).
  IoEngine(const SwapSpace& space, IoEngineConfig config,
           std::unique_ptr<detail::IoBackend> backend);
  /// Waits for every outstanding ticket, then stops the backend.
  ~IoEngine();
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;

  /// Submits a batch. Segments must lie inside the space (std::out_of_range otherwise, nothing
  /// submitted), with non-null buffers. An empty batch returns a ready ticket.
  IoTicket submit(std::span<const IoSegment> segments);
  /// The same, and `on_ready` is called once when the ticket completes, with its error (null
  /// on success), before the ticket reads ready (an event loop's completion: the node service
  /// answers its clients from it). It runs on the engine's completion path with the engine's
  /// lock held: it must be quick, must not block and must not call into the engine (a
  /// non-blocking send or an eventfd signal is the intended use). An empty batch calls it before
  /// submit returns.
  IoTicket submit(std::span<const IoSegment> segments,
                  std::function<void(std::exception_ptr)> on_ready);
  IoTicket read(std::uint64_t offset, void* buffer, std::uint64_t length);
  IoTicket write(std::uint64_t offset, const void* buffer, std::uint64_t length);

  /// Blocks until one of `tickets` is ready and returns its index (tickets.size() if all are
  /// invalid). Does not rethrow.
  std::size_t wait_any(std::span<IoTicket> tickets);
  /// The same over tickets held elsewhere (null entries are skipped).
  std::size_t wait_any(std::span<IoTicket* const> tickets);

  /// Registers [data, data + bytes) as io_uring fixed buffers (a pinned slab), cut into
  /// block_size pieces: a request whose buffer lies inside one piece uses READ_FIXED/WRITE_FIXED.
  /// Returns a handle (>= 0) or -1 when the backend has no fixed buffers or the table (4096
  /// pieces) is full; I/O into the region then still works, unregistered. The region must stay
  /// valid until unregister_buffer().
  int register_buffer(void* data, std::size_t bytes);
  /// Unregisters; waits for in-flight requests that use it.
  void unregister_buffer(int handle);

  IoBackendKind backend() const noexcept { return kind_; }
  /// Makes every write completed so far durable: the swap files' fdatasync, or, through the
  /// node service, the service's. Throws std::system_error naming what failed.
  void sync();
  /// Through the node service, I/O buffers must lie in the memory shared with it: the host
  /// pools then take their slabs from here. allocate_shared returns nullptr when that memory is
  /// exhausted (or not shared). Thread-safe.
  bool memory_is_shared() const noexcept;
  /// `locked`: from the memory the service locks (pinned pools); else from the pageable part
  /// when the client asked for one (the pinned part otherwise).
  std::byte* allocate_shared(std::uint64_t bytes, bool locked = true) noexcept;
  void free_shared(std::byte* p) noexcept;
  /// Human-readable: backend, features, and why earlier backends were skipped.
  const std::string& backend_description() const noexcept { return description_; }
  const IoEngineConfig& config() const noexcept { return config_; }
  const SwapSpace& space() const noexcept { return space_; }
  IoStats stats() const noexcept;

 private:
  friend class IoTicket;
  struct Impl;
  const SwapSpace& space_;
  IoEngineConfig config_;
  IoBackendKind kind_ = IoBackendKind::automatic;
  std::string description_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tierswap
