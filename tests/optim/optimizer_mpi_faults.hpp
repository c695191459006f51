// The failure cases of tests/optim/optimizer_mpi_main.cpp: one rank (the last) fails inside a
// collective call (its I/O, its budget, its manifest), and every rank must throw from that call,
// the others saying that another rank failed, none left waiting in a collective. Each case
// prints what every rank got and throws std::runtime_error naming the rank when a rank got
// something else.
#pragma once

#include <filesystem>
#include <memory>

#include "optim_model.hpp"
#include "tierswap/communicator.hpp"
#include "tierswap/io_engine.hpp"
#include "tierswap/swap_space.hpp"
#include "tierswap/tier_manager.hpp"

namespace tierswap::test {

/// The engine; with `faulty`, its requests of kind `op` fail with EIO while a case below asks.
std::unique_ptr<IoEngine> make_fault_engine(SwapSpace& space, bool faulty, IoOp op);

/// Step t with the last rank's reads or writes failing: no rank may have stepped, and the ranks
/// refuse the next backward together (16-bit parameters the last rank could not restore) or not
/// at all. The swap files stay for --resume.
void fail_step_io(ShardedOptimizer& opt, const ModelOptimizer& m, Communicator& comm, int t);
/// Step t with the last rank's commit failing (a directory where its manifest's temporary file
/// goes): every rank back at step t - 1. `in_place` (no shadow slots): the ranks that committed
/// cannot undo it, and the next step is refused on every rank too.
void fail_commit(ShardedOptimizer& opt, const ModelOptimizer& m, Communicator& comm, int t,
                 const std::filesystem::path& swap_dir, bool in_place);
/// finalize() with the last rank's host budget too small for a sub-group.
void refuse_finalize(ShardedOptimizer& opt, Communicator& comm);
/// initialize() with the last rank's writes failing: every rank then refuses to step, and
/// initialize() again (the disk back) gives every rank the state a run without the failure has.
void fail_initialize(ShardedOptimizer& opt, const ModelOptimizer& m, Communicator& comm);
/// gather() of the whole state with the last rank's reads failing.
void fail_gather(ShardedOptimizer& opt, const ModelOptimizer& m, Communicator& comm);
/// Step t reduced after every backward (no coalescing): after its first micro-batch the last
/// rank's gradients are written out of host memory, and its reads fail in the second, whose
/// reduction reads them back. Every gradient is dropped; the caller redoes step t.
void fail_reduce(ShardedOptimizer& opt, TierManager& tiers, const ModelOptimizer& m,
                 Communicator& comm, int t);

}  // namespace tierswap::test
