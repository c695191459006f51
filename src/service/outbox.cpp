#include "src/service/outbox.hpp"

#include <unistd.h>

#include <cerrno>

namespace tierswap::service {

void Outbox::wake() noexcept {
  const std::uint64_t one = 1;
  (void)!::write(wake_, &one, sizeof one);
}

int Outbox::send(const Answer& a) {
  std::unique_lock lk(mu_);
  left_.push_back(a);
  return flush_locked(lk);
}

int Outbox::flush() {
  std::unique_lock lk(mu_);
  return flush_locked(lk);
}

int Outbox::flush_locked(std::unique_lock<std::mutex>& lk) {
  for (;;) {
    for (const Answer& a : left_) {
      fb_.Clear();
      build_reply(conn_, fb_, a);
      conn_.queue(fb_);
    }
    left_.clear();
    if (!conn_.has_output()) return 0;
    writing_ = true;  // callbacks leave their replies in left_ meanwhile
    lk.unlock();
    const int r = conn_.flush();
    lk.lock();
    writing_ = false;
    if (r != 0) return r;
  }
}

void Outbox::post(Answer a) noexcept {
  try {
    std::lock_guard lk(mu_);
    if (writing_ || !left_.empty() || conn_.has_output()) {
      left_.push_back(std::move(a));
      wake();
      return;
    }
    fb_.Clear();
    build_reply(conn_, fb_, a);
    conn_.queue(fb_);
    if (conn_.try_flush() != 0) wake();  // the rest, or the error, is the session's
  } catch (...) {  // no memory for the reply: the session finds the connection's end
    wake();
  }
}

}  // namespace tierswap::service
