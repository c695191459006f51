// ServiceStorage: a raw client's region as a swap space, and an I/O backend that hands the
// engine's requests to the service (Read/Write with the request id as tag, answered in any order)
// and carves the host pools' slabs from the shared memory.
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

#include "src/service/client_impl.hpp"
#include "tierswap/detail/io_backend.hpp"
#include "tierswap/extent_allocator.hpp"
#include "tierswap/log.hpp"

namespace tierswap {
namespace {

constexpr std::uint64_t kSyncTag = 1ull << 63;  // tags of Sync requests; request ids are small

// What the backend takes over from the client after hello.
struct Link {
  Connection* conn = nullptr;
  std::byte* data = nullptr;  // the shared memory: locked, then pageable
  std::uint64_t bytes = 0;
  std::uint64_t locked = 0;
  std::filesystem::path path;
  int timeout_ms = 30000;
};

class ServiceBackend final : public detail::IoBackend {
 public:
  explicit ServiceBackend(Link l)
      : c_(std::move(l)), locked_(c_.locked, 4096), pageable_(c_.bytes - c_.locked, 4096) {
    wake_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake_ < 0) throw std::system_error(errno, std::system_category(), "eventfd");
  }
  ~ServiceBackend() override { ::close(wake_); }

  IoBackendKind kind() const noexcept override { return IoBackendKind::service; }
  std::string describe() const override { return "node service at " + c_.path.string(); }

  // The batch goes out as one write (the service takes it in with one read).
  int submit(std::span<detail::IoRequest* const> reqs) noexcept override {
    std::lock_guard lk(mu_);
    const bool was_idle = outstanding_.empty();
    for (detail::IoRequest* r : reqs) {
      const auto moff = static_cast<std::uint64_t>(r->buffer - c_.data);
      if (r->buffer < c_.data || moff + r->length > c_.bytes) {
        ready_.push_back({r, -EFAULT});  // not in the shared memory: the service cannot see it
        continue;
      }
      if (dead_ != 0) {
        ready_.push_back({r, -dead_});
        continue;
      }
      fb_.Clear();
      const auto body = r->op == IoOp::write
                            ? wire::CreateWrite(fb_, r->id, r->offset, r->length, moff).Union()
                            : wire::CreateRead(fb_, r->id, r->offset, r->length, moff).Union();
      fb_.Finish(
          c_.conn->message(fb_, r->op == IoOp::write ? wire::Body::Write : wire::Body::Read, body),
          wire::MessageIdentifier());
      try {
        c_.conn->queue(fb_);
      } catch (...) {
        ready_.push_back({r, -ENOMEM});
        continue;
      }
      outstanding_[r->id] = r;
    }
    if (dead_ == 0 && c_.conn->has_output())
      if (const int e = c_.conn->flush(); e != 0) die(-e);  // fails the batch with the rest
    // A reaper that found nothing outstanding polls without a timeout: kicked, it takes one now
    // (else a service that stopped answering would leave these requests waiting forever).
    if (!ready_.empty() || (was_idle && !outstanding_.empty())) kick();
    return static_cast<int>(reqs.size());
  }

  int reap(std::span<detail::IoCompletion> out, bool wait) noexcept override {
    std::size_t n = take_ready(out);
    if (n > 0) return static_cast<int>(n);
    const bool listening = dead_ == 0;
    if (listening && c_.conn->buffered()) {  // answers already read with an earlier one
      receive_all();
      return static_cast<int>(take_ready(out));
    }
    pollfd fds[2] = {{wake_, POLLIN, 0}, {listening ? c_.conn->fd() : -1, POLLIN, 0}};
    int timeout = wait ? -1 : 0;
    {
      std::lock_guard lk(mu_);
      if (wait && listening && (!outstanding_.empty() || syncs_waiting_ > 0))
        timeout = c_.timeout_ms;
    }
    const int p = ::poll(fds, 2, timeout);
    if (p < 0) return errno == EINTR ? 0 : -errno;
    if (p == 0 && timeout > 0) {
      std::lock_guard lk(mu_);
      die(ETIMEDOUT);
    }
    if (fds[0].revents & POLLIN) {
      std::uint64_t v;
      (void)!::read(wake_, &v, sizeof v);
    }
    if (fds[1].revents) receive_all();
    return static_cast<int>(take_ready(out));
  }

  void wake() noexcept override { kick(); }

  int sync() noexcept override {
    std::unique_lock lk(mu_);
    if (dead_ != 0) return -dead_;
    const std::uint64_t tag = kSyncTag | ++sync_seq_;
    fb_.Clear();
    fb_.Finish(c_.conn->message(fb_, wire::Body::Sync, wire::CreateSync(fb_, tag).Union()),
               wire::MessageIdentifier());
    if (const int e = c_.conn->send(fb_); e != 0) {
      die(-e);
      return e;
    }
    ++syncs_waiting_;
    kick();  // the reaper may be in a poll without a timeout: let it take one now
    cv_.wait(lk, [&] { return sync_done_.count(tag) || dead_ != 0; });
    --syncs_waiting_;
    const auto it = sync_done_.find(tag);
    if (it == sync_done_.end()) return -dead_;
    const int r = it->second;
    sync_done_.erase(it);
    return r;
  }

  bool memory_is_shared() const noexcept override { return true; }
  // The pageable pool takes the unlocked part when there is one; the pinned pools the locked one.
  std::byte* allocate_shared(std::uint64_t bytes, bool locked) noexcept override {
    std::lock_guard lk(mu_);
    const bool pageable = !locked && c_.bytes > c_.locked;
    const auto e = (pageable ? pageable_ : locked_).try_allocate(bytes);
    if (!e) return nullptr;
    const std::uint64_t off = e->offset + (pageable ? c_.locked : 0);
    slabs_[off] = e->length;
    return c_.data + off;
  }
  void free_shared(std::byte* p) noexcept override {
    std::lock_guard lk(mu_);
    const auto it = slabs_.find(static_cast<std::uint64_t>(p - c_.data));
    if (it == slabs_.end()) return;
    if (it->first >= c_.locked)
      pageable_.free({it->first - c_.locked, it->second});
    else
      locked_.free({it->first, it->second});
    slabs_.erase(it);
  }

 private:
  // Under mu_: every outstanding request fails with `err`, and every later one.
  void die(int err) {
    if (dead_ != 0) return;
    dead_ = err;
    c_.conn->break_off(err);  // the client's own requests (release, status) fail at once too
    log(LogLevel::error,
        fmt::format("tierswap service {}: {}: {} request(s) fail", c_.path.string(),
                    err == ETIMEDOUT   ? "no answer within the timeout"
                    : err == ESHUTDOWN ? "the service is stopping"
                                       : "connection lost",
                    outstanding_.size()));
    for (auto& [id, r] : outstanding_) ready_.push_back({r, -err});
    outstanding_.clear();
    cv_.notify_all();
  }

  void kick() noexcept {
    const std::uint64_t one = 1;
    (void)!::write(wake_, &one, sizeof one);
  }

  std::size_t take_ready(std::span<detail::IoCompletion> out) {
    std::lock_guard lk(mu_);
    std::size_t n = 0;
    while (n < out.size() && !ready_.empty()) {
      out[n++] = ready_.front();
      ready_.pop_front();
    }
    return n;
  }

  // Every answer the socket holds (one read takes all that have arrived; the reaper thread only).
  void receive_all() {
    do {
      receive_one();
    } while (dead_ == 0 && c_.conn->buffered());
  }

  // One answer from the service (the reaper thread only).
  void receive_one() {
    const wire::Message* m = nullptr;
    std::string why;
    const auto st = c_.conn->receive(buf_, &m, nullptr, &why);
    std::lock_guard lk(mu_);
    if (st != Connection::Status::ok) {
      if (st != Connection::Status::closed)
        log(LogLevel::error, "tierswap service " + c_.path.string() + ": " + why);
      die(st == Connection::Status::invalid ? EPROTO : EPIPE);
      return;
    }
    const wire::Reply* r = m->body_as_Reply();
    if (r == nullptr) return die(EPROTO);
    const int res_err = r->error();
    if (res_err == ESHUTDOWN) {  // the service is going: this request and every later one fail
      log(LogLevel::error, fmt::format("tierswap service {}: {}", c_.path.string(),
                                       r->message() ? r->message()->str() : "stopping"));
      return die(ESHUTDOWN);
    }
    if (r->tag() & kSyncTag) {
      sync_done_[r->tag()] = res_err ? -res_err : 0;
      cv_.notify_all();
      return;
    }
    const auto it = outstanding_.find(static_cast<std::uint32_t>(r->tag()));
    if (it == outstanding_.end()) return die(EPROTO);  // an answer to nothing we asked
    if (res_err != 0 && r->message())
      log(LogLevel::warn, "tierswap service: request failed: " + r->message()->str());
    ready_.push_back(
        {it->second, res_err ? -std::int64_t{res_err} : static_cast<std::int64_t>(r->value())});
    outstanding_.erase(it);
  }

  Link c_;
  flatbuffers::FlatBufferBuilder fb_;
  ExtentAllocator locked_, pageable_;             // the two parts' free space
  std::map<std::uint64_t, std::uint64_t> slabs_;  // carved: offset -> length
  int wake_ = -1;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::uint32_t, detail::IoRequest*> outstanding_;
  std::deque<detail::IoCompletion> ready_;
  std::map<std::uint64_t, int> sync_done_;
  std::uint64_t sync_seq_ = 0;
  int syncs_waiting_ = 0;
  std::atomic<int> dead_{0};  // errno once the connection is gone (set under mu_)
  std::vector<std::uint8_t> buf_;
};

}  // namespace

struct ServiceStorage::Impl {
  ServiceClient client;
  std::unique_ptr<SwapSpace> space;
  std::unique_ptr<IoEngine> engine;
  bool release = false;
  explicit Impl(ServiceClientConfig cfg) : client((cfg.raw = true, std::move(cfg))) {}
  ~Impl() {
    engine.reset();  // its reaper no longer reads the connection
    if (!release) return;
    try {
      client.release();
    } catch (const std::exception& e) {
      log(LogLevel::warn, std::string("releasing the service region: ") + e.what());
    }
  }
};

ServiceStorage::ServiceStorage(ServiceClientConfig cfg, const std::filesystem::path& manifest_dir,
                               IoEngineConfig ec)
    : impl_(std::make_unique<Impl>(std::move(cfg))) {
  ServiceClient::Impl& c = *impl_->client.impl_;
  Link link{c.conn.get(),   c.data, c.bytes,
            c.locked_bytes, c.path, static_cast<int>(c.cfg.timeout_seconds * 1000)};
  std::filesystem::create_directories(manifest_dir);
  impl_->space = std::make_unique<SwapSpace>(
      SwapSpace::region(c.region_bytes, c.alignment, c.space_uuid, manifest_dir,
                        fmt::format("the region of job {} rank {} at the tierswap service {}",
                                    c.cfg.job, c.cfg.rank, c.path.string())));
  ec.backend = IoBackendKind::service;
  impl_->engine =
      std::make_unique<IoEngine>(*impl_->space, ec, std::make_unique<ServiceBackend>(link));
}

ServiceStorage::~ServiceStorage() = default;
void ServiceStorage::release_on_close() noexcept {
  impl_->release = true;
}
SwapSpace& ServiceStorage::space() noexcept {
  return *impl_->space;
}
IoEngine& ServiceStorage::engine() noexcept {
  return *impl_->engine;
}
bool ServiceStorage::reattached() const noexcept {
  return impl_->client.reattached();
}

}  // namespace tierswap
