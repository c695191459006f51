// posix backend: a small pool of threads doing one pread/pwrite per request. The raw result goes
// back through the engine's completion path, which handles short transfers and retries.
#include <unistd.h>

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "tierswap/detail/io_backend.hpp"

#include <fmt/format.h>

namespace tierswap::detail {
namespace {

// Fixed-capacity FIFO: the engine never has more than queue_depth requests outstanding.
template <typename T>
class Ring {
 public:
  explicit Ring(std::size_t cap = 0) : items_(cap) {}
  bool empty() const noexcept { return count_ == 0; }
  bool push(const T& v) noexcept {
    if (count_ == items_.size()) return false;
    items_[(head_ + count_++) % items_.size()] = v;
    return true;
  }
  T pop() noexcept {
    T v = items_[head_];
    head_ = (head_ + 1) % items_.size();
    --count_;
    return v;
  }

 private:
  std::vector<T> items_;
  std::size_t head_ = 0, count_ = 0;
};

class PosixBackend final : public IoBackend {
 public:
  ~PosixBackend() override {
    {
      std::lock_guard lock(q_mu_);
      stop_ = true;
    }
    q_cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  int init(const BackendParams& p, std::string* why) {
    fds_.assign(p.fds.begin(), p.fds.end());
    queue_ = Ring<IoRequest*>(p.queue_depth);
    done_ = Ring<IoCompletion>(p.queue_depth);
    try {
      for (std::uint32_t i = 0; i < p.threads; ++i) workers_.emplace_back([this] { work(); });
    } catch (const std::system_error& e) {
      *why = fmt::format("cannot start worker threads: {}", e.what());
      return -EAGAIN;
    }
    return 0;
  }

  IoBackendKind kind() const noexcept override { return IoBackendKind::posix; }
  std::string describe() const override {
    return fmt::format("{} pread/pwrite threads", workers_.size());
  }

  int submit(std::span<IoRequest* const> reqs) noexcept override {
    int n = 0;
    {
      std::lock_guard lock(q_mu_);
      for (IoRequest* r : reqs) {
        if (!queue_.push(r)) break;
        ++n;
      }
    }
    if (n == 1)
      q_cv_.notify_one();
    else if (n > 1)
      q_cv_.notify_all();
    return n == 0 && !reqs.empty() ? -EBUSY : n;
  }

  int reap(std::span<IoCompletion> out, bool wait) noexcept override {
    std::unique_lock lock(d_mu_);
    if (wait) d_cv_.wait(lock, [&] { return !done_.empty() || woken_; });
    woken_ = false;
    int n = 0;
    while (!done_.empty() && static_cast<std::size_t>(n) < out.size()) out[n++] = done_.pop();
    return n;
  }

  void wake() noexcept override {
    {
      std::lock_guard lock(d_mu_);
      woken_ = true;
    }
    d_cv_.notify_one();
  }

 private:
  void work() {
    for (;;) {
      IoRequest* r = nullptr;
      {
        std::unique_lock lock(q_mu_);
        q_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        r = queue_.pop();
      }
      ssize_t res =
          r->op == IoOp::read
              ? ::pread(fds_[r->file], r->buffer, r->length, static_cast<off_t>(r->offset))
              : ::pwrite(fds_[r->file], r->buffer, r->length, static_cast<off_t>(r->offset));
      IoCompletion c{r, res < 0 ? -static_cast<std::int64_t>(errno) : res};
      {
        std::lock_guard lock(d_mu_);
        done_.push(c);
      }
      d_cv_.notify_one();
    }
  }

  std::vector<int> fds_;
  std::vector<std::thread> workers_;
  std::mutex q_mu_, d_mu_;
  std::condition_variable q_cv_, d_cv_;
  Ring<IoRequest*> queue_;
  Ring<IoCompletion> done_;
  bool stop_ = false;
  bool woken_ = false;
};

}  // namespace

std::unique_ptr<IoBackend> make_posix_backend(const BackendParams& p, int* err, std::string* why) {
  auto b = std::make_unique<PosixBackend>();
  int r = b->init(p, why);
  if (r < 0) {
    *err = r;
    return nullptr;
  }
  return b;
}

}  // namespace tierswap::detail
