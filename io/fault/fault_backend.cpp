// Fault-injecting wrapper used by the tests to prove every completion path: injected errors
// complete without touching the disk, and a short transfer really moves fewer bytes.
#include <mutex>
#include <unordered_map>
#include <vector>

#include "tierswap/detail/io_backend.hpp"

namespace tierswap::detail {
namespace {

class FaultBackend final : public IoBackend {
 public:
  FaultBackend(std::unique_ptr<IoBackend> inner, FaultPlan plan)
      : inner_(std::move(inner)), plan_(std::move(plan)) {}

  IoBackendKind kind() const noexcept override { return inner_->kind(); }
  std::string describe() const override { return "fault-injecting, over " + inner_->describe(); }

  int submit(std::span<IoRequest* const> reqs) noexcept override {
    std::vector<IoRequest*> pass;
    bool injected = false;
    {
      std::lock_guard lock(mu_);
      for (IoRequest* r : reqs) {
        Fault f = plan_ ? plan_(*r, seq_++) : Fault{};
        switch (f.kind) {
          case Fault::Kind::none:
            pass.push_back(r);
            break;
          case Fault::Kind::error:
            synthetic_.push_back({r, -static_cast<std::int64_t>(f.error)});
            injected = true;
            break;
          case Fault::Kind::again:
            synthetic_.push_back({r, -EAGAIN});
            injected = true;
            break;
          case Fault::Kind::interrupt:
            synthetic_.push_back({r, -EINTR});
            injected = true;
            break;
          case Fault::Kind::zero:
            synthetic_.push_back({r, 0});
            injected = true;
            break;
          case Fault::Kind::short_transfer:
            if (f.bytes == 0 || f.bytes >= r->length) {
              pass.push_back(r);
              break;
            }
            shortened_[r] = r->length;
            r->length = f.bytes;
            pass.push_back(r);
            break;
        }
      }
    }
    std::size_t accepted = 0;
    {
      // Held across the inner submit: reap() restores lengths under the same lock, and the
      // kernel's handoff from submission to completion is not an ordering ThreadSanitizer sees.
      std::lock_guard lock(mu_);
      while (accepted < pass.size()) {
        int n = inner_->submit(
            std::span<IoRequest* const>(pass.data() + accepted, pass.size() - accepted));
        if (n <= 0) break;
        accepted += static_cast<std::size_t>(n);
      }
    }
    if (accepted < pass.size()) {
      std::lock_guard lock(mu_);
      for (std::size_t i = accepted; i < pass.size(); ++i) {
        restore(pass[i]);
        synthetic_.push_back({pass[i], -EAGAIN});
      }
      injected = true;
    }
    if (injected) inner_->wake();
    return static_cast<int>(reqs.size());
  }

  int reap(std::span<IoCompletion> out, bool wait) noexcept override {
    {
      std::lock_guard lock(mu_);
      if (!synthetic_.empty()) {
        std::size_t n = std::min(out.size(), synthetic_.size());
        for (std::size_t i = 0; i < n; ++i) out[i] = synthetic_[i];
        synthetic_.erase(synthetic_.begin(), synthetic_.begin() + static_cast<long>(n));
        return static_cast<int>(n);
      }
    }
    int n = inner_->reap(out, wait);
    if (n > 0) {
      std::lock_guard lock(mu_);
      for (int i = 0; i < n; ++i)
        if (out[i].request) restore(out[i].request);
    }
    return n;
  }

  void wake() noexcept override { inner_->wake(); }
  bool owner_thread_submits() const noexcept override { return inner_->owner_thread_submits(); }
  int attach_reaper_thread() noexcept override { return inner_->attach_reaper_thread(); }
  std::uint32_t buffer_slots() const noexcept override { return inner_->buffer_slots(); }
  int register_buffer(std::uint32_t slot, void* data, std::size_t n) noexcept override {
    return inner_->register_buffer(slot, data, n);
  }
  int unregister_buffer(std::uint32_t slot) noexcept override {
    return inner_->unregister_buffer(slot);
  }

 private:
  void restore(IoRequest* r) {
    auto it = shortened_.find(r);
    if (it == shortened_.end()) return;
    r->length = it->second;
    shortened_.erase(it);
  }

  std::unique_ptr<IoBackend> inner_;
  FaultPlan plan_;
  std::mutex mu_;
  std::uint64_t seq_ = 0;
  std::vector<IoCompletion> synthetic_;
  std::unordered_map<IoRequest*, std::uint32_t> shortened_;
};

}  // namespace

std::unique_ptr<IoBackend> make_fault_backend(std::unique_ptr<IoBackend> inner, FaultPlan plan) {
  return std::make_unique<FaultBackend>(std::move(inner), std::move(plan));
}

}  // namespace tierswap::detail
