// The MPI communicator (OpenMPI from Debian). 16-bit sums use user-defined reduction operators
// that add in fp32 and round to nearest even, as the CPU kernels convert.
#include <fmt/format.h>
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <climits>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "tierswap/communicator.hpp"

namespace tierswap {
namespace {

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw std::runtime_error(fmt::format("mpi {}: {}", what, std::string(msg, len)));
}

template <float (*Load)(std::uint16_t), std::uint16_t (*Store)(float)>
void sum16(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = Store(Load(a[i]) + Load(b[i]));
}

std::mutex g_mu;
int g_users = 0;  // live communicators
MPI_Op g_sum_bf16 = MPI_OP_NULL, g_sum_f16 = MPI_OP_NULL;

bool mpi_finalized() noexcept {
  int fin = 0;
  MPI_Finalized(&fin);
  return fin != 0;
}

// MPI can be initialized once per process: a library that initialized it finalizes it at exit,
// not when its last communicator goes (a second optimizer in the same process would find it
// finalized).
void finalize_at_exit() noexcept {
  if (!mpi_finalized()) MPI_Finalize();
}

int to_int(std::size_t n, const char* what) {
  if (n > static_cast<std::size_t>(INT_MAX))
    throw std::invalid_argument(
        fmt::format("mpi {}: {} elements in one piece (at most 2^31-1)", what, n));
  return static_cast<int>(n);
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    std::lock_guard lk(g_mu);
    if (mpi_finalized())
      throw std::runtime_error(
          "mpi communicator: MPI was already finalized in this process (MPI_Finalize was "
          "called); no communicator can be made after it");
    int init = 0;
    MPI_Initialized(&init);
    if (!init) {
      int provided = 0;
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "init");
      std::atexit(finalize_at_exit);
    }
    if (g_users == 0) {
      check(MPI_Op_create(&sum16<bf16_to_float, float_to_bf16>, 1, &g_sum_bf16), "op_create");
      check(MPI_Op_create(&sum16<f16_to_float, float_to_f16>, 1, &g_sum_f16), "op_create");
    }
    ++g_users;
    check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "comm_dup");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override {
    std::lock_guard lk(g_mu);
    --g_users;
    if (mpi_finalized()) return;  // destroyed after the exit's finalize: nothing to free
    MPI_Comm_free(&comm_);
    if (g_users == 0) {
      MPI_Op_free(&g_sum_bf16);
      MPI_Op_free(&g_sum_f16);
    }
  }
  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  std::string_view name() const noexcept override { return "mpi"; }

  void reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts,
                      Dtype dtype) override {
    std::vector<int> c = ints(counts, "reduce_scatter");
    check(MPI_Reduce_scatter(send, recv, c.data(), type(dtype), op(dtype), comm_),
          "reduce_scatter");
  }
  void all_gather_v(void* buf, std::span<const std::size_t> counts,
                    std::span<const std::size_t> displs, Dtype dtype) override {
    std::vector<int> c = ints(counts, "all_gather_v"), d = ints(displs, "all_gather_v");
    check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, c.data(), d.data(), type(dtype),
                         comm_),
          "all_gather_v");
  }
  void all_reduce_sum(double* data, std::size_t n) override {
    for (std::size_t off = 0; off < n; off += INT_MAX / 2) {
      const int k = static_cast<int>(std::min<std::size_t>(n - off, INT_MAX / 2));
      check(MPI_Allreduce(MPI_IN_PLACE, data + off, k, MPI_DOUBLE, MPI_SUM, comm_), "all_reduce");
    }
  }
  bool all_reduce_or(bool flag) override {
    int v = flag ? 1 : 0;
    check(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_LOR, comm_), "all_reduce_or");
    return v != 0;
  }
  void broadcast(void* data, std::size_t bytes, int root) override {
    if (root < 0 || root >= size_)
      throw std::invalid_argument(fmt::format("broadcast: root {} of {} ranks", root, size_));
    auto* p = static_cast<char*>(data);
    for (std::size_t off = 0; off < bytes; off += INT_MAX / 2) {
      const int k = static_cast<int>(std::min<std::size_t>(bytes - off, INT_MAX / 2));
      check(MPI_Bcast(p + off, k, MPI_BYTE, root, comm_), "broadcast");
    }
  }
  void barrier() override { check(MPI_Barrier(comm_), "barrier"); }

 private:
  std::vector<int> ints(std::span<const std::size_t> v, const char* what) const {
    if (v.size() != static_cast<std::size_t>(size_))
      throw std::invalid_argument(
          fmt::format("mpi {}: {} counts for {} ranks", what, v.size(), size_));
    std::vector<int> out;
    out.reserve(v.size());
    for (auto x : v) out.push_back(to_int(x, what));
    return out;
  }
  static MPI_Datatype type(Dtype d) { return d == Dtype::f32 ? MPI_FLOAT : MPI_UINT16_T; }
  static MPI_Op op(Dtype d) {
    return d == Dtype::f32 ? MPI_SUM : d == Dtype::bf16 ? g_sum_bf16 : g_sum_f16;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
};

}  // namespace

bool mpi_available() noexcept {
  return true;
}

std::unique_ptr<Communicator> make_mpi_communicator() {
  return std::make_unique<MpiCommunicator>();
}

}  // namespace tierswap
