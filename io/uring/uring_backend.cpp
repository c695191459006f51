// io_uring backend: registered files, a sparse fixed-buffer table for pinned slabs
// (READ_FIXED/WRITE_FIXED), batched submission, optional SQPOLL.
#include <liburing.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "tierswap/detail/io_backend.hpp"
#include "tierswap/log.hpp"
#include "tierswap/units.hpp"

#include <fmt/format.h>

namespace tierswap::detail {
namespace {

std::string memlock_text() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_MEMLOCK, &rl) != 0) return "memlock ?";
  if (rl.rlim_cur == RLIM_INFINITY) return "memlock unlimited";
  return "memlock " + format_bytes(rl.rlim_cur);
}

class UringBackend final : public IoBackend {
 public:
  ~UringBackend() override {
    if (ready_) io_uring_queue_exit(&ring_);
    if (event_fd_ >= 0) ::close(event_fd_);
  }

  int init(const BackendParams& p, std::string* why) {
    if (const int r = setup_ring(p, why); r < 0) return r;
    ready_ = true;
    sqpoll_ = p.sqpoll;
    if (const int r = probe_opcodes(why); r < 0) return r;
    register_files_and_buffers(p);
    return 0;
  }

  IoBackendKind kind() const noexcept override { return IoBackendKind::uring; }

  bool owner_thread_submits() const noexcept override { return single_; }

  int attach_reaper_thread() noexcept override {
    if (!single_) return 0;
    // The calling thread becomes the only submitter. (liburing 2.3 declares
    // io_uring_enable_rings but does not export it, so the register call is made directly.)
    long r =
        ::syscall(__NR_io_uring_register, ring_.ring_fd, IORING_REGISTER_ENABLE_RINGS, nullptr, 0);
    if (r < 0) r = -errno;
    if (r < 0) {
      log(LogLevel::error,
          fmt::format("io_uring enable rings failed: {}", std::strerror(static_cast<int>(-r))));
      return static_cast<int>(r);
    }
    arm_event();
    return 0;
  }

  std::string describe() const override {
    std::string d = single_ ? "single issuer, deferred task work, " : "";
    d += files_registered_ ? "registered files" : file_note_;
    d += buffer_slots_
             ? fmt::format(", fixed buffers ({} slots, {})", buffer_slots_, memlock_text())
             : ", " + buffer_note_;
    d += sqpoll_ ? ", sqpoll on" : ", sqpoll off";
    if (coop_) d += ", coop taskrun";
    return d;
  }

  int submit(std::span<IoRequest* const> reqs) noexcept override {
    unsigned prepared = 0;
    for (IoRequest* r : reqs) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) break;
      const int fd = files_registered_ ? static_cast<int>(r->file) : fds_[r->file];
      const bool fixed = r->buffer_index >= 0 && buffer_slots_ > 0;
      if (r->op == IoOp::read) {
        if (fixed)
          io_uring_prep_read_fixed(sqe, fd, r->buffer, r->length, r->offset, r->buffer_index);
        else
          io_uring_prep_read(sqe, fd, r->buffer, r->length, r->offset);
      } else {
        if (fixed)
          io_uring_prep_write_fixed(sqe, fd, r->buffer, r->length, r->offset, r->buffer_index);
        else
          io_uring_prep_write(sqe, fd, r->buffer, r->length, r->offset);
      }
      if (files_registered_) sqe->flags |= IOSQE_FIXED_FILE;
      io_uring_sqe_set_data(sqe, r);
      ++prepared;
    }
    if (prepared == 0) return reqs.empty() ? 0 : -EBUSY;
    // Each call's requests go to the kernel in one system call of their own (the engine sizes
    // the calls: IoEngineConfig::submit_batch); a single issuer is the only caller.
    flush();
    return static_cast<int>(prepared);
  }

  int reap(std::span<IoCompletion> out, bool wait) noexcept override {
    if (single_) {
      int r = wait ? io_uring_submit_and_wait(&ring_, 1) : io_uring_submit(&ring_);
      if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY && r != -ETIME) return r;
    } else if (wait) {
      io_uring_cqe* cqe = nullptr;
      int r = io_uring_wait_cqe(&ring_, &cqe);
      if (r < 0) return r;
    }
    io_uring_cqe* cqes[128];
    unsigned max = static_cast<unsigned>(std::min<std::size_t>(out.size(), std::size(cqes)));
    unsigned n = io_uring_peek_batch_cqe(&ring_, cqes, max);
    unsigned k = 0;
    bool rearm = false;
    for (unsigned i = 0; i < n; ++i) {
      void* data = io_uring_cqe_get_data(cqes[i]);
      if (data == &event_value_) {  // a wake-up through the eventfd
        rearm = true;
        out[k++] = {nullptr, 0};
        continue;
      }
      out[k].request = static_cast<IoRequest*>(data);
      out[k++].result = cqes[i]->res;
    }
    io_uring_cq_advance(&ring_, n);
    if (rearm) arm_event();
    return static_cast<int>(k);
  }

  void wake() noexcept override {
    if (single_) {
      const std::uint64_t one = 1;
      [[maybe_unused]] auto r = ::write(event_fd_, &one, sizeof one);
      return;
    }
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) return;  // the ring is full, so a completion is coming anyway
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data(sqe, nullptr);
    flush();
  }

  std::uint32_t buffer_slots() const noexcept override { return buffer_slots_; }

  int register_buffer(std::uint32_t slot, void* data, std::size_t n) noexcept override {
    if (slot >= buffer_slots_) return -EINVAL;
    iovec iov{data, n};
    __u64 tag = 0;
    int r = io_uring_register_buffers_update_tag(&ring_, slot, &iov, &tag, 1);
    return r < 0 ? r : 0;
  }

  int unregister_buffer(std::uint32_t slot) noexcept override {
    if (slot >= buffer_slots_) return -EINVAL;
    iovec iov{nullptr, 0};
    __u64 tag = 0;
    int r = io_uring_register_buffers_update_tag(&ring_, slot, &iov, &tag, 1);
    return r < 0 ? r : 0;
  }

 private:
  // Preferred: one issuer (the engine's reaper thread) with deferred task work, so completions
  // are reaped in batches inside the same io_uring_enter that submits (kernel 6.1+). The ring
  // starts disabled and is enabled by the reaper thread, which becomes its submitter.
  // Fallbacks: cooperative task work (5.19+), then a plain ring.
  int setup_ring(const BackendParams& p, std::string* why) {
    const unsigned kSingle = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN |
                             IORING_SETUP_COOP_TASKRUN | IORING_SETUP_R_DISABLED;
    std::vector<unsigned> attempts;
    if (p.single_issuer && !p.sqpoll) attempts.push_back(kSingle);
    attempts.push_back(IORING_SETUP_COOP_TASKRUN);
    attempts.push_back(0u);
    int r = -EINVAL;
    for (unsigned flags : attempts) {
      io_uring_params params{};
      params.flags = flags;
      if (p.sqpoll) {
        params.flags |= IORING_SETUP_SQPOLL;
        params.sq_thread_idle = p.sqpoll_idle_ms;
      }
      // Extra entries: the wake-up NOP or eventfd read.
      r = io_uring_queue_init_params(p.queue_depth + 2, &ring_, &params);
      if (r == 0) {
        single_ = (flags & IORING_SETUP_SINGLE_ISSUER) != 0;
        coop_ = (flags & IORING_SETUP_COOP_TASKRUN) != 0;
        break;
      }
      if (r != -EINVAL) break;
    }
    if (r < 0) {
      *why = fmt::format("io_uring_setup failed: {}{}", std::strerror(-r),
                         r == -EPERM ? " (disabled by kernel.io_uring_disabled?)" : "");
      return r;
    }
    if (!single_) return 0;
    event_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (event_fd_ >= 0) return 0;
    r = -errno;
    io_uring_queue_exit(&ring_);
    *why = fmt::format("eventfd failed: {}", std::strerror(-r));
    return r;
  }

  // The opcodes the engine needs, and whether the fixed-buffer ones are there.
  int probe_opcodes(std::string* why) {
    io_uring_probe* probe = io_uring_get_probe_ring(&ring_);
    if (probe == nullptr) {
      *why = "io_uring opcode probe failed (kernel too old)";
      return -EOPNOTSUPP;
    }
    for (int op : {IORING_OP_READ, IORING_OP_WRITE, IORING_OP_NOP}) {
      if (!io_uring_opcode_supported(probe, op)) {
        io_uring_free_probe(probe);
        *why = fmt::format("io_uring lacks opcode {} (kernel too old)", op);
        return -EOPNOTSUPP;
      }
    }
    fixed_ops_ = io_uring_opcode_supported(probe, IORING_OP_READ_FIXED) &&
                 io_uring_opcode_supported(probe, IORING_OP_WRITE_FIXED);
    io_uring_free_probe(probe);
    return 0;
  }

  // The swap files and sparse buffer slots, registered where the kernel allows (else noted: the
  // engine then runs without them).
  void register_files_and_buffers(const BackendParams& p) {
    fds_.assign(p.fds.begin(), p.fds.end());
    int r = io_uring_register_files(&ring_, fds_.data(), static_cast<unsigned>(fds_.size()));
    files_registered_ = r == 0;
    if (!files_registered_) file_note_ = fmt::format("files not registered: {}", std::strerror(-r));
    if (!fixed_ops_) {
      buffer_note_ = "no fixed buffers: READ_FIXED unsupported";
      return;
    }
    r = io_uring_register_buffers_sparse(&ring_, p.buffer_slots);
    if (r == 0)
      buffer_slots_ = p.buffer_slots;
    else
      buffer_note_ = fmt::format("no fixed buffers: {} ({})", std::strerror(-r), memlock_text());
  }

  // Keeps one read of the eventfd in the ring: a write to it from any thread completes the read
  // and so ends the reaper's wait.
  void arm_event() noexcept {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) return;
    io_uring_prep_read(sqe, event_fd_, &event_value_, sizeof event_value_, 0);
    io_uring_sqe_set_data(sqe, &event_value_);
  }

  // Pushes every prepared SQE to the kernel. Prepared entries stay in the ring on a transient
  // error, so the loop only ends when they are all in.
  void flush() noexcept {
    unsigned spins = 0;
    while (io_uring_sq_ready(&ring_) > 0) {
      int r = io_uring_submit(&ring_);
      if (r >= 0 || r == -EINTR) continue;
      if ((r == -EAGAIN || r == -EBUSY) && ++spins < 100000) {
        sched_yield();
        continue;
      }
      log(LogLevel::error, fmt::format("io_uring_submit failed: {}", std::strerror(-r)));
      return;
    }
  }

  io_uring ring_{};
  bool ready_ = false;
  bool sqpoll_ = false;
  bool coop_ = false;
  bool single_ = false;
  int event_fd_ = -1;
  std::uint64_t event_value_ = 0;
  bool fixed_ops_ = false;
  bool files_registered_ = false;
  std::uint32_t buffer_slots_ = 0;
  std::vector<int> fds_;
  std::string file_note_, buffer_note_;
};

}  // namespace

std::unique_ptr<IoBackend> make_uring_backend(const BackendParams& p, int* err, std::string* why) {
  auto b = std::make_unique<UringBackend>();
  int r = b->init(p, why);
  if (r < 0) {
    *err = r;
    return nullptr;
  }
  return b;
}

}  // namespace tierswap::detail
