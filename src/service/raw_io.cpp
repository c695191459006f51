// The node service's raw I/O: a tier manager's reads and writes of its region, through the one
// engine of the node, scheduled so that every client gets its share of the drives.
//
// Each connection's thread takes requests in as they arrive; each is answered as soon as the engine
// completes it, in any order (a client's read-ahead is never held behind an earlier request), by
// the engine's completion callback itself (outbox.hpp): the session thread is not woken per
// completion, only when it has something to do: requests waiting for their share, or the last
// one in flight done (its accounting). The engine's queue (depth x block size) is shared fairly:
// while k clients have raw I/O outstanding, each has at most 1/k of the queue's bytes in the
// engine (at least one request), and the rest waits here, in its own queue. A client alone gets the
// whole queue; a client that floods cannot fill the engine's FIFO ahead of the others' requests.
#include <poll.h>
#include <unistd.h>

#include <cerrno>

#include "src/service/server_impl.hpp"
#include "tierswap/log.hpp"

#include <fmt/format.h>

namespace tierswap {

std::uint64_t SwapService::Impl::raw_share() const {
  const std::uint32_t k = std::max<std::uint32_t>(1, busy_clients.load());
  return std::max<std::uint64_t>(align, queue_bytes / k);
}

void SwapService::Impl::update_busy(Session& s) {
  const bool busy = !s.waiting.empty() || !s.inflight.empty();
  if (busy == s.busy) return;
  s.busy = busy;
  if (busy)
    busy_clients.fetch_add(1);
  else
    busy_clients.fetch_sub(1);
}

SwapService::Impl::Session::RawRequest SwapService::Impl::parse_raw(const wire::Message& m) {
  if (m.body_type() == wire::Body::Write) {
    const auto* r = m.body_as_Write();
    return {r->tag(), r->offset(), r->length(), r->memory_offset(), true};
  }
  const auto* r = m.body_as_Read();
  return {r->tag(), r->offset(), r->length(), r->memory_offset(), false};
}

// Why the request cannot be done (empty: it can): the client's kind, units, the region's bounds
// and the shared memory's.
std::string SwapService::Impl::check_raw(const Session& s, const Session::RawRequest& q) const {
  if (!s.rec->raw) return "read/write: a block client (its hello did not ask for raw access)";
  if (q.length == 0 || q.offset % align || q.length % align || q.memory_offset % align)
    return fmt::format("[{}, +{}) from memory {}: not in units of {} B", q.offset, q.length,
                       q.memory_offset, align);
  if (q.offset > s.rec->bytes || q.length > s.rec->bytes - q.offset)
    return fmt::format("[{}, +{}): outside the region of {}", q.offset, q.length, s.rec->bytes);
  if (q.memory_offset > s.mem->bytes || q.length > s.mem->bytes - q.memory_offset)
    return fmt::format("memory [{}, +{}): outside the shared memory of {}", q.memory_offset,
                       q.length, s.mem->bytes);
  return {};
}

bool SwapService::Impl::queue_raw(Session& s, const wire::Message& m) {
  const Session::RawRequest q = parse_raw(m);
  if (const std::string bad = check_raw(s, q); !bad.empty())
    return s.out->send({EINVAL, bad, 0, {}, q.tag}) == 0;
  s.waiting.push_back(q);
  s.waiting_any.store(true);  // completions from here on wake the session
  update_busy(s);
  if (!submit_raw(s)) return false;
  if (!s.waiting.empty()) ++s.traffic->throttled;  // this one waits for the client's share
  return true;
}

namespace {
void signal(int fd) {
  const std::uint64_t one = 1;
  (void)!::write(fd, &one, sizeof one);
}
}  // namespace

// Moves waiting requests into the engine while the client is within its share. Each is answered
// by its completion callback; the session is woken by the last one in flight, or by any while
// requests wait.
bool SwapService::Impl::submit_raw(Session& s) {
  const std::uint64_t share = raw_share();
  while (!s.waiting.empty() &&
         (s.inflight.empty() || s.inflight_bytes + s.waiting.front().length <= share)) {
    const Session::RawRequest q = s.waiting.front();
    s.waiting.pop_front();
    std::byte* mem = s.mem->data + q.memory_offset;
    const IoSegment seg{q.write ? IoOp::write : IoOp::read, s.rec->base + q.offset, q.length, mem};
    s.in_engine.fetch_add(1);
    try {
      IoTicket t = engine->submit(std::span(&seg, 1), [this, &s, q](std::exception_ptr err) {
        Traffic& c = *s.traffic;  // counted before the client can see the answer
        if (!err) (q.write ? c.written_bytes : c.read_bytes) += q.length;
        if (err) count_failed(q.write ? wire::Body::Write : wire::Body::Read);
        s.out->post(err ? service::error_answer(err, q.tag)
                        : service::Answer{0, {}, q.length, {}, q.tag});
        if (s.in_engine.fetch_sub(1) == 1 || s.waiting_any.load()) signal(s.done_fd);
      });
      s.inflight.push_back({q, std::move(t)});
      s.inflight_bytes += q.length;
    } catch (...) {
      s.in_engine.fetch_sub(1);
      count_failed(q.write ? wire::Body::Write : wire::Body::Read);
      if (s.out->send(service::error_answer(std::current_exception(), q.tag)) != 0) return false;
    }
  }
  s.waiting_any.store(!s.waiting.empty());
  Traffic& c = *s.traffic;
  if (s.inflight_bytes > c.peak_inflight_bytes) c.peak_inflight_bytes = s.inflight_bytes;
  return true;
}

// Forgets every completed request (their callbacks answered and counted them), sends what the
// callbacks could not send, then lets waiting requests in.
bool SwapService::Impl::answer_raw(Session& s) {
  // The last callback has run: its ticket reads ready a moment later (see IoEngine::submit).
  if (s.in_engine.load() == 0)
    for (auto& r : s.inflight) engine->wait_any(std::span(&r.ticket, 1));
  for (auto it = s.inflight.begin(); it != s.inflight.end();) {
    if (!it->ticket.ready()) {
      ++it;
      continue;
    }
    s.inflight_bytes -= it->req.length;
    it = s.inflight.erase(it);
  }
  if (s.out->flush() != 0) return false;
  const bool ok = submit_raw(s);
  update_busy(s);
  return ok;
}

bool SwapService::Impl::wait_raw(Peer& p, Session& s, bool* request) {
  pollfd fds[2] = {{p.conn.fd(), POLLIN, 0}, {s.done_fd, POLLIN, 0}};
  const bool buffered = p.conn.buffered();  // a request already read: only look at completions
  if (::poll(fds, 2, buffered ? 0 : -1) < 0) return errno == EINTR;
  if (fds[1].revents & POLLIN) {
    std::uint64_t n;
    (void)!::read(s.done_fd, &n, sizeof n);
  }
  if (!answer_raw(s)) return false;  // on every wake: a request's share needs the accounts
  *request = buffered || fds[0].revents != 0;  // a message, or the end of the stream
  return true;
}

// Every raw request answered (before a request that must follow them, e.g. a Sync).
bool SwapService::Impl::drain_raw(Session& s) {
  while (s.busy) {
    if (!s.inflight.empty()) engine->wait_any(std::span(&s.inflight.front().ticket, 1));
    if (!answer_raw(s)) return false;
  }
  return true;
}

// The connection is gone: waiting requests are dropped, those in the engine waited for (the
// memory they use is unmapped after this, and their callbacks use the session).
void SwapService::Impl::abandon_raw(Session& s) {
  s.waiting.clear();
  s.waiting_any.store(false);
  for (auto& r : s.inflight) r.ticket = IoTicket{};
  s.inflight.clear();
  s.inflight_bytes = 0;
  update_busy(s);
}

}  // namespace tierswap
