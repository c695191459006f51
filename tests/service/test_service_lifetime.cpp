// How long the node service keeps a region: a region no client attached to for the region TTL is
// released (an attached one never); its last use is in the registry (version 2) and survives a
// restart; a registry before it (version 1) or with a bad last use; the regions a uid is shown.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "metrics_scrape.hpp"
#include "service_util.hpp"
#include "test_util.hpp"
#include "tierswap/detail/manifest.hpp"
#include "tierswap/metrics.hpp"
#include "tierswap/service.hpp"

namespace tierswap {
namespace {

using test::as_nobody;
using test::errno_of;
using test::TempDir;
using Clock = std::chrono::steady_clock;

void commit_block(ServiceClient& c) {
  for (std::size_t i = 0; i < 4096; ++i) c.memory()[i] = std::byte(i % 11);
  c.put(1, 0, 4096);
  c.commit();
}

// The regions by key, as the service lists them to this uid.
std::map<std::string, ServiceRegion> regions(const ServiceConfig& sc) {
  std::map<std::string, ServiceRegion> out;
  for (auto& r : service_regions(sc.socket, 10)) out.emplace(r.key(), r);
  return out;
}

double expired_total() {
  return test::sample_value(test::parse_exposition(MetricsRegistry::process().render()),
                            "tierswap_service_expired_regions_total");
}

// Waits (up to a minute: the sweep runs every second) until `key` is gone; false if it never is.
bool gone_in_time(const ServiceConfig& sc, const std::string& key) {
  for (const auto until = Clock::now() + std::chrono::minutes(1); Clock::now() < until;
       std::this_thread::sleep_for(std::chrono::milliseconds(50)))
    if (!regions(sc).count(key)) return true;
  return false;
}

TEST(ServiceLifetime, AnIdleRegionExpiresAndAnAttachedOneNever) {
  TempDir d;
  auto sc = test::small_service(d.path());
  sc.region_ttl_seconds = 2;
  SwapService svc(sc);
  const double before = expired_total();
  ServiceClient busy(test::small_client(sc, "busy"));
  commit_block(busy);
  const auto detached = Clock::now();
  {
    ServiceClient idle(test::small_client(sc, "idle"));
    commit_block(idle);
  }
  EXPECT_FALSE(regions(sc).at("idle.0").attached);
  ASSERT_TRUE(gone_in_time(sc, "idle.0"));
  // The last use is kept in whole seconds: a TTL of 2 s is at least 1 s after the detach.
  EXPECT_GE(Clock::now() - detached, std::chrono::seconds(1));
  EXPECT_EQ(expired_total(), before + 1);
  std::this_thread::sleep_for(std::chrono::seconds(3));  // more than the TTL, attached
  const auto left = regions(sc);
  ASSERT_TRUE(left.count("busy.0"));
  EXPECT_TRUE(left.at("busy.0").attached);
  EXPECT_EQ(left.at("busy.0").idle_seconds, 0);
  commit_block(busy);                                   // and it still works
  ServiceClient again(test::small_client(sc, "idle"));  // what expired starts afresh
  EXPECT_EQ(again.attached_generation(), 0u);
  EXPECT_FALSE(again.reattached());
}

// The registry as the service wrote it, and written back with `edit` applied.
void edit_registry(const TempDir& d, const std::function<void(nlohmann::json&)>& edit) {
  const auto path = d.path() / "tierswap.service";
  auto j = nlohmann::json::parse(detail::read_manifest_file(path));
  edit(j);
  detail::write_manifest_file(path, j.dump(), true);
}

// A service that made client `job`.0 with one committed block and stopped.
ServiceConfig one_kept_client(const TempDir& d, const char* job) {
  const auto sc = test::small_service(d.path());
  SwapService svc(sc);
  ServiceClient c(test::small_client(sc, job));
  commit_block(c);
  return sc;
}

TEST(ServiceLifetime, TheLastUseIsInTheRegistryAndSurvivesARestart) {
  TempDir d;
  auto sc = one_kept_client(d, "old");
  std::int64_t written = 0;
  edit_registry(d, [&](nlohmann::json& j) {
    EXPECT_EQ(j.at("version"), 2);
    written = j.at("clients").at(0).at("last_used").get<std::int64_t>();
    j["clients"][0]["last_used"] = written - 3 * 3600;  // as if it ended 3 hours ago
  });
  EXPECT_GT(written, 1'700'000'000);  // Unix seconds
  {
    SwapService kept(sc);  // no TTL: kept, its idle time from the registry
    EXPECT_GE(regions(sc).at("old.0").idle_seconds, 3 * 3600);
  }
  sc.region_ttl_seconds = 2 * 3600;
  SwapService svc(sc);
  EXPECT_TRUE(gone_in_time(sc, "old.0"));
  EXPECT_FALSE(std::filesystem::exists(d.path() / "service-clients" / "old.0.manifest"));
}

TEST(ServiceLifetime, ARegistryOfVersion1CountsFromItsLoad) {
  TempDir d;
  auto sc = one_kept_client(d, "v1");
  edit_registry(d, [](nlohmann::json& j) {
    j["version"] = 1;
    j["clients"][0].erase("last_used");
  });
  sc.region_ttl_seconds = 3600;
  SwapService svc(sc);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // a sweep or more
  const auto r = regions(sc);
  ASSERT_TRUE(r.count("v1.0"));  // not expired by a last use it never had
  EXPECT_LT(r.at("v1.0").idle_seconds, 3600);
  ServiceClient c(test::small_client(sc, "v1"));
  EXPECT_EQ(c.attached_generation(), 1u);
}

TEST(ServiceLifetime, ABadLastUseOrVersionIsRefusedNamingTheRegistry) {
  TempDir d;
  const auto sc = one_kept_client(d, "bad");
  const auto path = d.path() / "tierswap.service";
  const std::string good = detail::read_manifest_file(path);
  const std::pair<std::function<void(nlohmann::json&)>, const char*> cases[] = {
      {[](nlohmann::json& j) { j["clients"][0]["last_used"] = -5; }, "bad last use of bad.0"},
      {[](nlohmann::json& j) { j["clients"][0]["last_used"] = "today"; }, "bad client table"},
      {[](nlohmann::json& j) { j["clients"][0].erase("last_used"); }, "bad client table"},
      {[](nlohmann::json& j) { j["version"] = 3; }, "unsupported version 3"},
      {[](nlohmann::json& j) { j["version"] = 0; }, "unsupported version 0"},
  };
  for (const auto& [edit, named] : cases) {
    detail::write_manifest_file(path, good, true);
    edit_registry(d, edit);
    const std::string on_disk = detail::read_manifest_file(path);
    const std::string why = test::error_of([&] { SwapService s(sc); });
    EXPECT_NE(why.find(path.string()), std::string::npos) << why;
    EXPECT_NE(why.find(named), std::string::npos) << why;
    EXPECT_EQ(detail::read_manifest_file(path), on_disk);  // nothing changed
  }
}

TEST(ServiceLifetime, ATtlMustBeANumberOfSeconds) {
  TempDir d;
  auto sc = test::small_service(d.path());
  for (const double bad : {-1.0, std::nan(""), HUGE_VAL}) {
    sc.region_ttl_seconds = bad;
    EXPECT_NE(test::error_of([&] { sc.validate(); }).find("region_ttl_seconds"), std::string::npos);
  }
}

TEST(ServiceLifetime, AUidIsShownItsOwnRegionsAndTheOperatorAll) {
  if (::getuid() != 0) GTEST_SKIP() << "needs root to connect as another uid";
  TempDir d;
  auto sc = test::small_service(d.path());
  sc.allow_other_users = true;
  ::chmod(d.path().c_str(), 0755);
  SwapService svc(sc);
  {
    ServiceClient root(test::small_client(sc, "rootjob"));
    commit_block(root);
  }
  EXPECT_EQ(as_nobody([&] {
              ServiceClient own(test::small_client(sc, "nobodyjob"));
              commit_block(own);
              return 0;
            }),
            0);
  EXPECT_EQ(as_nobody([&] {
              const auto r = regions(sc);
              return r.size() == 1 && r.count("nobodyjob.0") &&
                             r.at("nobodyjob.0").owner_uid == 65534
                         ? 0
                         : 1;
            }),
            0);
  const auto all = regions(sc);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all.at("rootjob.0").owner_uid, 0u);
  EXPECT_EQ(all.at("nobodyjob.0").owner_uid, 65534u);
}

TEST(ServiceLifetime, ListingWithoutAServiceNamesTheSocket) {
  TempDir d;
  const auto sc = test::small_service(d.path());
  std::string why;
  EXPECT_EQ(errno_of([&] { (void)service_regions(sc.socket, 5); }, &why), ENOENT);
  EXPECT_NE(why.find(sc.socket.string()), std::string::npos) << why;
  EXPECT_EQ(errno_of([&] { (void)service_regions(sc.socket, 0); }, &why), EINVAL);
}

}  // namespace
}  // namespace tierswap
