// ShardedOptimizer at world size 1, checkpoints: resuming bit-identically at another sub-group
// size, and bad checkpoints refused with the state left alone.
// (Multi-rank runs: optimizer_mpi under mpirun.)
#include "optim_fixture.hpp"
#include "tierswap/detail/file.hpp"

using namespace tierswap::optim_test;

TEST(ShardedOptimizer, CheckpointResumesBitIdenticallyAtAnotherSubgroupSize) {
  Rig a;
  auto ma = test::start_model(*a.opt);
  test::train(*a.opt, ma, 1, 10, 0, 1);
  TempDir ck;
  a.opt->save(ck.path());
  a.opt->save(ck.path());  // saving again replaces the files of the first save
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(ck.path())) files += e.is_regular_file();
  EXPECT_EQ(files, 3);  // manifest + one rank's index and data
  test::train(*a.opt, ma, 11, 20, 0, 1);

  OptimizerConfig oc = test::model_config();
  oc.subgroup_size = 16384;
  Rig b(tier_config(2 * kMiB, 128 * kKiB), oc);
  auto mb = test::build_model(*b.opt);
  b.opt->load(ck.path());
  EXPECT_EQ(b.opt->step_count(), 9u);  // step 6 was skipped
  test::train(*b.opt, mb, 11, 20, 0, 1);
  EXPECT_EQ(a.opt->loss_scale(), b.opt->loss_scale());
  expect_same_state(*a.opt, ma, *b.opt, mb);
  for (std::size_t p = 0; p < ma.ids.size(); ++p) {
    if (!test::model_params()[p].trainable) continue;
    const auto x = a.opt->param16(ma.ids[p]);
    const auto y = b.opt->param16(mb.ids[p]);
    EXPECT_TRUE(std::equal(x.begin(), x.end(), y.begin(), y.end()));
  }
}

// Two saves into one directory at once would each remove the other's files: the second is
// refused at once, naming the holder, and the directory keeps the first's checkpoint.
TEST(ShardedOptimizer, ASaveIntoADirectoryAnotherSaveHoldsIsRefused) {
  Rig a;
  auto ma = test::start_model(*a.opt);
  TempDir ck;
  test::train(*a.opt, ma, 1, 2, 0, 1);
  a.opt->save(ck.path());
  const std::set<std::string> files = test::names_in(ck.path());
  const int held = detail::open_lock(ck.path(), "test: checkpoint directory");  // a save going on
  test::train(*a.opt, ma, 3, 3, 0, 1);
  try {
    a.opt->save(ck.path());
    ADD_FAILURE() << "a save into a directory another save holds succeeded";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("save: checkpoint directory " + ck.path().string() +
                                         " is in use by this process"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(test::names_in(ck.path()), files);
  detail::close_lock(held);
  a.opt->save(ck.path());  // the other save done: this one goes ahead
  Rig b;
  auto mb = test::build_model(*b.opt);
  b.opt->load(ck.path());
  EXPECT_EQ(b.opt->step_count(), 3u);
}

namespace {

// World size 1, calling `on_collective` at each collective call: what a save leaves for the other
// ranks to see while it still holds the directory.
class WatchingCommunicator final : public Communicator {
 public:
  std::function<void()> on_collective;
  int rank() const noexcept override { return 0; }
  int size() const noexcept override { return 1; }
  std::string_view name() const noexcept override { return "single"; }
  void reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts,
                      Dtype dtype) override {
    watch();
    inner_->reduce_scatter(send, recv, counts, dtype);
  }
  void all_gather_v(void* buf, std::span<const std::size_t> counts,
                    std::span<const std::size_t> displs, Dtype dtype) override {
    watch();
    inner_->all_gather_v(buf, counts, displs, dtype);
  }
  void all_reduce_sum(double* data, std::size_t n) override {
    watch();
    inner_->all_reduce_sum(data, n);
  }
  bool all_reduce_or(bool flag) override {
    watch();
    return inner_->all_reduce_or(flag);
  }
  void broadcast(void* data, std::size_t bytes, int root) override {
    watch();
    inner_->broadcast(data, bytes, root);
  }
  void barrier() override {
    watch();
    inner_->barrier();
  }

 private:
  void watch() {
    if (on_collective) on_collective();
  }
  std::unique_ptr<Communicator> inner_ = make_single_communicator();
};

}  // namespace

// Rank 0's lock on the directory lasts until every rank has removed its earlier save's files:
// a save that took the lock while a slower rank still removed them would lose its own files to
// that removal. At the last collective call of a save (after which rank 0 lets the lock go), the
// earlier files are gone and the lock is still held.
TEST(ShardedOptimizer, ASaveHoldsItsDirectoryUntilEveryRankHasRemovedTheEarlierFiles) {
  WatchingCommunicator comm;  // outlives the optimizer
  Rig r;
  r.opt.reset();
  r.opt = std::make_unique<ShardedOptimizer>(*r.tiers, comm, test::model_config());
  auto m = test::start_model(*r.opt);
  test::train(*r.opt, m, 1, 2, 0, 1);
  TempDir ck;
  r.opt->save(ck.path());
  const std::set<std::string> first = test::names_in(ck.path());
  test::train(*r.opt, m, 3, 3, 0, 1);
  bool earlier_files = true, locked = false;
  comm.on_collective = [&] {
    const std::set<std::string> now = test::names_in(ck.path());
    earlier_files = std::any_of(first.begin(), first.end(), [&](const std::string& n) {
      return n.rfind("rank-", 0) == 0 && now.count(n) > 0;
    });
    try {
      detail::close_lock(detail::open_lock(ck.path(), "test: checkpoint directory"));
      locked = false;
    } catch (const std::runtime_error&) {
      locked = true;
    }
  };
  r.opt->save(ck.path());
  comm.on_collective = nullptr;
  EXPECT_FALSE(earlier_files) << "the last collective call came before the earlier files went";
  EXPECT_TRUE(locked) << "the directory was not held at the save's last collective call";
  Rig b;
  auto mb = test::build_model(*b.opt);
  b.opt->load(ck.path());
  EXPECT_EQ(b.opt->step_count(), 3u);
}

// A load reads under a shared lock: not while a save writes the directory (it would remove files
// under the load), alongside any other load, and a save waits for no load: it is refused.
TEST(ShardedOptimizer, ALoadAndASaveOfOneDirectoryExcludeEachOtherAndLoadsShareIt) {
  Rig a;
  auto ma = test::start_model(*a.opt);
  TempDir ck;
  test::train(*a.opt, ma, 1, 2, 0, 1);
  a.opt->save(ck.path());
  Rig b;
  auto mb = test::build_model(*b.opt);
  const int writing = detail::open_lock(ck.path(), "test: checkpoint directory");
  try {
    b.opt->load(ck.path());
    ADD_FAILURE() << "a load while a save writes the directory succeeded";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("load: checkpoint directory " + ck.path().string() +
                                         " is in use by this process"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("it is being written"), std::string::npos) << e.what();
  }
  detail::close_lock(writing);
  const int reading = detail::open_lock(ck.path(), "test: checkpoint directory", true);
  b.opt->load(ck.path());  // another load at the same time: shared
  EXPECT_EQ(b.opt->step_count(), 2u);
  EXPECT_THROW(a.opt->save(ck.path()), std::runtime_error);  // a save under a load: refused
  detail::close_lock(reading);
  a.opt->save(ck.path());
}

TEST(ShardedOptimizer, BadCheckpointsGiveClearErrorsAndLeaveTheStateAlone) {
  Rig a;
  auto ma = test::start_model(*a.opt);
  test::train(*a.opt, ma, 1, 3, 0, 1);
  TempDir ck;
  a.opt->save(ck.path());

  Rig b;
  auto mb = test::start_model(*b.opt);
  test::train(*b.opt, mb, 1, 1, 0, 1);
  const auto before = full(*b.opt, mb.ids[0]);
  auto expect_error = [&](const std::filesystem::path& dir, const std::string& what) {
    try {
      b.opt->load(dir);
      ADD_FAILURE() << "load succeeded; expected: " << what;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    EXPECT_TRUE(same_bits(full(*b.opt, mb.ids[0]), before));
    EXPECT_EQ(b.opt->step_count(), 1u);
  };
  TempDir empty;
  expect_error(empty.path(), "no tierswap.checkpoint");

  std::filesystem::path bin, index;
  for (auto& e : std::filesystem::directory_iterator(ck.path())) {
    if (e.path().extension() == ".bin") bin = e.path();
    if (e.path().extension() == ".json") index = e.path();
  }
  // Corrupt one byte deep in the data: the piece checksum catches it, mid-copy.
  {
    std::fstream f(bin, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40000);
    char c;
    f.read(&c, 1);
    c ^= 0x5a;
    f.seekp(40000);
    f.write(&c, 1);
  }
  expect_error(ck.path(), "checksum mismatch");
  std::filesystem::resize_file(bin, std::filesystem::file_size(bin) - 100);
  expect_error(ck.path(), "truncated");
  std::filesystem::remove(index);
  expect_error(ck.path(), "missing");

  // A model of another shape.
  Rig c;
  c.opt->add_group(GroupConfig{});
  c.opt->add_group(GroupConfig{});
  c.opt->add_param(0, {"w1", {97, 130}, Dtype::f16, true});
  c.opt->finalize();
  TempDir ck2;
  a.opt->save(ck2.path());
  try {
    c.opt->load(ck2.path());
    ADD_FAILURE() << "a mismatched model loaded";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("parameters"), std::string::npos) << e.what();
  }
}
