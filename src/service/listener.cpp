// The node service's socket, its acceptor thread and one thread per connection (listener.hpp).
#include "src/service/listener.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <system_error>
#include <utility>

#include "tierswap/log.hpp"

#include <fmt/format.h>

namespace tierswap::service {

Listener::Listener(std::filesystem::path path, bool allow_other_users, int inherited_fd)
    : path_(std::move(path)) {
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (wake_fd_ < 0) throw std::system_error(errno, std::system_category(), "eventfd");
  if (inherited_fd >= 0) {
    listen_fd_ = inherited_fd;
    inherited_ = true;
    sockaddr_un a{};
    socklen_t len = sizeof a;
    if (::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0 &&
        a.sun_family == AF_UNIX && a.sun_path[0] != '\0')
      path_ = a.sun_path;
    return;
  }
  try {
    bind_and_listen(allow_other_users);
  } catch (...) {
    if (listen_fd_ >= 0) ::close(listen_fd_);
    ::close(wake_fd_);
    throw;
  }
}

void Listener::bind_and_listen(bool allow_other_users) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const std::string s = path_.string();
  if (s.size() >= sizeof a.sun_path)
    throw std::system_error(ENAMETOOLONG, std::system_category(), "service socket " + s);
  std::memcpy(a.sun_path, s.c_str(), s.size() + 1);
  listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) throw std::system_error(errno, std::system_category(), "socket");
  // A socket file of a dead service is replaced; one that answers is another live service.
  if (::connect(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0)
    throw std::system_error(EADDRINUSE, std::system_category(),
                            "another tierswap service listens on " + s);
  ::close(listen_fd_);
  listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) throw std::system_error(errno, std::system_category(), "socket");
  struct stat st {};
  if (::lstat(a.sun_path, &st) == 0) {
    if (!S_ISSOCK(st.st_mode))
      throw std::system_error(EEXIST, std::system_category(),
                              "service socket path " + s + " exists and is not a socket");
    ::unlink(a.sun_path);
  }
  const mode_t old = ::umask(allow_other_users ? 0111 : 0177);
  const int rc = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
  const int err = errno;
  ::umask(old);
  if (rc != 0) throw std::system_error(err, std::system_category(), "bind " + s);
  if (::listen(listen_fd_, 64) != 0)
    throw std::system_error(errno, std::system_category(), "listen " + s);
}

Listener::~Listener() {
  if (acceptor_.joinable()) {
    const std::uint64_t one = 1;
    if (::write(wake_fd_, &one, sizeof one) < 0) { /* the poll timeout ends the loop anyway */
    }
    acceptor_.join();
  }
  reap(true);
  ::close(listen_fd_);
  ::close(wake_fd_);
  std::error_code ec;
  if (!inherited_) std::filesystem::remove(path_, ec);
}

void Listener::start(Handlers h) {
  if (acceptor_.joinable()) return;
  handlers_ = std::move(h);
  acceptor_ = std::thread([this] { accept_loop(); });
}

void Listener::accept_loop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (::poll(fds, 2, 1000) < 0 && errno != EINTR) return;
    if (fds[1].revents) return;
    reap(false);
    if (handlers_.tick) handlers_.tick();
    if (fds[0].revents & POLLIN) accept_one();
  }
}

void Listener::accept_one() {
  const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) return;
  auto peer = std::make_unique<Peer>(fd);
  socklen_t len = sizeof peer->cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer->cred, &len) != 0) return;
  Peer& p = *peer;
  std::lock_guard lk(peers_mu_);
  peers_.push_back(std::move(peer));
  try {
    p.thread = std::thread([this, &p] {
      handlers_.serve(p);
      p.done = true;
    });
  } catch (const std::system_error& e) {  // out of threads: this connection alone is refused
    if (handlers_.refused) handlers_.refused();
    log(LogLevel::error,
        fmt::format("service: refused pid {}: no thread to serve it: {}", p.cred.pid, e.what()));
    peers_.pop_back();  // closed by ~Peer
  }
}

void Listener::reap(bool all) {
  std::lock_guard lk(peers_mu_);
  for (auto it = peers_.begin(); it != peers_.end();) {
    if (all) ::shutdown((*it)->conn.fd(), SHUT_RDWR);
    if (all || (*it)->done) {
      (*it)->thread.join();
      it = peers_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace tierswap::service
