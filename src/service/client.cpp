// ServiceClient: connects, says hello, maps the memfd it is handed, and sends one request at a
// time, each answered by a Reply.
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <system_error>
#include <thread>

#include "src/service/client_impl.hpp"
#include "src/service/shared_memory.hpp"
#include "tierswap/log.hpp"
#include "tierswap/process_config.hpp"
#include "tierswap/service.hpp"
#include "tierswap/telemetry.hpp"

#include <fmt/format.h>

namespace tierswap {

std::filesystem::path default_service_socket() {
  if (const char* v = std::getenv("TIERSWAP_SERVICE"); v && *v) return v;
  std::error_code ec;  // the node's service (tools/systemd/tierswap.socket.in) where it is set up
  if (std::filesystem::is_socket(TIERSWAP_NODE_SOCKET, ec)) return TIERSWAP_NODE_SOCKET;
  return default_runtime_dir() / "service.sock";
}

namespace {

// Whether attaching may be tried again: the service is restarting (its socket gone or not
// accepting yet) or stopping.
bool service_is_away(const std::system_error& e) {
  const int err = e.code().value();
  return err == ENOENT || err == ECONNREFUSED || err == ESHUTDOWN;
}

// attempt(), tried again every half second for up to `wait_seconds` while the service is away.
template <class F>
decltype(auto) waiting_for_service(double wait_seconds, F&& attempt) {
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(wait_seconds));
  for (bool said = false;; said = true) {
    try {
      return attempt();
    } catch (const std::system_error& e) {
      if (!service_is_away(e) || std::chrono::steady_clock::now() >= until) throw;
      if (!said)
        log(LogLevel::warn, fmt::format("{}; waiting up to {:g} s for the service "
                                        "(TIERSWAP_SERVICE_WAIT)",
                                        e.what(), wait_seconds));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

}  // namespace

ServiceOffer service_offer(const std::filesystem::path& socket, std::uint32_t share,
                           double timeout_seconds, double wait_seconds) {
  if (!(wait_seconds >= 0))
    throw std::invalid_argument("service_offer: wait_seconds must be 0 or more");
  return waiting_for_service(wait_seconds, [&] {  // one offer asked and checked
    ServiceClient::Impl m;
    m.path = socket.empty() ? default_service_socket() : socket;
    if (share == 0) m.fail(EINVAL, "offer: share must be at least 1");
    if (!(timeout_seconds > 0)) m.fail(EINVAL, "offer: the timeout must be positive");
    m.cfg.timeout_seconds = timeout_seconds;
    m.connect();
    m.fb.Finish(m.conn->message(m.fb, wire::Body::Offer,
                                wire::CreateOffer(m.fb, service::kProtocolVersion, share).Union()),
                wire::MessageIdentifier());
    // A service older than the Offer (protocol 3) drops a first message that is not a Hello.
    const wire::Message& msg =
        m.exchange(nullptr,
                   "closed the connection without answering the offer: a service older than this "
                   "client (protocol 3) does so; run `tierswap serve` of this version, or give the "
                   "rank a host_budget (then it asks no offer)");
    if (const auto* r = msg.body_as_Reply())
      m.fail(r->error() ? r->error() : EPROTO,
             "offer refused: " + (r->message() ? r->message()->str() : std::string()));
    const auto* o = msg.body_as_Offered();
    if (!o)
      m.fail(EPROTO, "offer answered with " + std::string(wire::EnumNameBody(msg.body_type())));
    const ServiceOffer out{o->bytes(),         o->budget(),         o->free(),
                           o->quota(),         o->pageable_bytes(), o->pageable_budget(),
                           o->pageable_free(), o->pageable_quota()};
    const auto consistent = [](std::uint64_t bytes, std::uint64_t budget, std::uint64_t free,
                               std::uint64_t quota) {
      return bytes % 4096 == 0 && bytes <= free && bytes <= quota && free <= budget &&
             quota <= budget;
    };
    if (!consistent(out.bytes, out.budget, out.free, out.quota) ||
        (out.pageable_bytes != ServiceOffer::kUnknown &&
         !consistent(out.pageable_bytes, out.pageable_budget, out.pageable_free,
                     out.pageable_quota)))
      m.fail(EPROTO, fmt::format("offer answered with inconsistent figures: {} of a {} budget, {} "
                                 "free, quota {}; pageable {} of {}, {} free, quota {}",
                                 out.bytes, out.budget, out.free, out.quota, out.pageable_bytes,
                                 out.pageable_budget, out.pageable_free, out.pageable_quota));
    return out;
  });
}

void ServiceClient::Impl::connect() {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const std::string s = path.string();
  if (s.size() >= sizeof a.sun_path) fail(ENAMETOOLONG, "socket path too long");
  std::memcpy(a.sun_path, s.c_str(), s.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fail(errno, "socket");
  conn = std::make_unique<Connection>(fd);
  service::set_socket_timeout(fd, cfg.timeout_seconds, true);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
    fail(errno, errno == EACCES || errno == EPERM
                    ? fmt::format("cannot connect: the socket is not open to uid {} (a service "
                                  "serves other users' jobs only with --allow-other-users)",
                                  ::getuid())
                    : std::string("cannot connect (is `tierswap serve` running?)"));
}

const wire::Message& ServiceClient::Impl::exchange(int* fd, const char* closed) {
  if (const int err = conn->broken(); err != 0)
    fail(err, err == ETIMEDOUT ? fmt::format("the service did not answer within {} s earlier; this "
                                             "connection is not used again",
                                             cfg.timeout_seconds)
              : err == ESHUTDOWN ? "the service is stopping; this connection is not used again"
                                 : "the connection failed earlier; it is not used again");
  if (const int r = conn->send(fb); r != 0) fail(-r, "send failed");
  const wire::Message* m = nullptr;
  std::string why;
  switch (conn->receive(buf, &m, fd, &why)) {
    case Connection::Status::ok:
      return *m;
    case Connection::Status::closed:
      fail(EPIPE, closed);
    case Connection::Status::error:
      fail(conn->broken() == ETIMEDOUT ? ETIMEDOUT : EIO,
           why == service::kNoAnswerInTime ? fmt::format("{} ({} s)", why, cfg.timeout_seconds)
                                           : why);
    case Connection::Status::invalid:
      fail(EPROTO, "sent an invalid message: " + why);
  }
  fail(EPROTO, "unreachable");
}

const wire::Reply& ServiceClient::Impl::request(wire::Body type, flatbuffers::Offset<void> body,
                                                const char* what) {
  fb.Finish(conn->message(fb, type, body), wire::MessageIdentifier());
  const wire::Message& m = exchange();
  const wire::Reply* r = m.body_as_Reply();
  if (!r)
    fail(EPROTO, fmt::format("{}: answered with {}", what, wire::EnumNameBody(m.body_type())));
  if (r->error() != 0)
    fail(r->error(), r->message() ? r->message()->str() : std::string("error without a message"));
  return *r;
}

ServiceClient::ServiceClient(ServiceClientConfig cfg) : impl_(std::make_unique<Impl>()) {
  impl_->cfg = std::move(cfg);
  impl_->path = impl_->cfg.socket.empty() ? default_service_socket() : impl_->cfg.socket;
  if (!(impl_->cfg.timeout_seconds > 0))
    throw std::invalid_argument("ServiceClientConfig::timeout_seconds: must be positive");
  if (!(impl_->cfg.wait_seconds >= 0))
    throw std::invalid_argument("ServiceClientConfig::wait_seconds: must be 0 or more");
  waiting_for_service(impl_->cfg.wait_seconds, [&] {
    impl_->conn.reset();
    impl_->attach();
  });
  if (impl_->cfg.release_when_detached) release();  // takes effect at the detach
}

// Connects, says hello, and maps the shared memory the welcome comes with.
void ServiceClient::Impl::attach() {
  Impl& m = *this;
  m.fb.Clear();
  m.connect();
  const auto job = m.fb.CreateString(m.cfg.job);
  const auto h =
      wire::CreateHello(m.fb, service::kProtocolVersion, job, m.cfg.rank, m.cfg.memory_bytes,
                        m.cfg.region_bytes, m.cfg.raw, m.cfg.pageable_bytes);
  m.fb.Finish(m.conn->message(m.fb, wire::Body::Hello, h.Union()), wire::MessageIdentifier());
  int fd = -1;
  const wire::Message& msg = m.exchange(&fd);
  if (const auto* r = msg.body_as_Reply()) {
    if (fd >= 0) ::close(fd);
    m.fail(r->error() ? r->error() : EPROTO,
           "refused: " + (r->message() ? r->message()->str() : std::string()));
  }
  const auto* w = msg.body_as_Welcome();
  struct stat st {};
  if (!w || fd < 0 || ::fstat(fd, &st) != 0 ||
      static_cast<std::uint64_t>(st.st_size) != w->memory_bytes() + w->pageable_bytes() ||
      w->memory_bytes() + w->pageable_bytes() < w->memory_bytes()) {
    if (fd >= 0) ::close(fd);
    m.fail(EPROTO, "hello was not answered with a welcome and its shared memory");
  }
  const std::uint64_t total = w->memory_bytes() + w->pageable_bytes();
  void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) m.fail(err, "mmap of the shared memory");
  // The pageable part is faulted in here: on huge pages too where the service's are (its
  // locked part already is; shared_memory.cpp says why it matters).
  if (ProcessConfig::current().huge_pages) service::advise_huge_pages(p, total);
  m.data = static_cast<std::byte*>(p);
  m.bytes = total;
  m.locked_bytes = w->memory_bytes();
  m.generation = w->generation();
  m.reattached = w->reattached();
  m.alignment = w->alignment();
  m.region_bytes = w->region_bytes();
  m.space_uuid = w->space_uuid() ? w->space_uuid()->str() : std::string();
  if (m.alignment == 0 || (m.alignment & (m.alignment - 1)) != 0 || m.alignment > 1u << 20)
    m.fail(EPROTO, fmt::format("welcome with alignment {}", m.alignment));
}

ServiceClient::~ServiceClient() = default;

std::span<std::byte> ServiceClient::memory() const noexcept {
  return {impl_->data, impl_->bytes};
}
std::uint64_t ServiceClient::locked_bytes() const noexcept {
  return impl_->locked_bytes;
}
std::uint64_t ServiceClient::attached_generation() const noexcept {
  return impl_->generation;
}
bool ServiceClient::reattached() const noexcept {
  return impl_->reattached;
}

void ServiceClient::put(std::uint64_t block, std::uint64_t offset, std::uint64_t length) {
  Impl& m = *impl_;
  m.fb.Clear();
  m.request(wire::Body::Put, wire::CreatePut(m.fb, block, offset, length).Union(), "put");
}

std::uint64_t ServiceClient::get(std::uint64_t block, std::uint64_t offset, std::uint64_t length) {
  Impl& m = *impl_;
  m.fb.Clear();
  return m.request(wire::Body::Get, wire::CreateGet(m.fb, block, offset, length).Union(), "get")
      .value();
}

std::uint64_t ServiceClient::commit() {
  Impl& m = *impl_;
  m.fb.Clear();
  return m.request(wire::Body::Commit, wire::CreateCommit(m.fb).Union(), "commit").value();
}

void ServiceClient::discard() {
  Impl& m = *impl_;
  m.fb.Clear();
  m.request(wire::Body::Discard, wire::CreateDiscard(m.fb).Union(), "discard");
}

void ServiceClient::release() {
  Impl& m = *impl_;
  m.fb.Clear();
  m.request(wire::Body::Release, wire::CreateRelease(m.fb).Union(), "release");
}

std::string ServiceClient::status_json() {
  Impl& m = *impl_;
  m.fb.Clear();
  const auto& r = m.request(wire::Body::Status, wire::CreateStatus(m.fb).Union(), "status");
  return r.text() ? r.text()->str() : "{}";
}

}  // namespace tierswap
