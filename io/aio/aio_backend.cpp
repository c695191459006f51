// libaio backend: io_submit / io_getevents, one iocb per engine slot (no allocation per I/O).
#include <libaio.h>

#include <cstring>
#include <vector>

#include "tierswap/detail/io_backend.hpp"

#include <fmt/format.h>

namespace tierswap::detail {
namespace {

class AioBackend final : public IoBackend {
 public:
  ~AioBackend() override {
    if (ctx_) io_destroy(ctx_);
  }

  int init(const BackendParams& p, std::string* why) {
    int r = io_setup(static_cast<int>(p.queue_depth), &ctx_);
    if (r < 0) {
      ctx_ = nullptr;
      *why = fmt::format("io_setup failed: {}{}", std::strerror(-r),
                         r == -EAGAIN ? " (fs.aio-max-nr exhausted?)" : "");
      return r;
    }
    depth_ = p.queue_depth;
    fds_.assign(p.fds.begin(), p.fds.end());
    iocbs_.resize(depth_);
    return 0;
  }

  IoBackendKind kind() const noexcept override { return IoBackendKind::aio; }
  std::string describe() const override { return fmt::format("io_setup depth {}", depth_); }

  int submit(std::span<IoRequest* const> reqs) noexcept override {
    iocb* list[256];
    std::size_t n = std::min(reqs.size(), std::size(list));
    for (std::size_t i = 0; i < n; ++i) {
      IoRequest* r = reqs[i];
      iocb* cb = &iocbs_[r->id];
      if (r->op == IoOp::read)
        io_prep_pread(cb, fds_[r->file], r->buffer, r->length, static_cast<long long>(r->offset));
      else
        io_prep_pwrite(cb, fds_[r->file], r->buffer, r->length, static_cast<long long>(r->offset));
      cb->data = r;
      list[i] = cb;
    }
    return io_submit(ctx_, static_cast<long>(n), list);
  }

  int reap(std::span<IoCompletion> out, bool wait) noexcept override {
    io_event events[128];
    long max = static_cast<long>(std::min<std::size_t>(out.size(), std::size(events)));
    // A bounded wait, so wake() needs no kernel object: the reaper re-checks its stop flag.
    timespec ts{0, wait ? 50'000'000 : 0};
    int n = io_getevents(ctx_, wait ? 1 : 0, max, events, &ts);
    if (n < 0) return n;
    for (int i = 0; i < n; ++i) {
      out[i].request = static_cast<IoRequest*>(events[i].data);
      // res is unsigned long in the ABI; errors are -errno in it.
      out[i].result = static_cast<long>(events[i].res);
    }
    return n;
  }

  void wake() noexcept override {}

 private:
  io_context_t ctx_ = nullptr;
  std::uint32_t depth_ = 0;
  std::vector<int> fds_;
  std::vector<iocb> iocbs_;
};

}  // namespace

std::unique_ptr<IoBackend> make_aio_backend(const BackendParams& p, int* err, std::string* why) {
  auto b = std::make_unique<AioBackend>();
  int r = b->init(p, why);
  if (r < 0) {
    *err = r;
    return nullptr;
  }
  return b;
}

}  // namespace tierswap::detail
