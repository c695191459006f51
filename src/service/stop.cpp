// The node service's graceful stop (SIGTERM, `systemctl stop`): no new clients; each attached
// client served until its state is committed, then told that the service is going; the clients
// still attached when the drain time runs out named in the log.
#include <chrono>
#include <thread>

#include "src/service/server_impl.hpp"
#include "tierswap/log.hpp"

#include <fmt/format.h>

namespace tierswap {

service::Answer SwapService::Impl::stopping_answer(std::uint64_t tag) {
  return {ESHUTDOWN,
          "the tierswap service is stopping (SIGTERM): what this client committed is kept; run "
          "the job again once the service is back to resume from it (TIERSWAP_SERVICE_WAIT: "
          "seconds a client waits for it)",
          0,
          {},
          tag};
}

bool SwapService::Impl::done_when_stopping(const Session& s, wire::Body type) {
  switch (type) {
    case wire::Body::Sync:  // the commit the drain waits for, and what may follow it
    case wire::Body::Commit:
    case wire::Body::Discard:
    case wire::Body::Status:
    case wire::Body::Release:
      return false;
    default:  // reads and writes: served while the client has a commit to finish
      return s.writes_since_commit == 0;
  }
}

void SwapService::Impl::refuse_stopping(Session& s, const wire::Message& m) {
  if (!drain_raw(s)) return;  // the answers to what it asked before, first
  log(LogLevel::info,
      fmt::format("service: stopping: {} is at its last commit; told it the service is going",
                  s.key));
  s.out->send(stopping_answer(service::tag_of(m)));
}

std::size_t SwapService::stop(double drain_seconds) {
  Impl& m = *impl_;
  if (m.stopping.exchange(true)) return 0;
  std::size_t attached = 0;
  {
    std::lock_guard lk(m.mu);
    attached = m.live.size();
  }
  log(LogLevel::info,
      fmt::format("service: stopping: new clients refused; {} attached client(s) served to their "
                  "next commit, at most {:g} s",
                  attached, drain_seconds));
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(drain_seconds));
  for (;;) {
    {
      std::lock_guard lk(m.mu);
      if (m.live.empty()) {
        log(LogLevel::info, "service: stopping: every client is detached");
        return 0;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        for (const auto& [key, l] : m.live)
          log(LogLevel::warn,
              fmt::format("service: stopping: cut off {} (pid {}, uid {}): it reached no commit "
                          "within the drain time ({:g} s, --drain-seconds); it resumes from its "
                          "last one",
                          key, l.pid, l.uid, drain_seconds));
        return m.live.size();
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace tierswap
