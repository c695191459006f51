// The optimizer under mpirun: trains tests/optim_model.hpp's model for 20 steps on W ranks (each
// rank its share of the samples) with NVMe-resident state, and writes the whole model's master
// weights and both moments (gathered from the shards) to --out. The ctest script runs it at 1, 2,
// 3 and 4 ranks and compares the files byte for byte, resumes a 3-rank checkpoint at 2 ranks,
// and checks 3 ranks against torch.optim.AdamW (--fixture).
//   optimizer_mpi --out FILE [--save-at N DIR] [--load DIR] [--fixture FILE] [--no-coalesce]
//                 [--overlap [--param16-in-place]] [--device-grads]
// --device-grads: a simulated device tier; gradients through add_grad_device (host memory standing
// in for the GPU's) and the 16-bit parameters kept in bound device copies (bind_param16_device),
// checked against param16() at the end. --fail-io-at N read|write DIR: swap files kept in DIR, the
// last rank's reads (or writes) fail (EIO) in step N; every rank's step must throw with no rank
// stepped, and --resume DIR then continues from step N - 1. The other --fail-* and --refuse-*
// options make the last rank fail inside another collective call (optimizer_mpi_faults.hpp); the
// run then goes on to the end where the call can be redone.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "optim_model.hpp"
#include "optimizer_mpi_faults.hpp"
#include "test_util.hpp"
#include "tierswap/communicator.hpp"
#include "tierswap/io_engine.hpp"
#include "tierswap/swap_space.hpp"

using namespace tierswap;

namespace {

struct Args {
  std::string out, save_dir, load_dir, fixture, swap_dir;
  int save_at = 0, stop_at = 0, fail_at = 0, fail_commit_at = 0;
  bool resume = false, lagging = false, fail_writes = false;
  bool coalesce = true, overlap = false, device_grads = false, in_place16 = false;
  bool in_place = false;  // TierConfig::shadow_slots off: a commit cannot be undone
  bool refuse_finalize = false, fail_init = false, fail_gather = false;
  int fail_reduce_at = 0;
};

// Throws std::invalid_argument with the usage on a bad command line.
Args parse_args(int argc, char** argv) {
  Args o;
  // Flags without a value, each setting its field.
  const std::pair<std::string_view, bool*> flags[] = {{"--overlap", &o.overlap},
                                                      {"--device-grads", &o.device_grads},
                                                      {"--param16-in-place", &o.in_place16},
                                                      {"--in-place", &o.in_place},
                                                      {"--refuse-finalize", &o.refuse_finalize},
                                                      {"--fail-init", &o.fail_init},
                                                      {"--fail-gather", &o.fail_gather}};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto flag = std::find_if(std::begin(flags), std::end(flags),
                                   [&](const auto& f) { return a == f.first; });
    if (flag != std::end(flags))
      *flag->second = true;
    else if (a == "--out" && i + 1 < argc)
      o.out = argv[++i];
    else if (a == "--save-at" && i + 2 < argc)
      o.save_at = std::stoi(argv[++i]), o.save_dir = argv[++i];
    else if (a == "--load" && i + 1 < argc)
      o.load_dir = argv[++i];
    else if (a == "--stop-at" && i + 2 < argc)  // keep the swap files in DIR, stop after N
      o.stop_at = std::stoi(argv[++i]), o.swap_dir = argv[++i];
    else if (a == "--resume" && i + 1 < argc)  // continue from the swap files in DIR
      o.resume = true, o.swap_dir = argv[++i];
    else if (a == "--resume-lagging" && i + 1 < argc)  // as if ranks > 0 missed the last commit
      o.resume = o.lagging = true, o.swap_dir = argv[++i];
    else if (a == "--fail-io-at" && i + 3 < argc)  // keep the swap files in DIR, fail step N
      o.fail_at = std::stoi(argv[++i]), o.fail_writes = std::string(argv[++i]) == "write",
      o.swap_dir = argv[++i];
    else if (a == "--fail-commit-at" && i + 1 < argc)
      o.fail_commit_at = std::stoi(argv[++i]);
    else if (a == "--fixture" && i + 1 < argc)
      o.fixture = argv[++i];
    else if (a == "--no-coalesce")
      o.coalesce = false;
    else if (a == "--fail-reduce-at" && i + 1 < argc)
      o.fail_reduce_at = std::stoi(argv[++i]), o.coalesce = false;
    else
      throw std::invalid_argument(
          "usage: optimizer_mpi --out FILE [--save-at N DIR] [--load DIR] [--fixture F] "
          "[--no-coalesce] [--overlap [--param16-in-place]] [--device-grads] [--fail-io-at N "
          "read|write DIR] [--fail-commit-at N [--in-place]] [--refuse-finalize] [--fail-init] "
          "[--fail-gather] [--fail-reduce-at N] "
          "[--stop-at N DIR | --resume DIR | --resume-lagging DIR]");
  }
  return o;
}

// The whole model's master weights and both moments, gathered from the shards: each element has
// one owner, so a sum of zeros and it is exact.
std::vector<float> gather_state(ShardedOptimizer& opt, const test::ModelOptimizer& m,
                                Communicator& comm) {
  std::vector<float> dump;
  for (std::size_t p = 0; p < m.ids.size(); ++p) {
    if (!test::model_params()[p].trainable) continue;
    for (auto cls : {BlockClass::master, BlockClass::exp_avg, BlockClass::exp_avg_sq}) {
      std::vector<double> v(opt.param(m.ids[p]).numel(), 0.0);
      for (auto& [off, vals] : opt.shard(m.ids[p], cls))
        for (std::size_t i = 0; i < vals.size(); ++i) v[off + i] = vals[i];
      comm.all_reduce_sum(v.data(), v.size());
      for (double x : v) dump.push_back(static_cast<float>(x));
    }
  }
  return dump;
}

// Differences of `dump` from torch.optim.AdamW's masters (the fixture), at most 5 printed.
int compare_with_torch(const std::vector<float>& dump, const test::ModelOptimizer& m,
                       const std::string& fixture) {
  std::ifstream in(fixture);
  const auto ref = nlohmann::json::parse(in);
  std::size_t at = 0;
  int bad = 0;
  for (std::size_t p = 0; p < m.ids.size(); ++p) {
    const auto& mp = test::model_params()[p];
    if (!mp.trainable) continue;
    const auto want = ref.at("params").at(mp.name).get<std::vector<std::uint32_t>>();
    for (std::size_t i = 0; i < want.size(); ++i) {
      float w;
      std::memcpy(&w, &want[i], 4);
      if (std::abs(static_cast<double>(dump[at + i]) - w) > 1e-6 * std::abs(w) + 1e-8 && bad++ < 5)
        std::cerr << mp.name << "[" << i << "]: " << dump[at + i] << " vs torch " << w << "\n";
    }
    at += 3 * want.size();
  }
  return bad;
}

// The swap space of this rank: in a temporary directory, or in DIR/rankR for the runs whose
// swap files outlive the process (--stop-at, --resume, --fail-io-at).
SwapSpace open_space(const Args& a, int rank, const std::filesystem::path& tmp) {
  SwapSpaceConfig sc;
  sc.dirs = {tmp};
  if (!a.swap_dir.empty()) {
    sc.dirs = {std::filesystem::path(a.swap_dir) / ("rank" + std::to_string(rank))};
    std::filesystem::create_directories(sc.dirs[0]);
  }
  sc.capacity = 64 << 20;
  return a.resume ? SwapSpace::open(sc.dirs) : SwapSpace::create(sc);
}

TierConfig tier_config(const Args& a, bool last_rank) {
  TierConfig tc;
  tc.host_budget = 1 << 20;  // below the whole model's state: it streams through NVMe
  tc.host_slab_size = 128 << 10;
  if (a.fail_at > 0 || a.fail_gather)  // below a rank's part (~180 KiB at 2 ranks): reads
    tc.host_budget = 160 << 10;
  if (a.refuse_finalize && last_rank)  // too small for a sub-group's state
    tc.host_budget = tc.host_slab_size = 4096;
  tc.device_mode = a.device_grads ? DeviceTierMode::simulated : DeviceTierMode::off;
  tc.device_budget = a.device_grads ? 4 << 20 : 0;
  tc.durable = false;
  tc.telemetry = false;
  tc.shadow_slots = !a.in_place;
  return tc;
}

OptimizerConfig optimizer_config(const Args& a) {
  OptimizerConfig oc = test::model_config();
  oc.coalesce = a.coalesce;  // off: one reduce-scatter per backward pass instead of per step
  oc.overlap = a.overlap;    // sub-groups step speculatively as their reduced gradient arrives
  oc.overlap_param16_in_place = a.in_place16;
  return oc;
}

// The state before the first step trained here (resumed, loaded or initialized); returns that
// step.
int start(ShardedOptimizer& opt, const test::ModelOptimizer& m, Communicator& comm, const Args& a) {
  if (a.resume) {
    if (!opt.resume()) throw std::runtime_error("--resume: nothing to resume in " + a.swap_dir);
    return static_cast<int>(opt.step_count()) + 1;  // no skipped step before --stop-at
  }
  if (!a.load_dir.empty()) {
    opt.load(a.load_dir);
    return a.save_at > 0 ? a.save_at + 1 : 11;
  }
  if (a.fail_init)
    test::fail_initialize(opt, m, comm);
  else
    test::init_model(opt, m);
  return 1;
}

// The failure asked for, in the step it names, after training up to it from `first`. Returns the
// step to go on from, or nothing when the run ends there (the swap files stay for --resume).
std::optional<int> inject_failure(ShardedOptimizer& opt, TierManager& tiers, SwapSpace& space,
                                  const test::ModelOptimizer& m, Communicator& comm, const Args& a,
                                  int first) {
  const int at = a.fail_at > 0          ? a.fail_at
                 : a.fail_reduce_at > 0 ? a.fail_reduce_at
                                        : a.fail_commit_at;
  if (at == 0) return first;
  test::train(opt, m, first, at - 1, comm.rank(), comm.size());
  if (a.fail_at > 0) {
    test::fail_step_io(opt, m, comm, at);
    return std::nullopt;
  }
  if (a.fail_reduce_at > 0) {
    test::fail_reduce(opt, tiers, m, comm, at);
    return at;  // the gradients were dropped: the step is taken afresh
  }
  test::fail_commit(opt, m, comm, at, space.files().front().path.parent_path(), a.in_place);
  if (a.in_place) return std::nullopt;
  return at;  // redone: every rank is back at the step before
}

// The trainer's view of the 16-bit parameters while the run trains: every parameter once per
// step that changed it (at world size > 1 after the all-gather), ending equal to param16(); with
// --device-grads also the bound device copies.
struct Param16Watch {
  std::size_t handed = 0;
  std::map<ParamId, std::vector<std::uint16_t>> last16, bound;

  Param16Watch(ShardedOptimizer& opt, const test::ModelOptimizer& m, bool device_grads) {
    opt.on_param16_ready([this](ParamId id, std::span<const std::uint16_t> v) {
      ++handed;
      last16[id].assign(v.begin(), v.end());
    });
    for (std::size_t p = 0; device_grads && p < m.ids.size(); ++p) {
      if (!test::model_params()[p].trainable) continue;
      auto& v = bound[m.ids[p]];
      v.assign(opt.param(m.ids[p]).numel(), 0);
      opt.bind_param16_device(m.ids[p], v.data());
    }
  }

  void check(const ShardedOptimizer& opt, const std::vector<StepResult>& res) const {
    for (const auto& [id, v] : bound)
      if (!same(opt, id, v))
        throw std::runtime_error("bind_param16_device: the device copy of parameter " +
                                 std::to_string(id) + " is not param16()");
    std::size_t trainable = 0, stepped = 0;
    for (const auto& mp : test::model_params()) trainable += mp.trainable;
    for (const auto& r : res) stepped += !r.skipped;
    if (handed != trainable * stepped)
      throw std::runtime_error("on_param16_ready: " + std::to_string(handed) + " calls for " +
                               std::to_string(stepped) + " steps of " + std::to_string(trainable) +
                               " parameters");
    for (const auto& [id, v] : last16)
      if (!same(opt, id, v))
        throw std::runtime_error("on_param16_ready: the last values handed out for parameter " +
                                 std::to_string(id) + " are not param16()");
  }

  static bool same(const ShardedOptimizer& opt, ParamId id, const std::vector<std::uint16_t>& v) {
    const auto now = opt.param16(id);
    return std::equal(now.begin(), now.end(), v.begin(), v.end());
  }
};

// Rank 0 writes the gathered state to --out and, with --fixture, compares it with torch's.
// Returns the number of values that differ from torch's (0 without a fixture).
int write_out(const std::vector<float>& dump, const test::ModelOptimizer& m, const Args& a,
              const std::vector<StepResult>& res, int first, int world) {
  std::ofstream f(a.out, std::ios::binary);
  f.write(reinterpret_cast<const char*>(dump.data()),
          static_cast<std::streamsize>(dump.size() * 4));
  if (!f) throw std::runtime_error("cannot write " + a.out);
  int bad = 0;
  if (!a.fixture.empty()) {
    bad = compare_with_torch(dump, m, a.fixture);
    bool skipped6 = false;
    for (const auto& r : res) skipped6 |= r.skipped;
    if (!skipped6 && first <= test::kOverflowStep) ++bad, std::cerr << "step 6 not skipped\n";
  }
  std::printf("optimizer_mpi: %d rank(s), steps %d..20, %zu values written to %s%s\n", world, first,
              dump.size(), a.out.c_str(),
              a.fixture.empty() ? ""
              : bad             ? ", DIFFERS from torch"
                                : ", matches torch");
  return bad;
}

int run(const Args& a) {
  auto comm = make_communicator("auto");
  const int rank = comm->rank(), world = comm->size();
  const bool last = rank == world - 1;
  test::TempDir dir;
  SwapSpace space = open_space(a, rank, dir.path());
  const bool faults = a.fail_at > 0 || a.fail_init || a.fail_gather || a.fail_reduce_at > 0;
  const auto engine = test::make_fault_engine(
      space, faults && last, a.fail_writes || a.fail_init ? IoOp::write : IoOp::read);
  TierManager tiers(space, *engine, tier_config(a, last));
  // A job killed between the ranks' commits of the last step: ranks > 0 never committed it.
  if (a.lagging && rank > 0 && !tiers.roll_back_generation())
    throw std::runtime_error("--resume-lagging: no generation to roll back to");
  ShardedOptimizer opt(tiers, *comm, optimizer_config(a));
  if (a.refuse_finalize) {
    test::build_model(opt, /*finalize=*/false);
    test::refuse_finalize(opt, *comm);
    return 0;
  }
  const auto m = test::build_model(opt, !a.resume);
  const std::optional<int> go_on =
      inject_failure(opt, tiers, space, m, *comm, a, start(opt, m, *comm, a));
  if (!go_on) return 0;
  int first = *go_on;
  if (a.save_at > 0 && a.load_dir.empty()) {
    test::train(opt, m, first, a.save_at, rank, world);
    opt.save(a.save_dir);
    first = a.save_at + 1;
  }
  const Param16Watch watch(opt, m, a.device_grads);
  const auto res =
      test::train(opt, m, first, a.stop_at > 0 ? a.stop_at : 20, rank, world, a.device_grads);
  if (a.stop_at > 0) return 0;  // the swap files stay, as a crash leaves them
  watch.check(opt, res);
  if (a.fail_gather) test::fail_gather(opt, m, *comm);
  const std::vector<float> dump = gather_state(opt, m, *comm);
  return rank == 0 && write_out(dump, m, a, res, first, world) != 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse_args(argc, argv));
  } catch (const std::exception& e) {
    std::cerr << "optimizer_mpi: " << e.what() << "\n";
    return 1;
  }
}
