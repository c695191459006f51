// Prometheus text exposition: the writer, the process's registry of sources and the HTTP endpoint
// (Debian's cpp-httplib, one worker thread).
#include "tierswap/metrics.hpp"

#include <httplib.h>

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <system_error>
#include <thread>

#include "tierswap/log.hpp"
#include "tierswap/process_config.hpp"

#include <fmt/format.h>

namespace tierswap {
namespace {

bool name_ok(std::string_view s, bool colon) {
  if (s.empty()) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

std::string escape(std::string_view s, bool quote) {
  std::string out;
  for (char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else if (quote && c == '"')
      out += "\\\"";
    else
      out += c;
  }
  return out;
}

std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);
}

std::string label_text(const MetricLabels& labels) {
  if (labels.empty()) return {};
  std::string s = "{";
  for (std::size_t i = 0; i < labels.size(); ++i) {
    const auto& [k, v] = labels[i];
    if (!name_ok(k, false) || k.rfind("__", 0) == 0)
      throw std::logic_error("metrics: bad label name '" + k + "'");
    s += fmt::format("{}{}=\"{}\"", i ? "," : "", k, escape(v, true));
  }
  return s + "}";
}

}  // namespace

// ---- writer --------------------------------------------------------------------------------
void MetricsWriter::family(std::string_view name, std::string_view help, MetricType type) {
  if (!name_ok(name, true)) throw std::logic_error(fmt::format("metrics: bad name '{}'", name));
  current_name_ = std::string(name);
  auto [it, fresh] = families_.try_emplace(current_name_, Family{std::string(help), type, {}, {}});
  if (fresh)
    order_.push_back(current_name_);
  else if (it->second.type != type)
    throw std::logic_error(fmt::format("metrics: '{}' registered with two types", name));
  current_ = &it->second;
}

void MetricsWriter::sample(double value, const MetricLabels& labels) {
  if (!current_) throw std::logic_error("metrics: sample() before family()");
  std::string l = label_text(labels);
  for (const auto& seen : current_->label_sets)
    if (seen == l)
      throw std::logic_error(fmt::format("metrics: '{}{}' sampled twice", current_name_, l));
  current_->lines.push_back(fmt::format("{}{} {}", current_name_, l, number(value)));
  current_->label_sets.push_back(std::move(l));
}

std::string MetricsWriter::text() const {
  std::string out;
  for (const auto& name : order_) {
    const Family& f = families_.at(name);
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, escape(f.help, false), name,
                       f.type == MetricType::counter ? "counter" : "gauge");
    for (const auto& line : f.lines) out += line + '\n';
  }
  return out;
}

// ---- server --------------------------------------------------------------------------------
struct MetricsServer::Impl {
  httplib::Server http;
  std::thread thread;
  std::atomic<bool> finished{false};
  int port = 0;
};

namespace {
// Why httplib could not bind (it keeps no errno): a bind of our own to the same address, with
// the same SO_REUSEADDR, says. EADDRNOTAVAIL when the host does not resolve.
int bind_error(const ListenAddress& addr) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  if (::getaddrinfo(addr.host.c_str(), std::to_string(addr.port).c_str(), &hints, &res) != 0)
    return EADDRNOTAVAIL;
  int err = EADDRNOTAVAIL;
  for (const addrinfo* a = res; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    const bool bound = ::bind(fd, a->ai_addr, a->ai_addrlen) == 0;
    err = bound ? EADDRNOTAVAIL : errno;  // bound now: the failure was httplib's own
    ::close(fd);
    if (!bound) break;
  }
  ::freeaddrinfo(res);
  return err;
}
}  // namespace

MetricsServer::MetricsServer(const ListenAddress& addr, std::function<std::string()> render)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.http.new_task_queue = [] { return new httplib::ThreadPool(1); };
  // httplib's default adds SO_REUSEPORT, which would let a second process listen on the same
  // port and receive half the scrapes: a busy port must be an error instead.
  m.http.set_socket_options([](int sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  m.http.Get("/metrics", [render](const httplib::Request&, httplib::Response& res) {
    try {
      res.set_content(render(), "text/plain; version=0.0.4; charset=utf-8");
    } catch (const std::exception& e) {
      res.status = 500;
      res.set_content(std::string("metrics: ") + e.what() + "\n", "text/plain");
    }
  });
  m.port = addr.port == 0 ? m.http.bind_to_any_port(addr.host)
                          : (m.http.bind_to_port(addr.host, addr.port) ? addr.port : -1);
  if (m.port <= 0) {
    const int err = bind_error(addr);
    throw std::system_error(
        err, std::system_category(),
        fmt::format("metrics endpoint: cannot listen on {}:{}{}", addr.host, addr.port,
                    err == EADDRINUSE ? " (another process listens there)" : ""));
  }
  m.thread = std::thread([&m] {
    m.http.listen_after_bind();
    m.finished = true;
  });
  // stop() does nothing until the loop runs: wait for it, so the destructor cannot miss it.
  while (!m.http.is_running() && !m.finished)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

MetricsServer::~MetricsServer() {
  impl_->http.stop();
  impl_->thread.join();
}

int MetricsServer::port() const noexcept {
  return impl_->port;
}

// ---- registry ------------------------------------------------------------------------------
MetricsRegistry& MetricsRegistry::process() {
  static MetricsRegistry* r = new MetricsRegistry;  // never destroyed: sources may outlive main
  return *r;
}

MetricsRegistry::Source& MetricsRegistry::Source::operator=(Source&& o) noexcept {
  if (this != &o) {
    if (id_) MetricsRegistry::process().remove(id_);
    id_ = std::exchange(o.id_, 0);
  }
  return *this;
}

MetricsRegistry::Source::~Source() {
  if (id_) MetricsRegistry::process().remove(id_);
}

MetricsRegistry::Source MetricsRegistry::add(Fill fill) {
  const std::string& where = ProcessConfig::current().metrics;
  std::lock_guard lk(mu_);
  const std::uint64_t id = next_id_++;
  sources_.emplace(id, std::move(fill));
  if (!where.empty() && !server_) {
    try {
      const ListenAddress addr = parse_listen_address(where, "TIERSWAP_METRICS");
      server_ = std::make_unique<MetricsServer>(addr, [this] { return render(); });
      log(LogLevel::info,
          fmt::format("metrics on http://{}:{}/metrics", addr.host, server_->port()));
    } catch (const std::exception& e) {
      log(LogLevel::warn, fmt::format("metrics endpoint not started: {}", e.what()));
    }
  }
  return Source(id);
}

void MetricsRegistry::remove(std::uint64_t id) {
  std::unique_ptr<MetricsServer> stopping;
  {
    std::scoped_lock lk(render_mu_, mu_);
    sources_.erase(id);
    if (sources_.empty()) stopping = std::move(server_);
  }
  // Stopped with no lock held: its thread may be waiting in render().
}

std::string MetricsRegistry::render() {
  std::lock_guard rl(render_mu_);
  std::vector<Fill> fills;
  {
    std::lock_guard lk(mu_);
    for (auto& [id, f] : sources_) fills.push_back(f);
  }
  MetricsWriter w;
  for (auto& f : fills) f(w);
  fill_process_metrics(w);
  return w.text();
}

int MetricsRegistry::endpoint_port() {
  std::lock_guard lk(mu_);
  return server_ ? server_->port() : 0;
}

std::uint64_t MetricsRegistry::next_instance() {
  std::lock_guard lk(mu_);
  return next_instance_++;
}

}  // namespace tierswap
