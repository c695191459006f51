// The node service's socket and its connections: it listens on a Unix socket (or takes the one
// systemd passed), accepts on a thread of its own, runs each connection on a thread, and reaps
// the finished ones. Destroying it wakes the acceptor, ends every connection still open
// (shutdown, then join) and removes the socket file it made.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <thread>

#include "src/service/protocol.hpp"

namespace tierswap::service {

/// One connection: its socket, the peer's credentials, the thread serving it.
struct Peer {
  Connection conn;
  ucred cred{};
  std::thread thread;
  std::atomic<bool> done{false};
  explicit Peer(int fd) : conn(fd) {}
};

class Listener {
 public:
  /// Binds and listens on `path` (its permissions: the owner only, or anyone when
  /// `allow_other_users`), or takes `inherited_fd` (>= 0: systemd's socket, not ours to remove).
  /// std::system_error when another service answers there, the path is not a socket, or a call
  /// fails.
  Listener(std::filesystem::path path, bool allow_other_users, int inherited_fd);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  struct Handlers {
    std::function<void(Peer&)> serve;  // one connection, on its own thread
    std::function<void()> tick;        // on the acceptor's thread, at least every second
    std::function<void()> refused;     // a connection refused: no thread could serve it
  };
  /// Starts accepting (once).
  void start(Handlers h);
  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  void bind_and_listen(bool allow_other_users);
  void accept_loop();
  void accept_one();
  void reap(bool all);

  std::filesystem::path path_;
  bool inherited_ = false;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  Handlers handlers_;
  std::mutex peers_mu_;
  std::list<std::unique_ptr<Peer>> peers_;  // guarded by peers_mu_
  std::thread acceptor_;                    // last: joined first
};

}  // namespace tierswap::service
