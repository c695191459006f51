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
// stepped, and --resume DIR then continues from step N - 1. --fail-commit-at N: the last rank's
// commit of step N fails (its manifest cannot be written); every rank's step must throw, the
// ranks that committed undo it, and the run goes on from step N to the end in the same process.
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "optim_model.hpp"
#include "test_util.hpp"
#include "tierswap/communicator.hpp"
#include "tierswap/detail/io_backend.hpp"
#include "tierswap/detail/manifest.hpp"
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
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--out" && i + 1 < argc)
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
    else if (a == "--overlap")
      o.overlap = true;
    else if (a == "--device-grads")
      o.device_grads = true;
    else if (a == "--param16-in-place")
      o.in_place16 = true;
    else if (a == "--in-place")
      o.in_place = true;
    else if (a == "--refuse-finalize")
      o.refuse_finalize = true;
    else if (a == "--fail-init")
      o.fail_init = true;
    else if (a == "--fail-gather")
      o.fail_gather = true;
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

std::atomic<int> g_io_fails{0};

// The engine; with `faulty`, its next g_io_fails requests of kind `op` fail with EIO.
std::unique_ptr<IoEngine> make_engine(SwapSpace& space, bool faulty, IoOp op) {
  if (!faulty) return std::make_unique<IoEngine>(space);
  std::string why;
  auto inner = test::make_backend(IoBackendKind::posix, space, 16, &why);
  IoEngineConfig ec;
  ec.queue_depth = 16;  // the backend's
  return std::make_unique<IoEngine>(
      space, ec,
      detail::make_fault_backend(std::move(inner), [op](const detail::IoRequest& r, std::uint64_t) {
        if (r.op != op || g_io_fails <= 0) return detail::Fault{};
        --g_io_fails;
        return detail::Fault{detail::Fault::Kind::error, EIO};
      }));
}

// Step t with the last rank's reads or writes failing: it must throw on every rank (the others
// saying that another rank failed), and no rank may have stepped. (With failing reads the last
// rank cannot restore its 16-bit parameters either: the job ends, to resume from its swap files.)
void fail_once(ShardedOptimizer& opt, const test::ModelOptimizer& m, Communicator& comm, int t,
               int rank, int world) {
  g_io_fails = rank == world - 1 ? 1 << 30 : 0;
  std::string err;
  try {
    test::train(opt, m, t, t, rank, world);
  } catch (const std::exception& e) {
    err = e.what();
  }
  const std::string who = "--fail-io-at: rank " + std::to_string(rank) + ": ";
  g_io_fails = 0;
  if (err.empty()) throw std::runtime_error(who + "the failing step succeeded");
  if (opt.step_count() != static_cast<std::uint64_t>(t - 1))
    throw std::runtime_error(who + "at step " + std::to_string(opt.step_count()) + " after step " +
                             std::to_string(t) + " failed (" + err + ")");
  if (rank != world - 1 && err.find("another rank's step failed") == std::string::npos)
    throw std::runtime_error(who + "unexpected error: " + err);
  std::printf("rank %d: step %d failed on every rank: %s\n", rank, t, err.c_str());
  // A rank whose 16-bit parameters could not be restored (its reads fail) makes every rank refuse
  // the next backward, or none does: no rank goes on alone into a collective.
  double refused = 0;
  try {
    opt.begin_backward();
    opt.end_backward();
    opt.drop_grads();
  } catch (const std::exception& e) {
    if (std::string(e.what()).find("restart the job") == std::string::npos) throw;
    refused = 1;
  }
  comm.all_reduce_sum(&refused, 1);
  if (refused != 0 && refused != world)
    throw std::runtime_error(who + std::to_string(static_cast<int>(refused)) + " of " +
                             std::to_string(world) + " ranks refused the next backward");
}

// Step t with the last rank's commit failing (a directory where its manifest's temporary file
// goes: the manifest cannot be written): every rank's step must throw, the others saying that
// another rank's commit failed, and every rank must be back at step t - 1. `in_place` (no shadow
// slots): the ranks that committed cannot undo it; every rank's step, and the next step, must
// say so (and that only a save() checkpoint helps).
void fail_commit_once(ShardedOptimizer& opt, const test::ModelOptimizer& m, int t, int rank,
                      int world, const std::filesystem::path& swap_dir, bool in_place) {
  const auto blocker = swap_dir / (std::string(detail::kManifestName) + ".tmp");
  if (rank == world - 1) {
    std::filesystem::remove(blocker);  // the recycled file the next commit would write
    std::filesystem::create_directory(blocker);
  }
  std::string err;
  try {
    test::train(opt, m, t, t, rank, world);
  } catch (const std::exception& e) {
    err = e.what();
  }
  if (rank == world - 1) std::filesystem::remove(blocker);
  const std::string who = "--fail-commit-at: rank " + std::to_string(rank) + ": ";
  if (err.empty()) throw std::runtime_error(who + "the step whose commit failed succeeded");
  if (opt.step_count() != static_cast<std::uint64_t>(t - 1))
    throw std::runtime_error(who + "at step " + std::to_string(opt.step_count()) + " after step " +
                             std::to_string(t) + "'s commit failed (" + err + ")");
  const bool others = err.find("another rank's commit failed") != std::string::npos;
  if (others != (rank != world - 1)) throw std::runtime_error(who + "unexpected error: " + err);
  const bool apart = err.find("could not step back") != std::string::npos &&
                     err.find("restart from a save() checkpoint") != std::string::npos;
  if (apart != in_place) throw std::runtime_error(who + "unexpected error: " + err);
  std::printf("rank %d: step %d's commit failed on every rank: %s\n", rank, t, err.c_str());
  if (!in_place) return;
  try {
    test::train(opt, m, t, t, rank, world);
  } catch (const std::exception& e) {
    if (std::string(e.what()).find("could not step back") == std::string::npos) throw;
    std::printf("rank %d: step %d again refused: %s\n", rank, t, e.what());
    return;
  }
  throw std::runtime_error(who + "a step after the ranks came apart succeeded");
}

// The last rank's host budget refused at finalize(): every rank's finalize() must throw, the
// others saying that another rank's failed (none left waiting in a collective).
void refuse_finalize(ShardedOptimizer& opt, int rank, int world) {
  std::string err;
  try {
    opt.finalize();
  } catch (const std::exception& e) {
    err = e.what();
  }
  const std::string who = "--refuse-finalize: rank " + std::to_string(rank) + ": ";
  const bool others = err.find("another rank's finalize failed") != std::string::npos;
  const bool mine = err.find("host budget") != std::string::npos;
  if (rank == world - 1 ? !mine : !others) throw std::runtime_error(who + "got '" + err + "'");
  std::printf("rank %d: finalize refused on every rank: %s\n", rank, err.c_str());
}

// The last rank's writes fail while initialize() writes the first state: every rank's
// initialize() must throw, every rank then refuses to step, and initialize() again (the disk
// back) must give every rank the state a run without the failure has.
void fail_init_once(ShardedOptimizer& opt, const test::ModelOptimizer& m, int rank, int world) {
  g_io_fails = rank == world - 1 ? 1 << 30 : 0;
  std::string err, again;
  try {
    test::init_model(opt, m);
  } catch (const std::exception& e) {
    err = e.what();
  }
  g_io_fails = 0;
  try {
    opt.begin_backward();
  } catch (const std::exception& e) {
    again = e.what();
  }
  const std::string who = "--fail-init: rank " + std::to_string(rank) + ": ";
  const bool others = err.find("another rank failed committing") != std::string::npos;
  if (err.empty() || others != (rank != world - 1))
    throw std::runtime_error(who + "initialize() gave '" + err + "'");
  if (again.find("until initialize() or load() succeeds on every rank") == std::string::npos)
    throw std::runtime_error(who + "begin_backward() after it gave '" + again + "'");
  std::printf("rank %d: initialize failed on every rank (%s); then refused: %s\n", rank,
              err.c_str(), again.c_str());
  test::init_model(opt, m);
}

// The last rank's reads fail while every rank gathers the state (ShardedOptimizer::gather,
// which reads what the host budget does not hold): every rank's gather() must throw (the others:
// another rank could not read its part), none left waiting; the state is then gathered again.
void fail_gather_once(ShardedOptimizer& opt, const test::ModelOptimizer& m, int rank, int world) {
  g_io_fails = rank == world - 1 ? 1 << 30 : 0;
  std::string err;
  try {
    for (std::size_t p = 0; p < m.ids.size(); ++p)
      for (auto cls : {BlockClass::master, BlockClass::exp_avg, BlockClass::exp_avg_sq})
        if (test::model_params()[p].trainable) opt.gather(m.ids[p], cls);
  } catch (const std::exception& e) {
    err = e.what();
  }
  g_io_fails = 0;
  const bool others = err.find("another rank could not read its part") != std::string::npos;
  if (err.empty() || others != (rank != world - 1))
    throw std::runtime_error("--fail-gather: rank " + std::to_string(rank) + ": gather gave '" +
                             err + "'");
  std::printf("rank %d: the gather failed on every rank: %s\n", rank, err.c_str());
}

// Step t reduced after every backward (no coalescing): after the first micro-batch the last rank's
// gradients are written out of host memory, and its reads fail in the second one, whose
// reduction reads them back to add to them. Every rank's end_backward() must throw (the others:
// another rank could not take its part) with every gradient dropped; step t is then redone.
void fail_reduce_once(ShardedOptimizer& opt, TierManager& tiers, const test::ModelOptimizer& m,
                      int t, int rank, int world) {
  opt.begin_backward(false);
  test::add_micro_grads(opt, m, t, 0, rank, world);
  opt.end_backward();
  if (rank == world - 1)
    for (const auto& b : tiers.snapshot().blocks)
      if (b.name.ends_with(".grad16")) tiers.evict(*tiers.find(b.name), Tier::host);
  g_io_fails = rank == world - 1 ? 1 << 30 : 0;
  std::string err;
  try {
    opt.begin_backward(true);
    test::add_micro_grads(opt, m, t, 1, rank, world);
    opt.end_backward();
  } catch (const std::exception& e) {
    err = e.what();
  }
  g_io_fails = 0;
  const bool others = err.find("another rank could not take its part") != std::string::npos;
  if (err.empty() || others != (rank != world - 1))
    throw std::runtime_error("--fail-reduce-at: rank " + std::to_string(rank) +
                             ": end_backward() gave '" + err + "'");
  std::printf("rank %d: the reduction failed on every rank: %s\n", rank, err.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args args = parse_args(argc, argv);
    const auto& [out, save_dir, load_dir, fixture, swap_dir, save_at, stop_at, fail_at,
                 fail_commit_at, resume, lagging, fail_writes, coalesce, overlap, device_grads,
                 in_place16, in_place, refuse_finalize_, fail_init, fail_gather, fail_reduce_at] =
        args;
    auto comm = make_communicator("auto");
    const int rank = comm->rank(), world = comm->size();
    test::TempDir dir;
    SwapSpaceConfig sc;
    sc.dirs = {dir.path()};
    if (!swap_dir.empty()) {  // a swap directory that outlives the process (--stop-at, --resume)
      sc.dirs = {std::filesystem::path(swap_dir) / ("rank" + std::to_string(rank))};
      std::filesystem::create_directories(sc.dirs[0]);
    }
    sc.capacity = 64 << 20;
    SwapSpace space = resume ? SwapSpace::open(sc.dirs) : SwapSpace::create(sc);
    const auto engine_ptr = make_engine(
        space, (fail_at > 0 || fail_init || fail_gather || fail_reduce_at > 0) && rank == world - 1,
        fail_writes || fail_init ? IoOp::write : IoOp::read);
    IoEngine& engine = *engine_ptr;
    TierConfig tc;
    tc.host_budget = 1 << 20;  // below the whole model's state: it streams through NVMe
    tc.host_slab_size = 128 << 10;
    if (fail_at > 0 || fail_gather)  // below a rank's part (~180 KiB at 2 ranks): reads
      tc.host_budget = 160 << 10;
    tc.device_mode = device_grads ? DeviceTierMode::simulated : DeviceTierMode::off;
    tc.device_budget = device_grads ? 4 << 20 : 0;
    tc.durable = false;
    tc.telemetry = false;
    tc.shadow_slots = !in_place;
    if (refuse_finalize_ && rank == world - 1)  // too small for a sub-group's state
      tc.host_budget = tc.host_slab_size = 4096;
    TierManager tiers(space, engine, tc);
    // A job killed between the ranks' commits of the last step: ranks > 0 never committed it.
    if (lagging && rank > 0 && !tiers.roll_back_generation())
      throw std::runtime_error("--resume-lagging: no generation to roll back to");
    OptimizerConfig oc = test::model_config();
    oc.coalesce = coalesce;  // off: one reduce-scatter per backward pass instead of per step
    oc.overlap = overlap;    // sub-groups step speculatively as their reduced gradient arrives
    oc.overlap_param16_in_place = in_place16;
    ShardedOptimizer opt(tiers, *comm, oc);
    if (refuse_finalize_) {
      test::build_model(opt, /*finalize=*/false);
      refuse_finalize(opt, rank, world);
      return 0;
    }
    auto m = test::build_model(opt, !resume);
    int first = 1;
    if (resume) {
      if (!opt.resume()) throw std::runtime_error("--resume: nothing to resume in " + swap_dir);
      first = static_cast<int>(opt.step_count()) + 1;  // no skipped step before --stop-at
    } else if (!load_dir.empty()) {
      opt.load(load_dir);
      first = save_at > 0 ? save_at + 1 : 11;
    } else if (fail_init) {
      fail_init_once(opt, m, rank, world);
    } else {
      test::init_model(opt, m);
    }
    if (fail_at > 0) {
      test::train(opt, m, first, fail_at - 1, rank, world);
      fail_once(opt, m, *comm, fail_at, rank, world);
      return 0;  // the swap files stay
    }
    if (fail_reduce_at > 0) {
      test::train(opt, m, first, fail_reduce_at - 1, rank, world);
      fail_reduce_once(opt, tiers, m, fail_reduce_at, rank, world);
      first = fail_reduce_at;  // the gradients were dropped: the step is taken afresh
    }
    if (fail_commit_at > 0) {
      test::train(opt, m, first, fail_commit_at - 1, rank, world);
      fail_commit_once(opt, m, fail_commit_at, rank, world,
                       space.files().front().path.parent_path(), in_place);
      if (in_place) return 0;
      first = fail_commit_at;  // redone: every rank is back at the step before
    }
    if (save_at > 0 && load_dir.empty()) {
      test::train(opt, m, first, save_at, rank, world);
      opt.save(save_dir);
      first = save_at + 1;
    }
    // The trainer's view of the 16-bit parameters: every parameter once per step that changed
    // it (at world size > 1 after the all-gather), ending equal to param16().
    std::size_t handed = 0;
    std::map<ParamId, std::vector<std::uint16_t>> last16;
    opt.on_param16_ready([&](ParamId id, std::span<const std::uint16_t> v) {
      ++handed;
      last16[id].assign(v.begin(), v.end());
    });
    std::map<ParamId, std::vector<std::uint16_t>> bound;
    if (device_grads)
      for (std::size_t p = 0; p < m.ids.size(); ++p) {
        if (!test::model_params()[p].trainable) continue;
        auto& v = bound[m.ids[p]];
        v.assign(opt.param(m.ids[p]).numel(), 0);
        opt.bind_param16_device(m.ids[p], v.data());
      }
    const auto res =
        test::train(opt, m, first, stop_at > 0 ? stop_at : 20, rank, world, device_grads);
    if (stop_at > 0) return 0;  // the swap files stay, as a crash leaves them
    for (const auto& [id, v] : bound) {
      const auto now = opt.param16(id);
      if (!std::equal(now.begin(), now.end(), v.begin(), v.end()))
        throw std::runtime_error("bind_param16_device: the device copy of parameter " +
                                 std::to_string(id) + " is not param16()");
    }
    std::size_t trainable = 0, stepped = 0;
    for (const auto& mp : test::model_params()) trainable += mp.trainable;
    for (const auto& r : res) stepped += !r.skipped;
    if (handed != trainable * stepped)
      throw std::runtime_error("on_param16_ready: " + std::to_string(handed) + " calls for " +
                               std::to_string(stepped) + " steps of " + std::to_string(trainable) +
                               " parameters");
    for (const auto& [id, v] : last16) {
      const auto now = opt.param16(id);
      if (!std::equal(now.begin(), now.end(), v.begin(), v.end()))
        throw std::runtime_error("on_param16_ready: the last values handed out for parameter " +
                                 std::to_string(id) + " are not param16()");
    }
    if (fail_gather) fail_gather_once(opt, m, rank, world);
    const std::vector<float> dump = gather_state(opt, m, *comm);
    int bad = 0;
    if (rank == 0) {
      std::ofstream f(out, std::ios::binary);
      f.write(reinterpret_cast<const char*>(dump.data()),
              static_cast<std::streamsize>(dump.size() * 4));
      if (!f) throw std::runtime_error("cannot write " + out);
      if (!fixture.empty()) {
        bad = compare_with_torch(dump, m, fixture);
        bool skipped6 = false;
        for (const auto& r : res) skipped6 |= r.skipped;
        if (!skipped6 && first <= test::kOverflowStep) ++bad, std::cerr << "step 6 not skipped\n";
      }
      std::printf("optimizer_mpi: %d rank(s), steps %d..20, %zu values written to %s%s\n", world,
                  first, dump.size(), out.c_str(),
                  fixture.empty() ? ""
                  : bad           ? ", DIFFERS from torch"
                                  : ", matches torch");
    }
    return bad ? 1 : 0;
  } catch (const std::exception& e) {
    std::cerr << "optimizer_mpi: " << e.what() << "\n";
    return 1;
  }
}
