// The node service's raw I/O: a tier manager's reads and writes of its region, through the one
// engine of the node, scheduled so that every client gets its share of the drives.
//
// Each connection's thread takes requests in as they arrive and answers each as soon as the engine
// completes it (the engine signals the session's eventfd), in any order: a client's read-ahead is
// never held behind an earlier request. The engine's queue (depth x block size) is shared fairly:
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

bool SwapService::Impl::queue_raw(Peer& p, Session& s, const wire::Message& m,
                                  flatbuffers::FlatBufferBuilder& fb) {
  const Session::RawRequest q = parse_raw(m);
  if (const std::string bad = check_raw(s, q); !bad.empty()) {
    build_reply(p.conn, fb, EINVAL, bad, 0, {}, q.tag);
    return p.conn.send(fb) == 0;
  }
  s.waiting.push_back(q);
  update_busy(s);
  if (!submit_raw(p, s, fb)) return false;
  if (!s.waiting.empty()) {  // this one waits for the client's share
    std::lock_guard lk(mu);
    ++live[s.key].throttled;
  }
  return true;
}

// Moves waiting requests into the engine while the client is within its share.
bool SwapService::Impl::submit_raw(Peer& p, Session& s, flatbuffers::FlatBufferBuilder& fb) {
  const std::uint64_t share = raw_share();
  while (!s.waiting.empty() &&
         (s.inflight.empty() || s.inflight_bytes + s.waiting.front().length <= share)) {
    const Session::RawRequest q = s.waiting.front();
    s.waiting.pop_front();
    std::byte* mem = s.mem->data + q.memory_offset;
    const IoSegment seg{q.write ? IoOp::write : IoOp::read, s.rec->base + q.offset, q.length, mem};
    try {
      IoTicket t = engine->submit(std::span(&seg, 1), [fd = s.done_fd] {
        const std::uint64_t one = 1;
        (void)!::write(fd, &one, sizeof one);
      });
      s.inflight.push_back({q, std::move(t)});
      s.inflight_bytes += q.length;
    } catch (...) {
      fb.Clear();
      build_error_reply(p.conn, fb, std::current_exception(), q.tag);
      if (p.conn.send(fb) != 0) return false;
    }
  }
  std::lock_guard lk(mu);
  Live& l = live[s.key];
  l.inflight_bytes = s.inflight_bytes;
  l.peak_inflight_bytes = std::max(l.peak_inflight_bytes, s.inflight_bytes);
  return true;
}

// Answers every completed request, then lets waiting ones in.
bool SwapService::Impl::answer_raw(Peer& p, Session& s, flatbuffers::FlatBufferBuilder& fb) {
  for (auto it = s.inflight.begin(); it != s.inflight.end();) {
    if (!it->ticket.ready()) {
      ++it;
      continue;
    }
    const Session::RawRequest q = it->req;
    const std::exception_ptr err = it->ticket.error();
    s.inflight_bytes -= q.length;
    it = s.inflight.erase(it);
    fb.Clear();
    if (err) {
      build_error_reply(p.conn, fb, err, q.tag);
    } else {
      build_reply(p.conn, fb, 0, {}, q.length, {}, q.tag);
      std::lock_guard lk(mu);
      (q.write ? live[s.key].written_bytes : live[s.key].read_bytes) += q.length;
    }
    if (p.conn.send(fb) != 0) return false;
  }
  const bool ok = submit_raw(p, s, fb);
  update_busy(s);
  return ok;
}

bool SwapService::Impl::wait_raw(Peer& p, Session& s, flatbuffers::FlatBufferBuilder& fb,
                                 bool* request) {
  pollfd fds[2] = {{p.conn.fd(), POLLIN, 0}, {s.done_fd, POLLIN, 0}};
  const bool buffered = p.conn.buffered();  // a request already read: only look at completions
  if (::poll(fds, 2, buffered ? 0 : -1) < 0) return errno == EINTR;
  if (fds[1].revents & POLLIN) {
    std::uint64_t n;
    (void)!::read(s.done_fd, &n, sizeof n);
    if (!answer_raw(p, s, fb)) return false;
  }
  *request = buffered || fds[0].revents != 0;  // a message, or the end of the stream
  return true;
}

// Every raw request answered (before a request that must follow them, e.g. a Sync).
bool SwapService::Impl::drain_raw(Peer& p, Session& s, flatbuffers::FlatBufferBuilder& fb) {
  while (s.busy) {
    if (!s.inflight.empty()) engine->wait_any(std::span(&s.inflight.front().ticket, 1));
    if (!answer_raw(p, s, fb)) return false;
  }
  return true;
}

// The connection is gone: waiting requests are dropped, those in the engine waited for (the
// memory they use is unmapped after this).
void SwapService::Impl::abandon_raw(Session& s) {
  s.waiting.clear();
  for (auto& r : s.inflight) r.ticket = IoTicket{};
  s.inflight.clear();
  s.inflight_bytes = 0;
  update_busy(s);
}

}  // namespace tierswap
