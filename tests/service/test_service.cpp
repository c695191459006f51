// The node service: blocks through shared memory and back, generations, isolation between
// clients, the node budget, a client killed with kill -9, the service killed and restarted,
// malformed and out-of-order messages, another uid, a corrupt registry, and its metrics.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <system_error>
#include <thread>
#include <utility>

#include "metrics_scrape.hpp"
#include "service_util.hpp"
#include "src/service/budget.hpp"
#include "src/service/outbox.hpp"
#include "src/service/protocol.hpp"
#include "test_util.hpp"
#include "tierswap/detail/manifest.hpp"
#include "tierswap/metrics.hpp"
#include "tierswap/service.hpp"
#include "tierswap/swap_space.hpp"
#include "tierswap/tier_manager.hpp"

namespace tierswap {
namespace {

using test::TempDir;
constexpr std::uint64_t kKiB = 1024, kMiB = 1024 * 1024;

ServiceConfig service_config(const TempDir& d, std::uint64_t budget = 4 * kMiB) {
  ServiceConfig c;
  c.swap_dirs = {d.path()};
  c.capacity = 64 * kMiB;
  c.host_budget = budget;
  c.socket = d.path() / "service.sock";
  return c;
}

ServiceClientConfig client_config(const ServiceConfig& s, std::string job, std::uint32_t rank = 0,
                                  std::uint64_t memory = 256 * kKiB) {
  ServiceClientConfig c;
  c.socket = s.socket;
  c.job = std::move(job);
  c.rank = rank;
  c.memory_bytes = memory;
  c.region_bytes = 8 * kMiB;
  c.timeout_seconds = 10;
  return c;
}

void fill(ServiceClient& c, std::uint64_t offset, std::uint64_t length, std::uint8_t seed) {
  auto m = c.memory().subspan(offset, length);
  for (std::size_t i = 0; i < m.size(); ++i)
    m[i] = std::byte(static_cast<std::uint8_t>(seed + i * 7));
}

// Block 1 (4 KiB of pattern 1) put and committed: generation 1 for a new client.
void commit_one_block(ServiceClient& c) {
  fill(c, 0, 4 * kKiB, 1);
  c.put(1, 0, 4 * kKiB);
  c.commit();
}

bool holds(ServiceClient& c, std::uint64_t offset, std::uint64_t length, std::uint8_t seed) {
  auto m = c.memory().subspan(offset, length);
  for (std::size_t i = 0; i < m.size(); ++i)
    if (m[i] != std::byte(static_cast<std::uint8_t>(seed + i * 7))) return false;
  return true;
}

bool dropped_after(const std::filesystem::path& socket, const std::vector<std::uint8_t>& bytes);

using test::error_of;

TEST(Service, BlocksGoThroughSharedMemoryWithGenerations) {
  TempDir d;
  const auto sc = service_config(d);
  SwapService svc(sc);
  {
    ServiceClient c(client_config(sc, "job1"));
    EXPECT_FALSE(c.reattached());
    EXPECT_EQ(c.memory().size(), 256 * kKiB);
    fill(c, 0, 64 * kKiB, 1);
    c.put(7, 0, 64 * kKiB);
    EXPECT_EQ(c.commit(), 1u);
    fill(c, 0, 64 * kKiB, 2);
    c.put(7, 0, 64 * kKiB);  // the open generation
    std::memset(c.memory().data() + 64 * kKiB, 0, 64 * kKiB);
    EXPECT_EQ(c.get(7, 64 * kKiB, 64 * kKiB), 64 * kKiB);
    EXPECT_TRUE(holds(c, 64 * kKiB, 64 * kKiB, 2));
    c.discard();
    EXPECT_EQ(c.get(7, 64 * kKiB, 64 * kKiB), 64 * kKiB);
    EXPECT_TRUE(holds(c, 64 * kKiB, 64 * kKiB, 1));
    fill(c, 0, 64 * kKiB, 3);
    c.put(7, 0, 64 * kKiB);
    fill(c, 0, 4 * kKiB, 9);
    c.put(8, 0, 4 * kKiB);  // put, never committed: gone when the client detaches
  }
  ServiceClient again(client_config(sc, "job1"));
  EXPECT_TRUE(again.reattached());
  EXPECT_EQ(again.attached_generation(), 1u);
  again.get(7, 0, 64 * kKiB);
  EXPECT_TRUE(holds(again, 0, 64 * kKiB, 1));  // the open generation (seed 3) was discarded
  EXPECT_NE(error_of([&] { again.get(8, 0, 4 * kKiB); }).find("no block 8"), std::string::npos);
}

TEST(Service, ClientsAreIsolatedAndBadRequestsAreErrorsNotCrashes) {
  TempDir d;
  const auto sc = service_config(d);
  SwapService svc(sc);
  ServiceClient a(client_config(sc, "job", 0)), b(client_config(sc, "job", 1));
  fill(a, 0, 8 * kKiB, 10);
  fill(b, 0, 8 * kKiB, 20);
  a.put(1, 0, 8 * kKiB);
  b.put(1, 0, 8 * kKiB);
  a.commit();
  b.commit();
  a.get(1, 8 * kKiB, 8 * kKiB);
  b.get(1, 8 * kKiB, 8 * kKiB);
  EXPECT_TRUE(holds(a, 8 * kKiB, 8 * kKiB, 10));
  EXPECT_TRUE(holds(b, 8 * kKiB, 8 * kKiB, 20));
  EXPECT_NE(error_of([&] { a.put(2, 250 * kKiB, 8 * kKiB); }).find("outside the shared memory"),
            std::string::npos);
  EXPECT_NE(error_of([&] { a.put(2, 100, 4 * kKiB); }).find("4 KiB"), std::string::npos);
  EXPECT_NE(error_of([&] { a.put(1, 0, 4 * kKiB); }).find("has 8192 bytes"), std::string::npos);
  EXPECT_NE(error_of([&] { a.get(1, 0, 4 * kKiB); }).find("room for"), std::string::npos);
  EXPECT_NE(
      error_of([&] { ServiceClient x(client_config(sc, "job", 0)); }).find("already attached"),
      std::string::npos);
  EXPECT_NE(error_of([&] { ServiceClient x(client_config(sc, "../etc")); }).find("job id"),
            std::string::npos);
  auto big = client_config(sc, "big");
  big.region_bytes = 1ull << 40;
  EXPECT_NE(error_of([&] { ServiceClient x(big); }).find("of NVMe"), std::string::npos);
  a.get(1, 0, 8 * kKiB);  // still served after its errors
  EXPECT_TRUE(holds(a, 0, 8 * kKiB, 10));
  const auto st = nlohmann::json::parse(a.status_json());
  EXPECT_TRUE(st.at("service").get<bool>());
  EXPECT_EQ(st.at("memory_granted").get<std::uint64_t>(), 512 * kKiB);
}

// Attaches and detaches a client as `c`: {0, ""} when attached, else the refusal's errno and
// message. While the service has not yet seen an earlier connection of the same client close it
// refuses with EBUSY ("already attached"): retried for up to 2 s.
std::pair<int, std::string> attach_refusal(const ServiceClientConfig& c) {
  for (int i = 0;; ++i) {
    try {
      ServiceClient x(c);
      return {0, ""};
    } catch (const std::system_error& e) {
      if (e.code().value() != EBUSY || i == 99) return {e.code().value(), e.what()};
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

TEST(Service, TheNodeBudgetIsSharedAndGivenBack) {
  TempDir d;
  auto sc = service_config(d, 1 * kMiB);
  sc.client_quota = 768 * kKiB;
  SwapService svc(sc);
  EXPECT_NE(error_of([&] {
              ServiceClient x(client_config(sc, "q", 0, 1 * kMiB));
            }).find("per-client quota is 768.00 KiB"),
            std::string::npos);
  auto a = std::make_unique<ServiceClient>(client_config(sc, "a", 0, 768 * kKiB));
  const std::string why = error_of([&] { ServiceClient x(client_config(sc, "b", 0, 512 * kKiB)); });
  EXPECT_NE(why.find("256.00 KiB of the node's 1.00 MiB is free"), std::string::npos) << why;
  a.reset();
  // The service frees a's memory when it sees the connection close.
  for (int i = 0; i < 100; ++i) {
    if (nlohmann::json::parse(svc.status_json()).at("memory_granted") == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ServiceClient b(client_config(sc, "b", 0, 512 * kKiB));
  EXPECT_EQ(b.memory().size(), 512 * kKiB);
}

// An offer is the smallest of the quota, budget / share and what is free, in whole pages; it
// attaches nothing, and bad asks are named.
TEST(Service, AnOfferSaysWhatANewClientWouldBeGranted) {
  TempDir d;
  auto sc = service_config(d, 4 * kMiB);
  sc.client_quota = 3 * kMiB;
  SwapService svc(sc);
  ServiceOffer o = service_offer(sc.socket, 1, 10);
  EXPECT_EQ(o.bytes, 3 * kMiB);  // the quota
  EXPECT_EQ(o.budget, 4 * kMiB);
  EXPECT_EQ(o.free, 4 * kMiB);
  EXPECT_EQ(o.quota, 3 * kMiB);
  EXPECT_EQ(service_offer(sc.socket, 3, 10).bytes, (4 * kMiB / 3) / 4096 * 4096);  // the share
  ServiceClient a(client_config(sc, "a", 0, 3 * kMiB));
  EXPECT_EQ(service_offer(sc.socket, 2, 10).bytes, 1 * kMiB);  // what is free
  ServiceClient b(client_config(sc, "b", 0, 1 * kMiB));        // the offer was real
  EXPECT_EQ(service_offer(sc.socket, 1, 10).bytes, 0u);
  EXPECT_EQ(nlohmann::json::parse(svc.status_json()).at("clients").size(), 2u);  // none by offers
  // The pageable memory beside it, the same way: its own budget, quota and share.
  TempDir d2;
  auto sp = service_config(d2, 4 * kMiB);
  sp.pageable_budget = 6 * kMiB;
  sp.pageable_quota = 4 * kMiB;
  SwapService svc2(sp);
  o = service_offer(sp.socket, 1, 10);
  EXPECT_EQ(o.pageable_bytes, 4 * kMiB);  // the quota
  EXPECT_EQ(o.pageable_budget, 6 * kMiB);
  EXPECT_EQ(o.pageable_free, 6 * kMiB);
  EXPECT_EQ(o.pageable_quota, 4 * kMiB);
  EXPECT_EQ(service_offer(sp.socket, 4, 10).pageable_bytes, (6 * kMiB / 4) / 4096 * 4096);
  auto cp = client_config(sp, "p", 0, 1 * kMiB);
  cp.pageable_bytes = 4 * kMiB;
  ServiceClient p(cp);
  EXPECT_EQ(service_offer(sp.socket, 1, 10).pageable_bytes, 2 * kMiB);  // what is free
  EXPECT_NE(error_of([&] { service_offer(sc.socket, 0, 10); }).find("share must be at least 1"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              service_offer(d.path() / "none.sock", 1, 10);
            }).find("none.sock: cannot connect"),
            std::string::npos);
  flatbuffers::FlatBufferBuilder fb;  // another protocol: answered with the reason, then closed
  fb.Finish(wire::CreateMessage(fb, 1, wire::Body::Offer, wire::CreateOffer(fb, 99, 1).Union()),
            wire::MessageIdentifier());
  const std::string f = service::frame(fb);
  EXPECT_TRUE(dropped_after(sc.socket, {f.begin(), f.end()}));
}

// An offer made to a stand-in service at `path` that answers the one connection with
// `answer(fd)` (it owns fd); the offer's error, "" when it was answered.
std::string offer_to_stand_in(const std::filesystem::path& path,
                              const std::function<void(int)>& answer, ServiceOffer* out) {
  const int lfd = test::listening_socket(path);
  std::thread stand_in([lfd, &answer] {
    const int fd = ::accept(lfd, nullptr, nullptr);
    if (fd >= 0) answer(fd);  // else the client never connected (the shutdown below woke it)
  });
  const std::string why = error_of([&] { *out = service_offer(path, 1, 10); });
  ::shutdown(lfd, SHUT_RDWR);  // so that the join cannot hang if the offer never connected
  stand_in.join();
  ::close(lfd);
  return why;
}

// A service older than the Offer (protocol 2) reads a first message that is not a Hello and
// closes the connection: the client says so, not only that the connection closed.
TEST(Service, AnOfferToAnOlderServiceSaysWhyItWasNotAnswered) {
  TempDir d;
  ServiceOffer o;
  const std::string why = offer_to_stand_in(
      d.path() / "old.sock",
      [](int fd) {
        char buf[256];
        (void)!::read(fd, buf, sizeof buf);  // the Offer: not a Hello, so dropped
        ::close(fd);
      },
      &o);
  EXPECT_NE(why.find("closed the connection without answering the offer: a service older than "
                     "this client (protocol 3)"),
            std::string::npos)
      << why;
}

// A service of protocol 3 from before the pageable figures answers an offer without them: they
// read as unknown (no limit), and the locked memory's figures as sent.
TEST(Service, AnOfferWithoutPageableFiguresReadsAsUnknown) {
  TempDir d;
  ServiceOffer o;
  const std::string why = offer_to_stand_in(
      d.path() / "older.sock",
      [](int fd) {
        service::Connection c(fd);
        std::vector<std::uint8_t> buf;
        const wire::Message* m = nullptr;
        std::string ignored;
        if (c.receive(buf, &m, nullptr, &ignored) != service::Connection::Status::ok) return;
        flatbuffers::FlatBufferBuilder fb;
        const auto body = wire::CreateOffered(fb, 8 * kKiB, 64 * kKiB, 32 * kKiB, 16 * kKiB);
        fb.Finish(c.message(fb, wire::Body::Offered, body.Union()), wire::MessageIdentifier());
        (void)c.send(fb);
      },
      &o);
  EXPECT_EQ(why, "");
  EXPECT_EQ(o.bytes, 8 * kKiB);
  EXPECT_EQ(o.free, 32 * kKiB);
  EXPECT_EQ(o.pageable_bytes, ServiceOffer::kUnknown);
}

// Hellos made at once (the memory of each is made outside the service's lock, after its grant
// and key are taken): never more granted than the budget, a key attached once at a time, and
// every grant given back.
TEST(Service, SimultaneousAttachesNeverExceedTheBudgetNorShareAKey) {
  TempDir d;
  auto sc = service_config(d, 1 * kMiB);
  SwapService svc(sc);
  constexpr int kThreads = 8;
  std::atomic<int> attached{0}, over_budget{0}, busy{0}, other{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      // Threads 0-3 name four distinct clients of 768 KiB (one fits); 4-7 all name client "k".
      auto cc = t < 4 ? client_config(sc, "j" + std::to_string(t), 0, 768 * kKiB)
                      : client_config(sc, "k", 0, 128 * kKiB);
      while (!go) std::this_thread::yield();
      try {
        ServiceClient c(cc);
        ++attached;
        const auto st = nlohmann::json::parse(svc.status_json());
        EXPECT_LE(st.at("memory_granted").get<std::uint64_t>(), 1 * kMiB);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      } catch (const std::system_error& e) {
        const int v = e.code().value();
        (v == EINVAL ? over_budget : v == EBUSY ? busy : other)++;
      }
    });
  go = true;
  for (auto& t : ts) t.join();
  EXPECT_EQ(other.load(), 0);
  EXPECT_EQ(attached + over_budget + busy, kThreads);
  EXPECT_GE(attached.load(), 2);  // one of j0-j3 at least, and "k" at least once
  for (int i = 0; i < 100; ++i) {
    if (nlohmann::json::parse(svc.status_json()).at("memory_granted") == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(nlohmann::json::parse(svc.status_json()).at("memory_granted"), 0);
  ServiceClient last(client_config(sc, "j0", 0, 1 * kMiB));  // the whole budget is free again
  EXPECT_EQ(last.memory().size(), 1 * kMiB);
}

// A client's region is fixed at its first attach: a reattach asking more is refused with both
// figures (and the region kept), one asking as much or less gets it.
TEST(Service, AReattachAskingALargerRegionIsRefusedAndTheRegionKept) {
  TempDir d;
  const auto sc = service_config(d, 1 * kMiB);
  SwapService svc(sc);
  auto first = client_config(sc, "grow");
  { ServiceClient c(first); }
  auto more = first;
  more.region_bytes = 2 * first.region_bytes;
  const std::string why = attach_refusal(more).second;
  EXPECT_NE(why.find("asks 16.00 MiB of NVMe, but its region from its first attach holds 8.00 MiB"),
            std::string::npos)
      << why;
  auto less = first;
  less.region_bytes = first.region_bytes / 2;
  ServiceClient c(less);
  EXPECT_TRUE(c.reattached());
  EXPECT_EQ(nlohmann::json::parse(svc.status_json()).at("clients").at(0).at("region_bytes"),
            first.region_bytes);
}

// The memory budget alone: a grant within the client quota and what is left of the node's
// budgets is taken whole, one past a limit takes nothing and names the limit, a give-back frees
// it exactly; unset limits default from the machine's memory. (The pageable per-client quota is
// the hello's own check, before any state is looked at.)
TEST(Service, MemoryBudgetGrantsWithinLimitsAndGivesBackExactly) {
  using service::MemoryBudget;
  ServiceConfig cfg;
  cfg.host_budget = 1 * kMiB;
  cfg.client_quota = 768 * kKiB;
  cfg.pageable_budget = 2 * kMiB;
  cfg.pageable_quota = 1 * kMiB;
  MemoryBudget b(MemoryBudget::limits_for(cfg, 64 * 1024 * kMiB));
  std::string why;
  EXPECT_EQ(b.grant("a.0", 768 * kKiB, 1 * kMiB, &why), 0) << why;
  EXPECT_EQ(b.grant("b.0", 512 * kKiB, 0, &why), EINVAL);  // 256 KiB of the budget left
  EXPECT_NE(why.find("client b.0 asks 512.00 KiB of shared memory"), std::string::npos) << why;
  EXPECT_NE(why.find("the per-client quota is 768.00 KiB"), std::string::npos) << why;
  EXPECT_EQ(b.grant("c.0", 4 * kKiB, 1 * kMiB + 4 * kKiB, &why), EINVAL);  // pageable budget
  EXPECT_NE(why.find("pageable budget of 2.00 MiB"), std::string::npos) << why;
  EXPECT_EQ(b.granted().memory, 768 * kKiB);  // the refusals took nothing
  EXPECT_EQ(b.granted().pageable, 1 * kMiB);
  b.give_back(768 * kKiB, 1 * kMiB);
  EXPECT_EQ(b.granted().memory, 0u);
  EXPECT_EQ(b.granted().pageable, 0u);
  EXPECT_EQ(b.grant("b.0", 768 * kKiB, 2 * kMiB, &why), 0) << why;  // the whole pageable budget
  ServiceConfig unset;
  unset.host_budget = 1 * kMiB;
  const MemoryBudget::Limits l = MemoryBudget::limits_for(unset, 64 * 1024 * kMiB + 100);
  EXPECT_EQ(l.quota, 1 * kMiB);
  EXPECT_EQ(l.pageable_budget, 32 * 1024 * kMiB);
  EXPECT_EQ(l.pageable_quota, 16 * 1024 * kMiB);
}

// A refused hello says why by its errno too (the reason in its message): ENOENT for a client the
// service does not know that asks for no region, EBUSY while the client is attached, EPROTOTYPE
// for the other kind than its first attach's. `tierswap release` attaches as a known client with
// no region, as either kind, and releases it: then the service does not know it any more.
TEST(Service, RefusedHellosSayWhyAndAKnownClientIsReleasedWithoutItsRegion) {
  TempDir d;
  const auto sc = service_config(d, 1 * kMiB);
  SwapService svc(sc);
  auto blocks = client_config(sc, "kind");
  auto known = blocks;
  known.region_bytes = 0;
  const auto unknown = attach_refusal(known);
  EXPECT_EQ(unknown.first, ENOENT) << unknown.second;
  EXPECT_NE(unknown.second.find("kind.0 is not known"), std::string::npos) << unknown.second;
  const auto granted = [&] {
    return nlohmann::json::parse(svc.status_json()).at("memory_granted");
  };
  EXPECT_EQ(granted(), 0);  // refused after its memory was granted: the grant given back
  auto held = std::make_unique<ServiceClient>(blocks);
  held->commit();
  held->commit();  // its manifest rewritten: the one replaced is kept as the next write's file
  const auto manifests = d.path() / "service-clients";
  EXPECT_TRUE(std::filesystem::exists(manifests / "kind.0.manifest.tmp"));
  const std::string busy = error_of([&] { ServiceClient x(known); });
  EXPECT_NE(busy.find("already attached"), std::string::npos) << busy;
  held.reset();
  auto raw = known;
  raw.raw = true;
  const auto other = attach_refusal(raw);
  EXPECT_EQ(other.first, EPROTOTYPE) << other.second;
  EXPECT_NE(other.second.find("first attached as a block client"), std::string::npos);
  EXPECT_EQ(granted(), 0);  // held detached (else EBUSY), the refusal's grant given back
  EXPECT_EQ(attach_refusal(known).first, 0);  // the right kind and no region: attached
  {
    ServiceClient c(known);
    EXPECT_TRUE(c.reattached());
    EXPECT_EQ(c.attached_generation(), 2u);
    c.release();
  }
  EXPECT_EQ(attach_refusal(known).first, ENOENT);     // forgotten, its region free again
  EXPECT_TRUE(std::filesystem::is_empty(manifests));  // the manifest and its spare
  const auto st = nlohmann::json::parse(svc.status_json());
  EXPECT_EQ(st.at("nvme_free"), st.at("nvme_capacity"));
  EXPECT_TRUE(st.at("clients").empty());
}

// Pageable shared memory is mapped by both sides but neither locked nor counted in the node's
// budget; it has its own per-client quota, and a detach gives the budget back exactly.
TEST(Service, PageableMemoryIsSharedButNeitherLockedNorInTheBudget) {
  TempDir d;
  auto sc = service_config(d, 1 * kMiB);
  sc.pageable_quota = 2 * kMiB;
  SwapService svc(sc);
  const auto locked_kib = [] {  // this process's locked memory (the service runs in it)
    std::ifstream f("/proc/self/status");
    for (std::string l; std::getline(f, l);)
      if (l.rfind("VmLck:", 0) == 0) return std::stoull(l.substr(6));
    return 0ull;
  };
  const auto before = locked_kib();
  auto ca = client_config(sc, "a", 0, 512 * kKiB);
  ca.pageable_bytes = 2 * kMiB;
  auto a = std::make_unique<ServiceClient>(ca);
  EXPECT_EQ(a->memory().size(), 2560 * kKiB);
  EXPECT_EQ(a->locked_bytes(), 512 * kKiB);
  EXPECT_LE(locked_kib() - before, 512u) << "the pageable part was locked";
  fill(*a, 1536 * kKiB, 64 * kKiB, 9);  // a block through the pageable part
  a->put(1, 1536 * kKiB, 64 * kKiB);
  a->get(1, 0, 64 * kKiB);
  EXPECT_TRUE(holds(*a, 0, 64 * kKiB, 9));
  auto st = nlohmann::json::parse(svc.status_json());
  EXPECT_EQ(st.at("memory_granted"), 512 * kKiB);
  EXPECT_EQ(st.at("clients").at(0).at("pageable_bytes"), 2 * kMiB);
  ServiceClient b(client_config(sc, "b", 0, 512 * kKiB));  // the rest of the budget
  auto cc = client_config(sc, "c", 0, 4 * kKiB);
  cc.pageable_bytes = 3 * kMiB;
  const std::string why = error_of([&] { ServiceClient x(cc); });
  EXPECT_NE(why.find("pageable shared memory: the per-client quota is 2.00 MiB"), std::string::npos)
      << why;
  a.reset();
  for (int i = 0; i < 100; ++i) {
    if (nlohmann::json::parse(svc.status_json()).at("memory_granted") == 512 * kKiB) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(nlohmann::json::parse(svc.status_json()).at("memory_granted"), 512 * kKiB);
  ServiceClient again(client_config(sc, "a", 0, 512 * kKiB));  // a's budget came back whole
}

// The clients' pageable memory together stays within the node's pageable budget: an ask past it
// is refused with the figures (nothing attached), and a detach gives its share back.
TEST(Service, PageableMemoryOfAllClientsStaysWithinTheNodesPageableBudget) {
  TempDir d;
  auto sc = service_config(d, 1 * kMiB);
  sc.pageable_quota = 2 * kMiB;
  sc.pageable_budget = 3 * kMiB;
  SwapService svc(sc);
  auto with_pageable = [&](std::string job, std::uint64_t pageable) {
    auto c = client_config(sc, std::move(job), 0, 64 * kKiB);
    c.pageable_bytes = pageable;
    return c;
  };
  auto a = std::make_unique<ServiceClient>(with_pageable("a", 2 * kMiB));
  const std::string why = error_of([&] { ServiceClient b(with_pageable("b", 2 * kMiB)); });
  EXPECT_NE(why.find("client b.0 asks 2.00 MiB of pageable shared memory: 1.00 MiB of the node's "
                     "pageable budget of 3.00 MiB is free"),
            std::string::npos)
      << why;
  auto st = nlohmann::json::parse(svc.status_json());
  EXPECT_EQ(st.at("pageable_budget"), 3 * kMiB);
  EXPECT_EQ(st.at("pageable_granted"), 2 * kMiB);
  EXPECT_EQ(st.at("memory_granted"), 64 * kKiB);  // the refused client took nothing
  EXPECT_EQ(st.at("clients").size(), 1u);
  ServiceClient c(with_pageable("c", 1 * kMiB));  // what is left fits
  a.reset();
  for (int i = 0; i < 100; ++i) {
    if (nlohmann::json::parse(svc.status_json()).at("pageable_granted") == 1 * kMiB) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ServiceClient b(with_pageable("b", 2 * kMiB));  // a's share came back
  EXPECT_EQ(nlohmann::json::parse(svc.status_json()).at("pageable_granted"), 3 * kMiB);
  auto bad = sc;
  bad.pageable_quota = 4 * kMiB;
  EXPECT_NE(
      error_of([&] { bad.validate(); }).find("pageable_quota 4.00 MiB exceeds pageable_budget"),
      std::string::npos);
}

// Runs `body` in a forked child that is then killed with SIGKILL (no code of its runs after);
// whether the child died by the signal.
bool killed_after(const std::function<void()>& body) {
  const pid_t child = ::fork();
  if (child == 0) {
    body();
    ::kill(::getpid(), SIGKILL);
  }
  int status = 0;
  return ::waitpid(child, &status, 0) == child && WIFSIGNALED(status);
}

TEST(Service, AClientKilledMidStepKeepsItsCommittedGeneration) {
  TempDir d;
  const auto sc = service_config(d);
  SwapService svc(sc);
  ASSERT_TRUE(killed_after([&] {
    ServiceClient c(client_config(sc, "victim"));
    fill(c, 0, 16 * kKiB, 1);
    c.put(1, 0, 16 * kKiB);
    c.commit();
    fill(c, 0, 16 * kKiB, 2);
    c.put(1, 0, 16 * kKiB);  // mid-step: written, not committed
  }));
  std::unique_ptr<ServiceClient> c;
  for (int i = 0; i < 100 && !c; ++i) {  // until the service has seen the connection close
    try {
      c = std::make_unique<ServiceClient>(client_config(sc, "victim"));
    } catch (const std::system_error&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ASSERT_TRUE(c);
  EXPECT_TRUE(c->reattached());
  EXPECT_EQ(c->attached_generation(), 1u);
  c->get(1, 0, 16 * kKiB);
  EXPECT_TRUE(holds(*c, 0, 16 * kKiB, 1));
}

// A client that asks to be released when it detaches (a run on a temporary directory, which
// nothing can resume) leaves no region behind, killed or not; its region is free again.
TEST(Service, AClientReleasedWhenDetachedLeavesNothingWhenKilled) {
  TempDir d;
  const auto sc = service_config(d);
  SwapService svc(sc);
  ASSERT_TRUE(killed_after([&] {
    auto cc = client_config(sc, "ephemeral");
    cc.release_when_detached = true;
    ServiceClient c(cc);
    fill(c, 0, 16 * kKiB, 1);
    c.put(1, 0, 16 * kKiB);
    c.commit();
  }));
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {  // until the service has seen the connection close
    gone = nlohmann::json::parse(svc.status_json()).at("clients").empty();
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(gone) << svc.status_json();
  ServiceClient again(client_config(sc, "ephemeral"));  // a new client, not a reattach
  EXPECT_FALSE(again.reattached());
  EXPECT_EQ(again.attached_generation(), 0u);
}

TEST(Service, AKilledServiceFailsItsClientsPromptlyAndRestartsWithTheirState) {
  TempDir d;
  const auto sc = service_config(d);
  pid_t svc = test::spawn_service(sc);
  ASSERT_GT(svc, 0);
  auto cc = client_config(sc, "survivor");
  cc.timeout_seconds = 5;
  auto c = std::make_unique<ServiceClient>(cc);
  fill(*c, 0, 32 * kKiB, 5);
  c->put(3, 0, 32 * kKiB);
  c->commit();
  fill(*c, 0, 32 * kKiB, 6);
  c->put(3, 0, 32 * kKiB);
  ::kill(svc, SIGKILL);
  ::waitpid(svc, nullptr, 0);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string why = error_of([&] { c->commit(); });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(6));
  EXPECT_NE(why.find("tierswap service"), std::string::npos) << why;
  c.reset();
  svc = test::spawn_service(sc);  // a socket file of a dead service is replaced
  ASSERT_GT(svc, 0);
  ServiceClient again(cc);
  EXPECT_TRUE(again.reattached());
  EXPECT_EQ(again.attached_generation(), 1u);
  again.get(3, 0, 32 * kKiB);
  EXPECT_TRUE(holds(again, 0, 32 * kKiB, 5));
  ::kill(svc, SIGKILL);
  ::waitpid(svc, nullptr, 0);
}

// A raw connection sending whatever it is given; true when the service dropped it.
bool dropped_after(const std::filesystem::path& socket, const std::vector<std::uint8_t>& bytes) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strcpy(a.sun_path, socket.c_str());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return false;
  if (!bytes.empty()) (void)!::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char c;
  ssize_t r;
  while ((r = ::recv(fd, &c, 1, 0)) > 0 || (r < 0 && errno == EINTR)) {
  }  // (EINTR: a signal for this process interrupted the wait: wait on)
  const int err = errno;
  ::close(fd);
  // EOF or a reset: closed by the service (a timeout would be EAGAIN).
  return r == 0 || (r < 0 && err == ECONNRESET);
}

std::vector<std::uint8_t> framed(const flatbuffers::FlatBufferBuilder& fb) {
  const std::string f = service::frame(fb);
  return {f.begin(), f.end()};
}

std::vector<std::uint8_t> hello_frame(std::uint64_t seq, std::uint32_t protocol) {
  flatbuffers::FlatBufferBuilder fb;
  const auto job = fb.CreateString("raw");
  const auto h = wire::CreateHello(fb, protocol, job, 0, 64 * kKiB, kMiB);
  fb.Finish(wire::CreateMessage(fb, seq, wire::Body::Hello, h.Union()), wire::MessageIdentifier());
  return framed(fb);
}

TEST(Service, MalformedOversizedAndOutOfOrderMessagesDropOnlyThatClient) {
  TempDir d;
  const auto sc = service_config(d);
  SwapService svc(sc);
  ServiceClient good(client_config(sc, "good"));
  fill(good, 0, 4 * kKiB, 4);
  good.put(1, 0, 4 * kKiB);
  EXPECT_TRUE(dropped_after(sc.socket, {0xff, 0xff, 0xff, 0x7f}));  // 2 GiB length
  EXPECT_TRUE(dropped_after(
      sc.socket, {16, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}));  // garbage
  EXPECT_TRUE(dropped_after(sc.socket, hello_frame(5, service::kProtocolVersion)));       // seq 5
  EXPECT_TRUE(dropped_after(sc.socket, hello_frame(1, 99)));  // another protocol
  {
    flatbuffers::FlatBufferBuilder fb;  // a request before hello
    fb.Finish(wire::CreateMessage(fb, 1, wire::Body::Commit, wire::CreateCommit(fb).Union()),
              wire::MessageIdentifier());
    EXPECT_TRUE(dropped_after(sc.socket, framed(fb)));
  }
  {
    auto bytes = hello_frame(1, service::kProtocolVersion);  // an offer once attached
    flatbuffers::FlatBufferBuilder fb;
    fb.Finish(wire::CreateMessage(fb, 2, wire::Body::Offer,
                                  wire::CreateOffer(fb, service::kProtocolVersion, 1).Union()),
              wire::MessageIdentifier());
    const auto offer = framed(fb);
    bytes.insert(bytes.end(), offer.begin(), offer.end());
    EXPECT_TRUE(dropped_after(sc.socket, bytes));
  }
  {
    auto bytes = hello_frame(1, service::kProtocolVersion);  // a type from a newer protocol
    flatbuffers::FlatBufferBuilder fb;
    fb.Finish(
        wire::CreateMessage(fb, 2, static_cast<wire::Body>(200), wire::CreateCommit(fb).Union()),
        wire::MessageIdentifier());
    const auto unknown = framed(fb);
    bytes.insert(bytes.end(), unknown.begin(), unknown.end());
    EXPECT_TRUE(dropped_after(sc.socket, bytes));
  }
  auto corrupt = hello_frame(1, service::kProtocolVersion);
  corrupt[4] = 0xf0;  // the root table's offset points past the end of the message
  EXPECT_TRUE(dropped_after(sc.socket, corrupt));
  good.commit();  // unaffected
  good.get(1, 8 * kKiB, 4 * kKiB);
  EXPECT_TRUE(holds(good, 8 * kKiB, 4 * kKiB, 4));
}

// A connection that sends nothing, or half a frame, before its first message is dropped at the
// deadline (a telemetry query aimed at the service's socket used to wait on it forever, and so
// did the session thread); a client idle for longer than that after its hello stays attached.
TEST(Service, AConnectionWithoutAFirstMessageIsDroppedAtTheDeadlineAnIdleClientIsNot) {
  TempDir d;
  auto sc = service_config(d);
  sc.first_message_seconds = 0.2;
  SwapService svc(sc);
  ServiceClient idle(client_config(sc, "idle"));
  fill(idle, 0, 4 * kKiB, 6);
  idle.put(1, 0, 4 * kKiB);
  EXPECT_TRUE(dropped_after(sc.socket, {}));                    // nothing at all
  EXPECT_TRUE(dropped_after(sc.socket, {64, 0, 0, 0, 1}));      // a length and one byte of 64
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // past the deadline, idle
  idle.get(1, 8 * kKiB, 4 * kKiB);
  EXPECT_TRUE(holds(idle, 8 * kKiB, 4 * kKiB, 6));
  sc.first_message_seconds = 0;
  EXPECT_NE(error_of([&] { sc.validate(); }).find("first_message_seconds 0: must be positive"),
            std::string::npos);
}

using test::as_nobody;

TEST(Service, AnotherUidIsRefused) {
  if (::getuid() != 0) GTEST_SKIP() << "needs root to connect as another uid";
  TempDir d;
  auto sc = service_config(d);
  SwapService svc(sc);
  ::chmod(d.path().c_str(), 0755);
  ::chmod(sc.socket.c_str(), 0777);  // so only SO_PEERCRED stands in the way
  // Told why (issue 61: a refused uid saw "Broken pipe").
  EXPECT_EQ(as_nobody([&] {
              try {
                ServiceClient c(client_config(sc, "intruder"));
                return 1;
              } catch (const std::system_error& e) {
                return e.code().value() == EACCES &&
                               std::string(e.what()).find(
                                   "uid 65534 is not the service's (uid "
                                   "0): start it with --allow-other-users") != std::string::npos
                           ? 0
                           : 2;
              }
            }),
            0);
  EXPECT_TRUE(nlohmann::json::parse(svc.status_json()).at("clients").empty());
}

// issue 61: with --allow-other-users, uid 1001 attached root's job, read its block and released
// it. A region is its maker's (and the service's uid's, the operator's), across restarts.
TEST(Service, ARegionIsItsOwnersAloneAcrossRestarts) {
  if (::getuid() != 0) GTEST_SKIP() << "needs root to connect as another uid";
  TempDir d;
  auto sc = service_config(d);
  sc.allow_other_users = true;
  ::chmod(d.path().c_str(), 0755);
  const auto refused_root_job = [&] {
    try {
      ServiceClient c(client_config(sc, "rootjob"));
      return 1;  // attached another uid's region
    } catch (const std::system_error& e) {
      return std::string(e.what()).find("belongs to uid 0: uid 65534 may not") == std::string::npos
                 ? 2
                 : 0;
    }
  };
  {
    SwapService svc(sc);
    {
      ServiceClient root(client_config(sc, "rootjob"));
      commit_one_block(root);
    }
    EXPECT_EQ(as_nobody(refused_root_job), 0);
    EXPECT_EQ(as_nobody([&] {
                ServiceClient own(client_config(sc, "nobodyjob"));
                commit_one_block(own);
                return 0;
              }),
              0);
    ServiceClient operator_view(client_config(sc, "nobodyjob"));  // the service's uid may
    EXPECT_EQ(operator_view.attached_generation(), 1u);
  }
  SwapService again(sc);  // the owners come back from the registry
  EXPECT_EQ(as_nobody(refused_root_job), 0);
  ServiceClient root(client_config(sc, "rootjob"));
  EXPECT_EQ(root.attached_generation(), 1u);
}

// issue 61: after rm -rf of the swap directory, commits were acknowledged as durable into the
// deleted file.
TEST(Service, ACommitIntoADeletedSwapFileIsRefusedNamingIt) {
  TempDir d;
  const auto sc = service_config(d);
  SwapService svc(sc);
  ServiceClient c(client_config(sc, "j"));
  commit_one_block(c);
  std::filesystem::remove(d.path() / SwapSpace::kFileName);
  fill(c, 0, 4 * kKiB, 2);
  c.put(1, 0, 4 * kKiB);
  const std::string why = error_of([&] { c.commit(); });
  EXPECT_NE(why.find("was deleted or replaced while the service ran"), std::string::npos) << why;
  EXPECT_NE(why.find(SwapSpace::kFileName), std::string::npos) << why;
  EXPECT_NE(error_of([&] { c.commit(); }).find("deleted or replaced"), std::string::npos);
}

// issue 61: after rm of the swap file, a restart (Restart=on-failure) made a new one, then
// failed on the registry of the old ("belongs to another swap space"), again and again.
TEST(Service, ARestartOverALostSwapFileSaysWhatWasLostAndMakesNothing) {
  TempDir d;
  const auto sc = service_config(d);
  {
    SwapService svc(sc);
    ServiceClient c(client_config(sc, "lost"));
    commit_one_block(c);
  }
  std::filesystem::remove(d.path() / SwapSpace::kFileName);
  const auto before = test::names_in(d.path());
  const std::string why = error_of([&] { SwapService svc(sc); });
  EXPECT_NE(why.find(SwapSpace::kFileName), std::string::npos) << why;
  EXPECT_NE(why.find("lost.0"), std::string::npos) << why;
  EXPECT_NE(why.find("tierswap.service"), std::string::npos) << why;
  EXPECT_EQ(test::names_in(d.path()), before);  // no new swap file
}

TEST(Service, ACorruptRegistryIsAnErrorAndLeftAlone) {
  TempDir d;
  const auto sc = service_config(d);
  {
    SwapService svc(sc);
    ServiceClient c(client_config(sc, "j"));
  }
  const auto reg = d.path() / "tierswap.service";
  std::filesystem::resize_file(reg, std::filesystem::file_size(reg) - 3);
  const auto before = std::filesystem::file_size(reg);
  const std::string why = error_of([&] { SwapService svc(sc); });
  EXPECT_NE(why.find(reg.string()), std::string::npos) << why;
  EXPECT_EQ(std::filesystem::file_size(reg), before);
}

// A first attach whose registry entry cannot be written is refused, and nothing of it stays: an
// attach after that records the client, whose state then survives the service's restart (the
// record kept in memory alone made a second attach skip the registry, and the restart lose it).
TEST(Service, AnAttachWhoseRegistryWriteFailsIsRefusedAndLeavesNoClient) {
  TempDir d;
  const auto sc = service_config(d);
  {
    SwapService svc(sc);
    const auto blocker = d.path() / "tierswap.service.tmp";
    std::filesystem::create_directory(blocker);  // the registry's write opens this file
    const std::string why = error_of([&] { ServiceClient c(client_config(sc, "r")); });
    EXPECT_NE(why.find("tierswap.service.tmp"), std::string::npos) << why;
    EXPECT_TRUE(nlohmann::json::parse(svc.status_json()).at("clients").empty());
    std::filesystem::remove(blocker);
    ServiceClient c(client_config(sc, "r"));
    EXPECT_FALSE(c.reattached());
    commit_one_block(c);
  }
  SwapService svc(sc);
  ServiceClient c(client_config(sc, "r"));
  EXPECT_TRUE(c.reattached());
  EXPECT_EQ(c.attached_generation(), 1u);
}

// A release whose registry write fails keeps the client, with its region and committed blocks
// (it was forgotten in memory and its manifest removed while the registry still named it: the
// next start brought it back empty); released again, it is gone.
TEST(Service, AReleaseWhoseRegistryWriteFailsKeepsTheClientWhole) {
  TempDir d;
  const auto sc = service_config(d);
  const auto cc = client_config(sc, "k");
  const auto blocker = d.path() / "tierswap.service.tmp";
  {
    SwapService svc(sc);
    ServiceClient c(cc);
    commit_one_block(c);
    c.release();
    std::filesystem::remove(blocker);  // the registry's recycled spare: its write opens this
    std::filesystem::create_directory(blocker);
  }
  std::filesystem::remove(blocker);
  {
    SwapService svc(sc);
    ServiceClient c(cc);
    EXPECT_TRUE(c.reattached());
    EXPECT_EQ(c.attached_generation(), 1u);
    EXPECT_EQ(c.get(1, 0, 4 * kKiB), 4 * kKiB);
    c.release();
  }
  SwapService svc(sc);
  EXPECT_TRUE(nlohmann::json::parse(svc.status_json()).at("clients").empty());
  EXPECT_TRUE(std::filesystem::is_empty(d.path() / "service-clients"));
}

// A client manifest whose container is sound but whose numbers are not integers of their field's
// range (a float past 2^64, a negative length, a slot of 2^40) names the file; nothing is cast out
// of range (UBSan found one by fuzzing) and the file is left as it was.
TEST(Service, OutOfRangeNumbersInAClientManifestAreAnErrorAndLeftAlone) {
  TempDir d;
  const auto sc = service_config(d);
  {
    SwapService svc(sc);
    ServiceClient c(client_config(sc, "n"));
    commit_one_block(c);
  }
  const auto man = d.path() / "service-clients" / "n.0.manifest";
  const auto good = nlohmann::json::parse(detail::read_manifest_file(man));
  const std::pair<const char*, nlohmann::json> cases[] = {{"sums", {65013106456947493306.0, 0}},
                                                          {"length", -4096},
                                                          {"committed", 1099511627776LL},
                                                          {"extents", {0, 1e300}}};
  for (const auto& [field, value] : cases) {
    auto bad = good;
    bad["blocks"][0][field] = value;
    detail::write_manifest_file(man, bad.dump(), true);
    const auto before = detail::read_manifest_file(man);
    const std::string why = error_of([&] { SwapService svc(sc); });
    EXPECT_NE(why.find(man.string() + ": bad block table"), std::string::npos) << field << why;
    EXPECT_EQ(detail::read_manifest_file(man), before) << field;
  }
  detail::write_manifest_file(man, good.dump(), true);
  SwapService svc(sc);
  ServiceClient c(client_config(sc, "n"));
  EXPECT_EQ(c.attached_generation(), 1u);
}

// Without a capacity the service opens what the directories hold: each is checked first.
TEST(Service, SwapDirectoriesWithoutASwapSpaceAreNamedAndLeftAlone) {
  TempDir d;
  auto sc = service_config(d);
  sc.capacity = 0;
  const auto file = d.path() / "a-file";
  std::ofstream(file) << "kept";
  sc.swap_dirs = {file};
  EXPECT_NE(error_of([&] { SwapService svc(sc); }).find(file.string() + ": not a directory"),
            std::string::npos);
  sc.swap_dirs = {d.path() / "missing"};
  EXPECT_NE(error_of([&] { SwapService svc(sc); }).find("missing: does not exist"),
            std::string::npos);
  sc.swap_dirs = {d.path()};
  EXPECT_NE(error_of([&] { SwapService svc(sc); }).find("holds no tierswap swap space"),
            std::string::npos);
  EXPECT_EQ(std::filesystem::file_size(file), 4u);
  EXPECT_FALSE(std::filesystem::exists(d.path() / "tierswap.swap"));
}

TEST(Service, MetricsCountClientsAndTheirTraffic) {
  TempDir d;
  const auto sc = service_config(d);
  SwapService svc(sc);
  ServiceClient c(client_config(sc, "m", 3));
  fill(c, 0, 12 * kKiB, 1);
  c.put(1, 0, 12 * kKiB);
  c.get(1, 0, 12 * kKiB);
  const std::string t = MetricsRegistry::process().render();
  EXPECT_NE(t.find("tierswap_service_clients 1\n"), std::string::npos) << t;
  EXPECT_NE(t.find("tierswap_client_nvme_written_bytes_total{client=\"m.3\"} 12288\n"),
            std::string::npos);
  EXPECT_NE(t.find("tierswap_client_nvme_read_bytes_total{client=\"m.3\"} 12288\n"),
            std::string::npos);
  EXPECT_NE(t.find("tierswap_client_memory_bytes{client=\"m.3\"} 262144\n"), std::string::npos);
  c.commit();
  EXPECT_NE(
      MetricsRegistry::process().render().find("tierswap_client_generation{client=\"m.3\"} 1\n"),
      std::string::npos);
}

// The value of the sample `sample` (a name and its labels) in a scrape parsed strictly; -1 when
// absent.
double sample_of(const std::string& scrape, const std::string& sample) {
  return test::sample_value(test::parse_exposition(scrape), sample);
}

// issue 61: no NVMe capacity or free, no error counters, no build or process metrics.
TEST(Service, MetricsSayWhatWentWrongAndWhatIsLeft) {
  TempDir d;
  const auto sc = service_config(d);
  SwapService svc(sc);
  const auto scrape = [] { return MetricsRegistry::process().render(); };
  EXPECT_EQ(sample_of(scrape(), "tierswap_service_nvme_capacity_bytes"), 64.0 * kMiB);
  EXPECT_EQ(sample_of(scrape(), "tierswap_service_nvme_free_bytes"), 64.0 * kMiB);
  ServiceClient c(client_config(sc, "m"));
  commit_one_block(c);
  const std::string t = scrape();
  EXPECT_LT(sample_of(t, "tierswap_service_nvme_free_bytes"), 64.0 * kMiB) << t;
  EXPECT_GT(sample_of(t, "tierswap_service_nvme_free_bytes"), 0) << t;
  EXPECT_EQ(sample_of(t, "tierswap_service_refused_connections_total"), 0) << t;
  EXPECT_EQ(sample_of(t, "tierswap_service_dropped_connections_total"), 0) << t;
  EXPECT_EQ(sample_of(t, "tierswap_service_failed_requests_total{request=\"commit\"}"), 0) << t;
  EXPECT_NE(t.find("tierswap_build_info{version=\""), std::string::npos) << t;
  EXPECT_GT(sample_of(t, "process_resident_memory_bytes"), 0) << t;
  EXPECT_GT(sample_of(t, "process_open_fds"), 2) << t;
  EXPECT_GT(sample_of(t, "process_start_time_seconds"), 1.7e9) << t;
  EXPECT_GE(sample_of(t, "process_cpu_seconds_total"), 0) << t;

  EXPECT_TRUE(dropped_after(sc.socket, hello_frame(1, 99)));  // refused: its protocol
  EXPECT_TRUE(dropped_after(                                  // dropped: garbage
      sc.socket, {16, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}));
  std::filesystem::remove(d.path() / SwapSpace::kFileName);
  fill(c, 0, 4 * kKiB, 2);
  c.put(1, 0, 4 * kKiB);
  EXPECT_THROW(c.commit(), std::system_error);  // failed: its swap file is gone
  const std::string after = scrape();
  EXPECT_EQ(sample_of(after, "tierswap_service_refused_connections_total"), 1) << after;
  EXPECT_EQ(sample_of(after, "tierswap_service_dropped_connections_total"), 1) << after;
  EXPECT_EQ(sample_of(after, "tierswap_service_failed_requests_total{request=\"commit\"}"), 1)
      << after;
  EXPECT_EQ(sample_of(after, "tierswap_service_failed_requests_total{request=\"put\"}"), 0)
      << after;
}

}  // namespace
}  // namespace tierswap

namespace tierswap {
namespace {

TierConfig raw_tier_config() {
  TierConfig c;
  c.host_budget = 1 * kMiB;
  c.host_slab_size = 256 * kKiB;
  c.device_mode = DeviceTierMode::off;
  c.telemetry = false;
  return c;
}

std::vector<std::byte> pattern(std::size_t n, std::uint8_t seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = std::byte(static_cast<std::uint8_t>(seed + i * 13));
  return v;
}

// A tier manager on the service streams blocks through a budget smaller than them, commits, and
// reopens (reattached) with every block's checksum verified; released, its region is gone.
TEST(Service, ATierManagerRunsOnItAndItsRegionIsReleasedWhenAsked) {
  TempDir d, mdir;
  const auto sc = service_config(d, 8 * kMiB);
  SwapService svc(sc);
  auto cc = client_config(sc, "tm", 0, 2 * kMiB);
  cc.region_bytes = 16 * kMiB;
  std::vector<BlockId> ids;
  {
    ServiceStorage st(cc, mdir.path());
    EXPECT_FALSE(st.reattached());
    EXPECT_EQ(st.engine().backend(), IoBackendKind::service);
    TierManager tm(st.space(), st.engine(), raw_tier_config());
    for (int i = 0; i < 6; ++i) {  // 6 x 256 KiB through a 1 MiB budget
      BlockDesc bd;
      bd.name = "b" + std::to_string(i);
      bd.cls = BlockClass::master;
      bd.numel = 64 * 1024;
      ids.push_back(tm.create(bd));
      auto v = tm.acquire(ids.back(), Tier::host, Access::write);
      const auto p = pattern(256 * kKiB, static_cast<std::uint8_t>(i));
      std::memcpy(v.data(), p.data(), p.size());
      v.mark_dirty();
    }
    tm.commit();
    EXPECT_EQ(tm.snapshot().host_memory, "service-shared");
    EXPECT_GT(tm.counters().bytes_in[static_cast<int>(Tier::nvme)], 0u);
  }
  {
    ServiceStorage st(cc, mdir.path());
    EXPECT_TRUE(st.reattached());
    TierManager tm(st.space(), st.engine(), raw_tier_config());  // verifies every checksum
    EXPECT_TRUE(tm.snapshot().checksums_verified);
    for (int i = 0; i < 6; ++i) {
      auto v = tm.acquire(*tm.find("b" + std::to_string(i)), Tier::host, Access::read);
      const auto p = pattern(256 * kKiB, static_cast<std::uint8_t>(i));
      EXPECT_EQ(std::memcmp(v.data(), p.data(), p.size()), 0) << i;
    }
    st.release_on_close();
  }
  for (int i = 0; i < 100; ++i) {
    if (nlohmann::json::parse(svc.status_json()).at("clients").empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const auto st = nlohmann::json::parse(svc.status_json());
  EXPECT_TRUE(st.at("clients").empty()) << st.dump();
  EXPECT_EQ(st.at("nvme_free"), st.at("nvme_capacity"));
}

// A raw connection spoken by hand (what ServiceStorage's backend sends), for what the backend
// never does on its own: a flood of requests, or requests outside the client's bounds.
struct RawPeer {
  service::Connection c;
  flatbuffers::FlatBufferBuilder fb;
  std::vector<std::uint8_t> buf;
  const wire::Message* m = nullptr;
  std::string why;
  explicit RawPeer(const std::filesystem::path& socket, const char* job, std::uint64_t memory,
                   std::uint64_t region)
      : c(::socket(AF_UNIX, SOCK_STREAM, 0)) {
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strcpy(a.sun_path, socket.c_str());
    EXPECT_EQ(::connect(c.fd(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    const auto h = wire::CreateHello(fb, service::kProtocolVersion, fb.CreateString(job), 0, memory,
                                     region, true);
    fb.Finish(c.message(fb, wire::Body::Hello, h.Union()), wire::MessageIdentifier());
    EXPECT_EQ(c.send(fb), 0);
    int memfd = -1;
    EXPECT_EQ(c.receive(buf, &m, &memfd, &why), service::Connection::Status::ok) << why;
    EXPECT_TRUE(m->body_as_Welcome());
    if (memfd >= 0) ::close(memfd);
  }
  /// Sends a read now, or (`now` false) queues it for flush(): a burst the service reads at once.
  void read(std::uint64_t tag, std::uint64_t off, std::uint64_t len, std::uint64_t moff,
            bool now = true) {
    fb.Clear();
    fb.Finish(c.message(fb, wire::Body::Read, wire::CreateRead(fb, tag, off, len, moff).Union()),
              wire::MessageIdentifier());
    if (now)
      EXPECT_EQ(c.send(fb), 0);
    else
      c.queue(fb);
  }
  const wire::Reply* reply() {
    EXPECT_EQ(c.receive(buf, &m, nullptr, &why), service::Connection::Status::ok) << why;
    return m->body_as_Reply();
  }
};

// A client that floods the service has at most the engine's queue in flight (the rest waits in
// the service, counted as throttled), and every request is still answered, each once. The queue
// is one 1 MiB request deep and the flood arrives in one write, so that requests wait whatever the
// disk's speed (a 32-deep queue on a fast disk could drain as fast as the requests came in).
TEST(Service, AFloodingRawClientHasAtMostItsShareOfTheQueueInFlight) {
  TempDir d;
  const auto sc = service_config(d, 8 * kMiB);
  const test::ScopedEnv depth("TIERSWAP_QUEUE_DEPTH", "1"), block("TIERSWAP_BLOCK_SIZE", "1M");
  SwapService svc(sc);  // its engine reads them
  const auto queue =
      nlohmann::json::parse(svc.status_json()).at("queue_bytes").get<std::uint64_t>();
  ASSERT_EQ(queue, kMiB);
  const std::uint64_t n = 64;
  RawPeer p(sc.socket, "flood", kMiB, 8 * kMiB);
  for (std::uint64_t i = 0; i < n; ++i) p.read(i + 1, (i % 8) * kMiB, kMiB, 0, false);
  ASSERT_EQ(p.c.flush(), 0);
  std::vector<int> answered(n + 1, 0);
  for (std::uint64_t i = 0; i < n; ++i) {
    const wire::Reply* r = p.reply();
    ASSERT_TRUE(r && r->tag() >= 1 && r->tag() <= n);
    EXPECT_EQ(r->error(), 0);
    EXPECT_EQ(r->value(), kMiB);
    ++answered[r->tag()];
  }
  EXPECT_EQ(std::count(answered.begin() + 1, answered.end(), 1), static_cast<long>(n));
  const auto st = nlohmann::json::parse(svc.status_json()).at("clients").at(0);
  EXPECT_LE(st.at("peak_inflight_bytes").get<std::uint64_t>(), queue) << st.dump();
  EXPECT_GT(st.at("peak_inflight_bytes").get<std::uint64_t>(), 0u) << st.dump();
  EXPECT_GT(st.at("throttled_requests").get<std::uint64_t>(), 0u) << st.dump();
  EXPECT_EQ(st.at("nvme_read_bytes").get<std::uint64_t>(), n * kMiB);
}

// The pinned pools take the locked part of the shared memory, the pageable pool the rest.
TEST(Service, PinnedAndPageableSlabsComeFromTheirOwnParts) {
  TempDir d, mdir;
  const auto sc = service_config(d, 8 * kMiB);
  SwapService svc(sc);
  auto cc = client_config(sc, "parts", 0, kMiB);
  cc.pageable_bytes = kMiB;
  ServiceStorage st(cc, mdir.path());
  IoEngine& e = st.engine();
  std::vector<std::byte*> locked, pageable;
  for (int i = 0; i < 4; ++i) {
    locked.push_back(e.allocate_shared(256 * kKiB, true));
    pageable.push_back(e.allocate_shared(256 * kKiB, false));
    ASSERT_NE(locked.back(), nullptr);
    ASSERT_NE(pageable.back(), nullptr);
    EXPECT_GE(pageable.back(), locked.front() + kMiB);  // after the locked part
  }
  EXPECT_EQ(e.allocate_shared(4 * kKiB, true), nullptr);
  EXPECT_EQ(e.allocate_shared(4 * kKiB, false), nullptr);
  e.free_shared(pageable[1]);
  EXPECT_EQ(e.allocate_shared(256 * kKiB, false), pageable[1]);
  for (auto* p : locked) e.free_shared(p);
  st.release_on_close();
}

// The wire's reader takes every message that has arrived with one read (buffered() says so),
// puts a frame split across writes back together, and hands a passed descriptor over with the
// message it came with.
TEST(Service, TheWireTakesSeveralMessagesPerReadAndReassemblesSplitOnes) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  service::Connection a(sv[0]), b(sv[1]);
  flatbuffers::FlatBufferBuilder fb;
  auto send_status = [&](int fd = -1) {
    fb.Clear();
    fb.Finish(a.message(fb, wire::Body::Status, wire::CreateStatus(fb).Union()),
              wire::MessageIdentifier());
    ASSERT_EQ(a.send(fb, fd), 0);
  };
  for (int i = 0; i < 3; ++i) send_status();
  std::vector<std::uint8_t> buf;
  const wire::Message* m = nullptr;
  std::string why;
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(b.receive(buf, &m, nullptr, &why), service::Connection::Status::ok) << why;
    EXPECT_EQ(m->seq(), static_cast<std::uint64_t>(i + 1));
    EXPECT_EQ(b.buffered(), i < 2) << i;  // all three came with the first read
  }
  const int memfd = ::memfd_create("wire-test", MFD_CLOEXEC);
  ASSERT_GE(memfd, 0);
  send_status(memfd);
  ::close(memfd);
  int got = -1;
  ASSERT_EQ(b.receive(buf, &m, &got, &why), service::Connection::Status::ok) << why;
  EXPECT_GE(got, 0);
  if (got >= 0) ::close(got);
  fb.Clear();  // a frame in two writes, the second one later
  fb.Finish(a.message(fb, wire::Body::Status, wire::CreateStatus(fb).Union()),
            wire::MessageIdentifier());
  const std::string f = service::frame(fb);
  ASSERT_EQ(::write(sv[0], f.data(), 3), 3);
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(::write(sv[0], f.data() + 3, f.size() - 3), static_cast<ssize_t>(f.size() - 3));
  });
  EXPECT_FALSE(b.buffered());
  EXPECT_EQ(b.receive(buf, &m, nullptr, &why), service::Connection::Status::ok) << why;
  later.join();
  EXPECT_EQ(m->seq(), 5u);
}

// Replies posted by completion callbacks (other threads) never block, even when the peer reads
// nothing and the socket is full: what the socket does not take is left for the session, which
// is woken and sends it; every reply arrives once, numbered in sequence, with the session's own.
TEST(Service, PostedRepliesNeverBlockAndAllArriveOnceInSequence) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  const int small = 4096;
  ASSERT_EQ(::setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small), 0);
  service::Connection a(sv[0]), b(sv[1]);
  const int wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  ASSERT_GE(wake, 0);
  service::Outbox out(a, wake);
  constexpr int kThreads = 4, kEach = 300, kOwn = 100;
  auto post_all = [&](int base) {
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t)
      ts.emplace_back([&, t] {
        for (int i = 0; i < kEach; ++i) {
          const std::uint64_t tag = static_cast<std::uint64_t>(base + t * kEach + i);
          out.post({0, {}, tag * 3, {}, tag});
        }
      });
    for (auto& t : ts) t.join();  // a post that blocked would hang here
  };
  post_all(1);  // nobody reads: the socket fills, the rest is left for the session
  std::uint64_t woken = 0;
  EXPECT_EQ(::read(wake, &woken, sizeof woken), static_cast<ssize_t>(sizeof woken));
  EXPECT_GT(woken, 0u);
  const int total = 2 * kThreads * kEach + kOwn;
  std::vector<int> seen(total + 1, 0);
  std::thread reader([&] {
    std::vector<std::uint8_t> buf;
    const wire::Message* m = nullptr;
    std::string why;
    for (int i = 0; i < total; ++i) {
      ASSERT_EQ(b.receive(buf, &m, nullptr, &why), service::Connection::Status::ok) << why;
      const wire::Reply* r = m->body_as_Reply();
      ASSERT_TRUE(r && r->tag() >= 1 && r->tag() <= static_cast<std::uint64_t>(total));
      EXPECT_EQ(r->value(), r->tag() * 3);
      ++seen[r->tag()];
    }
  });
  std::thread posters([&] { post_all(1 + kThreads * kEach); });  // while the session sends
  for (int i = 0; i < kOwn; ++i) {
    const std::uint64_t tag = 2 * kThreads * kEach + 1 + i;
    ASSERT_EQ(out.send({0, {}, tag * 3, {}, tag}), 0);
  }
  posters.join();
  EXPECT_EQ(out.flush(), 0);  // whatever the posters left after the session's last send
  reader.join();
  EXPECT_EQ(std::count(seen.begin() + 1, seen.end(), 1), total);
  ::close(wake);
}

// Raw requests are checked against the client's region and shared memory (and refused with the
// reason, the connection kept); the block API is refused to a raw client.
TEST(Service, ARawClientCannotReachOutsideItsRegionOrMemory) {
  TempDir d;
  const auto sc = service_config(d);
  SwapService svc(sc);
  RawPeer p(sc.socket, "raw", 64 * kKiB, kMiB);
  auto ask = [&](std::uint64_t tag, std::uint64_t off, std::uint64_t len, std::uint64_t moff) {
    p.read(tag, off, len, moff);
    const wire::Reply* r = p.reply();
    EXPECT_TRUE(r && r->tag() == tag);
    return std::pair<int, std::string>(r->error(), r->message() ? r->message()->str() : "");
  };
  EXPECT_EQ(ask(1, kMiB, 4096, 0).first, EINVAL);  // past the region
  EXPECT_NE(ask(2, kMiB - 4096, 8192, 0).second.find("outside the region"), std::string::npos);
  EXPECT_NE(ask(3, 0, 4096, 64 * kKiB).second.find("shared memory"), std::string::npos);
  EXPECT_NE(ask(4, 100, 4096, 0).second.find("not in units"), std::string::npos);
  EXPECT_EQ(ask(5, 0, 4096, 0).first, 0);  // inside: served
  p.fb.Clear();
  p.fb.Finish(p.c.message(p.fb, wire::Body::Put, wire::CreatePut(p.fb, 1, 0, 4096).Union()),
              wire::MessageIdentifier());
  ASSERT_EQ(p.c.send(p.fb), 0);
  EXPECT_EQ(p.reply()->error(), EPERM);
  // A tier manager commits in its own manifest: the service has no generation of it to show.
  const auto status = nlohmann::json::parse(svc.status_json());
  ASSERT_EQ(status.at("clients").size(), 1u);
  EXPECT_TRUE(status.at("clients")[0].at("raw").get<bool>());
  EXPECT_FALSE(status.at("clients")[0].contains("generation")) << status.dump();
  EXPECT_EQ(
      MetricsRegistry::process().render().find("tierswap_client_generation{client=\"raw.0\"}"),
      std::string::npos);
}

// A tier manager whose service is killed fails its next transfer promptly, naming the service,
// and a restarted service gives the committed state back.
TEST(Service, ATierManagerOfAKilledServiceFailsPromptlyAndReattaches) {
  TempDir d, mdir;
  const auto sc = service_config(d, 8 * kMiB);
  pid_t svc = test::spawn_service(sc);
  ASSERT_GT(svc, 0);
  auto cc = client_config(sc, "tmk", 0, 2 * kMiB);
  cc.timeout_seconds = 5;
  BlockDesc bd;
  bd.name = "w";
  bd.cls = BlockClass::master;
  bd.numel = 64 * 1024;
  {
    ServiceStorage st(cc, mdir.path());
    TierManager tm(st.space(), st.engine(), raw_tier_config());
    const BlockId id = tm.create(bd);
    {
      auto v = tm.acquire(id, Tier::host, Access::write);
      const auto p = pattern(256 * kKiB, 7);
      std::memcpy(v.data(), p.data(), p.size());
      v.mark_dirty();
    }
    tm.commit();
    {
      auto v = tm.acquire(id, Tier::host, Access::write);
      std::memset(v.data(), 0, 4096);
      v.mark_dirty();
    }
    ::kill(svc, SIGKILL);
    ::waitpid(svc, nullptr, 0);
    const auto t0 = std::chrono::steady_clock::now();
    const std::string why = error_of([&] { tm.commit(); });
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(6));
    EXPECT_NE(why.find("service"), std::string::npos) << why;
  }
  svc = test::spawn_service(sc);
  ASSERT_GT(svc, 0);
  {
    ServiceStorage st(cc, mdir.path());
    EXPECT_TRUE(st.reattached());
    TierManager tm(st.space(), st.engine(), raw_tier_config());
    auto v = tm.acquire(*tm.find("w"), Tier::host, Access::read);
    const auto p = pattern(256 * kKiB, 7);
    EXPECT_EQ(std::memcmp(v.data(), p.data(), p.size()), 0);
  }
  ::kill(svc, SIGKILL);
  ::waitpid(svc, nullptr, 0);
}

}  // namespace
}  // namespace tierswap
