// The single-process communicator, the factory, and, for a transport this build lacks, the
// functions that refuse it with an error saying how to build it in.
#include "tierswap/communicator.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace tierswap {
namespace {

class SingleCommunicator final : public Communicator {
 public:
  int rank() const noexcept override { return 0; }
  int size() const noexcept override { return 1; }
  std::string_view name() const noexcept override { return "single"; }
  void reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts,
                      Dtype dtype) override {
    check(counts.size());
    if (counts[0] > 0 && send != recv) std::memmove(recv, send, counts[0] * dtype_size(dtype));
  }
  void all_gather_v(void*, std::span<const std::size_t> counts, std::span<const std::size_t> displs,
                    Dtype) override {
    check(counts.size());
    check(displs.size());
  }
  void all_reduce_sum(double*, std::size_t) override {}
  bool all_reduce_or(bool flag) override { return flag; }
  void broadcast(void*, std::size_t, int root) override {
    if (root != 0) throw std::invalid_argument(fmt::format("broadcast: root {} of 1 rank", root));
  }
  void barrier() override {}

 private:
  static void check(std::size_t n) {
    if (n != 1)
      throw std::invalid_argument(
          fmt::format("single communicator: {} counts given for a world of 1 rank", n));
  }
};

}  // namespace

void agree_on_failure(Communicator& comm, const std::exception_ptr& failed,
                      const std::function<void()>& undo, const std::string& then) {
  if (!comm.all_reduce_or(failed != nullptr)) return;
  if (undo) undo();
  if (failed) std::rethrow_exception(failed);
  throw std::runtime_error(then);
}

std::unique_ptr<Communicator> make_single_communicator() {
  return std::make_unique<SingleCommunicator>();
}

bool launched_by_mpi() noexcept {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v) != nullptr) return true;
  return false;
}

std::unique_ptr<Communicator> make_communicator(std::string_view kind) {
  if (kind == "single") return make_single_communicator();
  if (kind == "mpi") return make_mpi_communicator();
  if (kind == "auto")
    return launched_by_mpi() && mpi_available() ? make_mpi_communicator()
                                                : make_single_communicator();
  if (kind == "nccl") {
    std::shared_ptr<Communicator> boot =
        launched_by_mpi() ? make_mpi_communicator() : make_single_communicator();
    const int local = [] {
      const char* v = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
      return v != nullptr ? std::atoi(v) : 0;
    }();
    return make_nccl_communicator(std::move(boot), local);
  }
  throw std::invalid_argument(
      fmt::format("communicator '{}': expected single, mpi, nccl or auto", std::string(kind)));
}

#ifndef TIERSWAP_HAVE_MPI
bool mpi_available() noexcept {
  return false;
}
std::unique_ptr<Communicator> make_mpi_communicator() {
  throw std::runtime_error(
      "mpi communicator: this build has no MPI (configure with TIERSWAP_WITH_MPI=ON and "
      "libopenmpi-dev installed)");
}
#endif

#ifndef TIERSWAP_HAVE_NCCL
bool nccl_available() noexcept {
  return false;
}
std::unique_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Communicator>, int) {
  throw std::runtime_error(
      "nccl communicator: this build has no NCCL (a CUDA build finds it next to the toolkit)");
}
#endif

}  // namespace tierswap
