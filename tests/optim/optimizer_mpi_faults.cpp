// The failure cases of the optimizer under mpirun (see optimizer_mpi_faults.hpp).
#include "optimizer_mpi_faults.hpp"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>

#include "test_util.hpp"
#include "tierswap/detail/io_backend.hpp"
#include "tierswap/detail/manifest.hpp"

namespace tierswap::test {
namespace {

std::atomic<bool> g_io_fails{false};

bool last_rank(const Communicator& comm) {
  return comm.rank() == comm.size() - 1;
}

// error_of(f) while the last rank's faulty engine fails every request.
template <class F>
std::string error_under_faults(const Communicator& comm, F&& f) {
  g_io_fails = last_rank(comm);
  std::string err = error_of(f);
  g_io_fails = false;
  return err;
}

// `err` is every rank's error of a failure on the last rank: the last rank's own, the others'
// naming `others` (another rank's failure). Printed; a rank that got something else throws.
void expect_failed_everywhere(const Communicator& comm, std::string_view what,
                              const std::string& err, std::string_view others) {
  const bool said = err.find(others) != std::string::npos;
  if (err.empty() || said == last_rank(comm))
    throw std::runtime_error(std::string(what) + ": rank " + std::to_string(comm.rank()) +
                             " got '" + err + "'");
  std::printf("rank %d: %.*s failed on every rank: %s\n", comm.rank(),
              static_cast<int>(what.size()), what.data(), err.c_str());
}

void expect_step(const ShardedOptimizer& opt, const Communicator& comm, std::string_view what,
                 int t) {
  if (opt.step_count() != static_cast<std::uint64_t>(t))
    throw std::runtime_error(std::string(what) + ": rank " + std::to_string(comm.rank()) +
                             " is at step " + std::to_string(opt.step_count()) + ", not " +
                             std::to_string(t));
}

}  // namespace

std::unique_ptr<IoEngine> make_fault_engine(SwapSpace& space, bool faulty, IoOp op) {
  if (!faulty) return std::make_unique<IoEngine>(space);
  std::string why;
  auto inner = make_backend(IoBackendKind::posix, space, 16, &why);
  IoEngineConfig ec;
  ec.queue_depth = 16;  // the backend's
  return std::make_unique<IoEngine>(
      space, ec,
      detail::make_fault_backend(std::move(inner), [op](const detail::IoRequest& r, std::uint64_t) {
        if (r.op != op || !g_io_fails) return detail::Fault{};
        return detail::Fault{detail::Fault::Kind::error, EIO};
      }));
}

void fail_step_io(ShardedOptimizer& opt, const ModelOptimizer& m, Communicator& comm, int t) {
  const std::string err =
      error_under_faults(comm, [&] { train(opt, m, t, t, comm.rank(), comm.size()); });
  expect_failed_everywhere(comm, "--fail-io-at: the step", err, "another rank's step failed");
  expect_step(opt, comm, "--fail-io-at", t - 1);
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
  if (refused != 0 && refused != comm.size())
    throw std::runtime_error("--fail-io-at: " + std::to_string(static_cast<int>(refused)) + " of " +
                             std::to_string(comm.size()) + " ranks refused the next backward");
}

void fail_commit(ShardedOptimizer& opt, const ModelOptimizer& m, Communicator& comm, int t,
                 const std::filesystem::path& swap_dir, bool in_place) {
  const auto blocker = swap_dir / (std::string(detail::kManifestName) + ".tmp");
  if (last_rank(comm)) {
    std::filesystem::remove(blocker);  // the recycled file the next commit would write
    std::filesystem::create_directory(blocker);
  }
  const std::string err = error_of([&] { train(opt, m, t, t, comm.rank(), comm.size()); });
  if (last_rank(comm)) std::filesystem::remove(blocker);
  expect_failed_everywhere(comm, "--fail-commit-at: the commit", err,
                           "another rank's commit failed");
  expect_step(opt, comm, "--fail-commit-at", t - 1);
  const bool apart = err.find("could not step back") != std::string::npos &&
                     err.find("restart from a save() checkpoint") != std::string::npos;
  if (apart != in_place)
    throw std::runtime_error("--fail-commit-at: rank " + std::to_string(comm.rank()) + " got '" +
                             err + "'");
  if (!in_place) return;
  const std::string again = error_of([&] { train(opt, m, t, t, comm.rank(), comm.size()); });
  if (again.find("could not step back") == std::string::npos)
    throw std::runtime_error("--fail-commit-at: rank " + std::to_string(comm.rank()) +
                             ": the next step gave '" + again + "'");
}

void refuse_finalize(ShardedOptimizer& opt, Communicator& comm) {
  const std::string err = error_of([&] { opt.finalize(); });
  expect_failed_everywhere(comm, "--refuse-finalize: finalize()", err,
                           "another rank's finalize failed");
  if (last_rank(comm) && err.find("host budget") == std::string::npos)
    throw std::runtime_error("--refuse-finalize: the last rank got '" + err + "'");
}

void fail_initialize(ShardedOptimizer& opt, const ModelOptimizer& m, Communicator& comm) {
  const std::string err = error_under_faults(comm, [&] { init_model(opt, m); });
  expect_failed_everywhere(comm, "--fail-init: initialize()", err,
                           "another rank failed committing");
  const std::string refused = error_of([&] { opt.begin_backward(); });
  if (refused.find("until initialize() or load() succeeds on every rank") == std::string::npos)
    throw std::runtime_error("--fail-init: rank " + std::to_string(comm.rank()) +
                             ": a backward after it gave '" + refused + "'");
  init_model(opt, m);
}

void fail_gather(ShardedOptimizer& opt, const ModelOptimizer& m, Communicator& comm) {
  const std::string err = error_under_faults(comm, [&] {
    for (std::size_t p = 0; p < m.ids.size(); ++p)
      for (auto cls : {BlockClass::master, BlockClass::exp_avg, BlockClass::exp_avg_sq})
        if (model_params()[p].trainable) opt.gather(m.ids[p], cls);
  });
  expect_failed_everywhere(comm, "--fail-gather: gather()", err,
                           "another rank could not read its part");
}

void fail_reduce(ShardedOptimizer& opt, TierManager& tiers, const ModelOptimizer& m,
                 Communicator& comm, int t) {
  opt.begin_backward(false);
  add_micro_grads(opt, m, t, 0, comm.rank(), comm.size());
  opt.end_backward();
  if (last_rank(comm))
    for (const auto& b : tiers.snapshot().blocks)
      if (b.name.ends_with(".grad16")) tiers.evict(*tiers.find(b.name), Tier::host);
  const std::string err = error_under_faults(comm, [&] {
    opt.begin_backward(true);
    add_micro_grads(opt, m, t, 1, comm.rank(), comm.size());
    opt.end_backward();
  });
  expect_failed_everywhere(comm, "--fail-reduce-at: the reduction", err,
                           "another rank could not take its part");
}

}  // namespace tierswap::test
