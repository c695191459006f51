// Every completion path of the engine, proven with the fault-injecting backend: errors fail the
// ticket with a message naming op, file, offset and length; short transfers, EAGAIN and EINTR are
// retried to a correct result; no fault is ever reported as success.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>

#include "test_util.hpp"
#include "tierswap/aligned_buffer.hpp"
#include "tierswap/units.hpp"

using namespace tierswap;
using detail::Fault;
using detail::IoRequest;
using tierswap::test::TempDir;

namespace {

class FaultTest : public ::testing::TestWithParam<IoBackendKind> {
 protected:
  void SetUp() override {
    space_ = std::make_unique<SwapSpace>(test::make_space({dir_.path()}, 8 * MiB));
  }
  // An engine over the fault wrapper; skips when the backend is unavailable here.
  std::unique_ptr<IoEngine> engine(detail::FaultPlan plan, std::uint32_t depth = 8,
                                   std::uint32_t retries = 16) {
    auto inner = test::make_backend(GetParam(), *space_, depth, &unavailable_);
    if (!inner) return nullptr;
    IoEngineConfig c;
    c.queue_depth = depth;
    c.block_size = 64 * KiB;
    c.max_retries = retries;
    return std::make_unique<IoEngine>(
        *space_, c, detail::make_fault_backend(std::move(inner), std::move(plan)));
  }
  std::string file() const { return space_->files()[0].path.string(); }
  // A short transfer the kernel could really produce on this file: whole alignment units on
  // O_DIRECT files (sector granularity), any byte count on buffered ones. 0 = no fault.
  std::uint32_t short_len(std::uint32_t length, std::uint32_t r) const {
    const std::uint32_t a = space_->files()[0].offset_align;
    if (length <= a) return 0;
    const std::uint32_t units = (length - 1) / a;  // at least one unit short
    return a * (1 + r % units);
  }
  std::uint64_t data_offset() const { return space_->files()[0].data_offset; }

  TempDir dir_;
  std::unique_ptr<SwapSpace> space_;
  std::string unavailable_;  // why the last engine() could not start its backend
};

#define ENGINE_OR_SKIP(var, ...)                                                 \
  TIERSWAP_OR_SKIP(var, engine(__VA_ARGS__),                                     \
                   "backend " + std::string(::tierswap::to_string(GetParam())) + \
                       " unavailable here: " + unavailable_)

}  // namespace

TEST_P(FaultTest, HardErrorsFailTheTicketAndNameTheRequest) {
  for (int err : {EIO, ENOSPC, EBADF}) {
    // Fail the third request the backend sees.
    ENGINE_OR_SKIP(e, [err](const IoRequest&, std::uint64_t seq) {
      return seq == 2 ? Fault{Fault::Kind::error, err} : Fault{};
    });
    AlignedBuffer b(1 * MiB);
    IoTicket t = e->write(0, b.data(), b.size());
    try {
      t.wait();
      FAIL() << "an injected " << std::strerror(err) << " was reported as success";
    } catch (const std::system_error& x) {
      EXPECT_EQ(x.code().value(), err);
      std::string w = x.what();
      EXPECT_NE(w.find("write " + file() + " @"), std::string::npos) << w;
      EXPECT_NE(w.find("+65536"), std::string::npos) << w;  // the length of the failed request
    }
    EXPECT_TRUE(t.ready());
    EXPECT_LT(t.bytes_done(), b.size());
    EXPECT_EQ(e->stats().failed_tickets, 1u);
    // The engine is still usable: a later ticket succeeds.
    IoTicket ok = e->read(0, b.data(), 4096);
    EXPECT_NO_THROW(ok.wait());
  }
}

TEST_P(FaultTest, ShortTransfersAreCompletedForReadsAndWrites) {
  for (DirectIo mode : {DirectIo::automatic, DirectIo::off}) {
    space_.reset();
    TempDir d;
    space_ = std::make_unique<SwapSpace>(test::make_space({d.path()}, 8 * MiB, MiB, mode));
    std::mt19937 rng(1);
    // Every request first moves a random part of itself (any byte count on buffered files).
    ENGINE_OR_SKIP(e, [&](const IoRequest& r, std::uint64_t) {
      return Fault{Fault::Kind::short_transfer, 0, short_len(r.length, rng())};
    });
    AlignedBuffer w(2 * MiB), r(2 * MiB);
    test::fill_pattern(w.data(), w.size(), 21, 0);
    e->write(4096, w.data(), w.size()).wait();
    e->read(4096, r.data(), r.size()).wait();
    EXPECT_EQ(std::memcmp(w.data(), r.data(), w.size()), 0);
    EXPECT_GT(e->stats().short_transfers, 0u);
    // Unaligned head and tail through bounce buffers, with short transfers on every phase.
    std::vector<std::uint8_t> u(100 * KiB + 7), v(u.size());
    test::fill_pattern(u.data(), u.size(), 22, 0);
    e->write(333, u.data(), u.size()).wait();
    e->read(333, v.data(), v.size()).wait();
    EXPECT_EQ(u, v);
    e.reset();
  }
}

TEST_P(FaultTest, EagainAndEintrAreRetried) {
  std::map<std::pair<std::uint64_t, bool>, int> seen;  // (offset, write) -> attempts
  std::mutex mu;
  ENGINE_OR_SKIP(e, [&](const IoRequest& r, std::uint64_t) {
    std::lock_guard lock(mu);
    int n = seen[{r.offset, r.op == IoOp::write}]++;
    if (n == 0) return Fault{Fault::Kind::again};
    if (n == 1) return Fault{Fault::Kind::interrupt};
    return Fault{};
  });
  AlignedBuffer w(1 * MiB), r(1 * MiB);
  test::fill_pattern(w.data(), w.size(), 23, 0);
  e->write(0, w.data(), w.size()).wait();
  e->read(0, r.data(), r.size()).wait();
  EXPECT_EQ(std::memcmp(w.data(), r.data(), w.size()), 0);
  EXPECT_EQ(e->stats().retries, 2u * 2 * 16);  // 16 requests each way, 2 retries each
}

TEST_P(FaultTest, PersistentEagainEventuallyFails) {
  ENGINE_OR_SKIP(
      e, [](const IoRequest&, std::uint64_t) { return Fault{Fault::Kind::again}; }, 4, 5);
  AlignedBuffer b(64 * KiB);
  try {
    e->read(0, b.data(), b.size()).wait();
    FAIL();
  } catch (const std::system_error& x) {
    EXPECT_EQ(x.code().value(), EAGAIN);
    EXPECT_NE(std::string(x.what()).find("retries exhausted"), std::string::npos);
  }
}

TEST_P(FaultTest, ZeroByteCompletionsNeverPassAsSuccess) {
  {  // A read that returns 0 is an end of file inside the swap space: the file was truncated.
    ENGINE_OR_SKIP(e, [](const IoRequest&, std::uint64_t) { return Fault{Fault::Kind::zero}; });
    AlignedBuffer b(64 * KiB);
    try {
      e->read(0, b.data(), b.size()).wait();
      FAIL();
    } catch (const std::system_error& x) {
      EXPECT_EQ(x.code().value(), EIO);
      EXPECT_NE(std::string(x.what()).find("end of file"), std::string::npos);
    }
  }
  {  // A write that keeps moving nothing fails after the retry budget.
    ENGINE_OR_SKIP(
        e, [](const IoRequest&, std::uint64_t) { return Fault{Fault::Kind::zero}; }, 4, 3);
    AlignedBuffer b(64 * KiB);
    try {
      e->write(0, b.data(), b.size()).wait();
      FAIL();
    } catch (const std::system_error& x) {
      EXPECT_EQ(x.code().value(), EIO);
      EXPECT_NE(std::string(x.what()).find("no progress"), std::string::npos);
    }
  }
}

TEST_P(FaultTest, ErrorInReadModifyWritePhaseFailsTheWrite) {
  // The first request of an unaligned write is its read phase; fail it.
  ENGINE_OR_SKIP(e, [](const IoRequest& r, std::uint64_t) {
    return r.op == IoOp::read ? Fault{Fault::Kind::error, EIO} : Fault{};
  });
  if (!space_->all_direct()) GTEST_SKIP() << "no O_DIRECT here: no read-modify-write";
  std::vector<std::uint8_t> u(1000, 1);
  EXPECT_THROW(e->write(100, u.data(), u.size()).wait(), std::system_error);
}

// Property: over many tickets with random faults, a ticket fails if and only if one of its
// requests got a hard error; every ticket that succeeds has exactly the right bytes.
TEST_P(FaultTest, NoFaultIsEverReportedAsSuccess) {
  std::mt19937 rng(42);
  std::mutex mu;
  std::set<std::uint64_t> hard;  // physical offsets whose request got a hard error
  ENGINE_OR_SKIP(
      e,
      [&](const IoRequest& r, std::uint64_t) {
        std::lock_guard lock(mu);
        switch (rng() % 10) {
          case 0:
            hard.insert(r.offset);
            return Fault{Fault::Kind::error, EIO};
          case 1:
            hard.insert(r.offset);
            return Fault{Fault::Kind::error, ENOSPC};
          case 2:
            return Fault{Fault::Kind::again};
          case 3:
            return Fault{Fault::Kind::interrupt};
          case 4:
            return Fault{Fault::Kind::short_transfer, 0, short_len(r.length, rng())};
          default:
            return Fault{};
        }
      },
      8, 1000);
  const std::uint64_t kChunk = 64 * KiB;  // one request per ticket
  const int kTickets = 96;
  AlignedBuffer w(kChunk * kTickets), r(kChunk * kTickets);
  test::fill_pattern(w.data(), w.size(), 31, 0);
  std::vector<IoTicket> ts;
  for (int i = 0; i < kTickets; ++i)
    ts.push_back(e->write(i * kChunk, w.data() + i * kChunk, kChunk));
  std::vector<bool> written(kTickets);
  int failed = 0;
  for (int i = 0; i < kTickets; ++i) {
    bool ok = true;
    try {
      ts[i].wait();
    } catch (const std::system_error&) {
      ok = false;
      ++failed;
    }
    const std::uint64_t phys = data_offset() + i * kChunk;
    std::lock_guard lock(mu);
    bool had_hard = false;
    for (auto h : hard) had_hard |= h >= phys && h < phys + kChunk;
    EXPECT_EQ(ok, !had_hard) << "ticket " << i;
    written[i] = ok;
  }
  EXPECT_GT(failed, 0) << "the plan injected no hard error; the test proves nothing";
  EXPECT_LT(failed, kTickets);
  // Check the successful ones with a clean engine.
  IoEngineConfig c;
  c.backend = GetParam();
  IoEngine clean(*space_, c);
  clean.read(0, r.data(), r.size()).wait();
  for (int i = 0; i < kTickets; ++i)
    if (written[i])
      EXPECT_EQ(std::memcmp(w.data() + i * kChunk, r.data() + i * kChunk, kChunk), 0) << i;
}

INSTANTIATE_TEST_SUITE_P(Backends, FaultTest, ::testing::ValuesIn(test::kAllBackends),
                         test::backend_name);
