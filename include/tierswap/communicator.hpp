// Communicator: the collectives the sharded optimizer needs, over a transport tierswap does not
// implement itself. Three implementations:
//   single  one process (world size 1): copies, no transport
//   mpi     CPU ranks over MPI (OpenMPI): what the multi-rank tests use under mpirun
//   nccl    GPU ranks over NCCL (CUDA builds); host buffers are staged through device memory
//
// Every rank calls the same collectives in the same order with the same counts (MPI semantics).
// Buffers are host memory for single and mpi, host or device memory for nccl. 16-bit sums are
// computed in fp32 and rounded to nearest even after each addition (the order of additions is
// the transport's: exact only where the sums are exact).
//
// Thread-safety: one thread at a time per communicator. Errors of the transport throw
// std::runtime_error naming the collective and the transport's message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "tierswap/kernels.hpp"

namespace tierswap {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  /// "single" | "mpi" | "nccl".
  virtual std::string_view name() const noexcept = 0;

  /// Element-wise sum over ranks of `send` (sum(counts) elements of `dtype`, rank r's piece at
  /// offset counts[0] + ... + counts[r-1]); this rank's piece of the sum lands in `recv`
  /// (counts[rank()] elements). counts.size() == size(); each count < 2^31.
  virtual void reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts,
                              Dtype dtype) = 0;
  /// In place: rank r's piece (counts[r] elements at element offset displs[r] of `buf`) is
  /// copied to every rank. Pieces must not overlap; each count < 2^31.
  virtual void all_gather_v(void* buf, std::span<const std::size_t> counts,
                            std::span<const std::size_t> displs, Dtype dtype) = 0;
  /// Element-wise sum over ranks, in place.
  virtual void all_reduce_sum(double* data, std::size_t n) = 0;
  /// True on every rank when it is true on any.
  virtual bool all_reduce_or(bool flag) = 0;
  /// `bytes` bytes of `data` from rank `root` to every rank.
  virtual void broadcast(void* data, std::size_t bytes, int root) = 0;
  virtual void barrier() = 0;
};

/// Collective: whether any rank failed (`failed`: this rank's error, or null). Returns when none
/// did; else runs `undo` (when given), then rethrows this rank's error or throws
/// std::runtime_error(`then`: another rank failed). How a collective call makes one rank's error
/// every rank's, none left waiting in the collective that follows.
void agree_on_failure(Communicator& comm, const std::exception_ptr& failed,
                      const std::function<void()>& undo, const std::string& then);

/// World size 1.
std::unique_ptr<Communicator> make_single_communicator();

/// Whether this build has the MPI communicator (TIERSWAP_WITH_MPI).
bool mpi_available() noexcept;
/// The MPI communicator over MPI_COMM_WORLD. Initializes MPI (MPI_THREAD_SERIALIZED) unless the
/// program already did, and then finalizes it at the process's exit (std::atexit), not when the
/// last communicator goes: MPI can be initialized only once in a process, and a later optimizer
/// in the same process makes a communicator again. A program that initialized MPI itself
/// finalizes it itself, after its communicators are gone. Throws std::runtime_error in a build
/// without MPI, when MPI cannot start, or once MPI was finalized.
std::unique_ptr<Communicator> make_mpi_communicator();
/// Whether this process was started by an MPI launcher (mpirun/mpiexec environment variables).
bool launched_by_mpi() noexcept;

/// Whether this build has the NCCL communicator (CUDA builds with NCCL).
bool nccl_available() noexcept;
/// An NCCL communicator over the ranks of `bootstrap` (which carries the unique id and is kept
/// alive with it), on CUDA device `device`. Throws std::runtime_error without NCCL, without a
/// usable GPU, or when NCCL fails.
std::unique_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Communicator> bootstrap,
                                                     int device);

/// "single" | "mpi" | "nccl" (nccl bootstraps over mpi when launched by mpirun, else over single)
/// | "auto" (mpi when launched by an MPI launcher and built with MPI, else single).
std::unique_ptr<Communicator> make_communicator(std::string_view kind);

}  // namespace tierswap
