// SwapService: the listening socket, one thread per connected client, the node's memory budget,
// the clients' regions, and the requests (put, get, commit, discard, status) over one engine.
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <system_error>
#include <thread>

#include "src/service/server_impl.hpp"
#include "tierswap/checksum.hpp"
#include "tierswap/detail/manifest.hpp"
#include "tierswap/detail/paths.hpp"
#include "tierswap/io_engine.hpp"
#include "tierswap/log.hpp"
#include "tierswap/metrics.hpp"
#include "tierswap/service.hpp"
#include "tierswap/swap_space.hpp"
#include "tierswap/telemetry.hpp"
#include "tierswap/units.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tierswap {

using service::BlockRecord;
using service::ClientRecord;
using service::Connection;

namespace {
std::uint64_t machine_memory() {
  return static_cast<std::uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
         static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
}

// The socket's directory, made when missing as mkdir(1) would (one level: its parent must exist,
// so /run/tierswap/service.sock works without systemd and a mistyped path makes nothing).
// Searchable by others only when other users' clients are accepted. Before the swap space is
// opened, so a socket that cannot be made creates nothing.
void make_socket_dir(const std::filesystem::path& socket, bool others) {
  const std::filesystem::path dir = socket.parent_path();
  if (dir.empty() || ::mkdir(dir.c_str(), others ? 0755 : 0700) == 0 || errno == EEXIST) return;
  throw std::system_error(errno, std::system_category(),
                          fmt::format("service socket {}: cannot make its directory {} (tierswap "
                                      "makes one level; its parent must exist)",
                                      socket.string(), dir.string()));
}
}  // namespace

void ServiceConfig::validate() const {
  if (swap_dirs.empty()) throw std::invalid_argument("service: swap_dirs: at least one directory");
  if (host_budget < 4096) throw std::invalid_argument("service: host_budget: at least 4 KiB");
  if (client_quota > host_budget)
    throw std::invalid_argument(fmt::format("service: client_quota {} exceeds host_budget {}",
                                            format_bytes(client_quota), format_bytes(host_budget)));
  if (!(first_message_seconds > 0))
    throw std::invalid_argument(
        fmt::format("service: first_message_seconds {}: must be positive", first_message_seconds));
  if (!(region_ttl_seconds >= 0) || !std::isfinite(region_ttl_seconds))
    throw std::invalid_argument(fmt::format(
        "service: region_ttl_seconds {}: must be 0 (never) or more", region_ttl_seconds));
  if (pageable_budget != 0 && pageable_quota > pageable_budget)
    throw std::invalid_argument(fmt::format("service: pageable_quota {} exceeds pageable_budget {}",
                                            format_bytes(pageable_quota),
                                            format_bytes(pageable_budget)));
}

// ---- storage -------------------------------------------------------------------------------
// The swap directories exist, and a swap space is there to open or, with a capacity, may be
// made: not where a registry names clients of one that is gone (their state went with it, and a
// new space would only fail on that registry at every restart).
void SwapService::Impl::check_swap_dirs() const {
  bool any_swap_file = false;
  for (const auto& d : cfg.swap_dirs) {
    std::error_code ec;
    if (!std::filesystem::is_directory(d, ec))
      throw std::invalid_argument(
          fmt::format("swap directory {}: {}", d.string(),
                      std::filesystem::exists(d, ec) ? "not a directory" : "does not exist"));
    const bool here = std::filesystem::exists(d / SwapSpace::kFileName, ec);
    any_swap_file = any_swap_file || here;
    if (!here && cfg.capacity == 0)
      throw std::invalid_argument(fmt::format(
          "swap directory {} holds no tierswap swap space ({}): give a capacity to create one "
          "(tierswap serve --capacity SIZE)",
          d.string(), SwapSpace::kFileName));
  }
  const service::ServiceFiles f{cfg.swap_dirs.front()};
  std::error_code ec;
  if (any_swap_file || !std::filesystem::exists(f.registry(), ec)) return;
  const auto [keys, old_uuid] = service::registry_summary(f);
  throw std::invalid_argument(fmt::format(
      "the swap file {} of swap space {} is gone, and with it the state of the {} client(s) "
      "its registry {} names ({}); nothing was created. To start an empty swap space there, "
      "move {} and {} away",
      (cfg.swap_dirs.front() / SwapSpace::kFileName).string(), old_uuid, keys.size(),
      f.registry().string(), fmt::join(keys, ", "), f.registry().filename().string(),
      (f.dir / "service-clients").string()));
}

void SwapService::Impl::open_storage() {
  check_swap_dirs();
  SwapSpaceConfig sc;
  sc.dirs = cfg.swap_dirs;
  if (cfg.capacity > 0) {
    sc.capacity = cfg.capacity;
    space = std::make_unique<SwapSpace>(SwapSpace::open_or_create(sc));
  } else {
    space = std::make_unique<SwapSpace>(SwapSpace::open(cfg.swap_dirs));
  }
  engine = std::make_unique<IoEngine>(*space, IoEngineConfig::from_env());
  queue_bytes = std::uint64_t{engine->config().queue_depth} * engine->config().block_size;
  budget = std::make_unique<service::MemoryBudget>(
      service::MemoryBudget::limits_for(cfg, machine_memory()));
  align = std::max<std::uint64_t>(4096, space->alignment());
  uuid = space->uuid();
  files.dir = cfg.swap_dirs.front();
  clients = service::load_clients(files, uuid, align, ::getuid(), unix_now());
  regions = std::make_unique<ExtentAllocator>(space->capacity() / align * align, align);
  for (auto& [k, c] : clients) {
    try {
      regions->reserve({c.base, c.bytes});
    } catch (const std::exception& e) {
      throw std::runtime_error(
          fmt::format("{}: region of client {} ({} at {}) overlaps another or "
                      "lies outside the swap space: {}",
                      files.registry().string(), k, format_bytes(c.bytes), c.base, e.what()));
    }
  }
}

// ---- one connection ------------------------------------------------------------------------
void SwapService::Impl::serve(Peer& p) {
  Session s;
  s.done_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (s.done_fd < 0) {
    log(LogLevel::error,
        fmt::format("service: pid {}: eventfd: {}", p.cred.pid, std::strerror(errno)));
    return;
  }
  s.out = std::make_unique<service::Outbox>(p.conn, s.done_fd);
  service::set_socket_timeout(p.conn.fd(), cfg.first_message_seconds);  // until the hello
  try {
    converse(p, s);
  } catch (const std::exception& e) {  // an error of one connection ends that one alone
    ++dropped;
    log(LogLevel::error, fmt::format("service: dropped pid {} ({}): {}", p.cred.pid,
                                     s.key.empty() ? "before hello" : s.key, e.what()));
  }
  abandon_raw(s);  // waits: the memory must outlive its I/O
  if (s.registered >= 0) engine->unregister_buffer(s.registered);
  ::close(s.done_fd);
  detach(s);
  // The peer sees the end at once, after its memory and attachment are released (the socket
  // itself is closed when the acceptor reaps this thread).
  ::shutdown(p.conn.fd(), SHUT_RDWR);
}

// The connection's messages, until it ends or is dropped.
void SwapService::Impl::converse(Peer& p, Session& s) {
  std::vector<std::uint8_t> buf;
  for (;;) {
    // Raw I/O in flight: account what completed and take in new requests as they come.
    if (s.busy) {
      bool request = false;
      if (!wait_raw(p, s, &request)) return;
      if (!request) continue;
    }
    const wire::Message* m = nullptr;
    std::string why;
    const auto st = p.conn.receive(buf, &m, nullptr, &why);
    if (st != Connection::Status::ok) {
      if (st == Connection::Status::invalid || st == Connection::Status::error) {
        ++dropped;
        log(LogLevel::warn, fmt::format("service: dropped pid {} ({}): {}{}", p.cred.pid,
                                        s.key.empty() ? "before hello" : s.key, why,
                                        !s.rec && why == service::kNoAnswerInTime
                                            ? fmt::format(" ({:g} s for the first message)",
                                                          cfg.first_message_seconds)
                                            : ""));
      }
      return;
    }
    if (!s.rec) {
      if (!first_message(p, *m, s)) return;
      service::set_socket_timeout(p.conn.fd(), 0);  // a client may be idle between steps
      continue;
    }
    const wire::Body type = m->body_type();
    if (type == wire::Body::NONE || type == wire::Body::Hello || type == wire::Body::Welcome ||
        type == wire::Body::Reply || type == wire::Body::Offer || type == wire::Body::Offered) {
      ++dropped;
      log(LogLevel::warn,
          fmt::format("service: dropped {}: unexpected {}", s.key, wire::EnumNameBody(type)));
      return;
    }
    if (stopping.load() && done_when_stopping(s, type)) return refuse_stopping(s, *m);
    if (type == wire::Body::Write || type == wire::Body::Put) ++s.writes_since_commit;
    if (type == wire::Body::Read || type == wire::Body::Write) {
      if (!queue_raw(s, *m)) return;
      continue;
    }
    if (!drain_raw(s)) return;  // everything before it first (a Sync covers those writes)
    const service::Answer a = handle(*m, s);
    if (a.error != 0) count_failed(type);
    if (a.error == 0 &&
        (type == wire::Body::Sync || type == wire::Body::Commit || type == wire::Body::Discard))
      s.writes_since_commit = 0;
    if (s.out->send(a) != 0) return;
  }
}

// Before a hello: an Offer or a Status is answered and the connection ends; a Hello attaches (or
// is refused with the reason, and the connection ends); anything else drops it. Whether to go on.
bool SwapService::Impl::first_message(Peer& p, const wire::Message& m, Session& s) {
  if (p.cred.uid != ::getuid() && !cfg.allow_other_users) {  // told why, not just closed
    const std::string why = fmt::format(
        "uid {} is not the service's (uid {}): start it with --allow-other-users to "
        "serve other users' jobs",
        p.cred.uid, ::getuid());
    ++refused;
    log(LogLevel::warn, fmt::format("service: refused pid {}: {}", p.cred.pid, why));
    s.out->send({EACCES, why});
    return false;
  }
  if (stopping.load()) {  // a hello or an offer: refused, with the reason
    ++refused;
    log(LogLevel::info,
        fmt::format("service: stopping: refused pid {} of uid {}", p.cred.pid, p.cred.uid));
    s.out->send(stopping_answer());
    return false;
  }
  if (const auto* o = m.body_as_Offer()) {
    offer(p, *o);
    return false;
  }
  if (m.body_type() == wire::Body::Status) {  // `tierswap release --older-than`: the regions
    const bool all = p.cred.uid == 0 || p.cred.uid == ::getuid();
    s.out->send({0, {}, 0, status(all ? std::nullopt : std::optional<uid_t>(p.cred.uid))});
    return false;
  }
  const auto* h = m.body_as_Hello();
  if (!h) {
    ++dropped;
    log(LogLevel::warn,
        fmt::format("service: dropped pid {}: first message is not hello", p.cred.pid));
    return false;
  }
  std::string why;
  try {
    if (const int error = hello(p, *h, s, &why); error != 0) {
      ++refused;
      s.out->send({error, why});
      return false;
    }
  } catch (...) {  // its registry entry or its memory could not be made: refused, as above
    const service::Answer a = service::error_answer(std::current_exception());
    ++refused;
    log(LogLevel::error, fmt::format("service: refused pid {}: {}", p.cred.pid, a.message));
    s.out->send(a);
    return false;
  }
  return true;
}

int SwapService::Impl::offer(Peer& p, const wire::Offer& o) {
  flatbuffers::FlatBufferBuilder fb;
  if (o.protocol() != service::kProtocolVersion || o.share() == 0) {
    service::build_reply(
        p.conn, fb,
        {EINVAL, fmt::format("offer: protocol {}, share {} (this service speaks {}; share >= 1)",
                             o.protocol(), o.share(), service::kProtocolVersion)});
    return p.conn.send(fb);
  }
  const service::MemoryBudget::Limits& l = budget->limits();
  const service::MemoryBudget::Granted g = budget->granted();
  const std::uint64_t free = l.budget - g.memory, pageable_free = l.pageable_budget - g.pageable;
  const auto share_of = [&](std::uint64_t q, std::uint64_t total, std::uint64_t left) {
    return std::min({q, total / o.share(), left}) / 4096 * 4096;
  };
  const auto body =
      wire::CreateOffered(fb, share_of(l.quota, l.budget, free), l.budget, free, l.quota,
                          share_of(l.pageable_quota, l.pageable_budget, pageable_free),
                          l.pageable_budget, pageable_free, l.pageable_quota);
  fb.Finish(p.conn.message(fb, wire::Body::Offered, body.Union()), wire::MessageIdentifier());
  return p.conn.send(fb);
}

// The checks of a Hello that need no state: protocol, job id, sizes, the pageable quota.
int SwapService::Impl::check_hello(const wire::Hello& h, const std::string& job,
                                   std::string* why) const {
  if (h.protocol() != service::kProtocolVersion) {
    *why = fmt::format("protocol {} (this service speaks {})", h.protocol(),
                       service::kProtocolVersion);
    return EINVAL;
  }
  if (!detail::valid_job_id(job)) {
    *why = fmt::format("job id '{}': expected 1-64 of [A-Za-z0-9._-]", job);
    return EINVAL;
  }
  const std::uint64_t mem = h.memory_bytes(), pageable = h.pageable_bytes();
  if (mem == 0 || mem % 4096 != 0 || pageable % 4096 != 0) {
    *why = fmt::format("memory_bytes {}, pageable_bytes {}: multiples of 4 KiB (memory_bytes > 0)",
                       mem, pageable);
    return EINVAL;
  }
  if (const std::uint64_t pageable_quota = budget->limits().pageable_quota;
      pageable > pageable_quota) {
    *why = fmt::format("client {}.{} asks {} of pageable shared memory: the per-client quota is {}",
                       job, h.rank(), format_bytes(pageable), format_bytes(pageable_quota));
    return EINVAL;
  }
  return 0;
}

// Under mu: client `key` may attach (its region's owner, not attached already), its memory is
// granted, and it has its region (region_for()); a refusal after the grant gives it back.
int SwapService::Impl::admit(const wire::Hello& h, const std::string& key, uid_t uid,
                             ClientRecord** rec, std::string* why) {
  if (const auto it = clients.find(key);
      it != clients.end() && it->second.uid != uid && uid != ::getuid()) {
    *why = fmt::format(
        "client {} belongs to uid {}: uid {} may not attach, read or release it (a job id of "
        "your own gets a region of its own)",
        key, it->second.uid, uid);
    return EACCES;
  }
  if (live.count(key)) {
    *why = fmt::format("client {} is already attached (pid {})", key, live[key].pid);
    return EBUSY;
  }
  const std::uint64_t mem = h.memory_bytes(), pageable = h.pageable_bytes();
  if (const int refused = budget->grant(key, mem, pageable, why); refused != 0) return refused;
  try {
    const int refused = region_for(h, key, uid, rec, why);
    if (refused != 0) budget->give_back(mem, pageable);
    return refused;
  } catch (...) {
    budget->give_back(mem, pageable);
    throw;
  }
}

// Under mu: a known client attaches as the kind it was first, within its region; a first attach
// allocates the region and records the client. *rec: its record.
int SwapService::Impl::region_for(const wire::Hello& h, const std::string& key, uid_t uid,
                                  ClientRecord** rec, std::string* why) {
  auto it = clients.find(key);
  if (it != clients.end()) {
    if (it->second.raw != h.raw()) {
      *why = fmt::format("client {} was first attached as a {} client", key,
                         it->second.raw ? "raw" : "block");
      return EPROTOTYPE;  // distinct: a caller that does not know the kind may ask as the other
    }
    if (round_up(h.region_bytes(), align) > it->second.bytes) {
      *why = fmt::format(
          "client {} asks {} of NVMe, but its region from its first attach holds {}: a region "
          "does not grow (a new job id gets a new one; releasing this one frees it, losing what "
          "it holds)",
          key, format_bytes(h.region_bytes()), format_bytes(it->second.bytes));
      return EINVAL;
    }
    *rec = &it->second;
    return 0;
  }
  if (h.region_bytes() == 0) {
    *why = fmt::format(
        "client {} is not known to this service: it holds no region (nothing to reattach to or "
        "release)",
        key);
    return ENOENT;
  }
  const std::uint64_t want = round_up(h.region_bytes(), align);
  const auto e = regions->try_allocate(want);
  if (!e) {
    *why = fmt::format("client {} asks {} of NVMe: {} of the swap space is free", key,
                       format_bytes(want), format_bytes(regions->stats().free));
    return EINVAL;
  }
  ClientRecord c;
  c.job = h.job()->str();
  c.rank = h.rank();
  c.base = e->offset;
  c.bytes = e->length;
  c.raw = h.raw();
  c.uid = uid;
  c.last_used = unix_now();
  c.rebuild(align);
  const auto added = clients.emplace(key, std::move(c)).first;
  try {  // a client the registry does not name would lose its state at the service's restart
    save_registry(files, uuid, clients);
  } catch (...) {
    clients.erase(added);
    regions->free(*e);
    throw;
  }
  *rec = &added->second;
  return 0;
}

int SwapService::Impl::hello(Peer& p, const wire::Hello& h, Session& s, std::string* why) {
  const std::string job = h.job() ? h.job()->str() : "";
  if (const int refused = check_hello(h, job, why); refused != 0) {
    log(LogLevel::warn,
        fmt::format("service: refused pid {} of uid {}: {}", p.cred.pid, p.cred.uid, *why));
    return refused;
  }
  const std::uint64_t mem = h.memory_bytes(), pageable = h.pageable_bytes();
  const std::string key = job + "." + std::to_string(h.rank());
  std::unique_lock lk(mu);
  const bool reattached = clients.count(key) != 0;
  ClientRecord* rec = nullptr;
  if (const int refused = admit(h, key, p.cred.uid, &rec, why); refused != 0) {
    log(LogLevel::warn, fmt::format("service: refused {} to pid {} of uid {}: {}", key, p.cred.pid,
                                    p.cred.uid, *why));
    return refused;
  }
  if (reattached) touch(*rec);
  // The grant and the key are taken now (a second hello for the key is refused as attached);
  // the memory is made without the lock: locking gigabytes takes seconds, and every other
  // client's completions count their traffic under it.
  live[key] = Live{mem, pageable, p.cred.pid, p.cred.uid};
  s.traffic = live[key].traffic;
  lk.unlock();
  try {
    s.mem = service::make_shared_memory(key, mem + pageable, cfg.lock_memory ? mem : 0,
                                        huge_pages.lent);
  } catch (...) {
    lk.lock();
    budget->give_back(mem, pageable);
    live.erase(key);
    throw;
  }
  s.rec = rec;  // attached from here on: detach() undoes what follows
  s.key = key;
  // The locked part as io_uring fixed buffers: no page pinning per request (the pageable part
  // stays unregistered: a registration would pin it).
  if (cfg.lock_memory) s.registered = engine->register_buffer(s.mem->data, mem);
  flatbuffers::FlatBufferBuilder fb;
  const auto w =
      wire::CreateWelcome(fb, mem, s.rec->bytes, s.rec->generation, reattached,
                          static_cast<std::uint32_t>(align), fb.CreateString(uuid), pageable);
  fb.Finish(p.conn.message(fb, wire::Body::Welcome, w.Union()), wire::MessageIdentifier());
  log(LogLevel::info, fmt::format("service: {} {} (pid {}): {} shared, {} of NVMe{}", key,
                                  reattached ? "reattached" : "attached", p.cred.pid,
                                  format_bytes(mem), format_bytes(s.rec->bytes),
                                  s.rec->raw ? std::string(" (a tier manager)")
                                             : fmt::format(", generation {}", s.rec->generation)));
  return p.conn.send(fb, s.mem->fd) == 0 ? 0 : EPIPE;
}

service::Answer SwapService::Impl::handle(const wire::Message& m, Session& s) {
  service::Answer a;
  try {
    const bool block_op = m.body_type() == wire::Body::Put || m.body_type() == wire::Body::Get ||
                          m.body_type() == wire::Body::Commit ||
                          m.body_type() == wire::Body::Discard;
    if (block_op && s.rec->raw)
      throw std::system_error(EPERM, std::system_category(),
                              "put/get/commit/discard: a raw client keeps its own blocks");
    switch (m.body_type()) {
      case wire::Body::Sync:
        if (!s.rec->raw)
          throw std::system_error(EPERM, std::system_category(), "sync: not a raw client");
        sync_swap();
        a.tag = m.body_as_Sync()->tag();
        break;
      case wire::Body::Release:
        s.release = true;
        break;
      case wire::Body::Put:
        a.value = put(s, *m.body_as_Put());
        break;
      case wire::Body::Get:
        a.value = get(s, *m.body_as_Get());
        break;
      case wire::Body::Commit:
        a.value = commit(s);
        break;
      case wire::Body::Discard: {
        std::lock_guard lk(mu);
        for (auto& [id, b] : s.rec->blocks) b.open = false;
        break;
      }
      case wire::Body::Status:
        a.text = status();
        break;
      default:  // refused before: serve() drops the connection
        throw std::system_error(EPROTO, std::system_category(), "unexpected message");
    }
  } catch (...) {
    return service::error_answer(std::current_exception(), service::tag_of(m));
  }
  return a;
}

// ---- requests ------------------------------------------------------------------------------
namespace {

void check_range(const char* what, std::uint64_t offset, std::uint64_t length,
                 std::uint64_t memory) {
  if (length == 0 || offset % 4096 || length % 4096 || offset > memory || length > memory - offset)
    throw std::system_error(EINVAL, std::system_category(),
                            fmt::format("{} [{}, +{}): outside the shared memory of {} or not in "
                                        "whole 4 KiB pages",
                                        what, offset, length, format_bytes(memory)));
}

}  // namespace

std::uint64_t SwapService::Impl::put(Session& s, const wire::Put& r) {
  check_range("put", r.offset(), r.length(), s.mem->bytes);
  ClientRecord& c = *s.rec;
  BlockRecord b;
  {
    std::lock_guard lk(mu);  // status() reads the block table
    auto it = c.blocks.find(r.block());
    if (it == c.blocks.end()) {
      c.place(r.block(), r.length(), align);
      it = c.blocks.find(r.block());
    }
    if (it->second.length != r.length())
      throw std::system_error(EINVAL, std::system_category(),
                              fmt::format("put: block {} has {} bytes, not {}", r.block(),
                                          it->second.length, r.length()));
    b = it->second;
  }
  const std::byte* data = s.mem->data + r.offset();
  const int slot = b.writable();
  const std::uint64_t sum = checksum64(data, r.length());
  engine->write(c.base + b.extent[slot], data, r.length()).wait();
  s.traffic->written_bytes += r.length();
  std::lock_guard lk(mu);
  BlockRecord& rb = c.blocks.at(r.block());
  rb.sum[slot] = sum;
  rb.open = true;
  return r.length();
}

std::uint64_t SwapService::Impl::get(Session& s, const wire::Get& r) {
  check_range("get", r.offset(), r.length(), s.mem->bytes);
  const auto it = s.rec->blocks.find(r.block());
  if (it == s.rec->blocks.end() || it->second.readable() < 0)
    throw std::system_error(ENOENT, std::system_category(),
                            fmt::format("get: client {} has no block {}", s.key, r.block()));
  const BlockRecord& b = it->second;
  if (r.length() < b.length)
    throw std::system_error(
        EINVAL, std::system_category(),
        fmt::format("get: block {} has {} bytes, room for {}", r.block(), b.length, r.length()));
  std::byte* data = s.mem->data + r.offset();
  const int slot = b.readable();
  engine->read(s.rec->base + b.extent[slot], data, b.length).wait();
  if (checksum64(data, b.length) != b.sum[slot])
    throw std::system_error(EIO, std::system_category(),
                            fmt::format("get: block {} of client {} does not match its checksum "
                                        "(slot {} at {} of the swap space)",
                                        r.block(), s.key, slot, s.rec->base + b.extent[slot]));
  s.traffic->read_bytes += b.length;
  return b.length;
}

// fdatasync of the swap files, after checking that each is still the file at its path: one
// deleted (rm -rf of the swap directory) or replaced would take every write acknowledged as
// durable with it. Then nothing is acknowledged, and the log says why, at every attempt.
void SwapService::Impl::sync_swap() {
  for (const SwapFile& f : space->files()) {
    struct stat open_st {
    }, path_st{};
    const bool linked = ::fstat(f.fd, &open_st) == 0 && open_st.st_nlink > 0 &&
                        ::stat(f.path.c_str(), &path_st) == 0 && path_st.st_ino == open_st.st_ino &&
                        path_st.st_dev == open_st.st_dev;
    if (linked) continue;
    const std::string why = fmt::format(
        "swap file {} was deleted or replaced while the service ran: no write is durable any "
        "more; stop the service (what its clients committed went with the file)",
        f.path.string());
    log(LogLevel::error, "service: " + why);
    throw std::system_error(ENOENT, std::system_category(), why);
  }
  space->sync();
}

std::uint64_t SwapService::Impl::commit(Session& s) {
  ClientRecord& c = *s.rec;
  sync_swap();
  ClientRecord next;  // the manifest is written from a copy: a failed write changes nothing
  next.job = c.job;
  next.rank = c.rank;
  next.generation = c.generation + 1;
  for (const auto& [id, b] : c.blocks) {
    BlockRecord n = b;
    if (n.open) n.committed = n.writable();
    n.open = false;
    next.blocks.emplace(id, n);
  }
  save_manifest(files, uuid, next);
  std::lock_guard lk(mu);
  c.blocks = std::move(next.blocks);
  c.generation = next.generation;
  return c.generation;
}

void SwapService::Impl::detach(Session& s) {
  if (!s.rec) return;
  ClientRecord& c = *s.rec;
  std::unique_lock lk(mu);
  // The open generation is discarded: blocks never committed give their extents back.
  for (auto it = c.blocks.begin(); it != c.blocks.end();) {
    it->second.open = false;
    if (it->second.committed < 0) {
      for (std::uint64_t e : it->second.extent)
        c.alloc->free({e, round_up(it->second.length, align)});
      it = c.blocks.erase(it);
    } else {
      ++it;
    }
  }
  budget->give_back(live.at(s.key).memory, live.at(s.key).pageable);
  live.erase(s.key);
  log(LogLevel::info,
      c.raw ? fmt::format("service: {} detached", s.key)
            : fmt::format("service: {} detached at generation {}", s.key, c.generation));
  s.rec = nullptr;
  if (s.release)
    forget(s.key);  // destroys the record `c` refers to: last
  else
    touch(c);
  lk.unlock();
  s.mem.reset();  // unmapping gigabytes takes a while: not under the lock
}

// The registry without the client first: should that fail, it stays known with all it holds (a
// registry naming a client whose manifest is gone brought it back empty at the next start).
void SwapService::Impl::forget(const std::string& key) {
  const auto it = clients.find(key);
  if (it == clients.end()) return;
  auto gone = clients.extract(it);
  try {
    save_registry(files, uuid, clients);
  } catch (const std::exception& e) {
    clients.insert(std::move(gone));
    log(LogLevel::error, fmt::format("service: releasing {}: {}; it stays known, with its region "
                                     "and committed blocks (release it again)",
                                     key, e.what()));
    return;
  }
  const ClientRecord& c = gone.mapped();
  detail::remove_manifest_file(files.manifest(c));  // with its recycled spare
  regions->free({c.base, c.bytes});
  log(LogLevel::info, fmt::format("service: {} released", key));
}

// ---- status and metrics --------------------------------------------------------------------
std::string SwapService::Impl::status(std::optional<uid_t> owner) const {
  std::lock_guard lk(mu);
  const service::MemoryBudget::Granted g = budget->granted();
  const std::int64_t now = unix_now();
  nlohmann::json j = {{"service", true},
                      {"pid", ::getpid()},
                      {"socket", listener->path().string()},
                      {"swap_dirs", nlohmann::json::array()},
                      {"host_budget", cfg.host_budget},
                      {"memory_granted", g.memory},
                      {"pageable_quota", budget->limits().pageable_quota},
                      {"pageable_budget", budget->limits().pageable_budget},
                      {"pageable_granted", g.pageable},
                      {"queue_bytes", queue_bytes},
                      {"nvme_capacity", space->capacity()},
                      {"nvme_free", regions->stats().free},
                      {"backend", engine->backend_description()},
                      {"shared_memory_pages", huge_pages.describe()}};
  for (const auto& d : cfg.swap_dirs) j["swap_dirs"].push_back(d.string());
  j["clients"] = nlohmann::json::array();
  for (const auto& [k, c] : clients) {
    if (owner && c.uid != *owner) continue;
    nlohmann::json e = {
        {"job", c.job},
        {"rank", c.rank},
        {"region_bytes", c.bytes},
        {"blocks", c.blocks.size()},
        {"attached", live.count(k) > 0},
        {"raw", c.raw},
        {"owner_uid", c.uid},
        {"idle_seconds", live.count(k) ? 0 : std::max<std::int64_t>(0, now - c.last_used)}};
    if (!c.raw) e["generation"] = c.generation;  // a tier manager commits in its own manifest
    if (const auto it = live.find(k); it != live.end()) {
      const Live& l = it->second;
      e.update({{"pid", l.pid},
                {"uid", l.uid},
                {"memory_bytes", l.memory},
                {"pageable_bytes", l.pageable},
                {"nvme_read_bytes", l.traffic->read_bytes.load()},
                {"nvme_written_bytes", l.traffic->written_bytes.load()},
                {"peak_inflight_bytes", l.traffic->peak_inflight_bytes.load()},
                {"throttled_requests", l.traffic->throttled.load()}});
    }
    j["clients"].push_back(e);
  }
  return j.dump();
}

// ---- SwapService ---------------------------------------------------------------------------
SwapService::SwapService(ServiceConfig cfg, int listen_fd) : impl_(std::make_unique<Impl>()) {
  cfg.validate();
  Impl& m = *impl_;
  m.cfg = std::move(cfg);
  const std::filesystem::path socket =
      m.cfg.socket.empty() ? default_service_socket() : m.cfg.socket;
  // The budget is a cap, as in-process; above the machine's memory it caps nothing: refused
  // before anything is made.
  if (const std::uint64_t ram = machine_memory(); m.cfg.host_budget > ram)
    throw std::invalid_argument(
        fmt::format("service: host_budget {} is more than this machine's memory ({}): clients "
                    "would be granted more shared memory than it can hold",
                    format_bytes(m.cfg.host_budget), format_bytes(ram)));
  if (listen_fd < 0) make_socket_dir(socket, m.cfg.allow_other_users);
  m.open_storage();
  m.huge_pages = service::shmem_huge_pages();
  if (m.huge_pages.asked && !m.huge_pages.lent)
    log(LogLevel::warn,
        fmt::format("service: the clients' shared memory will be on {}: NVMe reads "
                    "into them run 2-3x slower than into huge pages. Allow them with `echo advise "
                    "> /sys/kernel/mm/transparent_hugepage/shmem_enabled` (as root; "
                    "tools/systemd/tierswap-thp.conf does it at boot)",
                    m.huge_pages.describe()));
  m.listener = std::make_unique<service::Listener>(socket, m.cfg.allow_other_users, listen_fd);
  m.metrics = MetricsRegistry::process().add([&m](MetricsWriter& w) { m.fill_metrics(w); });
  if (const TelemetryConfig tc = TelemetryConfig::from_env(); tc.enabled) {
    try {
      m.telemetry = std::make_unique<TelemetryServer>([&m] { return m.status(); }, tc);
    } catch (const std::exception& e) {
      log(LogLevel::warn, fmt::format("service: telemetry endpoint not started: {}", e.what()));
    }
  }
  m.listener->start({.serve = [&m](service::Peer& p) { m.serve(p); },
                     .tick = [&m] { m.expire_idle(); },
                     .refused = [&m] { ++m.refused; }});
}

SwapService::~SwapService() {
  Impl& m = *impl_;
  m.telemetry.reset();
  m.metrics = {};
  m.listener.reset();
}

const std::filesystem::path& SwapService::socket_path() const noexcept {
  return impl_->listener->path();
}

std::string SwapService::status_json() const {
  return impl_->status();
}

}  // namespace tierswap
