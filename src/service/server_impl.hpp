// The node service's insides, shared by server.cpp (sessions, admission, block requests,
// status), raw_io.cpp (a tier manager's raw reads and writes, scheduled across clients),
// lifetime.cpp, metrics.cpp and stop.cpp. The socket and its threads (listener.hpp) and the
// shared-memory budget (budget.hpp) are parts that own their state.
#pragma once

#include <sys/socket.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "src/service/budget.hpp"
#include "src/service/listener.hpp"
#include "src/service/outbox.hpp"
#include "src/service/protocol.hpp"
#include "src/service/shared_memory.hpp"
#include "src/service/store.hpp"
#include "tierswap/extent_allocator.hpp"
#include "tierswap/io_engine.hpp"
#include "tierswap/metrics.hpp"
#include "tierswap/service.hpp"
#include "tierswap/swap_space.hpp"
#include "tierswap/telemetry.hpp"

namespace tierswap {

struct SwapService::Impl {
  using Peer = service::Peer;
  using SharedMemory = service::SharedMemory;
  using ClientRecord = service::ClientRecord;
  using Connection = service::Connection;
  ServiceConfig cfg;
  std::unique_ptr<SwapSpace> space;
  std::unique_ptr<IoEngine> engine;
  service::ServiceFiles files;
  std::uint64_t align = 4096;
  std::string uuid;
  service::ShmemHugePages huge_pages;

  // An attached client's I/O counters: counted by its session and by the engine's completion
  // callbacks without a lock (a callback never waits for mu, nor status() for the I/O), read by
  // status() and the metrics, each on its own.
  struct Traffic {
    std::atomic<std::uint64_t> read_bytes{0}, written_bytes{0};
    std::atomic<std::uint64_t> peak_inflight_bytes{0};  // written by the session only
    std::atomic<std::uint64_t> throttled{0};  // raw requests that waited for the client's share
  };

  // The shared memory granted (budget.hpp; its own lock, taken under mu or alone).
  std::unique_ptr<service::MemoryBudget> budget;
  // Everything below. Lock order: the engine's lock, then mu; nothing that holds mu calls into
  // the engine.
  mutable std::mutex mu;
  std::map<std::string, ClientRecord> clients;
  std::unique_ptr<ExtentAllocator> regions;
  struct Live {
    std::uint64_t memory = 0, pageable = 0;
    pid_t pid = 0;
    uid_t uid = 0;
    std::shared_ptr<Traffic> traffic = std::make_shared<Traffic>();  // the session's too
  };
  std::map<std::string, Live> live;  // attached clients

  // The socket and the connections' threads (listener.hpp): reset first by ~SwapService, so no
  // connection outlives what it uses.
  std::unique_ptr<service::Listener> listener;
  MetricsRegistry::Source metrics;
  std::unique_ptr<TelemetryServer> telemetry;  // `tierswap ps` finds the service through it

  void check_swap_dirs() const;
  void open_storage();
  /// One connection, on a thread of its own: converse(), then whatever the client held is freed.
  void serve(Peer& p);
  // Requests of an attached client (its record is only touched by its own connection).
  struct Session {
    ClientRecord* rec = nullptr;
    std::unique_ptr<SharedMemory> mem;
    std::string key;
    std::shared_ptr<Traffic> traffic;  // live[key]'s counters
    struct RawRequest {
      std::uint64_t tag = 0, offset = 0, length = 0, memory_offset = 0;
      bool write = false;
    };
    struct Raw {
      RawRequest req;
      IoTicket ticket;
    };
    std::deque<RawRequest> waiting;  // raw I/O beyond the client's share of the engine's queue
    std::list<Raw> inflight;         // raw I/O in the engine, answered as each completes
    std::uint64_t inflight_bytes = 0;
    std::unique_ptr<service::Outbox> out;     // the replies (this thread's and the callbacks')
    std::atomic<std::uint32_t> in_engine{0};  // raw requests whose callback has not run
    std::atomic<bool> waiting_any{false};     // !waiting.empty(), for the callbacks
    int done_fd = -1;      // eventfd: a callback wakes the session (see submit_raw)
    int registered = -1;   // the locked memory as the engine's fixed buffers (-1: not)
    bool busy = false;     // counted in busy_clients
    bool release = false;  // forget the client at the disconnect
    std::uint64_t writes_since_commit = 0;  // Write and Put requests since its last Sync/Commit
  };
  // ---- raw I/O: each busy client's share of the engine's queue (raw_io.cpp) ----
  std::uint64_t queue_bytes = 0;               // the engine's depth x block size
  std::atomic<std::uint32_t> busy_clients{0};  // clients with raw I/O waiting or in flight
  std::uint64_t raw_share() const;
  bool queue_raw(Session& s, const wire::Message& m);
  static Session::RawRequest parse_raw(const wire::Message& m);
  std::string check_raw(const Session& s, const Session::RawRequest& q) const;
  bool submit_raw(Session& s);
  bool answer_raw(Session& s);
  bool drain_raw(Session& s);
  // Blocks until a request arrives (*request = true) or the session is woken (accounts here).
  bool wait_raw(Peer& p, Session& s, bool* request);
  void abandon_raw(Session& s);
  void update_busy(Session& s);
  /// Attaches the client a Hello names; 0, or the errno of the refusal (`why` says it): the
  /// stateless checks, then (under mu) the admission against quota, budget, kind and region.
  int check_hello(const wire::Hello& h, const std::string& job, std::string* why) const;
  void converse(Peer& p, Session& s);
  bool first_message(Peer& p, const wire::Message& m, Session& s);
  /// Under mu: whether client `key` may attach for `uid` (its region's owner, or the service's
  /// own uid), is not attached already, is granted its memory (budget); then region_for().
  int admit(const wire::Hello& h, const std::string& key, uid_t uid, ClientRecord** rec,
            std::string* why);
  /// Under mu: a known client's region (same kind, big enough), or a first attach's new one.
  int region_for(const wire::Hello& h, const std::string& key, uid_t uid, ClientRecord** rec,
                 std::string* why);
  int hello(Peer& p, const wire::Hello& h, Session& s, std::string* why);
  /// Answers an Offer (the first and only message of its connection) with Offered, or with a
  /// Reply naming what was wrong; 0 or -errno of the send.
  int offer(Peer& p, const wire::Offer& o);
  service::Answer handle(const wire::Message& m, Session& s);
  std::uint64_t put(Session& s, const wire::Put& r);
  std::uint64_t get(Session& s, const wire::Get& r);
  /// fdatasync of the swap files, refused (logged) once one was deleted or replaced.
  void sync_swap();
  std::uint64_t commit(Session& s);
  void detach(Session& s);
  void forget(const std::string& key);  // under mu
  /// The status JSON; with `owner`, only the regions that uid owns (what another uid is shown).
  std::string status(std::optional<uid_t> owner = std::nullopt) const;
  // ---- region lifetime (lifetime.cpp) ----
  static std::int64_t unix_now();
  /// Under mu: records in the registry that `c` is used now (an attach or a detach).
  void touch(ClientRecord& c);
  /// Releases the detached regions no client attached to for cfg.region_ttl_seconds (the
  /// acceptor's loop calls it; it sweeps at most every tenth of the TTL).
  void expire_idle();
  std::chrono::steady_clock::time_point last_sweep{};  // the acceptor's
  std::atomic<std::uint64_t> expired{0};               // regions released by their TTL
  // ---- the metrics endpoint (metrics.cpp) ----
  void fill_metrics(MetricsWriter& w) const;
  void fill_client_metrics(MetricsWriter& w) const;  // under mu
  void fill_failure_metrics(MetricsWriter& w) const;
  /// What went wrong since the start: connections refused at their first message (another uid,
  /// a stop, a hello the budget or the registry refused), connections dropped (what they sent,
  /// a timeout), and requests answered with an error, by message type.
  std::atomic<std::uint64_t> refused{0}, dropped{0};
  std::array<std::atomic<std::uint64_t>, static_cast<std::size_t>(wire::Body::MAX) + 1> failed{};
  void count_failed(wire::Body type) { failed[static_cast<std::size_t>(type)].fetch_add(1); }
  // ---- a graceful stop (stop.cpp) ----
  std::atomic<bool> stopping{false};
  /// While stopping: whether a request of `type` finds the session done (at a commit: nothing
  /// written since its last one) and is refused instead of served.
  static bool done_when_stopping(const Session& s, wire::Body type);
  /// Refuses `m` (ESHUTDOWN, the reason) after the session's raw I/O completes; the session ends.
  void refuse_stopping(Session& s, const wire::Message& m);
  /// The refusal of a hello or an offer while stopping.
  static service::Answer stopping_answer(std::uint64_t tag = 0);
};

}  // namespace tierswap
