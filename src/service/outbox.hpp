// One client's replies, sent by its session thread and by the engine's completion callbacks.
//
// Raw I/O is answered on the engine's reaper thread as each request completes (no wake-up of
// the session thread per request): the callback numbers, queues and sends the reply itself if
// the socket takes it at once. Only the session thread ever blocks on the socket: a reply a
// callback cannot send whole at once (a client slow to read, or the session thread writing at
// that moment) is left here and the session's eventfd is signalled; the session sends it with
// its next flush(). One lock orders the two, held only to number and queue messages and for
// non-blocking writes, never across a blocking one.
#pragma once

#include <mutex>
#include <vector>

#include "src/service/protocol.hpp"

namespace tierswap::service {

class Outbox {
 public:
  Outbox(Connection& conn, int wake_fd) noexcept : conn_(conn), wake_(wake_fd) {}
  Outbox(const Outbox&) = delete;
  Outbox& operator=(const Outbox&) = delete;

  /// The session thread: sends `a` after whatever callbacks left. 0 or -errno.
  int send(const Answer& a);
  /// The session thread: sends what callbacks left. 0 or -errno.
  int flush();
  /// A completion callback (any thread, under the engine's lock): sends `a` if the socket takes
  /// it now, else leaves it for flush() and signals the session. Never blocks.
  void post(Answer a) noexcept;

 private:
  int flush_locked(std::unique_lock<std::mutex>& lk);
  void wake() noexcept;

  Connection& conn_;
  const int wake_;
  std::mutex mu_;
  flatbuffers::FlatBufferBuilder fb_;
  std::vector<Answer> left_;  // posted, not yet queued
  bool writing_ = false;      // the session thread writes conn_'s output without the lock
};

}  // namespace tierswap::service
