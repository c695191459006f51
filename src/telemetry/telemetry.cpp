#include "tierswap/telemetry.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <system_error>
#include <thread>

#include "tierswap/detail/file.hpp"
#include "tierswap/detail/process.hpp"
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

// TIERSWAP_RUNTIME_DIR, empty when unset; a relative path is refused.
std::filesystem::path runtime_dir_from_env() {
  const char* v = std::getenv("TIERSWAP_RUNTIME_DIR");
  if (v == nullptr || *v == 0) return {};
  const std::filesystem::path dir(v);
  if (dir.is_relative())
    throw std::invalid_argument(fmt::format(
        "TIERSWAP_RUNTIME_DIR={}: expected an absolute path (tierswap residency, ps and the "
        "service's clients look for sockets there from any working directory)",
        v));
  return dir;
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
  c.runtime_dir = runtime_dir_from_env();
  return c;
}

std::filesystem::path default_runtime_dir() {
  if (auto dir = runtime_dir_from_env(); !dir.empty()) return dir;
  // The XDG base directory specification: a relative path there is invalid and ignored.
  if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x != nullptr && *x == '/')
    return std::filesystem::path(x) / "tierswap";
  return fmt::format("/tmp/tierswap-{}", ::getuid());
}

namespace {

// The process's socket in one runtime directory, shared by every TelemetryServer there (two
// optimizers in one process, a GAN's): it is bound while any of them lives, and answers with
// the one document of a single source, else {"pid": P, "sources": [document, ...]} in the order
// they were made. A source is never called after its server is gone (removal waits for a
// document being built).
class Endpoint {
 public:
  explicit Endpoint(const std::filesystem::path& dir);
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  std::uint64_t add(std::function<std::string()> source) {
    std::lock_guard lk(mu_);
    sources_.emplace(next_, std::move(source));
    return next_++;
  }
  void remove(std::uint64_t id) {
    std::lock_guard lk(mu_);
    sources_.erase(id);
  }
  const std::filesystem::path& path() const noexcept { return path_; }
  /// A forked child's copy: the parent's socket and thread (never served nor closed here).
  bool inherited() const noexcept { return owner_ != detail::current_pid(); }

 private:
  void serve();
  std::string document();

  std::filesystem::path path_;
  pid_t owner_ = detail::current_pid();
  int listen_fd_ = -1;
  int stop_pipe_[2] = {-1, -1};
  std::thread thread_;
  std::mutex mu_;
  std::map<std::uint64_t, std::function<std::string()>> sources_;  // by creation order
  std::uint64_t next_ = 0;
};

std::string one_document(const std::function<std::string()>& source) {
  try {
    return source();
  } catch (const std::exception& e) {
    return nlohmann::json{{"error", e.what()}}.dump();
  }
}

std::string Endpoint::document() {
  std::lock_guard lk(mu_);
  if (sources_.size() == 1) return one_document(sources_.begin()->second) + "\n";
  std::string doc = fmt::format("{{\"pid\": {}, \"sources\": [", ::getpid());
  for (const auto& [id, source] : sources_)
    doc += (id == sources_.begin()->first ? "" : ", ") + one_document(source);
  return doc + "]}\n";
}

void Endpoint::serve() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.uid == ::getuid())
      write_all(c, document());
    else
      log(LogLevel::warn, fmt::format("telemetry: refused a connection from uid {}", cred.uid));
    ::close(c);
  }
}

Endpoint::Endpoint(const std::filesystem::path& dir) {
  secure_dir(dir);
  path_ = dir / fmt::format("{}.sock", ::getpid());
  ::unlink(path_.c_str());  // a leftover of a dead process with our pid
  const sockaddr_un a = address_of(path_);
  listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) throw_errno(errno, "telemetry socket");
  const mode_t old = ::umask(0177);  // the socket is created 0600
  const int rc = ::bind(listen_fd_, reinterpret_cast<const sockaddr*>(&a), sizeof a);
  const int err = errno;
  ::umask(old);
  if (rc != 0 || ::chmod(path_.c_str(), 0600) != 0 || ::listen(listen_fd_, 16) != 0 ||
      ::pipe2(stop_pipe_, O_CLOEXEC) != 0) {
    const int e = rc != 0 ? err : errno;
    ::close(listen_fd_);
    ::unlink(path_.c_str());
    throw_errno(e, "telemetry socket " + path_.string());
  }
  thread_ = std::thread([this] { serve(); });
}

Endpoint::~Endpoint() {
  const char x = 1;
  (void)!::write(stop_pipe_[1], &x, 1);
  thread_.join();
  ::close(listen_fd_);
  ::close(stop_pipe_[0]);
  ::close(stop_pipe_[1]);
  ::unlink(path_.c_str());
}

// The endpoints of this process by runtime directory, with how many servers use each: made by
// the first server, closed with the last, both under the registry's lock (so a new endpoint never
// binds the path an old one is about to unlink). A forked child's first server leaves the
// parent's endpoint alone (its copy is dropped, never closed: its stop pipe is the parent's) and
// makes the child's own.
struct Registry {
  std::mutex mu;
  std::map<std::filesystem::path, std::pair<std::unique_ptr<Endpoint>, int>> endpoints;

  static Registry& get() {
    static Registry* r = new Registry;  // never destroyed: servers may outlive static objects
    return *r;
  }
  Endpoint* acquire(const std::filesystem::path& dir) {
    std::lock_guard lk(mu);
    auto& [endpoint, users] = endpoints[dir];
    if (endpoint && endpoint->inherited()) {
      (void)endpoint.release();
      users = 0;
    }
    if (!endpoint) {
      try {
        endpoint = std::make_unique<Endpoint>(dir);
      } catch (...) {
        endpoints.erase(dir);
        throw;
      }
    }
    ++users;
    return endpoint.get();
  }
  void release(const std::filesystem::path& dir, const Endpoint* endpoint) {
    std::lock_guard lk(mu);
    const auto it = endpoints.find(dir);
    if (it == endpoints.end() || it->second.first.get() != endpoint) return;  // dropped in a child
    if (--it->second.second == 0) endpoints.erase(it);
  }
};

}  // namespace

struct TelemetryServer::Impl {
  std::filesystem::path dir;
  Endpoint* endpoint = nullptr;
  std::uint64_t id = 0;
};

TelemetryServer::TelemetryServer(std::function<std::string()> snapshot, TelemetryConfig cfg)
    : impl_(std::make_unique<Impl>()) {
  impl_->dir =
      std::filesystem::absolute(cfg.runtime_dir.empty() ? default_runtime_dir() : cfg.runtime_dir)
          .lexically_normal();
  impl_->endpoint = Registry::get().acquire(impl_->dir);
  impl_->id = impl_->endpoint->add(std::move(snapshot));
}

TelemetryServer::~TelemetryServer() {
  // A forked child's copy: its endpoint is the parent's (acquire() only hands out this
  // process's own), and so is closing it.
  if (impl_->endpoint->inherited()) return;
  impl_->endpoint->remove(impl_->id);
  Registry::get().release(impl_->dir, impl_->endpoint);
}

const std::filesystem::path& TelemetryServer::socket_path() const noexcept {
  return impl_->endpoint->path();
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

namespace {

// Reads until EOF or the deadline; false on the deadline.
bool read_until_eof(int fd, std::string* out, std::chrono::steady_clock::time_point deadline,
                    const std::filesystem::path& socket) {
  char buf[1 << 16];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd pf{fd, POLLIN, 0};
    const int p = ::poll(&pf, 1, static_cast<int>(left.count()));
    if (p < 0 && errno == EINTR) continue;
    if (p < 0) throw_errno(errno, "poll " + socket.string());
    if (p == 0) continue;  // the deadline, checked above
    const ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw_errno(errno, "read from " + socket.string());
    if (r == 0) return true;
    out->append(buf, static_cast<std::size_t>(r));
  }
}

// The state letter of /proc/<pid>/stat ('T': stopped, 't': stopped by a debugger), or 0.
char process_state(int pid) {
  std::ifstream f(fmt::format("/proc/{}/stat", pid));
  std::string stat((std::istreambuf_iterator<char>(f)), {});
  const auto paren = stat.rfind(')');  // the command may hold spaces and parentheses
  return paren != std::string::npos && paren + 2 < stat.size() ? stat[paren + 2] : 0;
}

// Why a socket that accepted gave nothing: its listener is stopped, or it is not a telemetry
// socket (then the listener's own one is named).
[[noreturn]] void throw_silent(int fd, const std::filesystem::path& socket, double seconds) {
  ucred cred{};
  socklen_t len = sizeof cred;
  const int pid = ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 ? cred.pid : 0;
  const char state = pid > 0 ? process_state(pid) : 0;
  std::string why;
  if (state == 'T' || state == 't')
    why = fmt::format("process {} is stopped (SIGSTOP or a debugger)", pid);
  else if (pid > 0 && socket.filename() != fmt::format("{}.sock", pid))
    why = fmt::format(
        "not a tierswap telemetry socket (a node service's socket?): process {} "
        "listens there, `tierswap residency {}` asks its own",
        pid, pid);
  else
    why = "the process did not answer";
  throw std::system_error(
      ETIMEDOUT, std::system_category(),
      fmt::format("no snapshot from {} within {:g} s: {}", socket.string(), seconds, why));
}

}  // namespace

std::string query_telemetry(const std::filesystem::path& socket, double timeout_seconds) {
  if (!(timeout_seconds > 0))
    throw std::invalid_argument("query_telemetry: the timeout must be positive");
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_seconds));
  const sockaddr_un a = address_of(socket);
  const detail::File s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), socket.string());
  if (!s) throw_errno(errno, "socket");
  if (::connect(s.fd(), reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0)
    throw_errno(errno, "connect to " + socket.string());
  std::string out;
  if (!read_until_eof(s.fd(), &out, deadline, socket))
    throw_silent(s.fd(), socket, timeout_seconds);
  if (out.empty())
    throw std::system_error(ECONNRESET, std::system_category(),
                            "no snapshot from " + socket.string() + " (refused?)");
  return out;
}

}  // namespace tierswap
