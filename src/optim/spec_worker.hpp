// The overlapped step's background thread (ShardedOptimizer, cfg.overlap).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "tierswap/optimizer.hpp"

namespace tierswap {

// One sub-group in the overlapped step: none, queued for (or in) a speculative step, or stepped
// speculatively (new state in the open generation, its 16-bit parameters in `out16`), and
// whether its undo copies hold the state from before the speculation.
struct SubSpec {
  enum class State : std::uint8_t { none, queued, stepped } state = State::none;  // under mu
  std::vector<std::uint16_t> out16;
  bool undo_saved = false;
};

// The overlapped step's background thread and what it shares with the thread driving the
// optimizer (all guarded by `mu`). It owns its thread: stop() (also its destructor) wakes it,
// waits for the sub-group in progress and joins, so nothing runs on it once the optimizer's
// memory starts to go.
struct SpecWorker {
  std::mutex mu;
  std::condition_variable cv;       // work queued, or stop
  std::condition_variable idle_cv;  // queue empty and nothing running
  std::deque<std::size_t> queue;    // sub-groups to step speculatively, in order
  bool busy = false, stopping = false;
  std::exception_ptr error;  // the first failure of a speculative step
  bool invalid = false;      // a result can no longer be kept (a gradient or config changed)
  // What the speculative steps use: the hyper-parameters, multiplier and step number when the
  // final backward began.
  std::vector<GroupConfig> cfgs;
  float mult = 1.0f;
  std::uint64_t t = 0;
  // The sub-groups in the order their gradients became final in this final backward (queued):
  // the next one's order, whose head step() reads ahead when it ends (read_ahead_next()).
  std::vector<std::size_t> order;
  // Each sub-group's speculation (Impl::subs' order).
  std::vector<SubSpec> per_sub;

  SpecWorker() = default;
  SpecWorker(const SpecWorker&) = delete;
  SpecWorker& operator=(const SpecWorker&) = delete;
  ~SpecWorker() { stop(); }
  bool running() const { return thread_.joinable(); }
  /// Starts the thread running `loop` (once).
  template <class Loop>
  void start(Loop&& loop) {
    if (!thread_.joinable()) thread_ = std::thread(std::forward<Loop>(loop));
  }
  void stop() noexcept {
    if (!thread_.joinable()) return;
    {
      std::lock_guard lk(mu);
      stopping = true;
    }
    cv.notify_all();
    thread_.join();
  }

 private:
  std::thread thread_;
};

}  // namespace tierswap
