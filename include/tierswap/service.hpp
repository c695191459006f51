// The node service (`tierswap serve`): one process per node owns the swap drives (one striped
// swap space, one I/O engine) and one budget of shared memory for every client on the node.
//
// A client (job id + rank) connects over a Unix socket, is checked by its peer credentials
// (SO_PEERCRED: another uid is refused unless allowed) and gets a memfd of shared memory mapped
// by both sides (SCM_RIGHTS), within the node budget and the per-client quota, plus a region of
// the swap space of its own. It then stores numbered blocks: put() writes a block from its shared
// memory to NVMe, get() reads one back into it, commit() makes the open generation durable,
// discard() forgets it. Bytes of state never cross the socket; control messages are versioned,
// length-prefixed FlatBuffers (src/service/protocol.fbs), verified before use.
//
// Blocks are shadow-paged as the tier manager's: each has two extents in the client's region; a
// put writes the one the committed generation does not use, and a commit (fdatasync, then the
// client's manifest written to a temporary file, fsynced and renamed) flips them. A client that
// dies (kill -9 included) loses only its open generation; the service frees its memory, keeps its
// region and manifest, and a client with the same job id and rank reattaches to the committed
// generation, also after the service itself was killed and restarted. Every block read back is
// checked against the checksum its put recorded.
//
// Files in the first swap directory: tierswap.swap (the space), tierswap.service (the clients'
// regions), service-clients/<job>.<rank>.manifest (each client's blocks). Formats: the manifest
// container of detail/manifest.hpp with a JSON payload.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tierswap/io_engine.hpp"
#include "tierswap/swap_space.hpp"

namespace tierswap {

/// The service's socket: TIERSWAP_SERVICE when set, else the node service's socket
/// (/run/tierswap/service.sock, CMake's TIERSWAP_NODE_SOCKET, the systemd unit's) when it
/// exists, else this user's "<runtime dir>/service.sock".
std::filesystem::path default_service_socket();

struct ServiceConfig {
  std::vector<std::filesystem::path> swap_dirs;  ///< one per drive (striped)
  /// Bytes of swap space to create when the directories hold none (0: open an existing one).
  std::uint64_t capacity = 0;
  /// Shared memory of all clients together (the node's one budget).
  std::uint64_t host_budget = 1ull << 30;
  /// Most shared memory one client may hold (0: the whole budget).
  std::uint64_t client_quota = 0;
  /// Most unlocked shared memory one client may hold beside it (its gradients on their way to a
  /// CPU step; not counted in host_budget). 0: a quarter of the node's physical memory, or the
  /// pageable budget if that is less.
  std::uint64_t pageable_quota = 0;
  /// Unlocked shared memory of all clients together: a client whose ask would take the node past
  /// it is refused, so ranks cannot together hold more than the machine has. 0: half the node's
  /// physical memory.
  std::uint64_t pageable_budget = 0;
  std::filesystem::path socket;  ///< empty: default_service_socket()
  bool allow_other_users = false;
  /// mlock the clients' shared memory (pinned); a failure is a warning, the memory stays usable.
  bool lock_memory = true;
  /// A connection whose first message (a hello or an offer) has not come whole within this many
  /// seconds is dropped, with a logged reason: something that is not a client (a telemetry
  /// query aimed at this socket, a stopped process) does not hold a session thread forever.
  double first_message_seconds = 30;
  /// A region no client attached to for this many seconds is released (its blocks and manifest
  /// go, as with `tierswap release`); its last use is kept in the registry across restarts, and
  /// an attached region never expires. 0: regions are kept until released.
  double region_ttl_seconds = 0;
  /// Throws std::invalid_argument naming the setting.
  void validate() const;
};

/// The service. Listens from construction (or on `listen_fd`, a socket handed over by systemd's
/// socket activation) on a thread per client, until destroyed. Throws std::system_error naming
/// the path when the socket or the swap space cannot be set up, std::runtime_error naming the
/// file when a registry or manifest is corrupt (nothing on disk is changed then).
class SwapService {
 public:
  explicit SwapService(ServiceConfig cfg, int listen_fd = -1);
  ~SwapService();
  SwapService(const SwapService&) = delete;
  SwapService& operator=(const SwapService&) = delete;

  const std::filesystem::path& socket_path() const noexcept;
  /// Clients, budget and traffic as JSON (what `tierswap serve --status` prints).
  std::string status_json() const;
  /// A graceful stop (SIGTERM): new clients are refused (ESHUTDOWN, "the service is stopping"),
  /// and each attached client is served until its state is committed: a client that has written
  /// since its last commit (Sync, or Commit) goes on to its next one, then its next request is
  /// refused with ESHUTDOWN and its session ends; one that has not is refused at its next
  /// request. Returns when no client is attached, or after `drain_seconds`, logging each client
  /// still attached then (the destructor cuts them off): how many those are. Call before the
  /// destructor; a second call returns 0 at once.
  std::size_t stop(double drain_seconds);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct ServiceClientConfig {
  std::filesystem::path socket;  ///< empty: default_service_socket()
  std::string job;               ///< [A-Za-z0-9._-]{1,64}
  std::uint32_t rank = 0;
  std::uint64_t memory_bytes = 0;  ///< locked shared memory asked for (a multiple of 4 KiB)
  /// Unlocked shared memory asked for beside it (a multiple of 4 KiB; not in the node budget).
  std::uint64_t pageable_bytes = 0;
  std::uint64_t region_bytes = 0;  ///< NVMe bytes asked for at the first attach
  /// How long a request may wait for the service before failing (a killed or hung service).
  double timeout_seconds = 30;
  /// How long attaching waits for a service that is not there yet or is going (restarting: its
  /// socket missing or refusing, or it refused the hello because it is stopping), trying again
  /// every half second; 0: fail at once.
  double wait_seconds = 0;
  /// A raw client (a tier manager, through ServiceStorage) addresses its region itself; a block
  /// client uses put/get/commit/discard. Fixed at the first attach of job + rank.
  bool raw = false;
  /// Forget this client when it detaches, however that happens (kill -9 included): its region,
  /// blocks and manifest (a run nothing can resume, whose manifest is in a temporary directory).
  bool release_when_detached = false;
};

/// What the service would grant a new client that asks for 1/share of the node's budget now: a
/// snapshot (others may attach in between), for sizing a client before it attaches.
struct ServiceOffer {
  std::uint64_t bytes = 0;   ///< min(quota, budget / share, free), in whole 4 KiB pages
  std::uint64_t budget = 0;  ///< the node's budget of locked shared memory
  std::uint64_t free = 0;    ///< what attached clients do not hold
  std::uint64_t quota = 0;   ///< the most one client may hold
  /// The same for the unlocked (pageable) shared memory beside it, where a client's gradients
  /// wait for a CPU step. kUnknown from a service that predates these figures.
  static constexpr std::uint64_t kUnknown = ~std::uint64_t{0};
  std::uint64_t pageable_bytes = kUnknown;  ///< min(quota, budget / share, free), whole pages
  std::uint64_t pageable_budget = 0;
  std::uint64_t pageable_free = 0;
  std::uint64_t pageable_quota = 0;
};

/// Asks the service at `socket` (empty: default_service_socket()) for its offer to a client
/// sharing the budget with `share` - 1 others (share >= 1). Throws std::system_error naming the
/// socket when it cannot connect, gets no answer within the timeout, or is refused.
/// `wait_seconds`: as ServiceClientConfig::wait_seconds.
ServiceOffer service_offer(const std::filesystem::path& socket, std::uint32_t share,
                           double timeout_seconds = 30, double wait_seconds = 0);

/// A region the node service keeps (a client's NVMe state), as `tierswap release` selects them.
struct ServiceRegion {
  std::string job;
  std::uint32_t rank = 0;
  std::uint64_t bytes = 0;  ///< its size in the swap space
  std::uint32_t owner_uid = 0;
  bool raw = false;  ///< a tier manager's (it keeps its own manifest)
  bool attached = false;
  /// Seconds since a client last attached or detached (0 while attached): what
  /// ServiceConfig::region_ttl_seconds counts.
  std::int64_t idle_seconds = 0;
  std::string key() const { return job + "." + std::to_string(rank); }
};

/// The regions the service at `socket` (empty: default_service_socket()) keeps that this uid
/// owns (all of them for root and the service's own uid), by key. Throws std::system_error naming
/// the socket when it cannot connect, gets no answer within the timeout, or is answered with
/// anything but such a list (EPROTO).
std::vector<ServiceRegion> service_regions(const std::filesystem::path& socket,
                                           double timeout_seconds = 30);

/// A connection to the service. Every call throws std::system_error with the service's reason
/// (or "service <socket> closed the connection" / "no answer within the timeout") on failure.
/// Not thread-safe: one caller at a time.
class ServiceClient {
 public:
  explicit ServiceClient(ServiceClientConfig cfg);
  ~ServiceClient();
  ServiceClient(const ServiceClient&) = delete;
  ServiceClient& operator=(const ServiceClient&) = delete;

  /// The shared memory (page-aligned), valid while the client lives: its first locked_bytes()
  /// are locked by the service, the rest (pageable_bytes) is not.
  std::span<std::byte> memory() const noexcept;
  std::uint64_t locked_bytes() const noexcept;
  /// The committed generation when attached (0 for a new client).
  std::uint64_t attached_generation() const noexcept;
  bool reattached() const noexcept;

  /// Writes memory()[offset, offset + length) as block `block` of the open generation (offset
  /// and length multiples of 4 KiB; a block keeps its first length).
  void put(std::uint64_t block, std::uint64_t offset, std::uint64_t length);
  /// Reads block `block` (its open-generation value if put since the last commit) into
  /// memory()[offset, ...); returns its length. ENOENT for a block never put.
  std::uint64_t get(std::uint64_t block, std::uint64_t offset, std::uint64_t length);
  /// Returns the new committed generation.
  std::uint64_t commit();
  void discard();
  std::string status_json();
  /// Asks the service to forget this client when it disconnects: its region, blocks and
  /// manifest (a run that ended and keeps nothing; the next attach starts afresh).
  void release();

 private:
  friend class ServiceStorage;
  friend ServiceOffer service_offer(const std::filesystem::path&, std::uint32_t, double, double);
  friend std::vector<ServiceRegion> service_regions(const std::filesystem::path&, double);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// A tier manager's storage through the node service: the client's region as a SwapSpace and an
/// IoEngine whose requests the service carries out in the shared memory, which is where the tier
/// manager's host pools then take their slabs from: the pinned pool from the locked part (ask
/// memory_bytes >= host_budget), the pageable pool from the rest (pageable_bytes >=
/// pageable_budget; without it, from the locked part). A TierManager (and so an optimizer) built on
/// space() and engine() runs unchanged; it keeps its manifest in `manifest_dir` and reopens from it
/// after a crash, as on its own swap files. The service carries several requests at once; a killed
/// service fails them (and every later one) with an error naming the socket, a silent one after
/// timeout_seconds.
class ServiceStorage {
 public:
  /// `cfg.raw` is implied. Throws as ServiceClient does.
  ServiceStorage(ServiceClientConfig cfg, const std::filesystem::path& manifest_dir,
                 IoEngineConfig engine = {});
  ~ServiceStorage();
  ServiceStorage(const ServiceStorage&) = delete;
  ServiceStorage& operator=(const ServiceStorage&) = delete;

  SwapSpace& space() noexcept;
  IoEngine& engine() noexcept;
  /// True when the service already knew this job + rank (its region kept what was committed).
  bool reattached() const noexcept;
  /// At destruction, after the engine stopped, ask the service to forget the region (see
  /// ServiceClient::release): what removing its swap files is to a run on its own files.
  void release_on_close() noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tierswap
