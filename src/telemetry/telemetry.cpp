#include "tierswap/telemetry.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <system_error>
#include <thread>

#include "tierswap/detail/file.hpp"
#include "tierswap/log.hpp"

#include <fmt/format.h>

namespace tierswap {
namespace {

[[noreturn]] void throw_errno(int err, const std::string& what) {
  throw std::system_error(err, std::system_category(), what);
}

sockaddr_un address_of(const std::filesystem::path& p) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const std::string s = p.string();
  if (s.size() >= sizeof a.sun_path)
    throw std::system_error(ENAMETOOLONG, std::system_category(),
                            "telemetry socket path too long: " + s);
  std::memcpy(a.sun_path, s.c_str(), s.size() + 1);
  return a;
}

// Creates (0700) or checks the runtime directory: ours, a directory, not a symlink, and not
// writable by group or others.
void secure_dir(const std::filesystem::path& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    throw_errno(errno, "create telemetry directory " + dir.string());
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) throw_errno(errno, "stat " + dir.string());
  if (!S_ISDIR(st.st_mode))
    throw std::system_error(ENOTDIR, std::system_category(),
                            "telemetry directory " + dir.string() + " is not a directory");
  if (st.st_uid != ::getuid())
    throw std::system_error(EPERM, std::system_category(),
                            fmt::format("telemetry directory {} is owned by uid {}, not by us ({})",
                                        dir.string(), st.st_uid, ::getuid()));
  if ((st.st_mode & 022) != 0)
    throw std::system_error(EPERM, std::system_category(),
                            fmt::format("telemetry directory {} is writable by group or others "
                                        "(mode {:o})",
                                        dir.string(), st.st_mode & 0777));
}

bool write_all(int fd, const std::string& s) {
  std::size_t off = 0;
  while (off < s.size()) {
    const ssize_t w = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    off += static_cast<std::size_t>(w);
  }
  return true;
}

}  // namespace

TelemetryConfig TelemetryConfig::from_env() {
  TelemetryConfig c;
  if (const char* v = std::getenv("TIERSWAP_TELEMETRY")) {
    const std::string_view s(v);
    if (s != "0" && s != "1")
      throw std::invalid_argument(fmt::format("TIERSWAP_TELEMETRY={}: expected 0 or 1", s));
    c.enabled = s == "1";
  }
  if (const char* v = std::getenv("TIERSWAP_RUNTIME_DIR"); v != nullptr && *v) c.runtime_dir = v;
  return c;
}

std::filesystem::path default_runtime_dir() {
  if (const char* v = std::getenv("TIERSWAP_RUNTIME_DIR"); v != nullptr && *v) return v;
  if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x != nullptr && *x)
    return std::filesystem::path(x) / "tierswap";
  return fmt::format("/tmp/tierswap-{}", ::getuid());
}

struct TelemetryServer::Impl {
  std::function<std::string()> snapshot;
  std::filesystem::path path;
  int listen_fd = -1;
  int stop_pipe[2] = {-1, -1};
  std::thread thread;

  void serve() {
    for (;;) {
      pollfd fds[2] = {{listen_fd, POLLIN, 0}, {stop_pipe[0], POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[1].revents != 0) return;
      if ((fds[0].revents & POLLIN) == 0) continue;
      const int c = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      ucred cred{};
      socklen_t len = sizeof cred;
      if (::getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.uid == ::getuid()) {
        std::string doc;
        try {
          doc = snapshot() + "\n";
        } catch (const std::exception& e) {
          doc = fmt::format("{{\"error\": \"{}\"}}\n", e.what());
        }
        write_all(c, doc);
      } else {
        log(LogLevel::warn, fmt::format("telemetry: refused a connection from uid {}", cred.uid));
      }
      ::close(c);
    }
  }
};

TelemetryServer::TelemetryServer(std::function<std::string()> snapshot, TelemetryConfig cfg)
    : impl_(std::make_unique<Impl>()) {
  impl_->snapshot = std::move(snapshot);
  const auto dir = cfg.runtime_dir.empty() ? default_runtime_dir() : cfg.runtime_dir;
  secure_dir(dir);
  impl_->path = dir / fmt::format("{}.sock", ::getpid());
  ::unlink(impl_->path.c_str());  // a leftover of a dead process with our pid
  const sockaddr_un a = address_of(impl_->path);
  impl_->listen_fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (impl_->listen_fd < 0) throw_errno(errno, "telemetry socket");
  const mode_t old = ::umask(0177);  // the socket is created 0600
  const int rc = ::bind(impl_->listen_fd, reinterpret_cast<const sockaddr*>(&a), sizeof a);
  const int err = errno;
  ::umask(old);
  if (rc != 0 || ::chmod(impl_->path.c_str(), 0600) != 0 || ::listen(impl_->listen_fd, 16) != 0 ||
      ::pipe2(impl_->stop_pipe, O_CLOEXEC) != 0) {
    const int e = rc != 0 ? err : errno;
    ::close(impl_->listen_fd);
    ::unlink(impl_->path.c_str());
    throw_errno(e, "telemetry socket " + impl_->path.string());
  }
  impl_->thread = std::thread([this] { impl_->serve(); });
}

TelemetryServer::~TelemetryServer() {
  const char x = 1;
  (void)!::write(impl_->stop_pipe[1], &x, 1);
  impl_->thread.join();
  ::close(impl_->listen_fd);
  ::close(impl_->stop_pipe[0]);
  ::close(impl_->stop_pipe[1]);
  ::unlink(impl_->path.c_str());
}

const std::filesystem::path& TelemetryServer::socket_path() const noexcept {
  return impl_->path;
}

std::vector<LiveProcess> list_live_processes(const std::filesystem::path& dir) {
  std::vector<LiveProcess> out;
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const auto name = e.path().filename().string();
    if (name.size() < 6 || name.substr(name.size() - 5) != ".sock") continue;
    char* end = nullptr;
    const long pid = std::strtol(name.c_str(), &end, 10);
    if (end != name.c_str() + name.size() - 5 || pid <= 0) continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      struct stat st {};
      if (::lstat(e.path().c_str(), &st) == 0 && st.st_uid == ::getuid())
        ::unlink(e.path().c_str());  // stale: its process is gone
      continue;
    }
    LiveProcess p;
    p.pid = static_cast<int>(pid);
    p.socket = e.path();
    std::ifstream f(fmt::format("/proc/{}/cmdline", pid), std::ios::binary);
    std::string cmd((std::istreambuf_iterator<char>(f)), {});
    for (auto& c : cmd)
      if (c == '\0') c = ' ';
    while (!cmd.empty() && cmd.back() == ' ') cmd.pop_back();
    p.command = cmd;
    out.push_back(std::move(p));
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.pid < b.pid; });
  return out;
}

std::string query_telemetry(const std::filesystem::path& socket) {
  const sockaddr_un a = address_of(socket);
  const detail::File s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), socket.string());
  if (!s) throw_errno(errno, "socket");
  if (::connect(s.fd(), reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0)
    throw_errno(errno, "connect to " + socket.string());
  const std::string out = s.read_to_end();
  if (out.empty())
    throw std::system_error(ECONNRESET, std::system_category(),
                            "no snapshot from " + socket.string() + " (refused?)");
  return out;
}

}  // namespace tierswap
