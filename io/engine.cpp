// IoEngine: splitting, queueing, the one completion path, bounce buffers.
//
// Locking: one mutex (mu_) guards the FIFO of tickets, the requests, the bounce pool and every
// call into the backend's submission side. The reaper thread blocks in backend->reap() without the
// lock (the completion side has that single consumer), then takes the lock to run complete() on
// each completion and to refill the queue.
#include "tierswap/io_engine.hpp"

#include <sched.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "tierswap/aligned_buffer.hpp"
#include "tierswap/detail/io_backend.hpp"
#include "tierswap/error.hpp"
#include "tierswap/log.hpp"
#include "tierswap/units.hpp"

#include <fmt/format.h>

namespace tierswap {

namespace detail {

struct TicketState {
  std::vector<IoSegment> segments;
  std::size_t seg = 0;    // split cursor: current segment
  std::uint64_t pos = 0;  // split cursor: bytes of it already issued
  std::uint32_t inflight = 0;
  std::atomic<std::uint64_t> done_bytes{0};
  std::atomic<bool> ready{false};
  std::exception_ptr error;
  std::function<void(std::exception_ptr)> on_ready;  // IoEngine::submit's notification, once
  bool queued = false;
  TicketState* next = nullptr;        // FIFO link
  std::shared_ptr<TicketState> self;  // keeps the state alive while the engine uses it

  bool split_done() const noexcept { return seg >= segments.size(); }
};

}  // namespace detail

using detail::IoBackend;
using detail::IoCompletion;
using detail::IoRequest;
using detail::TicketState;

namespace {

enum class Phase : std::uint8_t { direct, bounce_read, bounce_write, rmw_read, rmw_write };

struct Request {
  IoRequest req;  // must stay first: completions hand back &req
  TicketState* ticket = nullptr;
  Phase phase = Phase::direct;
  std::uint32_t retries = 0;
  std::uint64_t first_offset = 0;  // physical range as first issued, for error messages
  std::uint32_t first_length = 0;
  std::byte* user = nullptr;  // user buffer of this chunk
  std::uint32_t user_len = 0;
  std::uint32_t head = 0;  // user data starts at bounce + head
  std::uint64_t aligned_offset = 0;
  std::uint32_t aligned_len = 0;
  std::byte* bounce = nullptr;
  int region = -1;            // registered region used, for unregister_buffer()
  int fixed = -1;             // fixed-buffer slot of the piece holding the buffer, or -1
  std::int64_t start_ns = 0;  // when the chunk was built, for the latency histogram
  Request* next = nullptr;    // free list / resubmit list
};
static_assert(offsetof(Request, req) == 0);

// A registered buffer, cut into pieces of `piece` bytes, each its own io_uring fixed-buffer
// slot: the kernel's cost of a fixed-buffer request grows with its offset inside the registered
// buffer, so one large slab registered whole is slower than the same memory in block-size pieces.
struct Region {
  std::byte* data = nullptr;
  std::size_t bytes = 0;
  std::size_t piece = 0;
  std::uint32_t first_fixed = 0;  // its pieces are fixed-buffer slots first_fixed..+fixed_count
  std::uint32_t fixed_count = 0;
  std::uint32_t inflight = 0;
  bool used = false;
};

}  // namespace

struct IoEngine::Impl {
  IoEngine& owner;
  std::unique_ptr<IoBackend> backend;
  std::mutex mu;
  std::condition_variable done_cv;    // a ticket became ready
  std::condition_variable region_cv;  // a region's in-flight count dropped
  std::vector<Request> request_pool;  // queue_depth of them, free or in flight
  Request* free_requests = nullptr;
  Request* resubmit = nullptr;  // requests that must go to the backend again
  std::uint32_t inflight = 0;
  TicketState* fifo_head = nullptr;
  TicketState* fifo_tail = nullptr;
  std::vector<Region> regions;
  std::vector<bool> fixed_used;  // backend fixed-buffer slots
  // Bounce buffers: one per request, created on first need (registered as a fixed buffer if
  // possible).
  AlignedBuffer bounce_pool;
  std::size_t bounce_size = 0;
  int bounce_region = -1;
  std::vector<std::byte*> free_bounce;
  bool stop = false;
  std::thread reaper;
  // Owner mode (backend->owner_thread_submits()): only the reaper touches the backend's
  // submission side; other threads queue work and wake it when it is blocked in reap().
  bool owner_submits = false;
  bool reaper_waiting = false;
  struct Control {
    std::function<void()> fn;
    bool done = false;
  };
  std::vector<Control*> controls;  // one per waiting caller
  std::uint32_t max_align = 1;
  // Requests per backend call (0: all): IoEngineConfig::submit_batch where the backend hands
  // each call to the kernel as one submission (io_uring, libaio), which Linux plugs from 3
  // requests on, merging those adjacent on disk into ones larger than block_size.
  std::uint32_t submit_per_call = 0;

  std::atomic<std::uint64_t> bytes_read{0}, bytes_written{0}, requests{0}, short_transfers{0},
      retries{0}, bounce_requests{0}, fixed_requests{0}, failed_tickets{0};
  std::atomic<std::uint64_t> latency[32] = {};

  static std::int64_t now_ns() noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  explicit Impl(IoEngine& e) : owner(e) {}

  const SwapFile& file(std::uint32_t i) const { return owner.space_.files()[i]; }

  // ---- FIFO -----------------------------------------------------------------------------------
  void push(TicketState* t) {
    t->queued = true;
    t->next = nullptr;
    if (fifo_tail)
      fifo_tail->next = t;
    else
      fifo_head = t;
    fifo_tail = t;
  }
  void pop_head() {
    TicketState* t = fifo_head;
    fifo_head = t->next;
    if (!fifo_head) fifo_tail = nullptr;
    t->next = nullptr;
    t->queued = false;
  }
  void unlink(TicketState* t) {
    TicketState* prev = nullptr;
    for (TicketState* p = fifo_head; p; prev = p, p = p->next) {
      if (p != t) continue;
      (prev ? prev->next : fifo_head) = p->next;
      if (fifo_tail == p) fifo_tail = prev;
      p->next = nullptr;
      p->queued = false;
      return;
    }
  }

  // ---- tickets --------------------------------------------------------------------------------
  void maybe_finish(TicketState* t) {
    if (t->inflight != 0 || t->queued) return;
    if (!t->split_done() && !t->error) return;
    if (t->error) failed_tickets.fetch_add(1, std::memory_order_relaxed);
    // Before the ticket reads ready: whoever sees it ready (or destroys it) knows the
    // notification has returned.
    if (t->on_ready) std::exchange(t->on_ready, nullptr)(t->error);
    t->ready.store(true, std::memory_order_release);
    auto keep = std::move(t->self);  // may free t when the user already dropped the ticket
    done_cv.notify_all();
  }

  void fail(Request* s, int err, std::string_view detail = {}) {
    TicketState* t = s->ticket;
    if (!t->error) {
      const char* op = s->req.op == IoOp::read ? "read" : "write";
      t->error = std::make_exception_ptr(
          io_error(err, op, file(s->req.file).name(), s->first_offset, s->first_length, detail));
    }
    if (t->queued) unlink(t);
    finish(s, /*ok=*/false);
  }

  void finish(Request* s, bool ok) {
    TicketState* t = s->ticket;
    if (ok) {
      t->done_bytes.fetch_add(s->user_len, std::memory_order_relaxed);
      (s->req.op == IoOp::read ? bytes_read : bytes_written)
          .fetch_add(s->user_len, std::memory_order_relaxed);
      const std::uint64_t us =
          static_cast<std::uint64_t>(std::max<std::int64_t>(0, now_ns() - s->start_ns)) / 1000;
      const int bucket = us < 2 ? 0 : std::min(31, 63 - __builtin_clzll(us));
      latency[bucket].fetch_add(1, std::memory_order_relaxed);
    }
    if (s->bounce) free_bounce.push_back(s->bounce);
    if (s->region >= 0 && --regions[s->region].inflight == 0) region_cv.notify_all();
    s->bounce = nullptr;
    s->region = -1;
    s->ticket = nullptr;
    s->next = free_requests;
    free_requests = s;
    --inflight;
    --t->inflight;
    maybe_finish(t);
  }

  void requeue(Request* s) {
    s->next = resubmit;
    resubmit = s;
  }

  // ---- the one completion path ----------------------------------------------------------------
  void complete(Request* s, std::int64_t res) {
    IoRequest& r = s->req;
    if (res < 0) {
      const int err = static_cast<int>(-res);
      if ((err == EAGAIN || err == EINTR) && s->retries < owner.config_.max_retries) {
        ++s->retries;
        retries.fetch_add(1, std::memory_order_relaxed);
        requeue(s);
        return;
      }
      fail(s, err, err == EAGAIN || err == EINTR ? "retries exhausted" : std::string_view{});
      return;
    }
    std::uint64_t moved = static_cast<std::uint64_t>(res);
    if (moved > r.length) {
      fail(s, EIO, "backend reported more bytes than asked");
      return;
    }
    if (moved < r.length) {
      short_transfers.fetch_add(1, std::memory_order_relaxed);
      const SwapFile& f = file(r.file);
      // On O_DIRECT files only aligned progress can be kept: the partial block is redone
      // (re-reading or re-writing the same bytes is idempotent).
      if (f.direct) moved = round_down(moved, std::max(f.offset_align, f.mem_align));
      if (res == 0 && r.op == IoOp::read) {
        fail(s, EIO, "unexpected end of file (swap file truncated?)");
        return;
      }
      if (moved == 0) {
        if (s->retries >= owner.config_.max_retries) {
          fail(s, EIO, "no progress after retries");
          return;
        }
        ++s->retries;
        retries.fetch_add(1, std::memory_order_relaxed);
      }
      r.offset += moved;
      r.buffer += moved;
      r.length -= static_cast<std::uint32_t>(moved);
      requeue(s);
      return;
    }
    // This request's transfer is complete.
    switch (s->phase) {
      case Phase::bounce_read:
        std::memcpy(s->user, s->bounce + s->head, s->user_len);
        break;
      case Phase::rmw_read:
        std::memcpy(s->bounce + s->head, s->user, s->user_len);
        s->phase = Phase::rmw_write;
        s->retries = 0;
        r.op = IoOp::write;
        r.offset = s->aligned_offset;
        r.buffer = s->bounce;
        r.length = s->aligned_len;
        requeue(s);
        return;
      default:
        break;
    }
    finish(s, /*ok=*/true);
  }

  // ---- splitting and submission ---------------------------------------------------------------
  // The registered region holding [p, p + n), and in *fixed the slot of its piece when the
  // range lies inside one piece (else -1: the request goes unregistered).
  int region_of(const std::byte* p, std::size_t n, int* fixed) const {
    *fixed = -1;
    for (std::size_t i = 0; i < regions.size(); ++i) {
      const Region& g = regions[i];
      if (!g.used || p < g.data || p + n > g.data + g.bytes) continue;
      const std::size_t k = static_cast<std::size_t>(p - g.data) / g.piece;
      if (p + n <= g.data + (k + 1) * g.piece) *fixed = static_cast<int>(g.first_fixed + k);
      return static_cast<int>(i);
    }
    return -1;
  }

  void ensure_bounce_pool() {
    if (bounce_pool) return;
    bounce_size = round_up(owner.config_.block_size + 2 * max_align, 4096);
    bounce_pool =
        AlignedBuffer(bounce_size * request_pool.size(), std::max<std::size_t>(4096, max_align));
    for (std::size_t i = 0; i < request_pool.size(); ++i)
      free_bounce.push_back(bounce_pool.data() + i * bounce_size);
    bounce_region = register_locked(bounce_pool.data(), bounce_pool.size(), bounce_size);
  }

  // Does an in-flight read-modify-write touch [a0, a1) of file f?
  bool rmw_conflict(std::uint32_t f, std::uint64_t a0, std::uint64_t a1) const {
    for (const Request& s : request_pool) {
      if (s.ticket && (s.phase == Phase::rmw_read || s.phase == Phase::rmw_write) &&
          s.req.file == f && s.aligned_offset < a1 && a0 < s.aligned_offset + s.aligned_len)
        return true;
    }
    return false;
  }

  // Ticket t's next chunk: where it lands (at most a block; on a direct file cut at an aligned
  // boundary unless it ends its segment, so only a segment's first and last chunk can have
  // partial blocks) and how it moves: straight from the caller's buffer, or through a bounce
  // buffer of the aligned span [a0, a0 + alen) (a read-modify-write for a partial write).
  struct Chunk {
    PhysicalSpan ps;
    std::byte* user = nullptr;
    std::uint64_t len = 0, a0 = 0, alen = 0;
    Phase phase = Phase::direct;
  };
  Chunk next_chunk(const TicketState* t) const {
    const IoSegment& seg = t->segments[t->seg];
    const std::uint64_t remaining = seg.length - t->pos;
    Chunk c;
    c.ps = owner.space_.map(seg.offset + t->pos, std::min(remaining, owner.config_.block_size));
    c.user = static_cast<std::byte*>(seg.buffer) + t->pos;
    c.len = c.ps.length;
    c.a0 = c.ps.offset;
    c.alen = c.len;
    const SwapFile& f = file(c.ps.file);
    if (!f.direct) return c;
    const std::uint64_t oa = f.offset_align;
    if (c.len < remaining && (c.ps.offset + c.len) % oa != 0) {
      const std::uint64_t end = round_down(c.ps.offset + c.len, oa);
      if (end > c.ps.offset) c.len = end - c.ps.offset;
    }
    const bool partial = c.ps.offset % oa != 0 || c.len % oa != 0;
    if (!partial && reinterpret_cast<std::uintptr_t>(c.user) % f.mem_align == 0) return c;
    c.a0 = round_down(c.ps.offset, oa);
    c.alen = round_up(c.ps.offset + c.len, oa) - c.a0;
    if (seg.op == IoOp::read)
      c.phase = Phase::bounce_read;
    else
      c.phase = partial ? Phase::rmw_read : Phase::bounce_write;
    return c;
  }

  // Whether chunk c can start now: a bounce buffer free, no read-modify-write in flight on its
  // blocks.
  bool can_start(const Chunk& c) {
    if (c.phase == Phase::direct) return true;
    ensure_bounce_pool();
    if (c.phase == Phase::rmw_read && rmw_conflict(c.ps.file, c.a0, c.a0 + c.alen)) return false;
    return !free_bounce.empty();
  }

  // Request s through a bounce buffer (a write's bytes copied into it now).
  void point_at_bounce(Request* s, const Chunk& c) {
    IoRequest& r = s->req;
    s->bounce = free_bounce.back();
    free_bounce.pop_back();
    s->head = static_cast<std::uint32_t>(c.ps.offset - c.a0);
    s->aligned_offset = c.a0;
    s->aligned_len = static_cast<std::uint32_t>(c.alen);
    r.op = c.phase == Phase::bounce_write ? IoOp::write : IoOp::read;
    r.offset = c.a0;
    r.length = static_cast<std::uint32_t>(c.alen);
    r.buffer = s->bounce;
    if (c.phase == Phase::bounce_write) std::memcpy(s->bounce + s->head, c.user, c.len);
    s->region = bounce_region;
    s->fixed = -1;
    if (bounce_region >= 0) {
      const Region& g = regions[bounce_region];
      s->fixed = static_cast<int>(g.first_fixed + (s->bounce - g.data) / g.piece);
    }
    bounce_requests.fetch_add(1, std::memory_order_relaxed);
  }

  // Builds the next request of ticket t into a free one; false when it must wait.
  bool build(TicketState* t, Request** out) {
    const Chunk c = next_chunk(t);
    if (!can_start(c)) return false;
    Request* s = free_requests;
    free_requests = s->next;
    s->next = nullptr;
    s->ticket = t;
    s->phase = c.phase;
    s->retries = 0;
    s->user = c.user;
    s->user_len = static_cast<std::uint32_t>(c.len);
    s->req.file = c.ps.file;
    s->req.backend_data = nullptr;
    if (c.phase == Phase::direct) {
      s->req.op = t->segments[t->seg].op;
      s->req.offset = c.ps.offset;
      s->req.length = static_cast<std::uint32_t>(c.len);
      s->req.buffer = c.user;
      s->region = region_of(c.user, c.len, &s->fixed);
    } else {
      point_at_bounce(s, c);
    }
    if (s->region >= 0) ++regions[s->region].inflight;
    s->first_offset = c.ps.offset;
    s->first_length = static_cast<std::uint32_t>(c.len);
    s->start_ns = now_ns();
    ++inflight;
    ++t->inflight;
    t->pos += c.len;
    while (t->seg < t->segments.size() && t->pos == t->segments[t->seg].length) {
      ++t->seg;
      t->pos = 0;
    }
    *out = s;
    return true;
  }

  // Fills the queue up to its depth and hands the batch to the backend. Called with mu held.
  void pump() {
    IoRequest* batch[256];
    for (;;) {
      std::size_t n = 0;
      while (resubmit && n < std::size(batch)) {
        Request* s = resubmit;
        resubmit = s->next;
        s->next = nullptr;
        batch[n++] = &s->req;
      }
      while (n < std::size(batch) && free_requests && fifo_head) {
        TicketState* t = fifo_head;
        if (t->error || t->split_done()) {
          pop_head();
          maybe_finish(t);
          continue;
        }
        Request* s = nullptr;
        if (!build(t, &s)) break;
        batch[n++] = &s->req;
        if (t->split_done()) pop_head();
      }
      if (n == 0) return;
      submit_batch(batch, n);
    }
  }

  void submit_batch(IoRequest** batch, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      IoRequest& r = *batch[i];
      Request* s = reinterpret_cast<Request*>(batch[i]);
      r.buffer_index = -1;
      if (s->fixed >= 0) {
        r.buffer_index = s->fixed;
        fixed_requests.fetch_add(1, std::memory_order_relaxed);
      }
    }
    std::size_t done = 0;
    std::uint32_t attempts = 0;
    int last = 0;
    const std::size_t per_call = submit_per_call ? submit_per_call : n;
    while (done < n) {
      const std::size_t k = std::min(per_call, n - done);
      int r = backend->submit(std::span<IoRequest* const>(batch + done, k));
      if (r > 0) {
        done += static_cast<std::size_t>(r);
        attempts = 0;
        continue;
      }
      last = r == 0 ? -EAGAIN : r;
      if ((last == -EAGAIN || last == -EINTR || last == -EBUSY) &&
          ++attempts <= owner.config_.max_retries) {
        sched_yield();
        continue;
      }
      break;
    }
    requests.fetch_add(done, std::memory_order_relaxed);
    for (std::size_t i = done; i < n; ++i) {
      Request* s = reinterpret_cast<Request*>(batch[i]);
      fail(s, -last, "the backend did not accept the request");
    }
  }

  // ---- buffers --------------------------------------------------------------------------------
  int register_locked(void* data, std::size_t bytes, std::size_t piece) {
    const std::uint32_t cap = backend->buffer_slots();
    if (cap == 0) return -1;
    if (fixed_used.size() < cap) fixed_used.resize(cap);
    piece = std::max<std::size_t>(piece, 4096);
    const std::size_t count = (bytes + piece - 1) / piece;
    // First fit of `count` consecutive free slots.
    std::size_t first = 0, run = 0;
    for (std::size_t i = 0; i < cap && run < count; ++i) {
      if (fixed_used[i]) {
        run = 0;
        first = i + 1;
      } else {
        ++run;
      }
    }
    if (run < count) {
      log(LogLevel::info, fmt::format("fixed buffer of {} not registered: no {} free slots",
                                      format_bytes(bytes), count));
      return -1;
    }
    auto* base = static_cast<std::byte*>(data);
    for (std::size_t k = 0; k < count; ++k) {
      const std::size_t len = std::min(piece, bytes - k * piece);
      const int r =
          backend->register_buffer(static_cast<std::uint32_t>(first + k), base + k * piece, len);
      if (r < 0) {
        for (std::size_t j = 0; j < k; ++j)
          backend->unregister_buffer(static_cast<std::uint32_t>(first + j));
        log(LogLevel::info, fmt::format("fixed buffer of {} not registered: {}",
                                        format_bytes(bytes), std::strerror(-r)));
        return -1;
      }
    }
    for (std::size_t k = 0; k < count; ++k) fixed_used[first + k] = true;
    Region g{
        base, bytes, piece, static_cast<std::uint32_t>(first), static_cast<std::uint32_t>(count),
        0,    true};
    for (std::size_t i = 0; i < regions.size(); ++i) {
      if (!regions[i].used) {
        regions[i] = g;
        return static_cast<int>(i);
      }
    }
    regions.push_back(g);
    return static_cast<int>(regions.size() - 1);
  }

  void unregister_locked(int handle) {
    Region& g = regions[handle];
    for (std::uint32_t k = 0; k < g.fixed_count; ++k) {
      backend->unregister_buffer(g.first_fixed + k);
      fixed_used[g.first_fixed + k] = false;
    }
    g = Region{};
  }

  // Wakes the reaper when it is blocked in reap(). Called with mu held.
  void kick() {
    if (reaper_waiting) backend->wake();
  }

  // Runs fn on the reaper thread (owner mode) or here (otherwise), under mu either way.
  void run_on_reaper(std::unique_lock<std::mutex>& lock, std::function<void()> fn) {
    if (!owner_submits) {
      fn();
      return;
    }
    Control c{std::move(fn)};
    controls.push_back(&c);
    kick();
    done_cv.wait(lock, [&] { return c.done; });
  }

  // ---- reaper thread --------------------------------------------------------------------------
  void reap_loop(std::promise<int>& attached) {
    const int a = backend->attach_reaper_thread();
    if (a >= 0) {
      // Counted as waiting from here on: a kick that comes before the first reap() is kept by
      // the backend (eventfd count, pending NOP, wake flag) and ends that wait at once.
      std::lock_guard lock(mu);
      reaper_waiting = true;
    }
    attached.set_value(a);
    if (a < 0) return;
    IoCompletion comps[128];
    bool warned = false;
    for (;;) {
      int n = backend->reap(std::span<IoCompletion>(comps), /*wait=*/true);
      std::unique_lock lock(mu);
      reaper_waiting = false;
      if (n < 0 && n != -EINTR && n != -EAGAIN && n != -ETIME && !warned) {
        log(LogLevel::error, fmt::format("I/O backend reap failed: {}", std::strerror(-n)));
        warned = true;
      }
      for (int i = 0; i < n; ++i) {
        if (comps[i].request == nullptr) continue;  // wake-up
        complete(reinterpret_cast<Request*>(comps[i].request), comps[i].result);
      }
      if (!controls.empty()) {
        for (Control* c : controls) {
          c->fn();
          c->done = true;
        }
        controls.clear();
        done_cv.notify_all();
      }
      pump();
      if (stop && inflight == 0 && !fifo_head) return;
      reaper_waiting = true;
    }
  }
};

// ---- IoTicket ---------------------------------------------------------------------------------

IoTicket::IoTicket(IoEngine* engine, std::shared_ptr<detail::TicketState> state) noexcept
    : engine_(engine), state_(std::move(state)) {}
IoTicket::IoTicket(IoTicket&& o) noexcept
    : engine_(std::exchange(o.engine_, nullptr)), state_(std::move(o.state_)) {}
IoTicket& IoTicket::operator=(IoTicket&& o) noexcept {
  if (this != &o) {
    if (state_ && !ready()) {
      try {
        wait();
      } catch (...) {
      }
    }
    engine_ = std::exchange(o.engine_, nullptr);
    state_ = std::move(o.state_);
  }
  return *this;
}
IoTicket::~IoTicket() {
  if (state_ && !ready()) {
    try {
      wait();
    } catch (...) {
    }
  }
}
bool IoTicket::ready() const noexcept {
  return state_ && state_->ready.load(std::memory_order_acquire);
}
void IoTicket::wait() {
  if (!state_) throw std::logic_error("IoTicket::wait on an empty ticket");
  if (!ready()) {
    std::unique_lock lock(engine_->impl_->mu);
    engine_->impl_->done_cv.wait(lock, [&] { return ready(); });
  }
  if (state_->error) std::rethrow_exception(state_->error);
}
std::uint64_t IoTicket::bytes_done() const noexcept {
  return state_ ? state_->done_bytes.load(std::memory_order_relaxed) : 0;
}
std::exception_ptr IoTicket::error() const noexcept {
  return ready() ? state_->error : std::exception_ptr{};
}

// ---- IoEngine ---------------------------------------------------------------------------------

namespace detail {
BackendParams backend_params(const SwapSpace& space, const IoEngineConfig& c,
                             std::vector<int>& fds) {
  fds.clear();
  for (const auto& f : space.files()) fds.push_back(f.fd);
  BackendParams p;
  p.fds = fds;
  p.queue_depth = c.queue_depth;
  p.sqpoll = c.sqpoll;
  p.sqpoll_idle_ms = c.sqpoll_idle_ms;
  p.threads = c.posix_threads;
  return p;
}
}  // namespace detail

IoEngine::IoEngine(const SwapSpace& space, IoEngineConfig config)
    : IoEngine(space, config, nullptr) {}

IoEngine::IoEngine(const SwapSpace& space, IoEngineConfig config,
                   std::unique_ptr<detail::IoBackend> backend)
    : space_(space), config_(config) {
  config_.validate();
  if (space.files().empty())
    throw std::invalid_argument("IoEngine: the swap space has no open files");
  if (!backend) {
    std::vector<int> fds;
    auto p = detail::backend_params(space, config_, fds);
    backend = detail::choose_backend(config_.backend, p, &description_);
  } else {
    description_ = std::string(to_string(backend->kind())) + " (" + backend->describe() + ")";
  }
  kind_ = backend->kind();
  impl_ = std::make_unique<Impl>(*this);
  impl_->backend = std::move(backend);
  impl_->request_pool.resize(config_.queue_depth);
  for (std::uint32_t i = 0; i < config_.queue_depth; ++i) {
    Request& s = impl_->request_pool[config_.queue_depth - 1 - i];
    s.req.id = config_.queue_depth - 1 - i;
    s.next = impl_->free_requests;
    impl_->free_requests = &s;
  }
  for (const auto& f : space.files())
    impl_->max_align = std::max({impl_->max_align, f.offset_align, f.mem_align});
  // A service client's region has no files of its own: how they are opened is the service's.
  if (!space.all_direct() && kind_ != IoBackendKind::service)
    description_ += ", buffered I/O on some files";
  log(LogLevel::info, "I/O engine: " + description_);
  impl_->owner_submits = impl_->backend->owner_thread_submits();
  if (kind_ == IoBackendKind::uring || kind_ == IoBackendKind::aio)
    impl_->submit_per_call = config_.submit_batch;
  std::promise<int> attached;
  auto result = attached.get_future();
  impl_->reaper = std::thread([this, &attached] { impl_->reap_loop(attached); });
  if (const int r = result.get(); r < 0) {
    impl_->reaper.join();
    throw std::system_error(-r, std::system_category(),
                            "I/O engine: the reaper thread could not take over the backend");
  }
}

IoEngine::~IoEngine() {
  {
    std::unique_lock lock(impl_->mu);
    impl_->done_cv.wait(lock, [&] { return impl_->inflight == 0 && !impl_->fifo_head; });
    impl_->stop = true;
    impl_->backend->wake();
  }
  impl_->reaper.join();
  // Registered buffers go with the backend (closing an io_uring ring releases its table).
}

IoTicket IoEngine::submit(std::span<const IoSegment> segments) {
  return submit(segments, nullptr);
}

IoTicket IoEngine::submit(std::span<const IoSegment> segments,
                          std::function<void(std::exception_ptr)> on_ready) {
  auto st = std::make_shared<TicketState>();
  st->segments.reserve(segments.size());
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const IoSegment& s = segments[i];
    if (s.length == 0) continue;
    if (s.buffer == nullptr)
      throw std::invalid_argument(fmt::format("IoEngine::submit: segment {} has a null buffer", i));
    if (s.offset > space_.capacity() || s.length > space_.capacity() - s.offset)
      throw std::out_of_range(fmt::format(
          "IoEngine::submit: segment {} @{}+{} lies outside the swap space (capacity {})", i,
          s.offset, s.length, space_.capacity()));
    st->segments.push_back(s);
  }
  if (st->segments.empty()) {
    if (on_ready) on_ready(nullptr);
    st->ready.store(true);
    return IoTicket(this, std::move(st));
  }
  st->on_ready = std::move(on_ready);
  std::lock_guard lock(impl_->mu);
  st->self = st;
  impl_->push(st.get());
  if (impl_->owner_submits)
    impl_->kick();
  else
    impl_->pump();
  return IoTicket(this, std::move(st));
}

IoTicket IoEngine::read(std::uint64_t offset, void* buffer, std::uint64_t length) {
  IoSegment s{IoOp::read, offset, length, buffer};
  return submit(std::span(&s, 1));
}

IoTicket IoEngine::write(std::uint64_t offset, const void* buffer, std::uint64_t length) {
  IoSegment s{IoOp::write, offset, length, const_cast<void*>(buffer)};
  return submit(std::span(&s, 1));
}

std::size_t IoEngine::wait_any(std::span<IoTicket* const> tickets) {
  auto first_ready = [&]() -> std::size_t {
    bool any_valid = false;
    for (std::size_t i = 0; i < tickets.size(); ++i) {
      if (tickets[i] == nullptr || !tickets[i]->valid()) continue;
      any_valid = true;
      if (tickets[i]->ready()) return i;
    }
    return any_valid ? tickets.size() + 1 : tickets.size();
  };
  std::size_t i = first_ready();
  if (i <= tickets.size()) return i;
  std::unique_lock lock(impl_->mu);
  impl_->done_cv.wait(lock, [&] { return (i = first_ready()) <= tickets.size(); });
  return i;
}

std::size_t IoEngine::wait_any(std::span<IoTicket> tickets) {
  std::vector<IoTicket*> p;
  p.reserve(tickets.size());
  for (auto& t : tickets) p.push_back(&t);
  return wait_any(std::span<IoTicket* const>(p));
}

int IoEngine::register_buffer(void* data, std::size_t bytes) {
  if (data == nullptr || bytes == 0)
    throw std::invalid_argument("IoEngine::register_buffer: null or empty region");
  std::unique_lock lock(impl_->mu);
  int handle = -1;
  impl_->run_on_reaper(lock,
                       [&] { handle = impl_->register_locked(data, bytes, config_.block_size); });
  return handle;
}

void IoEngine::unregister_buffer(int handle) {
  std::unique_lock lock(impl_->mu);
  if (handle < 0 || static_cast<std::size_t>(handle) >= impl_->regions.size() ||
      !impl_->regions[handle].used || handle == impl_->bounce_region)
    throw std::invalid_argument(
        fmt::format("IoEngine::unregister_buffer: {} is not a registered buffer", handle));
  impl_->region_cv.wait(lock, [&] { return impl_->regions[handle].inflight == 0; });
  impl_->run_on_reaper(lock, [&] { impl_->unregister_locked(handle); });
}

IoStats IoEngine::stats() const noexcept {
  const Impl& m = *impl_;
  IoStats s;
  s.bytes_read = m.bytes_read.load();
  s.bytes_written = m.bytes_written.load();
  s.requests = m.requests.load();
  s.short_transfers = m.short_transfers.load();
  s.retries = m.retries.load();
  s.bounce_requests = m.bounce_requests.load();
  s.fixed_requests = m.fixed_requests.load();
  s.failed_tickets = m.failed_tickets.load();
  for (std::size_t k = 0; k < s.latency_us_log2.size(); ++k)
    s.latency_us_log2[k] = m.latency[k].load();
  return s;
}

}  // namespace tierswap

namespace tierswap {

void IoEngine::sync() {
  const int r = impl_->backend->sync();
  if (r == -EOPNOTSUPP) return space_.sync();
  if (r < 0)
    throw std::system_error(
        -r, std::system_category(),
        std::string("sync through the ") + std::string(to_string(kind_)) + " backend");
}

bool IoEngine::memory_is_shared() const noexcept {
  return impl_->backend->memory_is_shared();
}

std::byte* IoEngine::allocate_shared(std::uint64_t bytes, bool locked) noexcept {
  return impl_->backend->allocate_shared(bytes, locked);
}

void IoEngine::free_shared(std::byte* p) noexcept {
  impl_->backend->free_shared(p);
}

}  // namespace tierswap
