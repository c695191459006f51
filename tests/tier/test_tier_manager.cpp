// TierManager: residency across the three tiers (the device tier simulated here), budgets and
// eviction, write-behind, prefetch, generations (commit/discard), the manifest and reopening
// after a crash, misuse errors, and many threads at once.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <utility>

#include "test_util.hpp"
#include "tierswap/aligned_buffer.hpp"
#include "tierswap/detail/io_backend.hpp"
#include "tierswap/detail/manifest.hpp"
#include "tierswap/detail/tier_pools.hpp"
#include "tierswap/io_engine.hpp"
#include "tierswap/log.hpp"
#include "tierswap/process_config.hpp"
#include "tierswap/swap_space.hpp"
#include "tierswap/telemetry.hpp"
#include "tierswap/tier_manager.hpp"

using namespace tierswap;
using tierswap::test::TempDir;

namespace {

constexpr std::uint64_t kKiB = 1024;

struct Rig {
  TempDir dir;
  std::unique_ptr<SwapSpace> space;
  std::unique_ptr<IoEngine> engine;
  std::unique_ptr<TierManager> mgr;

  explicit Rig(TierConfig cfg, std::uint64_t capacity = 64 << 20,
               detail::FaultPlan faults = nullptr) {
    SwapSpaceConfig sc;
    sc.dirs = {dir.path()};
    sc.capacity = capacity;
    space = std::make_unique<SwapSpace>(SwapSpace::create(sc));
    if (faults) {
      std::string why;
      IoEngineConfig ec;
      ec.queue_depth = 16;  // the backend's
      engine = std::make_unique<IoEngine>(
          *space, ec,
          detail::make_fault_backend(test::make_backend(IoBackendKind::posix, *space, 16, &why),
                                     std::move(faults)));
    } else {
      engine = std::make_unique<IoEngine>(*space);
    }
    mgr = std::make_unique<TierManager>(*space, *engine, cfg);
  }
  // Closes and reopens everything on the same directory (as a new process would).
  void reopen(TierConfig cfg) {
    mgr.reset();
    engine.reset();
    space.reset();  // its files' lock goes with it, as with a process that ends
    space = std::make_unique<SwapSpace>(SwapSpace::open({dir.path()}));
    engine = std::make_unique<IoEngine>(*space);
    mgr = std::make_unique<TierManager>(*space, *engine, cfg);
  }
};

TierConfig small_config(std::uint64_t block_bytes, std::uint64_t host_blocks,
                        std::uint64_t device_blocks = 0) {
  TierConfig c;
  c.host_budget = host_blocks * block_bytes;
  c.host_slab_size = block_bytes;
  c.device_budget = device_blocks * block_bytes;
  c.device_mode = device_blocks > 0 ? DeviceTierMode::simulated : DeviceTierMode::off;
  c.simulated_device_gbps = 50;
  c.max_dirty_bytes = 2 * block_bytes;
  c.durable = false;
  c.telemetry = false;
  return c;
}

BlockDesc desc(const std::string& name, std::uint64_t numel, Dtype dt = Dtype::f32,
               BlockClass cls = BlockClass::master, int subgroup = 0) {
  BlockDesc d;
  d.name = name;
  d.numel = numel;
  d.dtype = dt;
  d.cls = cls;
  d.owner = {0, 0, subgroup};
  return d;
}

void fill(BlockView& v, std::uint64_t seed) {
  test::fill_pattern(v.data(), v.bytes(), seed, 0);
}

// Writes the pattern of `seed` into the block's host copy (dirty: the next commit writes it).
void write_pattern(TierManager& m, BlockId id, std::uint64_t seed) {
  BlockView v = m.acquire(id, Tier::host, Access::write);
  fill(v, seed);
  m.release(v, true);
}

void expect_pattern(TierManager& m, BlockId id, std::uint64_t seed, Tier t = Tier::host) {
  BlockView v = m.acquire(id, t);
  EXPECT_EQ(test::first_mismatch(v.data(), v.bytes(), seed, 0), -1)
      << m.desc(id).name << " seed " << seed << " via " << to_string(t);
}

bool all_zero(const BlockView& v) {
  for (std::uint64_t i = 0; i < v.bytes(); ++i)
    if (v.data()[i] != std::byte{0}) return false;
  return true;
}

}  // namespace

TEST(TierManager, NewBlocksReadAsZerosAndRoundTripThroughNvme) {
  const std::uint64_t n = 10000;  // 40000 bytes: not a multiple of 4 KiB
  Rig r(small_config(40 * kKiB, 4));
  const BlockId a = r.mgr->create(desc("a", n));
  {
    BlockView v = r.mgr->acquire(a, Tier::host);
    EXPECT_EQ(v.bytes(), n * 4);
    EXPECT_TRUE(all_zero(v));
  }
  {
    BlockView v = r.mgr->acquire(a, Tier::host, Access::write);
    fill(v, 7);
    r.mgr->release(v, true);
  }
  r.mgr->flush();
  r.mgr->evict(a, Tier::host);
  auto snap = r.mgr->snapshot();
  EXPECT_EQ(snap.blocks[0].state[1], CopyState::absent);
  EXPECT_EQ(snap.blocks[0].state[2], CopyState::valid);
  expect_pattern(*r.mgr, a, 7);
  const auto c = r.mgr->counters();
  EXPECT_GE(c.bytes_in[static_cast<int>(Tier::nvme)], n * 4);
  EXPECT_GE(c.bytes_out[static_cast<int>(Tier::nvme)], n * 4);
  EXPECT_EQ(r.mgr->find("a"), a);
  EXPECT_FALSE(r.mgr->find("b").has_value());
  // Host slabs are registered with the engine: io_uring moves them with fixed buffers.
  if (r.engine->backend() == IoBackendKind::uring) EXPECT_GT(r.engine->stats().fixed_requests, 0u);
}

TEST(TierManager, HostSlabsBindToARealNumaNodeAndRefuseAMissingOne) {
  TierConfig cfg = small_config(64 * kKiB, 4);
  cfg.numa_node = 0;
  std::unique_ptr<Rig> rig;
  try {
    rig = std::make_unique<Rig>(cfg);
  } catch (const std::invalid_argument& e) {
    if (std::string(e.what()).find("no NUMA support") != std::string::npos)
      GTEST_SKIP() << e.what();  // e.g. a container whose seccomp profile forbids mbind
    throw;
  }
  Rig& r = *rig;
  const BlockId a = r.mgr->create(desc("numa", 1000));
  BlockView v = r.mgr->acquire(a, Tier::host);
  EXPECT_TRUE(all_zero(v));
  v = BlockView();
  TierConfig bad = cfg;
  bad.numa_node = 999;
  try {
    TierManager m(*r.space, *r.engine, bad);
    ADD_FAILURE() << "accepted NUMA node 999";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("numa_node=999"), std::string::npos) << e.what();
  }
}

TEST(TierManager, SimulatedDeviceTierIsLabelledAndHoldsTheNewestCopy) {
  const std::uint64_t bytes = 64 * kKiB;
  Rig r(small_config(bytes, 4, 2));
  const BlockId a = r.mgr->create(desc("dev", bytes / 2, Dtype::bf16, BlockClass::param16));
  {
    BlockView v = r.mgr->acquire(a, Tier::device, Access::write);
    EXPECT_EQ(v.tier(), Tier::device);
    fill(v, 11);
    r.mgr->release(v, true);
  }
  auto snap = r.mgr->snapshot();
  EXPECT_TRUE(snap.simulated_device);
  EXPECT_TRUE(snap.device_tier);
  EXPECT_EQ(snap.blocks[0].state[0], CopyState::dirty);
  EXPECT_EQ(snap.blocks[0].state[1], CopyState::absent);  // the stale host copy was dropped
  const auto j = nlohmann::json::parse(snap.to_json());
  EXPECT_TRUE(j.at("simulated_device").get<bool>());
  EXPECT_EQ(j.at("tiers").at(0).at("tier"), "gpu");
  expect_pattern(*r.mgr, a, 11, Tier::host);  // copied down from the device
  r.mgr->evict(a, Tier::device);
  r.mgr->flush();
  r.mgr->evict(a, Tier::host);
  expect_pattern(*r.mgr, a, 11, Tier::device);  // NVMe -> host -> device
}

// A device view of a block whose device copy is current moves nothing (GPU-resident state and
// gradients stay on the GPU step after step); a block with no data anywhere gets its zeros in
// device memory; only a newer host copy goes up, and only a host view brings data down.
TEST(TierManager, DeviceViewsOfDeviceCopiesCopyNothing) {
  const std::uint64_t bytes = 64 * kKiB;
  Rig r(small_config(bytes, 4, 4));
  const int d = static_cast<int>(Tier::device);
  const BlockId a = r.mgr->create(desc("state", bytes / 4));
  BlockDesc gd = desc("grad", bytes / 2, Dtype::bf16, BlockClass::grad16);
  gd.memory_only = true;
  const BlockId g = r.mgr->create(gd);
  auto moved = [&] {
    const auto c = r.mgr->counters();
    return std::pair{c.bytes_in[d], c.bytes_out[d]};
  };
  auto host_state = [&](BlockId id) { return r.mgr->snapshot().blocks[id].state[1]; };
  {
    BlockView v = r.mgr->acquire(a, Tier::device);
    EXPECT_TRUE(all_zero(v));
  }
  EXPECT_EQ(moved(), (std::pair<std::uint64_t, std::uint64_t>{0, 0}));
  EXPECT_EQ(host_state(a), CopyState::absent);
  for (int i = 0; i < 4; ++i) {  // steps: written in place on the device, read again
    BlockView v = r.mgr->acquire(a, Tier::device, Access::write);
    fill(v, 20 + i);
    r.mgr->release(v, true);
    expect_pattern(*r.mgr, a, 20 + i, Tier::device);
    BlockView w = r.mgr->acquire(g, Tier::device, Access::write);
    if (i == 0) EXPECT_TRUE(all_zero(w));
    fill(w, 40 + i);
    r.mgr->release(w, true);
    r.mgr->commit();  // nothing of the device copies goes down for a commit: flush excepted
  }
  // The commit flushed the state (not memory-only): down once per commit, never up.
  const auto [in1, out1] = moved();
  EXPECT_EQ(in1, 0u);
  EXPECT_EQ(out1, 4 * (bytes / 4 * 4));
  EXPECT_EQ(host_state(g), CopyState::absent) << "a memory-only gradient never came down";
  r.mgr->evict(a, Tier::host);
  const auto before = moved();
  expect_pattern(*r.mgr, a, 23, Tier::device);
  expect_pattern(*r.mgr, g, 43, Tier::device);
  EXPECT_EQ(moved(), before);
  // A host view brings it down; a newer host copy goes up, once.
  expect_pattern(*r.mgr, a, 23, Tier::host);
  EXPECT_EQ(moved().second, before.second + bytes / 4 * 4);
  {
    BlockView v = r.mgr->acquire(a, Tier::host, Access::write);
    fill(v, 30);
    r.mgr->release(v, true);
  }
  expect_pattern(*r.mgr, a, 30, Tier::device);
  expect_pattern(*r.mgr, a, 30, Tier::device);
  EXPECT_EQ(moved().first, bytes / 4 * 4);
  // Trimmed: zeros again, made on the device.
  r.mgr->trim(g);
  {
    BlockView w = r.mgr->acquire(g, Tier::device);
    EXPECT_TRUE(all_zero(w));
  }
  EXPECT_EQ(moved().first, bytes / 4 * 4);
  EXPECT_EQ(host_state(g), CopyState::absent);
}

TEST(TierManager, BudgetsAreNeverExceededAndEvictionWritesDirtyDataBack) {
  const std::uint64_t bytes = 64 * kKiB;
  Rig r(small_config(bytes, 3, 2));
  std::vector<BlockId> ids;
  for (int i = 0; i < 10; ++i)
    ids.push_back(r.mgr->create(desc("b" + std::to_string(i), bytes / 4)));
  for (int i = 0; i < 10; ++i) {
    const Tier t = i % 3 == 0 ? Tier::device : Tier::host;
    BlockView v = r.mgr->acquire(ids[i], t, Access::write);
    fill(v, 100 + i);
    r.mgr->release(v, true);
    const auto s = r.mgr->snapshot();
    for (auto& row : s.tiers) EXPECT_LE(row.resident_bytes, row.capacity_bytes);
  }
  for (int i = 9; i >= 0; --i)
    expect_pattern(*r.mgr, ids[i], 100 + i, i % 2 ? Tier::host : Tier::device);
  const auto c = r.mgr->counters();
  EXPECT_GT(c.evictions, 0u);
  EXPECT_GT(c.bytes_in[static_cast<int>(Tier::nvme)], 0u);
}

TEST(TierManager, RunningOutOfBudgetNamesTheBudgetAndTheRequest) {
  const std::uint64_t bytes = 64 * kKiB;
  Rig r(small_config(bytes, 2));
  const BlockId a = r.mgr->create(desc("a", bytes / 4));
  const BlockId b = r.mgr->create(desc("b", bytes / 4));
  const BlockId c = r.mgr->create(desc("c", bytes / 4));
  const BlockId huge = r.mgr->create(desc("huge", bytes));  // 4 blocks' worth
  BlockView va = r.mgr->acquire(a, Tier::host);
  BlockView vb = r.mgr->acquire(b, Tier::host);
  try {
    r.mgr->acquire(c, Tier::host);
    FAIL() << "expected a budget error";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("host tier budget exhausted"), std::string::npos) << m;
    EXPECT_NE(m.find("'c'"), std::string::npos) << m;
    EXPECT_NE(m.find("the budget is 128.00 KiB"), std::string::npos) << m;
  }
  EXPECT_THROW(r.mgr->acquire(huge, Tier::host), std::runtime_error);
  va = BlockView();  // released: now c fits (a is evicted)
  EXPECT_NO_THROW(r.mgr->acquire(c, Tier::host));
}

// commit_async(): the caller goes on; a writable view of a committed block waits for the commit
// (the generation being made durable cannot change under it), reads and transient blocks do not;
// wait_commit() returns the generation, and a second commit_async() before it is refused.
TEST(TierManager, AnAsynchronousCommitLandsWhileReadsGoOnAndWritesWait) {
  const std::uint64_t bytes = 64 * kKiB;
  Rig r(small_config(bytes, 8));
  const BlockId a = r.mgr->create(desc("a", bytes / 4));
  BlockDesc scratch = desc("grad", bytes / 4);
  scratch.transient = true;
  const BlockId g = r.mgr->create(scratch);
  {
    BlockView v = r.mgr->acquire(a, Tier::host, Access::write);
    fill(v, 1000);
    r.mgr->release(v, true);
  }
  r.mgr->commit_async();
  EXPECT_THROW(r.mgr->commit_async(), std::logic_error);  // the first not waited for
  expect_pattern(*r.mgr, a, 1000);                        // a read goes on
  {
    BlockView v = r.mgr->acquire(g, Tier::host, Access::write);  // a transient block too
    fill(v, 7);
    r.mgr->release(v, true);
  }
  {
    BlockView v = r.mgr->acquire(a, Tier::host, Access::write);  // waits for the commit
    EXPECT_FALSE(r.mgr->commit_in_flight());
    EXPECT_EQ(r.mgr->committed_generation(), 1u);
    fill(v, 2000);
    r.mgr->release(v, true);
  }
  EXPECT_EQ(r.mgr->wait_commit(), 1u);
  EXPECT_EQ(r.mgr->wait_commit(), 1u);  // none in flight: the committed one
  r.mgr->discard();                     // generation 2's change goes; 1 is what landed
  expect_pattern(*r.mgr, a, 1000);
  r.mgr->commit_async();
  EXPECT_EQ(r.mgr->wait_commit(), 2u);
}

TEST(TierManager, DiscardRestoresTheCommittedGenerationBitForBit) {
  const std::uint64_t bytes = 64 * kKiB;
  Rig r(small_config(bytes, 8));
  const BlockId a = r.mgr->create(desc("a", bytes / 4));
  const BlockId b = r.mgr->create(desc("b", bytes / 4));
  for (BlockId id : {a, b}) {
    BlockView v = r.mgr->acquire(id, Tier::host, Access::write);
    fill(v, 1000 + id);
    r.mgr->release(v, true);
  }
  EXPECT_EQ(r.mgr->commit(), 1u);
  // Generation 2: a written back to NVMe (its uncommitted slot), b only dirty in memory.
  for (BlockId id : {a, b}) {
    BlockView v = r.mgr->acquire(id, Tier::host, Access::write);
    fill(v, 2000 + id);
    r.mgr->release(v, true);
  }
  r.mgr->evict(a, Tier::host);
  r.mgr->discard();
  expect_pattern(*r.mgr, a, 1000 + a);
  expect_pattern(*r.mgr, b, 1000 + b);
  EXPECT_EQ(r.mgr->committed_generation(), 1u);
  // A later commit still works from the restored state.
  {
    BlockView v = r.mgr->acquire(a, Tier::host, Access::write);
    fill(v, 3000);
    r.mgr->release(v, true);
  }
  EXPECT_EQ(r.mgr->commit(), 2u);
  r.mgr->evict(a, Tier::host);
  expect_pattern(*r.mgr, a, 3000);
}

TEST(TierManager, ReopeningYieldsTheLastCommittedGenerationWithChecksumsVerified) {
  const std::uint64_t bytes = 64 * kKiB;
  TierConfig cfg = small_config(bytes, 8);
  cfg.durable = true;
  Rig r(cfg);
  const BlockId a = r.mgr->create(desc("a", bytes / 4, Dtype::f32, BlockClass::exp_avg, 3));
  const BlockId z = r.mgr->create(desc("never-written", 1000, Dtype::bf16, BlockClass::grad16));
  {
    BlockView v = r.mgr->acquire(a, Tier::host, Access::write);
    fill(v, 42);
    r.mgr->release(v, true);
  }
  EXPECT_EQ(r.mgr->commit(), 1u);
  {
    BlockView v = r.mgr->acquire(a, Tier::host, Access::write);
    fill(v, 43);
    r.mgr->release(v, true);
  }
  r.mgr->flush();  // generation 2 reaches the disk but is never committed
  r.reopen(cfg);
  EXPECT_EQ(r.mgr->committed_generation(), 1u);
  EXPECT_EQ(r.mgr->block_count(), 2u);
  const auto s = r.mgr->snapshot();
  EXPECT_TRUE(s.checksums_verified);
  const BlockId a2 = *r.mgr->find("a");
  EXPECT_EQ(r.mgr->desc(a2).cls, BlockClass::exp_avg);
  EXPECT_EQ(r.mgr->desc(a2).owner.subgroup, 3);
  expect_pattern(*r.mgr, a2, 42);
  BlockView vz = r.mgr->acquire(*r.mgr->find("never-written"), Tier::host);
  EXPECT_TRUE(all_zero(vz));
  (void)z;
  // The offline reader sees the same table.
  const ManifestInfo info = read_manifest(r.mgr->manifest_path());
  EXPECT_EQ(info.generation, 1u);
  EXPECT_EQ(info.space_uuid, r.space->uuid());
  ASSERT_EQ(info.blocks.size(), 2u);
  EXPECT_TRUE(info.blocks[0].has_data);
  EXPECT_FALSE(info.blocks[1].has_data);
}

TEST(TierManager, CorruptOrTruncatedManifestOrDataGivesAClearError) {
  const std::uint64_t bytes = 64 * kKiB;
  TierConfig cfg = small_config(bytes, 8);
  Rig r(cfg);
  const BlockId a = r.mgr->create(desc("a", bytes / 4));
  {
    BlockView v = r.mgr->acquire(a, Tier::host, Access::write);
    fill(v, 5);
    r.mgr->release(v, true);
  }
  r.mgr->commit();
  const auto path = r.mgr->manifest_path();
  r.mgr.reset();
  std::string good;
  {
    std::ifstream f(path, std::ios::binary);
    good.assign(std::istreambuf_iterator<char>(f), {});
  }
  auto expect_open_error = [&](const std::string& content, const std::string& needle) {
    {
      std::ofstream f(path, std::ios::binary | std::ios::trunc);
      f << content;
    }
    try {
      TierManager m(*r.space, *r.engine, cfg);
      ADD_FAILURE() << "opened a bad manifest (" << needle << ")";
    } catch (const std::runtime_error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path.string()), std::string::npos) << msg;
      EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    }
  };
  expect_open_error(good.substr(0, 30), "truncated");
  expect_open_error(good.substr(0, good.size() - 5), "truncated");
  std::string flipped = good;
  flipped[good.size() - 3] ^= 0x20;
  expect_open_error(flipped, "checksum");
  std::string magic = good;
  magic[0] = 'X';
  expect_open_error(magic, "magic");
  // Data corruption in the committed extent (both slots, whichever is committed).
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << good;
  }
  const auto& file = r.space->files().front();
  AlignedBuffer junk(4096);  // O_DIRECT wants an aligned buffer
  std::memset(junk.data(), 0x5a, 4096);
  for (std::uint64_t logical : {std::uint64_t{0}, bytes}) {
    const PhysicalSpan p = r.space->map(logical, 4096);
    ASSERT_EQ(::pwrite(file.fd, junk.data(), 4096, static_cast<off_t>(p.offset)), 4096);
  }
  try {
    TierManager m(*r.space, *r.engine, cfg);
    ADD_FAILURE() << "opened corrupt data";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("block 'a'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("checksum"), std::string::npos) << msg;
  }
}

TEST(TierManager, ManifestOfAnotherSpaceIsRefused) {
  const std::uint64_t bytes = 64 * kKiB;
  TierConfig cfg = small_config(bytes, 8);
  Rig r1(cfg), r2(cfg);
  r1.mgr->create(desc("a", 100));
  r1.mgr->commit();
  r2.mgr.reset();
  std::filesystem::copy_file(r1.mgr->manifest_path(), r2.dir.path() / "tierswap.manifest");
  try {
    TierManager m(*r2.space, *r2.engine, cfg);
    ADD_FAILURE() << "opened another space's manifest";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("belongs to swap space"), std::string::npos) << e.what();
  }
}

TEST(TierManager, InPlaceModeCommitsAndReopensButCannotDiscard) {
  const std::uint64_t bytes = 64 * kKiB;
  TierConfig cfg = small_config(bytes, 8);
  cfg.shadow_slots = false;
  Rig r(cfg);
  const BlockId a = r.mgr->create(desc("a", bytes / 4));
  write_pattern(*r.mgr, a, 9);
  EXPECT_EQ(r.mgr->commit(), 1u);
  EXPECT_THROW(r.mgr->discard(), std::logic_error);
  r.reopen(cfg);
  expect_pattern(*r.mgr, *r.mgr->find("a"), 9);
  TierConfig shadow = cfg;
  shadow.shadow_slots = true;
  EXPECT_THROW(r.reopen(shadow), std::runtime_error);  // mode mismatch is named, not guessed
}

// A commit record is the owner's text, kept with its generation and the one before: any UTF-8
// (quotes, backslashes, control characters) comes back as it was set, after a reopen and after
// a roll-back; text a manifest cannot hold is refused when set, and the record already set stays.
TEST(TierManager, CommitRecordsComeBackAsSetAfterAReopenAndARollBack) {
  const std::uint64_t bytes = 64 * kKiB;
  TierConfig cfg = small_config(bytes, 4);
  cfg.shadow_slots = true;
  Rig r(cfg);
  const BlockId a = r.mgr->create(desc("a", bytes / 4));
  const std::string first = "{\"name\": \"w\\\\x\"}\n\x01 caf\xc3\xa9";
  const std::string second = "step 2: \"\u00e9t\u00e9\"";
  for (int gen = 1; gen <= 2; ++gen) {
    r.mgr->set_commit_record(gen == 1 ? first : second);
    write_pattern(*r.mgr, a, gen);
    r.mgr->commit();
  }
  EXPECT_THROW(r.mgr->set_commit_record("bad \xff byte"), std::invalid_argument);
  r.reopen(cfg);
  EXPECT_EQ(r.mgr->commit_record(), second);
  ASSERT_TRUE(r.mgr->roll_back_generation());
  EXPECT_EQ(r.mgr->commit_record(), first);
  r.reopen(cfg);
  EXPECT_EQ(r.mgr->commit_record(), first);
  EXPECT_THROW(r.mgr->set_commit_record("bad \xc3"), std::invalid_argument);
  r.mgr->commit();  // the record set back by the roll-back goes with the next generation
  r.reopen(cfg);
  EXPECT_EQ(r.mgr->commit_record(), first);
}

// A commit undone right after it (one process of a group whose commit failed): the blocks it
// changed read their earlier data from every tier, copies and read-ahead of the undone
// generation included, a transient block's contents stay, and after a reopen too; a block
// changed or viewed since the commit is refused by name, nothing undone.
TEST(TierManager, ACommitIsUndoneRightAfterItWithCopiesAndReadAheadInFlight) {
  const std::uint64_t bytes = 64 * kKiB;
  TierConfig cfg = small_config(bytes, 4);
  cfg.shadow_slots = true;
  Rig r(cfg);
  const BlockId a = r.mgr->create(desc("a", bytes / 4)), b = r.mgr->create(desc("b", bytes / 4));
  BlockDesc td = desc("scratch", bytes / 4);
  td.transient = true;
  const BlockId t = r.mgr->create(td);
  for (std::uint64_t gen = 1; gen <= 2; ++gen) {
    r.mgr->set_commit_record("step " + std::to_string(gen));
    write_pattern(*r.mgr, a, gen);
    if (gen == 1) write_pattern(*r.mgr, b, 7);  // unchanged by the commit undone
    r.mgr->commit();
  }
  write_pattern(*r.mgr, a, 3);  // changed since the commit: refused
  try {
    r.mgr->roll_back_generation();
    FAIL() << "rolled back over a change";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("'a' was changed"), std::string::npos) << e.what();
  }
  r.mgr->discard();
  write_pattern(*r.mgr, t, 5);
  {
    BlockView v = r.mgr->acquire(t, Tier::host);  // a transient view is not in the way
    r.mgr->evict(a, Tier::host);
    r.mgr->prefetch(a, Tier::host);  // read-ahead of generation 2, maybe still in flight
    r.mgr->prefetch(b, Tier::host);
    ASSERT_TRUE(r.mgr->roll_back_generation());
    r.mgr->release(v, false);
  }
  EXPECT_EQ(r.mgr->commit_record(), "step 1");
  expect_pattern(*r.mgr, a, 1);
  expect_pattern(*r.mgr, b, 7);
  expect_pattern(*r.mgr, t, 5);
  EXPECT_FALSE(r.mgr->roll_back_generation());  // once
  r.reopen(cfg);
  EXPECT_EQ(r.mgr->commit_record(), "step 1");
  expect_pattern(*r.mgr, *r.mgr->find("a"), 1);
  expect_pattern(*r.mgr, *r.mgr->find("b"), 7);
}

// small_config() of four `bytes` blocks with shadow slots and every commit synced.
TierConfig durable_shadow_config(std::uint64_t bytes) {
  TierConfig cfg = small_config(bytes, 4);
  cfg.shadow_slots = true;
  cfg.durable = true;
  return cfg;
}

// What `f` throws while every directory sync fails with EIO (after a manifest's rename).
template <class F>
std::string error_with_failing_directory_sync(F&& f) {
  const auto before = detail::replace_directory_sync([](const std::filesystem::path& d) {
    throw std::system_error(EIO, std::system_category(), "fsync directory " + d.string());
  });
  std::string why = test::error_of(std::forward<F>(f));
  detail::replace_directory_sync(before);
  return why;
}

// A commit whose directory sync fails after its manifest was renamed into place throws, and the
// manifest's earlier state is put back: the caller keeps the earlier generation and may overwrite
// the slots the failed commit named, so a crash after that must not find them named (it found
// checksum mismatches before). Also for the first commit, which had no manifest to replace.
TEST(TierManager, ACommitWhoseDirectorySyncFailsLeavesTheEarlierGenerationOnDisk) {
  const std::uint64_t bytes = 64 * kKiB;
  const TierConfig cfg = durable_shadow_config(bytes);
  Rig r(cfg);
  const BlockId a = r.mgr->create(desc("a", bytes / 4));
  const auto manifest = r.dir.path() / std::string(detail::kManifestName);
  const auto commit_failing_sync = [&](std::uint64_t seed) {
    write_pattern(*r.mgr, a, seed);
    const std::string why = error_with_failing_directory_sync([&] { r.mgr->commit(); });
    EXPECT_NE(why.find("fsync directory"), std::string::npos) << why;
    EXPECT_NE(why.find("earlier state was put back"), std::string::npos) << why;
  };
  commit_failing_sync(1);
  EXPECT_FALSE(std::filesystem::exists(manifest));
  EXPECT_EQ(r.mgr->committed_generation(), 0u);
  r.mgr->set_commit_record("step 1");
  write_pattern(*r.mgr, a, 2);
  r.mgr->commit();
  commit_failing_sync(3);
  EXPECT_EQ(r.mgr->committed_generation(), 1u);
  write_pattern(*r.mgr, a, 4);  // into the slot the failed commit named
  r.mgr->flush();
  r.reopen(cfg);  // as after a crash here
  EXPECT_EQ(r.mgr->committed_generation(), 1u);
  EXPECT_EQ(r.mgr->commit_record(), "step 1");
  expect_pattern(*r.mgr, *r.mgr->find("a"), 2);
}

// A roll-back whose manifest write fails (its directory sync, after the rename) throws and
// changes nothing: the generation it would have undone stays committed, in memory (record,
// generation, the blocks' data) and on disk, and the roll-back can be tried again. Before, the
// blocks and the record stepped back in memory first, so memory and disk disagreed.
TEST(TierManager, ARollBackWhoseManifestWriteFailsLeavesTheCommittedGenerationAsItWas) {
  const std::uint64_t bytes = 64 * kKiB;
  const TierConfig cfg = durable_shadow_config(bytes);
  Rig r(cfg);
  const BlockId a = r.mgr->create(desc("a", bytes / 4));
  for (std::uint64_t gen = 1; gen <= 2; ++gen) {
    r.mgr->set_commit_record("step " + std::to_string(gen));
    write_pattern(*r.mgr, a, gen);
    r.mgr->commit();
  }
  const std::string why = error_with_failing_directory_sync([&] { r.mgr->roll_back_generation(); });
  EXPECT_NE(why.find("earlier state was put back"), std::string::npos) << why;
  EXPECT_EQ(r.mgr->committed_generation(), 2u);
  EXPECT_EQ(r.mgr->commit_record(), "step 2");
  expect_pattern(*r.mgr, a, 2);
  r.reopen(cfg);  // as after a crash here: the disk says the same
  EXPECT_EQ(r.mgr->commit_record(), "step 2");
  expect_pattern(*r.mgr, *r.mgr->find("a"), 2);
  ASSERT_TRUE(r.mgr->roll_back_generation());  // tried again, it takes
  EXPECT_EQ(r.mgr->commit_record(), "step 1");
  expect_pattern(*r.mgr, *r.mgr->find("a"), 1);
  r.reopen(cfg);
  EXPECT_EQ(r.mgr->commit_record(), "step 1");
  expect_pattern(*r.mgr, *r.mgr->find("a"), 1);
}

TEST(TierManager, MisuseIsRejectedWithClearErrors) {
  const std::uint64_t bytes = 64 * kKiB;
  Rig r(small_config(bytes, 8));
  const BlockId a = r.mgr->create(desc("a", 100));
  EXPECT_THROW(r.mgr->create(desc("a", 100)), std::invalid_argument);
  EXPECT_THROW(r.mgr->create(desc("", 100)), std::invalid_argument);
  EXPECT_THROW(r.mgr->create(desc("zero", 0)), std::invalid_argument);
  EXPECT_THROW(r.mgr->create(desc(std::string("bad\nname"), 4)), std::invalid_argument);
  EXPECT_THROW(r.mgr->acquire(a, Tier::nvme), std::invalid_argument);
  EXPECT_THROW(r.mgr->acquire(a, Tier::device), std::invalid_argument);  // no device tier
  EXPECT_THROW(r.mgr->acquire(99, Tier::host), std::invalid_argument);
  {
    BlockView w = r.mgr->acquire(a, Tier::host, Access::write);
    EXPECT_THROW(r.mgr->acquire(a, Tier::host, Access::write), std::logic_error);
    EXPECT_THROW(r.mgr->acquire(a, Tier::host), std::logic_error);
    EXPECT_THROW(r.mgr->evict(a, Tier::host), std::logic_error);
    EXPECT_THROW(r.mgr->commit(), std::logic_error);
  }
  {
    BlockView v = r.mgr->acquire(a, Tier::host);
    EXPECT_THROW(r.mgr->release(v, true), std::logic_error);
    EXPECT_THROW(r.mgr->acquire(a, Tier::host, Access::write), std::logic_error);
    EXPECT_THROW(r.mgr->discard(), std::logic_error);
  }
  BlockView empty;
  EXPECT_THROW(r.mgr->release(empty, false), std::logic_error);
  EXPECT_THROW(TierConfig::from_json(R"({"host_budget": "1GiB", "bogus": 1})"),
               std::invalid_argument);
  EXPECT_THROW(TierConfig::from_json(R"({"device_mode": "simulated"})"), std::invalid_argument);
  EXPECT_EQ(TierConfig::from_json(R"({"host_budget": "2MiB", "lookahead": 4})").host_budget,
            2u << 20);
}

TEST(TierManager, ThePrefetchQueueServesAcquiresAhead) {
  const std::uint64_t bytes = 256 * kKiB;
  TierConfig cfg = small_config(bytes, 4);
  cfg.lookahead = 2;
  Rig r(cfg);
  std::vector<BlockId> ids;
  for (int i = 0; i < 12; ++i) {
    ids.push_back(r.mgr->create(desc("p" + std::to_string(i), bytes / 4)));
    BlockView v = r.mgr->acquire(ids.back(), Tier::host, Access::write);
    fill(v, 500 + i);
    r.mgr->release(v, true);
  }
  r.mgr->commit();
  for (BlockId id : ids) r.mgr->evict(id, Tier::host);
  // Streaming with look-ahead 2, through a budget of 4 blocks.
  r.mgr->prefetch(ids[0], Tier::host);
  r.mgr->prefetch(ids[1], Tier::host);
  for (int i = 0; i < 12; ++i) {
    if (i + 2 < 12) r.mgr->prefetch(ids[i + 2], Tier::host);
    expect_pattern(*r.mgr, ids[i], 500 + i);
  }
  const auto c = r.mgr->counters();
  EXPECT_GE(c.prefetch_hits, 10u);
  EXPECT_LE(c.prefetch_misses, 2u);
}

// Three blocks under a budget of two: put() writes one; the third, written last, makes one of
// the first two go, and expect_third_evicts(gone) checks which (the other is not read again).
struct TwoOfThree {
  static constexpr std::uint64_t kBytes = 256 * kKiB;
  Rig r{small_config(kBytes, 2)};
  std::vector<BlockId> ids;
  TwoOfThree() {
    for (int i = 0; i < 3; ++i)
      ids.push_back(r.mgr->create(desc("b" + std::to_string(i), kBytes / 4)));
  }
  void put(int i) {
    BlockView v = r.mgr->acquire(ids[i], Tier::host, Access::write);
    fill(v, 700 + i);
    r.mgr->release(v, true);
  }
  std::uint64_t reads() const { return r.mgr->counters().bytes_out[static_cast<int>(Tier::nvme)]; }
  void expect_third_evicts(int gone) {
    const int kept = 1 - gone;
    const std::uint64_t read0 = reads();
    put(2);
    expect_pattern(*r.mgr, ids[kept], 700 + kept);
    EXPECT_EQ(reads(), read0) << "b" << kept << " stayed";
    expect_pattern(*r.mgr, ids[gone], 700 + gone);
    EXPECT_EQ(reads(), read0 + kBytes) << "b" << gone << " went and is read back";
  }
};

// A prefetch of a copy already in host memory reads nothing and counts it as just used: the LRU
// eviction takes another one first (the optimizer's read-ahead keeps the state it will step next).
TEST(TierManager, APrefetchOfAResidentCopyKeepsItUnderEviction) {
  TwoOfThree t;
  t.put(0);
  t.put(1);
  t.r.mgr->commit();  // both clean; b0 is the least recently used
  const std::uint64_t read0 = t.reads();
  t.r.mgr->prefetch(t.ids[0], Tier::host);
  EXPECT_EQ(t.reads(), read0) << "a resident copy is not read again";
  t.expect_third_evicts(1);
}

// Copies written back go before any other, in the order they were written back (not by block
// id): a caller that steps its blocks backwards keeps the ones it finished last.
TEST(TierManager, WrittenBackCopiesGoInTheOrderTheyWereWrittenBack) {
  TwoOfThree t;
  for (int i : {1, 0}) {  // b1 finished (and written back) first, then b0
    t.put(i);
    t.r.mgr->write_back(t.ids[i]);
  }
  t.r.mgr->commit();
  t.expect_third_evicts(1);
}

TEST(TierManager, ManyThreadsOverThreeTiersWithTinyBudgets) {
  const std::uint64_t bytes = 64 * kKiB;
  constexpr int kThreads = 6, kOwn = 3, kShared = 4;
  TierConfig cfg = small_config(bytes, 10, 7);
  cfg.max_dirty_bytes = bytes;
  Rig r(cfg);
  // Every block's content is pattern(seed) with the seed in its first 8 bytes, so a reader can
  // tell a consistent copy from a torn or stale one.
  auto write_version = [&](BlockId id, std::uint64_t seed, Tier t, Access how = Access::write) {
    BlockView v = r.mgr->acquire(id, t, how);
    test::fill_pattern(v.data() + 8, v.bytes() - 8, seed, 8);
    std::memcpy(v.data(), &seed, 8);
    r.mgr->release(v, true);
  };
  auto check = [&](BlockId id, Tier t, std::uint64_t expect) {
    BlockView v = r.mgr->acquire(id, t);
    std::uint64_t seed = 0;
    std::memcpy(&seed, v.data(), 8);
    EXPECT_EQ(seed, expect) << r.mgr->desc(id).name;
    EXPECT_EQ(test::first_mismatch(v.data() + 8, v.bytes() - 8, seed, 8), -1)
        << r.mgr->desc(id).name;
  };
  std::vector<BlockId> shared;
  for (int i = 0; i < kShared; ++i) {
    shared.push_back(r.mgr->create(desc("shared" + std::to_string(i), bytes / 4)));
    write_version(shared.back(), 9000 + i, Tier::host);
  }
  std::vector<std::vector<BlockId>> own(kThreads);
  for (int t = 0; t < kThreads; ++t)
    for (int k = 0; k < kOwn; ++k)
      own[t].push_back(r.mgr->create(desc("t" + std::to_string(t) + "." + std::to_string(k),
                                          bytes / 4, Dtype::f32, BlockClass::exp_avg, t)));
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t + 1);
      std::vector<std::uint64_t> version(kOwn, 0);
      try {
        for (int it = 0; it < 300; ++it) {
          const Tier tier = rng() % 3 == 0 ? Tier::device : Tier::host;
          const int k = static_cast<int>(rng() % kOwn);
          switch (rng() % 6) {
            case 0:
            case 1:
              version[k] = (static_cast<std::uint64_t>(t) << 32) | (it + 1);
              write_version(own[t][k], version[k], tier,
                            rng() % 2 ? Access::write : Access::overwrite);
              break;
            case 2:
              if (version[k] != 0) check(own[t][k], tier, version[k]);
              break;
            case 3: {
              const int i = static_cast<int>(rng() % kShared);
              check(shared[i], tier, 9000 + i);
              break;
            }
            case 4:
              r.mgr->prefetch(shared[rng() % kShared], Tier::host);
              r.mgr->prefetch(own[t][k], tier);
              break;
            case 5:
              r.mgr->evict(own[t][k], tier);
              break;
          }
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << "thread " << t << ": " << e.what();
        ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  for (auto& row : r.mgr->snapshot().tiers) EXPECT_LE(row.resident_bytes, row.capacity_bytes);
  r.mgr->flush();
  EXPECT_EQ(r.mgr->commit(), 1u);
}

// A child process writes generations (every block = pattern(generation)) and commits, durably;
// the parent kills it with SIGKILL at a random moment, reopens, and checks that it finds a
// complete committed generation with every checksum verified. 24 trials on one directory.
TEST(TierManagerCrash, KillNineAtRandomPointsLeavesTheLastCommittedGeneration) {
  const std::uint64_t bytes = 256 * kKiB;
  constexpr int kBlocks = 6, kTrials = 24;
  TierConfig cfg = small_config(bytes, 3);  // smaller than the blocks: eviction mid-generation
  cfg.durable = true;
  TempDir dir;
  {
    SwapSpaceConfig sc;
    sc.dirs = {dir.path()};
    sc.capacity = 16 << 20;
    SwapSpace::create(sc);
  }
  auto block_seed = [](std::uint64_t gen, int i) { return gen * 100 + static_cast<unsigned>(i); };
  std::mt19937 rng(2026);
  std::uint64_t last_seen = 0;
  int advanced = 0;
  for (int trial = 0; trial < kTrials; ++trial) {
    int progress[2];
    ASSERT_EQ(::pipe(progress), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // Child: no gtest here; any failure is an exit code. Reports each committed generation.
      ::close(progress[0]);
      try {
        SwapSpace space = SwapSpace::open({dir.path()});
        IoEngine engine(space);
        TierManager m(space, engine, cfg);
        std::vector<BlockId> ids;
        for (int i = 0; i < kBlocks; ++i) {
          const std::string name = "b" + std::to_string(i);
          auto id = m.find(name);
          ids.push_back(id ? *id : m.create(desc(name, bytes / 4)));
        }
        for (std::uint64_t gen = m.committed_generation() + 1;; ++gen) {
          for (int i = 0; i < kBlocks; ++i) {
            BlockView v = m.acquire(ids[i], Tier::host, Access::write);
            test::fill_pattern(v.data(), v.bytes(), block_seed(gen, i), 0);
            m.release(v, true);
          }
          if (m.commit() != gen) ::_exit(3);
          if (::write(progress[1], &gen, sizeof gen) != sizeof gen) ::_exit(4);
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child: %s\n", e.what());
        ::_exit(2);
      }
    }
    ::close(progress[1]);
    // Let the child commit at least one new generation (slow machines, sanitizers), then kill it
    // at a random moment of whatever it is doing next.
    std::uint64_t reported = 0;
    while (reported <= last_seen) {
      std::uint64_t g = 0;
      const ssize_t n = ::read(progress[0], &g, sizeof g);
      if (n != static_cast<ssize_t>(sizeof g)) break;  // the child died: checked below
      reported = g;
    }
    ::close(progress[0]);
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 60000));
    ::kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "child exited early with status " << WEXITSTATUS(status);
    // Reopen: a consistent generation, every block at exactly that generation's content.
    SwapSpace space = SwapSpace::open({dir.path()});
    IoEngine engine(space);
    TierManager m(space, engine, cfg);  // verifies every committed block's checksum
    const std::uint64_t g = m.committed_generation();
    EXPECT_TRUE(m.snapshot().checksums_verified);
    EXPECT_GE(g, reported) << "trial " << trial << ": a reported commit was lost";
    if (g > last_seen) ++advanced;
    last_seen = g;
    for (int i = 0; i < kBlocks && g > 0; ++i) {
      const auto id = m.find("b" + std::to_string(i));
      ASSERT_TRUE(id.has_value());
      BlockView v = m.acquire(*id, Tier::host);
      ASSERT_EQ(test::first_mismatch(v.data(), v.bytes(), block_seed(g, i), 0), -1)
          << "trial " << trial << " generation " << g << " block " << i;
    }
  }
  EXPECT_EQ(advanced, kTrials);
}

TEST(Telemetry, ALiveManagerServesItsSnapshotOnAPrivateSocket) {
  TempDir runtime;
  TierConfig cfg = small_config(64 * kKiB, 4, 2);
  cfg.telemetry = true;
  const test::ScopedEnv dir("TIERSWAP_RUNTIME_DIR", (runtime.path() / "rt").c_str());
  Rig r(cfg);
  r.mgr->create(desc("served", 1000, Dtype::bf16, BlockClass::grad16, 2));
  const auto sock = r.mgr->telemetry_socket();
  ASSERT_FALSE(sock.empty());
  struct stat st {};
  ASSERT_EQ(::stat(sock.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat(sock.parent_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  const auto j = nlohmann::json::parse(query_telemetry(sock));
  EXPECT_EQ(j.at("pid").get<int>(), ::getpid());
  EXPECT_TRUE(j.at("simulated_device").get<bool>());
  EXPECT_EQ(j.at("tiers").size(), 3u);
  for (const char* k :
       {"tier", "capacity_bytes", "resident_bytes", "dirty_bytes", "inflight_bytes"})
    EXPECT_TRUE(j.at("tiers").at(1).contains(k)) << k;
  EXPECT_TRUE(j.at("generation").contains("committed"));
  EXPECT_TRUE(j.at("generation").contains("checksums_verified"));
  EXPECT_TRUE(j.at("counters").is_object());
  EXPECT_EQ(j.at("subgroups").at(0).at("blocks").at(0).at("name"), "served");
  const auto live = list_live_processes(sock.parent_path());
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0].pid, ::getpid());
  EXPECT_NE(live[0].command.find("test_tier_manager"), std::string::npos);
  r.mgr.reset();
  EXPECT_FALSE(std::filesystem::exists(sock));  // removed on shutdown
}

// Two tier managers in one process (two optimizers: a GAN's) share its socket: both answer, in
// the order they were made, and the socket stays until the last one goes.
TEST(Telemetry, ServersOfOneProcessShareItsSocketUntilTheLastGoes) {
  TempDir runtime;
  TelemetryConfig tc;
  tc.runtime_dir = runtime.path() / "run";
  auto first = std::make_unique<TelemetryServer>([] { return std::string(R"({"n": 1})"); }, tc);
  auto second = std::make_unique<TelemetryServer>(
      []() -> std::string { throw std::runtime_error(R"(a "quoted" failure)"); }, tc);
  const auto sock = first->socket_path();
  EXPECT_EQ(second->socket_path(), sock);
  auto j = nlohmann::json::parse(query_telemetry(sock));
  EXPECT_EQ(j.at("pid").get<int>(), ::getpid());
  ASSERT_EQ(j.at("sources").size(), 2u) << j.dump();
  EXPECT_EQ(j.at("sources")[0].at("n"), 1);
  EXPECT_EQ(j.at("sources")[1].at("error"), R"(a "quoted" failure)");
  first.reset();  // the other still answers, alone: its document as a single server's
  ASSERT_TRUE(std::filesystem::exists(sock));
  j = nlohmann::json::parse(query_telemetry(sock));
  EXPECT_FALSE(j.contains("sources")) << j.dump();
  EXPECT_EQ(j.at("error"), R"(a "quoted" failure)");
  ASSERT_EQ(list_live_processes(sock.parent_path()).size(), 1u);
  second.reset();
  EXPECT_FALSE(std::filesystem::exists(sock));
  TelemetryServer again([] { return std::string(R"({"n": 3})"); }, tc);  // a new one binds it
  EXPECT_EQ(nlohmann::json::parse(query_telemetry(sock)).at("n"), 3);
}

TEST(Telemetry, AnUnsafeRuntimeDirectoryIsRefused) {
  TempDir runtime;
  const auto dir = runtime.path() / "open";
  std::filesystem::create_directory(dir);
  ::chmod(dir.c_str(), 0777);
  TelemetryConfig tc;
  tc.runtime_dir = dir;
  try {
    TelemetryServer s([] { return std::string("{}"); }, tc);
    ADD_FAILURE() << "served from a world-writable directory";
  } catch (const std::system_error& e) {
    EXPECT_NE(std::string(e.what()).find("writable by group or others"), std::string::npos)
        << e.what();
  }
  // A stale socket of a dead process is cleaned up, not listed.
  ::chmod(dir.c_str(), 0700);
  std::ofstream(dir / "999999999.sock") << "";
  EXPECT_TRUE(list_live_processes(dir).empty());
  EXPECT_FALSE(std::filesystem::exists(dir / "999999999.sock"));
}

// A relative TIERSWAP_RUNTIME_DIR would put the socket under the working directory, where
// `tierswap residency` run from anywhere else never finds it: refused, nothing created. A
// relative XDG_RUNTIME_DIR is ignored, as the XDG specification says.
TEST(Telemetry, ARelativeRuntimeDirectoryIsRefusedOrIgnored) {
  TempDir cwd;
  const auto old = std::filesystem::current_path();
  std::filesystem::current_path(cwd.path());
  {
    const test::ScopedEnv rel("TIERSWAP_RUNTIME_DIR", "rt");
    for (auto* call :
         {+[] { (void)default_runtime_dir(); }, +[] { (void)TelemetryConfig::from_env(); }})
      try {
        call();
        ADD_FAILURE() << "a relative TIERSWAP_RUNTIME_DIR was taken";
      } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("TIERSWAP_RUNTIME_DIR=rt: expected an absolute path"),
                  std::string::npos)
            << e.what();
      }
  }
  {
    const test::ScopedEnv unset("TIERSWAP_RUNTIME_DIR", "");
    const test::ScopedEnv xdg("XDG_RUNTIME_DIR", "xdg");
    EXPECT_EQ(default_runtime_dir(),
              std::filesystem::path("/tmp/tierswap-" + std::to_string(::getuid())));
  }
  EXPECT_TRUE(std::filesystem::is_empty(cwd.path()));
  std::filesystem::current_path(old);
}

// A socket that accepts but never answers (a node service's, or a stopped process's): the
// query ends at its deadline with ETIMEDOUT, naming the socket and the pid that listens there,
// instead of waiting forever.
TEST(Telemetry, ASocketThatNeverAnswersTimesOutNamingWhoListens) {
  TempDir d;
  const auto path = d.path() / "silent.sock";
  const int lfd = test::listening_socket(path);  // nothing is ever sent on it
  try {
    (void)query_telemetry(path, 0.2);
    ADD_FAILURE() << "a silent socket gave a snapshot";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code().value(), ETIMEDOUT);
    const std::string w = e.what();
    EXPECT_NE(w.find("no snapshot from " + path.string() + " within 0.2 s"), std::string::npos)
        << w;
    EXPECT_NE(w.find("not a tierswap telemetry socket (a node service's socket?): process " +
                     std::to_string(::getpid()) + " listens there"),
              std::string::npos)
        << w;
  }
  EXPECT_THROW((void)query_telemetry(path, 0), std::invalid_argument);
  ::close(lfd);
}

// A live process stopped (SIGSTOP, a debugger) accepts on its telemetry socket and answers
// nothing: the query says so at its deadline.
TEST(Telemetry, AStoppedProcessIsSaidToBeStopped) {
  TempDir d;
  const auto path = d.path() / "listener.sock";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    (void)test::listening_socket(path);
    ::raise(SIGSTOP);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, WUNTRACED), child);
  ASSERT_TRUE(WIFSTOPPED(status));
  try {
    (void)query_telemetry(path, 0.2);
    ADD_FAILURE() << "a stopped process gave a snapshot";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code().value(), ETIMEDOUT);
    EXPECT_NE(std::string(e.what()).find("process " + std::to_string(child) +
                                         " is stopped (SIGSTOP or a debugger)"),
              std::string::npos)
        << e.what();
  }
  ::kill(child, SIGKILL);
  ::waitpid(child, &status, 0);
}

TEST(TierManager, OverwriteViewsReadNothingAndKeepTheOldDataWhenReleasedClean) {
  const std::uint64_t bytes = 64 * kKiB;
  Rig r(small_config(bytes, 4, 2));
  const BlockId a = r.mgr->create(desc("a", bytes / 4));
  {
    BlockView v = r.mgr->acquire(a, Tier::host, Access::write);
    fill(v, 1);
    r.mgr->release(v, true);
  }
  r.mgr->commit();
  r.mgr->evict(a, Tier::host);
  const int nv = static_cast<int>(Tier::nvme);
  const auto before = r.mgr->counters().bytes_out[nv];
  {
    BlockView v = r.mgr->acquire(a, Tier::host, Access::overwrite);
    EXPECT_TRUE(v.writable());
    EXPECT_THROW(r.mgr->acquire(a, Tier::host), std::logic_error);
    fill(v, 2);
    r.mgr->release(v, true);
  }
  EXPECT_EQ(r.mgr->counters().bytes_out[nv], before) << "overwrite read the old data";
  expect_pattern(*r.mgr, a, 2);
  // Released clean (here: destroyed), a fresh overwrite copy is dropped: the old data stays.
  r.mgr->flush();
  r.mgr->evict(a, Tier::host);
  { BlockView v = r.mgr->acquire(a, Tier::device, Access::overwrite); }
  EXPECT_EQ(r.mgr->snapshot().blocks[0].state[0], CopyState::absent);
  expect_pattern(*r.mgr, a, 2, Tier::device);
  // In place over an existing copy, as write.
  {
    BlockView v = r.mgr->acquire(a, Tier::device, Access::overwrite);
    fill(v, 3);
    r.mgr->release(v, true);
  }
  expect_pattern(*r.mgr, a, 3, Tier::host);
}

// Transient blocks (gradients): never written behind or by commit(), untouched by discard(),
// spilled only under memory pressure, gone after reopening; trim() empties a block.
// Memory-only blocks: transient, and never spilled: under pressure the other blocks go, the
// memory-only one is never written to NVMe nor read back, commit/discard leave it alone, an
// explicit evict is refused, and a budget full of memory-only blocks is a clear error.
TEST(TierManager, MemoryOnlyBlocksNeverLeaveHostMemory) {
  const std::uint64_t n = 4096;  // 16 KiB blocks
  TierConfig cfg = small_config(16 * kKiB, 3);
  Rig r(cfg);
  BlockDesc md = desc("state", n);
  md.memory_only = true;
  const BlockId s = r.mgr->create(md);
  EXPECT_TRUE(r.mgr->desc(s).transient);
  {
    BlockView v = r.mgr->acquire(s, Tier::host, Access::overwrite);
    fill(v, 7);
    r.mgr->release(v, true);
  }
  r.mgr->commit();
  std::vector<BlockId> others;
  for (int round = 0; round < 3; ++round)
    for (int i = 0; i < 4; ++i) {
      if (round == 0) others.push_back(r.mgr->create(desc("o" + std::to_string(i), n)));
      BlockView v = r.mgr->acquire(others[i], Tier::host, Access::write);
      fill(v, 100 + i);
      r.mgr->release(v, true);
    }
  const auto c = r.mgr->counters();
  // Four persistent blocks through two free slots: they spill and come back; the memory-only
  // block stays (nothing of it read or written), so NVMe traffic is whole persistent blocks.
  EXPECT_GT(c.evictions, 0u);
  EXPECT_EQ(c.bytes_in[static_cast<int>(Tier::nvme)] % (16 * kKiB), 0u);
  expect_pattern(*r.mgr, s, 7);
  for (int i = 0; i < 4; ++i) expect_pattern(*r.mgr, others[i], 100 + i);
  const auto nvme_out = r.mgr->counters().bytes_out[static_cast<int>(Tier::nvme)];
  expect_pattern(*r.mgr, s, 7);  // resident: no read
  EXPECT_EQ(r.mgr->counters().bytes_out[static_cast<int>(Tier::nvme)], nvme_out);
  EXPECT_THROW(r.mgr->evict(s, Tier::host), std::logic_error);
  r.mgr->commit();
  {
    BlockView v = r.mgr->acquire(s, Tier::host, Access::write);
    fill(v, 8);
    r.mgr->release(v, true);
  }
  r.mgr->discard();  // not part of generations: the new contents stay
  expect_pattern(*r.mgr, s, 8);
  // Three memory-only blocks fill a three-block budget: a fourth block cannot come in.
  std::vector<BlockId> mo;
  for (int i = 0; i < 2; ++i) {
    BlockDesc d = desc("m" + std::to_string(i), n);
    d.memory_only = true;
    mo.push_back(r.mgr->create(d));
    BlockView v = r.mgr->acquire(mo.back(), Tier::host, Access::overwrite);
    r.mgr->release(v, true);
  }
  EXPECT_THROW(r.mgr->acquire(others[0], Tier::host), std::runtime_error);
  r.mgr->trim(mo[0]);  // trim frees it
  expect_pattern(*r.mgr, others[0], 100);
  r.mgr->commit();
  const auto info = read_manifest(r.mgr->manifest_path());
  for (const auto& b : info.blocks)
    if (b.name == "state") EXPECT_TRUE(b.memory_only && b.transient && !b.has_data);
}

// A memory-only block written in host memory and then copied up to the device tier (as the
// optimizer's initialization leaves GPU-resident state) has two copies of the same data: its
// host copy gives way to other blocks under the host budget and the device copy carries the
// data; likewise its device copy, written there, gives way under the device budget to a host
// copy. Neither is ever the last copy dropped, nor written to NVMe.
TEST(TierManager, AMemoryOnlyBlocksCopyGivesWayWhenTheOtherTierHoldsTheSameData) {
  const std::uint64_t n = 4096;  // 16 KiB blocks
  Rig r(small_config(16 * kKiB, 3, 3));
  std::vector<BlockId> mo;
  for (int i = 0; i < 3; ++i) {  // fill the host budget, each block copied up
    BlockDesc d = desc("m" + std::to_string(i), n);
    d.memory_only = true;
    mo.push_back(r.mgr->create(d));
    BlockView v = r.mgr->acquire(mo[i], Tier::host, Access::overwrite);
    fill(v, 20 + i);
    r.mgr->release(v, true);
    BlockView up = r.mgr->acquire(mo[i], Tier::device);
    r.mgr->release(up, false);
  }
  const BlockId o = r.mgr->create(desc("o", n));
  {
    BlockView v = r.mgr->acquire(o, Tier::host, Access::overwrite);  // a host copy must go
    fill(v, 30);
    r.mgr->release(v, true);
  }
  const int dev = static_cast<int>(Tier::device);
  const auto before = r.mgr->counters();
  EXPECT_GT(before.evictions, 0u);
  for (int i = 0; i < 3; ++i) expect_pattern(*r.mgr, mo[i], 20 + i, Tier::device);
  EXPECT_EQ(r.mgr->counters().bytes_in[dev], before.bytes_in[dev]) << "nothing copied up again";
  // Written on the device (its host copy dropped), then read in host memory: under the device
  // budget a device copy gives way, the dirty one's mark going with its data to the host copy.
  {
    BlockView v = r.mgr->acquire(mo[0], Tier::device, Access::write);
    fill(v, 40);
    r.mgr->release(v, true);
  }
  expect_pattern(*r.mgr, mo[0], 40);  // copied down
  const auto mid = r.mgr->counters();
  BlockDesc gd = desc("g", n);
  gd.memory_only = true;
  const BlockId g = r.mgr->create(gd);
  {
    BlockView v = r.mgr->acquire(g, Tier::device, Access::overwrite);
    fill(v, 50);
    r.mgr->release(v, true);
  }
  EXPECT_GT(r.mgr->counters().evictions, mid.evictions);
  for (int i = 0; i < 3; ++i) expect_pattern(*r.mgr, mo[i], i == 0 ? 40 : 20 + i);
  expect_pattern(*r.mgr, g, 50, Tier::device);
  expect_pattern(*r.mgr, o, 30);
  EXPECT_EQ(r.mgr->counters().bytes_in[static_cast<int>(Tier::nvme)], 16 * kKiB)
      << "only the ordinary block reached NVMe";
}

// Memory-only blocks take no NVMe extents: a swap space with room for two ordinary 16 KiB blocks
// (two shadow slots each) holds them beside any number of memory-only ones, and the manifest
// lists none for them, reopens, and reads them as zeros (a crash loses memory-only data).
TEST(TierManager, MemoryOnlyBlocksTakeNoNvmeSpace) {
  const std::uint64_t n = 4096;  // 16 KiB blocks
  TierConfig cfg = small_config(16 * kKiB, 8);
  Rig r(cfg, 1 << 20);  // 1 MiB: 32 ordinary blocks (two 16 KiB shadow slots each)
  std::vector<BlockId> mo;
  for (int i = 0; i < 200; ++i) {  // 6.25 MiB of slots, had they any
    BlockDesc d = desc("m" + std::to_string(i), n);
    d.memory_only = true;
    mo.push_back(r.mgr->create(d));
  }
  for (int i = 0; i < 6; ++i) {
    BlockView v = r.mgr->acquire(mo[i], Tier::host, Access::overwrite);
    fill(v, 10 + i);
    r.mgr->release(v, true);
  }
  std::vector<BlockId> ord;
  try {
    for (int i = 0; i < 64; ++i) ord.push_back(r.mgr->create(desc("o" + std::to_string(i), n)));
    ADD_FAILURE() << "64 ordinary blocks fit a 1 MiB space";
  } catch (const std::runtime_error&) {
  }
  EXPECT_GE(ord.size(), 30u);  // the space is the ordinary blocks', whole
  {
    BlockView v = r.mgr->acquire(ord[0], Tier::host, Access::overwrite);
    fill(v, 50);
    r.mgr->release(v, true);
  }
  r.mgr->commit();
  for (int i = 0; i < 6; ++i) expect_pattern(*r.mgr, mo[i], 10 + i);
  const auto info = read_manifest(r.mgr->manifest_path());
  std::size_t listed = 0;
  for (const auto& blk : info.blocks)
    if (blk.memory_only) {
      ++listed;
      EXPECT_TRUE(blk.slots.empty()) << blk.name;
    }
  EXPECT_EQ(listed, mo.size());
  r.reopen(cfg);
  expect_pattern(*r.mgr, ord[0], 50);
  const auto id = r.mgr->find("m0");
  ASSERT_TRUE(id.has_value());
  BlockView v = r.mgr->acquire(*id, Tier::host);
  EXPECT_TRUE(
      std::all_of(v.data(), v.data() + v.bytes(), [](std::byte x) { return x == std::byte{0}; }));
  r.mgr->release(v, false);
}

TEST(TierManager, TransientBlocksStayOutOfGenerations) {
  const std::uint64_t n = 4096;  // 16 KiB blocks
  TierConfig cfg = small_config(16 * kKiB, 3);
  cfg.max_dirty_bytes = 0;  // any dirty persistent block is written behind at once
  Rig r(cfg);
  BlockDesc gd = desc("grad", n, Dtype::f32, BlockClass::grad16);
  gd.transient = true;
  const BlockId g = r.mgr->create(gd);
  const BlockId p = r.mgr->create(desc("p", n));
  {
    BlockView v = r.mgr->acquire(g, Tier::host, Access::overwrite);
    fill(v, 1);
    r.mgr->release(v, true);
  }
  {
    BlockView v = r.mgr->acquire(p, Tier::host, Access::overwrite);
    fill(v, 2);
    r.mgr->release(v, true);
  }
  r.mgr->commit();
  // Only the persistent block went to NVMe.
  EXPECT_EQ(r.mgr->counters().bytes_in[static_cast<int>(Tier::nvme)], 16 * kKiB);
  expect_pattern(*r.mgr, g, 1);
  r.mgr->discard();  // nothing changed since the commit: the gradient is still there
  expect_pattern(*r.mgr, g, 1);
  {
    BlockView v = r.mgr->acquire(p, Tier::host, Access::write);
    fill(v, 3);
    r.mgr->release(v, true);
  }
  r.mgr->discard();  // p goes back to the committed data; the transient block is untouched
  expect_pattern(*r.mgr, p, 2);
  expect_pattern(*r.mgr, g, 1);

  // Memory pressure spills the gradient to NVMe and brings it back intact.
  std::vector<BlockId> others;
  for (int i = 0; i < 3; ++i) {
    others.push_back(r.mgr->create(desc("o" + std::to_string(i), n)));
    BlockView v = r.mgr->acquire(others.back(), Tier::host, Access::overwrite);
    fill(v, 10 + i);
    r.mgr->release(v, true);
  }
  r.mgr->evict(g, Tier::host);
  expect_pattern(*r.mgr, g, 1);
  r.mgr->commit();
  expect_pattern(*r.mgr, g, 1);

  // trim(): zeros afterwards, no write.
  const auto before = r.mgr->counters().bytes_in[static_cast<int>(Tier::nvme)];
  r.mgr->trim(g);
  {
    BlockView v = r.mgr->acquire(g, Tier::host);
    EXPECT_TRUE(all_zero(v));
    EXPECT_THROW(r.mgr->trim(g), std::logic_error);  // it has a view
  }
  EXPECT_EQ(r.mgr->counters().bytes_in[static_cast<int>(Tier::nvme)], before);

  // A committed block trimmed, then discarded: its data is back; trimmed then committed: zeros.
  r.mgr->trim(p);
  {
    BlockView v = r.mgr->acquire(p, Tier::host);
    EXPECT_TRUE(all_zero(v));
  }
  r.mgr->discard();
  expect_pattern(*r.mgr, p, 2);
  {
    BlockView v = r.mgr->acquire(g, Tier::host, Access::overwrite);
    fill(v, 5);
    r.mgr->release(v, true);
  }
  r.mgr->trim(p);
  r.mgr->commit();
  r.reopen(cfg);
  const auto info = read_manifest(r.mgr->manifest_path());
  for (const auto& b : info.blocks) {
    if (b.name == "grad") EXPECT_TRUE(b.transient && !b.has_data);
    if (b.name == "p") EXPECT_FALSE(b.has_data);
  }
  BlockView v = r.mgr->acquire(*r.mgr->find("grad"), Tier::host);
  EXPECT_TRUE(all_zero(v));
  BlockView w = r.mgr->acquire(*r.mgr->find("p"), Tier::host);
  EXPECT_TRUE(all_zero(w));
}

// Pageable blocks (16-bit gradients waiting for a CPU step) live in a pool of their own beside
// the pinned budget: filling it evicts nothing pinned, filling the pinned budget evicts no
// pageable copy, each pool's peak stays within its budget, and a pageable copy that does not fit
// spills to NVMe and comes back intact.
TEST(TierManager, PageableBlocksUseTheirOwnBudgetAndSpillWhenItIsFull) {
  const std::uint64_t n = 4096;  // 16 KiB blocks
  TierConfig cfg = small_config(16 * kKiB, 2);
  cfg.pageable_budget = 2 * 16 * kKiB;
  Rig r(cfg);
  std::vector<BlockId> grads, states;
  for (int i = 0; i < 3; ++i) {
    BlockDesc gd = desc("grad" + std::to_string(i), n, Dtype::f32, BlockClass::grad16, i);
    gd.transient = gd.pageable = true;
    grads.push_back(r.mgr->create(gd));
    states.push_back(
        r.mgr->create(desc("state" + std::to_string(i), n, Dtype::f32, BlockClass::master, i)));
  }
  auto write = [&](BlockId id, std::uint64_t seed) {
    BlockView v = r.mgr->acquire(id, Tier::host, Access::overwrite);
    fill(v, seed);
    r.mgr->release(v, true);
  };
  write(states[0], 10);
  write(states[1], 11);
  const auto evictions = r.mgr->counters().evictions;
  write(grads[0], 20);
  write(grads[1], 21);
  EXPECT_EQ(r.mgr->counters().evictions, evictions) << "the gradients took pinned memory";
  const auto nvme_in = r.mgr->counters().bytes_in[static_cast<int>(Tier::nvme)];
  write(grads[2], 22);  // the pageable pool is full: one gradient spills to NVMe
  EXPECT_EQ(r.mgr->counters().bytes_in[static_cast<int>(Tier::nvme)], nvme_in + 16 * kKiB);
  write(states[2], 12);  // the pinned pool is full: a state block goes, no gradient
  for (int i = 0; i < 3; ++i) {
    expect_pattern(*r.mgr, grads[i], 20 + i);
    expect_pattern(*r.mgr, states[i], 10 + i);
  }
  const TierCounters c = r.mgr->counters();
  EXPECT_LE(c.peak_reserved_bytes[static_cast<int>(Tier::host)], cfg.host_budget);
  EXPECT_EQ(c.peak_pageable_bytes, cfg.pageable_budget);
  const auto snap = r.mgr->snapshot();  // the host row: pinned and pageable together
  EXPECT_EQ(snap.counters.peak_pageable_bytes, cfg.pageable_budget);
  EXPECT_EQ(snap.host_budget_bytes, cfg.host_budget);  // and each part on its own
  EXPECT_EQ(snap.pageable_budget_bytes, cfg.pageable_budget);
  const auto j = nlohmann::json::parse(snap.to_json());
  EXPECT_EQ(j.at("host_budget_bytes").get<std::uint64_t>(), cfg.host_budget);
  EXPECT_EQ(j.at("pageable_budget_bytes").get<std::uint64_t>(), cfg.pageable_budget);
  for (const auto& row : snap.tiers)
    if (row.tier == Tier::host) {
      EXPECT_EQ(row.capacity_bytes, cfg.host_budget + cfg.pageable_budget);
      EXPECT_LE(row.resident_bytes, row.capacity_bytes);
    }
  // Without a pageable pool the same blocks share the pinned budget, as before.
  TierConfig shared = small_config(16 * kKiB, 2);
  Rig r2(shared);
  BlockDesc gd = desc("grad", n, Dtype::f32, BlockClass::grad16);
  gd.transient = gd.pageable = true;
  const BlockId g = r2.mgr->create(gd);
  {
    BlockView v = r2.mgr->acquire(g, Tier::host, Access::overwrite);
    fill(v, 1);
    r2.mgr->release(v, true);
  }
  EXPECT_EQ(r2.mgr->counters().peak_pageable_bytes, 0u);
  EXPECT_EQ(r2.mgr->counters().peak_reserved_bytes[static_cast<int>(Tier::host)], 16 * kKiB);
}

// write_back(): the write starts at once, and the block is the first to go afterwards.
CopyState host_state(TierManager& m, const std::string& name) {
  for (const auto& row : m.snapshot().blocks)
    if (row.name == name) return row.state[static_cast<int>(Tier::host)];
  ADD_FAILURE() << "no block " << name;
  return CopyState::absent;
}

// A write-behind that fails with nobody waiting for it is finalized by the reaper: its copy stays
// dirty and its error is seen by no one. The commit writes such a copy again, and a commit whose
// rewrite fails too throws and commits nothing. (When the reaper finalized the failure while the
// commit was already past that block, the commit used to record the block's older data as the new
// generation's; that race is what the dense fault soak catches, test_fault_soak.cpp.)
TEST(TierManager, AWriteBehindThatFailedUnseenIsWrittenAgainByTheCommit) {
  const std::uint64_t bytes = 64 * kKiB;
  std::atomic<int> fail_writes{0};
  Rig r(small_config(bytes, 8), 64 << 20, [&](const detail::IoRequest& q, std::uint64_t) {
    if (q.op == IoOp::write && fail_writes.load() > 0) {
      --fail_writes;
      return detail::Fault{detail::Fault::Kind::error, EIO};
    }
    return detail::Fault{};
  });
  const BlockId a = r.mgr->create(desc("a", bytes / 4));
  const auto write_behind_failing = [&](int pattern, int failures) {
    {
      BlockView v = r.mgr->acquire(a, Tier::host, Access::write);
      fill(v, pattern);
      r.mgr->release(v, true);
    }
    fail_writes = failures;
    r.mgr->write_back(a);
    while (host_state(*r.mgr, "a") == CopyState::writing) std::this_thread::yield();
    ASSERT_EQ(host_state(*r.mgr, "a"), CopyState::dirty) << "the failed write leaves it dirty";
  };
  write_behind_failing(1, 1);
  EXPECT_EQ(r.mgr->commit(), 1u);  // written again: the fault was one request
  r.mgr->evict(a, Tier::host);
  expect_pattern(*r.mgr, a, 1);  // read back from NVMe: the committed data is the newest
  r.mgr->discard();
  expect_pattern(*r.mgr, a, 1);
  write_behind_failing(2, 1000);
  try {
    r.mgr->commit();
    ADD_FAILURE() << "a commit whose writes fail must throw";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code().value(), EIO) << e.what();
  }
  EXPECT_EQ(r.mgr->committed_generation(), 1u);
  fail_writes = 0;
  r.mgr->discard();
  expect_pattern(*r.mgr, a, 1);
  r.reopen(small_config(bytes, 8));
  expect_pattern(*r.mgr, a, 1);
}

TEST(TierManager, WriteBackStartsAtOnceAndDemotes) {
  const std::uint64_t n = 4096;
  TierConfig cfg = small_config(16 * kKiB, 2);
  cfg.max_dirty_bytes = 1 << 30;
  Rig r(cfg);
  const BlockId a = r.mgr->create(desc("a", n));
  const BlockId b = r.mgr->create(desc("b", n));
  const BlockId c = r.mgr->create(desc("c", n));
  for (auto [id, seed] : {std::pair{a, 1}, std::pair{b, 2}}) {
    BlockView v = r.mgr->acquire(id, Tier::host, Access::overwrite);
    fill(v, seed);
    r.mgr->release(v, true);
  }
  r.mgr->write_back(b);  // b is newer than a, but b is the one to make room
  {
    BlockView v = r.mgr->acquire(c, Tier::host, Access::overwrite);
    fill(v, 3);
    r.mgr->release(v, true);
  }
  const auto snap = r.mgr->snapshot();
  for (const auto& row : snap.blocks) {
    if (row.name == "a") EXPECT_EQ(row.state[static_cast<int>(Tier::host)], CopyState::dirty);
    if (row.name == "b") EXPECT_EQ(row.state[static_cast<int>(Tier::host)], CopyState::absent);
  }
  EXPECT_EQ(r.mgr->counters().bytes_in[static_cast<int>(Tier::nvme)], 16 * kKiB);
  expect_pattern(*r.mgr, b, 2);
}

// A constructor given a bad setting throws, naming it, and leaves no thread behind (before the
// fix, TIERSWAP_TELEMETRY=yes aborted the process: the reaper was running when it was parsed).
TEST(TierManager, ABadSettingThrowsFromTheConstructorInsteadOfAborting) {
  TempDir dir;
  SwapSpaceConfig sc;
  sc.dirs = {dir.path()};
  sc.capacity = 8 << 20;
  SwapSpace space = SwapSpace::create(sc);
  IoEngine engine(space);
  TierConfig cfg = small_config(64 * kKiB, 4);
  cfg.telemetry = true;
  {
    test::ScopedEnv bad("TIERSWAP_TELEMETRY", "yes");
    try {
      TierManager mgr(space, engine, cfg);
      ADD_FAILURE() << "TIERSWAP_TELEMETRY=yes accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("TIERSWAP_TELEMETRY"), std::string::npos) << e.what();
    }
  }
  TierManager ok(space, engine, cfg);  // and the next one starts normally
  EXPECT_EQ(ok.committed_generation(), 0u);
}

// A manifest rewritten with `recycle` keeps the file it replaces as the next write's ".tmp" (no
// commit frees disk blocks, whose discard a rename can wait for), cuts a longer recycled file to
// the new size, survives a ".old" left by a cut-off write, and is removed with its spare. Without
// `recycle` no spare is left.
TEST(Manifest, ARewriteRecyclesTheFileItReplacesInsteadOfFreeingIt) {
  TempDir d;
  const auto path = d.path() / "m";
  const std::string spare = path.string() + ".tmp", old = path.string() + ".old";
  auto ino = [](const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 ? st.st_ino : ino_t{0};
  };
  const std::string big(10000, 'b'), small(700, 's'), tiny = "t";
  detail::write_manifest_file(path, big, false, true);
  const ino_t first = ino(path.string());
  EXPECT_EQ(ino(spare), 0u);  // nothing replaced yet
  detail::write_manifest_file(path, small, true, true);
  const ino_t second = ino(path.string());
  EXPECT_NE(second, first);
  EXPECT_EQ(ino(spare), first);
  EXPECT_EQ(ino(old), 0u);
  EXPECT_EQ(detail::read_manifest_file(path), small);
  detail::write_manifest_file(path, tiny, false, true);  // into the 10 KB file: cut to size
  EXPECT_EQ(ino(path.string()), first);
  EXPECT_EQ(ino(spare), second);
  EXPECT_EQ(detail::read_manifest_file(path), tiny);
  std::ofstream(old) << "left by a write that was cut off";
  detail::write_manifest_file(path, big, false, true);
  EXPECT_EQ(detail::read_manifest_file(path), big);
  EXPECT_EQ(ino(old), 0u);
  EXPECT_EQ(ino(spare), first);
  detail::remove_manifest_file(path);
  EXPECT_TRUE(std::filesystem::is_empty(d.path()));
  detail::write_manifest_file(path, small, false);
  detail::write_manifest_file(path, tiny, false);
  EXPECT_EQ(detail::read_manifest_file(path), tiny);
  EXPECT_EQ(ino(spare), 0u);
}

// A manifest whose checksum is valid but whose fields disagree (sizes against slots and dtype,
// the two slots, names) is refused naming the block and the field, before anything reads data
// (before the fix a huge numel overflowed the size and verify_blocks read past its buffer).
TEST(TierManager, AConsistentChecksumIsNotConsistentFields) {
  const std::uint64_t bytes = 64 * kKiB;
  TierConfig cfg = small_config(bytes, 8);
  Rig r(cfg);
  for (const char* name : {"a", "b"}) {
    const BlockId id = r.mgr->create(desc(name, bytes / 4));
    BlockView v = r.mgr->acquire(id, Tier::host, Access::write);
    fill(v, 3);
    r.mgr->release(v, true);
  }
  r.mgr->commit();
  const auto path = r.mgr->manifest_path();
  r.mgr.reset();
  const auto good = nlohmann::json::parse(detail::read_manifest_file(path));
  auto expect_refused = [&](const std::function<void(nlohmann::json&)>& edit,
                            const std::string& needle) {
    nlohmann::json j = good;
    edit(j);
    detail::write_manifest_file(path, j.dump(), false);  // a valid checksum over it
    try {
      TierManager m(*r.space, *r.engine, cfg);
      ADD_FAILURE() << "opened a manifest with " << needle;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("block '"), std::string::npos) << e.what();
    }
  };
  expect_refused([](auto& j) { j["blocks"][0]["numel"] = std::uint64_t{1} << 62; }, "numel");
  expect_refused([](auto& j) { j["blocks"][0]["numel"] = std::uint64_t{1} << 20; }, "does not fit");
  expect_refused([](auto& j) { j["blocks"][1]["numel"] = 0; }, "numel is 0");
  expect_refused(
      [](auto& j) {
        j["blocks"][0]["slots"][1][1] =
            j["blocks"][0]["slots"][1][1].template get<std::uint64_t>() + 4096;
      },
      "slots of");
  expect_refused([](auto& j) { j["blocks"][0]["slots"][0][0] = UINT64_MAX - 10; }, "slot 0");
  expect_refused([](auto& j) { j["blocks"][1]["name"] = j["blocks"][0]["name"]; }, "twice");
  detail::write_manifest_file(path, good.dump(), false);
  EXPECT_NO_THROW(TierManager(*r.space, *r.engine, cfg));  // the original still opens
}

// Host slabs smaller than a huge page are carved in order from 2 MiB-aligned chunks (on
// transparent huge pages), never beyond the budget, and never overlap.
TEST(HostPool, SmallSlabsAreCarvedFromHugePageChunksWithinTheBudget) {
  if (!ProcessConfig::current().huge_pages)
    GTEST_SKIP() << "huge pages off (TIERSWAP_HUGE_PAGES=0)";
  constexpr std::uint64_t M = 1 << 20;
  detail::HostPool pool(8 * M, M, /*lock=*/false, /*numa_node=*/-1, /*engine=*/nullptr);
  std::byte* a = pool.try_allocate(M);
  std::byte* b = pool.try_allocate(M);
  std::byte* c = pool.try_allocate(5 * M);  // a slab of its own size, from the same chunk
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a) % (2 * M), 0u);
  EXPECT_EQ(b, a + M);
  EXPECT_EQ(c, a + 2 * M);
  EXPECT_EQ(pool.try_allocate(2 * M), nullptr);  // 7 MiB reserved: 2 more is over the budget
  std::byte* d = pool.try_allocate(M);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d, a + 7 * M);
  EXPECT_EQ(pool.reserved(), 8 * M);
  const std::pair<std::byte*, std::uint64_t> pieces[] = {{a, M}, {b, M}, {c, 5 * M}, {d, M}};
  for (std::size_t i = 0; i < 4; ++i) std::memset(pieces[i].first, int(i + 1), pieces[i].second);
  for (std::size_t i = 0; i < 4; ++i)
    for (std::uint64_t k = 0; k < pieces[i].second; k += 4096)
      ASSERT_EQ(pieces[i].first[k], std::byte(i + 1)) << i << " " << k;
  pool.free(b);
  EXPECT_EQ(pool.try_allocate(M), b);  // a freed piece is reused inside its slab
}

// Slabs made for pieces of odd sizes (a group's last sub-group is smaller) give their bytes back
// once empty when a larger piece needs the budget, smallest first and only as many as needed;
// when giving back every empty one would not make room, none goes. Pieces in use stay as they
// are, and the budget is never exceeded. For the host pool (ranges of huge-page chunks, given
// back to their chunk) and the simulated device pool (memory of their own).
TEST(HostPool, EmptySlabsOfOddSizesGiveTheirBytesBackWhenALargerPieceNeedsThem) {
  constexpr std::uint64_t K = 1024;
  const auto check = [&](detail::SlabPool& pool) {
    std::byte* x = pool.try_allocate(280 * K);  // each a slab of its own size (over 256 KiB)
    std::byte* y = pool.try_allocate(344 * K);
    std::byte* z = pool.try_allocate(256 * K);
    ASSERT_TRUE(x && y && z);
    std::memset(z, 0x5a, 256 * K);
    EXPECT_EQ(pool.reserved(), 880 * K);
    pool.free(x);
    pool.free(y);
    EXPECT_EQ(pool.try_allocate(900 * K), nullptr);  // 256 + 900 > 1024 even with both back
    EXPECT_EQ(pool.slab_count(), 3u);
    std::byte* w = pool.try_allocate(512 * K);  // both go (280 alone would leave 1112 KiB)
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(pool.slab_count(), 2u);
    EXPECT_EQ(pool.reserved(), 768 * K);
    std::memset(w, 0xa5, 512 * K);
    for (std::uint64_t i = 0; i < 256 * K; i += 4096) ASSERT_EQ(z[i], std::byte{0x5a}) << i;
    std::byte* v = pool.try_allocate(256 * K);  // 1 MiB: the budget, whole
    ASSERT_NE(v, nullptr);
    EXPECT_EQ(pool.reserved(), 1024 * K);
    EXPECT_EQ(pool.try_allocate(4 * K), nullptr);
    pool.free(v);
    std::byte* u = pool.try_allocate(128 * K);  // an empty slab is reused, not given back
    EXPECT_EQ(u, v);
    EXPECT_LE(pool.peak_reserved(), 1024 * K);
  };
  detail::HostPool host(1024 * K, 256 * K, /*lock=*/false, /*numa_node=*/-1, /*engine=*/nullptr);
  check(host);
  detail::DevicePool device(1024 * K, 256 * K, /*simulated=*/true);
  check(device);
}
