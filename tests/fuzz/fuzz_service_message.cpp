// The node service's messages from a peer, end to end against a live SwapService on a scratch
// swap space. Selector 0: the input is everything a connection sends (length prefixes, FlatBuffers,
// sequence numbers; a hello or an offer first). Selector 1: a valid hello first, then the input
// (requests of an attached client: put, get, commit, discard with any offsets, lengths and block
// ids). Selector 2: the input is the registry payload (JSON in a valid container) a restarting
// service reads. Selector 3: the input is the manifest payload of client seed.0 (its blocks,
// extents, generation), which a registry naming that client makes the restarting service read;
// the client then reattaches and reads, writes and commits its blocks. In the payloads of 2 and 3
// fuzz::kUuidToken stands for the swap space's uuid. Each connection's answers are drained until
// the service closes it; a good client must then still get a round trip, so a connection that
// poisons the service is a finding too.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string_view>

#include "fuzz_util.hpp"
#include "src/service/protocol.hpp"
#include "tierswap/detail/manifest.hpp"
#include "tierswap/service.hpp"
#include "tierswap/swap_space.hpp"

using namespace tierswap;

namespace {

ServiceConfig config(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  ServiceConfig c;
  c.swap_dirs = {dir};
  c.capacity = 16ull << 20;
  c.host_budget = 4ull << 20;
  c.socket = dir / "s.sock";
  c.lock_memory = false;
  return c;
}

std::string hello_frame() {
  flatbuffers::FlatBufferBuilder fb;
  const auto h = wire::CreateHello(fb, service::kProtocolVersion, fb.CreateString("fuzz"), 0,
                                   64 << 10, 1 << 20);
  fb.Finish(wire::CreateMessage(fb, 1, wire::Body::Hello, h.Union()), wire::MessageIdentifier());
  return service::frame(fb);
}

// Sends `bytes` on a new connection, half-closes, reads until the service closes it.
void converse(const std::filesystem::path& socket, const std::string& bytes) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strcpy(a.sun_path, socket.c_str());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) std::abort();
  (void)!::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  ::shutdown(fd, SHUT_WR);
  char buf[4096];
  while (::recv(fd, buf, sizeof buf, 0) > 0) {
  }
  ::close(fd);
}

// Client `job`.0 of the service `c`: 4 KiB of memory, a 1 MiB region.
ServiceClientConfig small_client(const ServiceConfig& c, const char* job) {
  ServiceClientConfig cc;
  cc.socket = c.socket;
  cc.job = job;
  cc.memory_bytes = 4096;
  cc.region_bytes = 1 << 20;
  return cc;
}

void still_serves(const ServiceConfig& c) {
  const ServiceClientConfig cc = small_client(c, "witness");
  for (int i = 0;; ++i) {  // the fuzz connection's detach may still be running
    try {
      ServiceClient w(cc);
      std::memset(w.memory().data(), 0x5a, 4096);
      w.put(1, 0, 4096);
      if (w.get(1, 0, 4096) != 4096) std::abort();
      return;
    } catch (const std::system_error&) {
      if (i == 1000) std::abort();
      ::usleep(1000);
    }
  }
}

// A swap space under `name` made once by a service, with client seed.0 attached once (so the
// registry names it), and its uuid.
struct Restart {
  ServiceConfig cfg;
  std::string uuid;
};

Restart restart_space(const char* name) {
  auto c = config(fuzz::scratch() / name);
  {
    SwapService make_space(c);
    ServiceClient seed(small_client(c, "seed"));
  }
  return {c, SwapSpace::open(c.swap_dirs).uuid()};
}

// A restarting service over what the input made of its files: if it starts, client seed.0
// reattaches and uses blocks 0-3 (each request may be refused; none may crash the service).
void restart(const ServiceConfig& c) {
  try {
    SwapService s(c);
    (void)s.status_json();
    ServiceClient cl(small_client(c, "seed"));
    for (std::uint64_t id = 0; id < 4; ++id) {
      try {
        (void)cl.get(id, 0, 4096);
        cl.put(id, 0, 4096);
      } catch (const std::system_error&) {
      }
    }
    (void)cl.commit();
  } catch (const std::exception&) {
  }
}

// The input, its uuid token replaced, written as the file `rel` of r's swap directory (the
// registry or a client's manifest), then a restart over it.
void restart_over(const Restart& r, const std::filesystem::path& rel, std::string_view bytes) {
  const auto file = r.cfg.swap_dirs.front() / rel;
  std::filesystem::create_directories(file.parent_path());
  detail::write_manifest_file(file, fuzz::with_uuid(bytes, r.uuid), false);
  restart(r.cfg);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t n) {
  static const ServiceConfig live_cfg = config(fuzz::scratch() / "live");
  static SwapService live(live_cfg);
  static const std::string hello = hello_frame();
  const auto [which, bytes] = fuzz::split(data, n);
  switch (which % 4) {
    case 0:
      converse(live_cfg.socket, std::string(bytes));
      still_serves(live_cfg);
      break;
    case 1:
      converse(live_cfg.socket, hello + std::string(bytes));
      still_serves(live_cfg);
      break;
    case 2: {
      static const Restart r = restart_space("restart");
      restart_over(r, "tierswap.service", bytes);
      break;
    }
    default: {
      static const Restart r = restart_space("restart-client");
      restart_over(r, std::filesystem::path("service-clients") / "seed.0.manifest", bytes);
    }
  }
  return 0;
}
