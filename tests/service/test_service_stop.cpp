// The node service's graceful stop: clients served to their next commit, then told the service is
// going; new clients refused; a client that reaches no commit cut off at the drain time and named;
// a client that waits for a restarting service.
#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <system_error>
#include <thread>

#include "service_util.hpp"
#include "test_util.hpp"
#include "tierswap/service.hpp"

namespace tierswap {
namespace {

using test::errno_of;
using test::TempDir;
constexpr std::uint64_t kKiB = 1024;

void put_pattern(ServiceClient& c, std::uint8_t seed) {
  for (std::size_t i = 0; i < 4 * kKiB; ++i) c.memory()[i] = std::byte(seed + i % 7);
  c.put(1, 0, 4 * kKiB);
}

bool holds_pattern(ServiceClient& c, std::uint8_t seed) {
  c.get(1, 4 * kKiB, 4 * kKiB);
  for (std::size_t i = 0; i < 4 * kKiB; ++i)
    if (c.memory()[4 * kKiB + i] != std::byte(seed + i % 7)) return false;
  return true;
}

// Waits until the service refuses new clients (its stop has begun).
void await_refusals(const ServiceConfig& sc) {
  auto probe = test::small_client(sc, "probe");
  probe.release_when_detached = true;
  while (errno_of([&] { ServiceClient p(probe); }) != ESHUTDOWN) std::this_thread::yield();
}

TEST(ServiceStop, ClientsFinishTheirCommitThenAreToldTheServiceIsGoing) {
  TempDir d;
  const auto sc = test::small_service(d.path());
  auto svc = std::make_unique<SwapService>(sc);
  ServiceClient writing(test::small_client(sc, "writing")), done(test::small_client(sc, "done"));
  put_pattern(writing, 1);
  ASSERT_EQ(writing.commit(), 1u);
  put_pattern(writing, 2);  // a commit under way when the stop comes
  put_pattern(done, 3);
  ASSERT_EQ(done.commit(), 1u);  // at its commit: nothing to finish

  auto stopped = std::async(std::launch::async, [&] { return svc->stop(60); });
  await_refusals(sc);
  std::string why;
  EXPECT_EQ(errno_of([&] { done.get(1, 4 * kKiB, 4 * kKiB); }, &why), ESHUTDOWN);
  EXPECT_NE(why.find("the tierswap service is stopping"), std::string::npos) << why;
  put_pattern(writing, 4);  // still served: it has a commit to finish
  EXPECT_EQ(writing.commit(), 2u);
  EXPECT_EQ(errno_of([&] { put_pattern(writing, 5); }), ESHUTDOWN);
  EXPECT_EQ(stopped.get(), 0u);  // both went at their commit: nobody cut off
  EXPECT_EQ(svc->stop(60), 0u);  // once only
  svc.reset();

  SwapService again(sc);
  ServiceClient w(test::small_client(sc, "writing")), k(test::small_client(sc, "done"));
  EXPECT_EQ(w.attached_generation(), 2u);
  EXPECT_TRUE(holds_pattern(w, 4));
  EXPECT_EQ(k.attached_generation(), 1u);
  EXPECT_TRUE(holds_pattern(k, 3));
}

TEST(ServiceStop, AClientThatReachesNoCommitIsCutOffAtTheDrainTimeAndResumesFromItsLast) {
  TempDir d;
  const auto sc = test::small_service(d.path());
  auto svc = std::make_unique<SwapService>(sc);
  auto c = std::make_unique<ServiceClient>(test::small_client(sc, "slow"));
  put_pattern(*c, 1);
  ASSERT_EQ(c->commit(), 1u);
  put_pattern(*c, 2);  // and then no commit within the drain time
  EXPECT_EQ(svc->stop(0.2), 1u);
  svc.reset();
  EXPECT_NE(errno_of([&] { c->commit(); }), 0);  // cut off
  c.reset();
  SwapService again(sc);
  ServiceClient back(test::small_client(sc, "slow"));
  EXPECT_EQ(back.attached_generation(), 1u);
  EXPECT_TRUE(holds_pattern(back, 1));
}

TEST(ServiceStop, AClientWaitsForARestartingServiceOnlyWhenAskedTo) {
  TempDir d;
  const auto sc = test::small_service(d.path());
  auto cc = test::small_client(sc, "patient");
  std::string why;
  EXPECT_EQ(errno_of([&] { ServiceClient c(cc); }, &why), ENOENT);  // no service, no wait
  EXPECT_NE(why.find("is `tierswap serve` running?"), std::string::npos) << why;
  EXPECT_THROW(service_offer(sc.socket, 1, 5, -1), std::invalid_argument);
  cc.wait_seconds = 600;
  auto attached = std::async(std::launch::async, [&] {
    ServiceClient c(cc);
    return c.reattached();
  });
  EXPECT_EQ(attached.wait_for(std::chrono::milliseconds(600)), std::future_status::timeout);
  SwapService svc(sc);  // the restart it waits for
  EXPECT_FALSE(attached.get());
}

}  // namespace
}  // namespace tierswap
