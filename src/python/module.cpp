// _tierswap: the Python binding of the one-object setup (TieredOptimizer). It does not link
// libtorch: tensors cross as (data pointer, dtype name, element count), which the Python layer
// (tierswap/torch.py) takes from checked, contiguous CPU tensors and this layer checks against the
// registered parameter. The GIL is released wherever tierswap works (ingest, step, copies, I/O).
// C++ exceptions become Python ones by pybind11's mapping: std::invalid_argument -> ValueError,
// every other std::exception (std::logic_error, std::runtime_error, std::system_error) ->
// RuntimeError, with the message.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "tierswap/communicator.hpp"
#include "tierswap/detail/temp_dir.hpp"
#include "tierswap/kernels.hpp"
#include "tierswap/tier_manager.hpp"
#include "tierswap/tiered_optimizer.hpp"
#include "tierswap/units.hpp"

namespace py = pybind11;
using namespace tierswap;

namespace {

using Release = py::call_guard<py::gil_scoped_release>;
// (parameter id, data pointer, dtype name, element count)
using TensorRef = std::tuple<ParamId, std::uintptr_t, std::string, std::uint64_t>;

Dtype parse_dtype(const std::string& s) {
  if (s == "bfloat16" || s == "bf16") return Dtype::bf16;
  if (s == "float16" || s == "f16") return Dtype::f16;
  if (s == "float32" || s == "f32") return Dtype::f32;
  throw std::invalid_argument(
      fmt::format("dtype '{}': tierswap takes bfloat16, float16 or float32", s));
}

// GroupConfig's fields by their Python names: one table for both directions.
constexpr std::pair<const char*, double GroupConfig::*> kReals[] = {
    {"lr", &GroupConfig::lr},
    {"beta1", &GroupConfig::beta1},
    {"beta2", &GroupConfig::beta2},
    {"eps", &GroupConfig::eps},
    {"weight_decay", &GroupConfig::weight_decay},
    {"momentum", &GroupConfig::momentum},
    {"dampening", &GroupConfig::dampening}};
constexpr std::pair<const char*, bool GroupConfig::*> kFlags[] = {
    {"amsgrad", &GroupConfig::amsgrad},
    {"maximize", &GroupConfig::maximize},
    {"nesterov", &GroupConfig::nesterov}};

GroupConfig group_config(const std::string& kind, const py::dict& h) {
  GroupConfig c = GroupConfig::defaults(parse_optimizer_kind(kind));
  for (auto [k, v] : h) {
    const auto key = k.cast<std::string>();
    auto is = [&](const auto& entry) { return key == entry.first; };
    if (auto r = std::find_if(std::begin(kReals), std::end(kReals), is); r != std::end(kReals))
      c.*(r->second) = v.cast<double>();
    else if (auto f = std::find_if(std::begin(kFlags), std::end(kFlags), is); f != std::end(kFlags))
      c.*(f->second) = v.cast<bool>();
    else
      throw std::invalid_argument(fmt::format("group option '{}': unknown", key));
  }
  c.validate();
  return c;
}

py::dict group_dict(const GroupConfig& c) {
  py::dict d;
  d["kind"] = std::string(to_string(c.kind));
  for (const auto& [name, field] : kReals) d[name] = c.*field;
  for (const auto& [name, field] : kFlags) d[name] = c.*field;
  return d;
}

py::dict step_dict(const StepResult& r) {
  py::dict d;
  d["skipped"] = r.skipped;
  d["step"] = r.step;
  d["grad_norm"] = r.grad_norm;
  d["clip_factor"] = r.clip_factor;
  d["loss_scale"] = r.loss_scale;
  d["next_loss_scale"] = r.next_loss_scale;
  constexpr int nvme = static_cast<int>(Tier::nvme);
  d["nvme_bytes_read"] = r.bytes_out[nvme];  // out of the NVMe tier
  d["nvme_bytes_written"] = r.bytes_in[nvme];
  d["io_wait_seconds"] = r.io_wait_seconds;
  d["commit_seconds"] = r.commit_seconds;
  d["commit_wait_seconds"] = r.commit_wait_seconds;
  d["commit_pending"] = r.commit_pending;
  d["seconds"] = r.seconds;
  d["generation"] = r.generation;
  d["overlapped_subgroups"] = r.overlapped_subgroups;
  d["lent_subgroups"] = r.lent_subgroups;
  d["redone"] = r.redone;
  return d;
}

// A Communicator implemented in Python (tierswap.distributed.TorchCommunicator over a
// torch.distributed process group). Buffers cross as writable memoryviews of host memory; the
// GIL is taken for each collective (the optimizer calls them with it released).
class PyCommunicator : public Communicator {
 public:
  int rank() const noexcept override { return cached(rank_, "rank"); }
  int size() const noexcept override { return cached(size_, "size"); }
  std::string_view name() const noexcept override { return "torch.distributed"; }

  void reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts,
                      Dtype dtype) override {
    std::size_t total = 0, off = 0;
    for (std::size_t r = 0; r < counts.size(); ++r) {
      if (static_cast<int>(r) < rank()) off += counts[r];
      total += counts[r];
    }
    const std::size_t es = dtype_size(dtype);
    py::gil_scoped_acquire gil;
    call("reduce_scatter", view(const_cast<void*>(send), total * es),
         view(recv, counts[rank()] * es), std::vector<std::size_t>(counts.begin(), counts.end()),
         std::string(to_string(dtype)), off);
  }
  void all_gather_v(void* buf, std::span<const std::size_t> counts,
                    std::span<const std::size_t> displs, Dtype dtype) override {
    std::size_t end = 0;
    for (std::size_t r = 0; r < counts.size(); ++r) end = std::max(end, displs[r] + counts[r]);
    py::gil_scoped_acquire gil;
    call("all_gather_v", view(buf, end * dtype_size(dtype)),
         std::vector<std::size_t>(counts.begin(), counts.end()),
         std::vector<std::size_t>(displs.begin(), displs.end()), std::string(to_string(dtype)));
  }
  void all_reduce_sum(double* data, std::size_t n) override {
    py::gil_scoped_acquire gil;
    call("all_reduce_sum", view(data, n * sizeof(double)));
  }
  bool all_reduce_or(bool flag) override {
    py::gil_scoped_acquire gil;
    return call("all_reduce_or", flag).cast<bool>();
  }
  void broadcast(void* data, std::size_t bytes, int root) override {
    py::gil_scoped_acquire gil;
    call("broadcast", view(data, bytes), root);
  }
  void barrier() override {
    py::gil_scoped_acquire gil;
    call("barrier");
  }

 private:
  static py::memoryview view(void* p, std::size_t bytes) {
    return py::memoryview::from_memory(p, static_cast<py::ssize_t>(bytes), false);
  }
  template <class... A>
  py::object call(const char* what, A&&... args) {
    py::function f = py::get_override(static_cast<const Communicator*>(this), what);
    if (!f)
      throw std::logic_error(
          fmt::format("communicator: the Python class defines no '{}' method", what));
    return f(std::forward<A>(args)...);
  }
  // rank() and size() are noexcept: asked of Python once, then cached.
  int cached(int& slot, const char* what) const noexcept {
    if (slot < 0) {
      try {
        py::gil_scoped_acquire gil;
        py::function f = py::get_override(static_cast<const Communicator*>(this), what);
        slot = f ? f().cast<int>() : 0;
      } catch (...) {
        slot = 0;
      }
    }
    return slot;
  }
  mutable int rank_ = -1, size_ = -1;
};

class PyOptimizer {
 public:
  PyOptimizer(std::vector<std::string> swap_dirs, std::uint64_t host_budget,
              std::string communicator, std::shared_ptr<Communicator> comm, unsigned threads,
              const std::string& optimizer_json, const std::string& tiers_json,
              const std::string& service_json, bool keep_swap_files, std::uint64_t swap_capacity,
              std::uint64_t subgroup_size, bool resume, bool temporary)
      : t_(options(std::move(swap_dirs), host_budget, std::move(communicator), std::move(comm),
                   threads, optimizer_json, tiers_json, service_json, keep_swap_files,
                   swap_capacity, subgroup_size, resume, temporary)) {}

  TieredOptimizer& t() {
    if (closed_) throw std::logic_error("the tierswap optimizer was closed");
    return *t_;
  }
  ShardedOptimizer& opt() { return t().optimizer(); }

  const ParamSpec& checked(ParamId id, std::uint64_t numel, const char* what) {
    const ParamSpec& p = opt().param(id);
    if (p.numel() != numel)
      throw std::invalid_argument(
          fmt::format("{} '{}': {} elements given for {}", what, p.name, numel, p.numel()));
    return p;
  }

  void initialize(const std::vector<TensorRef>& values) {
    std::unordered_map<ParamId, std::pair<const std::byte*, Dtype>> src;
    for (const auto& [id, ptr, dt, n] : values) {
      checked(id, n, "initialize");
      src[id] = {reinterpret_cast<const std::byte*>(ptr), parse_dtype(dt)};
    }
    opt().initialize([&](ParamId id, std::uint64_t off, float* out, std::uint64_t n) {
      auto it = src.find(id);
      if (it == src.end())
        throw std::invalid_argument(
            fmt::format("initialize: no values for '{}'", opt().param(id).name));
      const auto [p, dt] = it->second;
      cast(p + off * dtype_size(dt), dt, out, Dtype::f32, n);
    });
  }

  // A group added between steps: (name, shape, dtype, requires_grad, values' address) per
  // parameter; the values (16-bit, the parameter's own) become its masters. The new ids, in order.
  using NewParam =
      std::tuple<std::string, std::vector<std::int64_t>, std::string, bool, std::uintptr_t>;
  std::vector<ParamId> add_group_between_steps(const GroupConfig& cfg, std::string name,
                                               const std::vector<NewParam>& given) {
    std::vector<ParamSpec> specs;
    std::unordered_map<std::string, std::pair<const std::byte*, Dtype>> src;
    for (const auto& [pname, shape, dt, trainable, ptr] : given) {
      specs.push_back({pname, shape, parse_dtype(dt), trainable});
      src[pname] = {reinterpret_cast<const std::byte*>(ptr), parse_dtype(dt)};
    }
    return opt().add_group_between_steps(
        cfg, std::move(name), specs,
        [&](ParamId id, std::uint64_t off, float* out, std::uint64_t n) {
          const auto [p, dt] = src.at(opt().param(id).name);
          cast(p + off * dtype_size(dt), dt, out, Dtype::f32, n);
        });
  }

  void add_grad(ParamId id, std::uintptr_t ptr, const std::string& dt, std::uint64_t n) {
    checked(id, n, "gradient of");
    opt().add_grad(id, reinterpret_cast<const void*>(ptr), parse_dtype(dt));
  }

  // From device memory (host memory standing in on a simulated device tier), ordered after the
  // events (cudaEvent_t addresses) of the streams that produced it.
  void add_grad_device(ParamId id, std::uintptr_t ptr, const std::string& dt, std::uint64_t n,
                       const std::vector<std::uintptr_t>& events) {
    checked(id, n, "gradient of");
    std::vector<void*> ev;
    for (std::uintptr_t e : events) ev.push_back(reinterpret_cast<void*>(e));
    opt().add_grad_device(id, reinterpret_cast<const void*>(ptr), parse_dtype(dt), ev);
  }

  // The caller keeps the tensors alive and unchanged until step() returns (tierswap.torch does).
  // One call for a step's every gradient: the GIL is released once, not per parameter.
  void lend_grads(const std::vector<TensorRef>& grads) {
    for (const auto& [id, ptr, dt, n] : grads) {
      checked(id, n, "gradient of");
      opt().lend_grad(id, reinterpret_cast<const void*>(ptr), parse_dtype(dt));
    }
  }

  void gather(ParamId id, const std::string& cls, std::uintptr_t ptr, std::uint64_t n) {
    checked(id, n, "gather");
    const auto v = opt().gather(id, parse_block_class(cls));
    std::memcpy(reinterpret_cast<void*>(ptr), v.data(), v.size() * sizeof(float));
  }

  void import_state(
      const std::vector<std::tuple<ParamId, std::string, std::uintptr_t, std::uint64_t>>& items,
      std::optional<std::uint64_t> step, const std::vector<std::uint64_t>& group_steps) {
    std::vector<ShardedOptimizer::StateTensor> in;
    for (const auto& [id, cls, ptr, n] : items)
      in.push_back({id, parse_block_class(cls),
                    std::span<const float>(reinterpret_cast<const float*>(ptr), n)});
    opt().import_state(in, step, group_steps);
  }

  /// `failed`: the run ends by an error (its swap files are kept for a resume).
  void close(bool failed) {
    closed_ = true;
    if (failed && t_) t_->mark_failed();
    t_.reset();
  }

 private:
  static TieredOptions options(std::vector<std::string> dirs, std::uint64_t budget,
                               std::string comm, std::shared_ptr<Communicator> custom,
                               unsigned threads, const std::string& oj, const std::string& tj,
                               const std::string& sj, bool keep, std::uint64_t capacity,
                               std::uint64_t subgroup, bool resume, bool temporary) {
    TieredOptions o;
    for (auto& d : dirs) o.swap_dirs.emplace_back(std::move(d));
    o.host_budget = budget;
    o.communicator = std::move(comm);
    o.comm = std::move(custom);
    o.threads = threads;
    o.optimizer = OptimizerConfig::from_json(oj);
    o.optimizer.subgroup_size = subgroup;  // 0: chosen from the host budget
    o.tiers = TierConfig::from_json(tj);
    // The service's settings from the environment, those given as keywords over them.
    o.service = NodeServiceConfig::from_json(sj, NodeServiceConfig::from_env());
    o.keep_swap_files = keep;
    o.swap_capacity = capacity;
    o.resume = resume;
    o.temporary_swap_dirs = temporary;
    return o;
  }

  std::optional<TieredOptimizer> t_;
  bool closed_ = false;
};

using PyOptimizerClass = py::class_<PyOptimizer>;

// Groups and parameters, finalize and the initial values.
void bind_setup(PyOptimizerClass& c) {
  c.def("resumed", [](PyOptimizer& s) { return s.t().resumed(); })
      .def("add_group",
           [](PyOptimizer& s, const std::string& kind, const py::dict& h, std::string name) {
             return s.t().add_group(group_config(kind, h), std::move(name));
           })
      .def("set_group",
           [](PyOptimizer& s, int g, const std::string& kind, const py::dict& h) {
             s.opt().set_group_config(g, group_config(kind, h));
           })
      .def("group", [](PyOptimizer& s, int g) { return group_dict(s.opt().group_config(g)); })
      .def("add_param",
           [](PyOptimizer& s, int g, std::string name, std::vector<std::int64_t> shape,
              const std::string& dt, bool requires_grad) {
             return s.t().add_param(
                 g, {std::move(name), std::move(shape), parse_dtype(dt), requires_grad});
           })
      .def("add_group_between_steps",
           [](PyOptimizer& s, const std::string& kind, const py::dict& h, std::string name,
              const std::vector<PyOptimizer::NewParam>& params) {
             const GroupConfig cfg = group_config(kind, h);  // with the GIL: reads the dict
             py::gil_scoped_release nogil;
             return s.add_group_between_steps(cfg, std::move(name), params);
           })
      .def("group_step_count", [](PyOptimizer& s, int g) { return s.opt().group_step_count(g); })
      .def(
          "finalize", [](PyOptimizer& s) { s.t().finalize(); }, Release())
      .def("initialize", &PyOptimizer::initialize, Release());
}

// A backward's gradients and the step.
void bind_backward_and_step(PyOptimizerClass& c) {
  c.def(
       "begin_backward", [](PyOptimizer& s, bool final) { s.opt().begin_backward(final); },
       Release())
      .def("add_grad", &PyOptimizer::add_grad, Release())
      .def("lend_grads", &PyOptimizer::lend_grads, Release())
      .def("add_grad_device", &PyOptimizer::add_grad_device, Release())
      .def(
          "bind_param16_device",
          [](PyOptimizer& s, ParamId id, std::uintptr_t ptr) {
            s.opt().bind_param16_device(id, reinterpret_cast<void*>(ptr));
          },
          Release())
      .def(
          "drop_grads", [](PyOptimizer& s) { s.opt().drop_grads(); }, Release())
      .def(
          "leave_alone",
          [](PyOptimizer& s, const std::vector<ParamId>& ids) { s.opt().leave_alone(ids); },
          Release())
      .def(
          "end_backward", [](PyOptimizer& s) { s.opt().end_backward(); }, Release())
      .def("in_backward", [](PyOptimizer& s) { return s.opt().in_backward(); })
      .def(
          "step",
          [](PyOptimizer& s, std::optional<double> clip_factor) {
            StepResult r;
            {
              py::gil_scoped_release nogil;
              r = clip_factor ? s.opt().step(*clip_factor) : s.opt().step();
            }
            return step_dict(r);
          },
          py::arg("clip_factor") = py::none());
}

// The 16-bit parameters, the state in and out, checkpoints.
void bind_state(PyOptimizerClass& c) {
  c  // param16() itself, writable, for the trainer's tensors to alias (zero-copy); valid until
     // close(). The optimizer writes it at every step, load() and import_state().
      .def("param16_view",
           [](PyOptimizer& s, ParamId id) {
             const auto v = s.opt().param16(id);
             return py::memoryview::from_memory(const_cast<std::uint16_t*>(v.data()),
                                                static_cast<py::ssize_t>(v.size_bytes()), false);
           })
      .def("gather", &PyOptimizer::gather, Release())
      .def("import_state", &PyOptimizer::import_state, py::arg("items"), py::arg("step"),
           py::arg("group_steps") = std::vector<std::uint64_t>{}, Release())
      .def(
          "save", [](PyOptimizer& s, const std::string& d) { s.opt().save(d); }, Release())
      .def(
          "load", [](PyOptimizer& s, const std::string& d) { s.opt().load(d); }, Release());
}

// What the trainer and `tierswap residency` ask about.
void bind_introspection(PyOptimizerClass& c) {
  c.def("loss_scale", [](PyOptimizer& s) { return s.opt().loss_scale(); })
      .def("step_count", [](PyOptimizer& s) { return s.opt().step_count(); })
      .def("set_overlap", [](PyOptimizer& s, bool on) { s.opt().set_overlap(on); })
      .def("overlap", [](PyOptimizer& s) { return s.opt().overlap(); })
      .def("speculation_pending", [](PyOptimizer& s) { return s.opt().speculation_pending(); })
      .def("subgroup_count", [](PyOptimizer& s) { return s.opt().subgroup_count(); })
      .def("subgroup_size", [](PyOptimizer& s) { return s.opt().config().subgroup_size; })
      .def("state_bytes", [](PyOptimizer& s) { return s.opt().state_bytes(); })
      .def("world", [](PyOptimizer& s) { return s.t().communicator().size(); })
      .def("rank", [](PyOptimizer& s) { return s.t().communicator().rank(); })
      .def(  // collective: whether `flag` is true on any rank
          "any_rank",
          [](PyOptimizer& s, bool flag) { return s.t().communicator().all_reduce_or(flag); },
          Release())
      .def(  // collective: flag by flag, whether it is true on any rank (one reduction)
          "any_rank_each",
          [](PyOptimizer& s, const std::vector<bool>& flags) {
            std::vector<double> v(flags.begin(), flags.end());
            s.t().communicator().all_reduce_sum(v.data(), v.size());
            return std::vector<bool>(v.begin(), v.end());  // sums of 0 and 1: exact
          },
          Release())
      .def("residency_json",
           [](PyOptimizer& s) {
             ResidencySnapshot snap;
             {
               py::gil_scoped_release nogil;
               snap = s.t().tiers().snapshot();
             }
             return snap.to_json();
           })
      .def("telemetry_socket",
           [](PyOptimizer& s) { return s.t().tiers().telemetry_socket().string(); })
      .def("rank_dirs", [](PyOptimizer& s) {
        std::vector<std::string> out;
        for (const auto& d : s.t().rank_dirs()) out.push_back(d.string());
        return out;
      });
}

// detail::OwnedTempDir: an optimizer's temporary swap directory (tierswap/_swapdir.py).
void bind_temp_dir(py::module_& m) {
  using detail::OwnedTempDir;
  py::class_<OwnedTempDir>(m, "TempDir",
                           "a temporary directory removed at remove(), when SIGINT/SIGTERM/SIGHUP "
                           "ends the process, and by a later sweep when its process was killed")
      .def_property_readonly("path", [](const OwnedTempDir& d) { return d.path().string(); })
      .def("remove", &OwnedTempDir::remove, Release());
  m.def(
      "default_temp_root", [] { return OwnedTempDir::default_root().string(); },
      "TMPDIR when set and not empty, else /var/tmp");
  m.def(
      "make_temp_dir",
      [](const std::string& root, const std::string& prefix) {
        std::vector<OwnedTempDir::Swept> swept;
        std::unique_ptr<OwnedTempDir> dir;
        {
          py::gil_scoped_release nogil;
          dir =
              std::make_unique<OwnedTempDir>(root, prefix, OwnedTempDir::OnSignal::remove, &swept);
        }
        std::vector<std::pair<std::string, std::uint64_t>> gone;
        for (const auto& g : swept) gone.emplace_back(g.path.string(), g.bytes);
        return py::make_tuple(py::cast(std::move(dir)), gone);
      },
      py::arg("root"), py::arg("prefix"),
      "a new temporary directory under root, after removing those of processes that have ended: "
      "(TempDir, [(path removed, bytes)])");
}

}  // namespace

PYBIND11_MODULE(_tierswap, m) {
  m.doc() = "tierswap's native layer (use tierswap.torch)";
  py::class_<Communicator, PyCommunicator, std::shared_ptr<Communicator>>(m, "Communicator")
      .def(py::init<>())
      .def("rank", &Communicator::rank)
      .def("size", &Communicator::size)
      .def("all_reduce_or", &Communicator::all_reduce_or, py::arg("flag"), Release());
  // A native communicator ("mpi", "auto", ...: make_communicator's kinds), made before the
  // optimizer so that the ranks can agree on the Python side's checks over it first.
  m.def(
      "make_communicator",
      [](const std::string& kind) {
        return std::shared_ptr<Communicator>(make_communicator(kind));
      },
      py::arg("kind"), Release());
  m.def("launched_by_mpi", &launched_by_mpi);
  m.def("mpi_available", &mpi_available);
  PyOptimizerClass c(m, "Optimizer");
  c.def(py::init<std::vector<std::string>, std::uint64_t, std::string,
                 std::shared_ptr<Communicator>, unsigned, const std::string&, const std::string&,
                 const std::string&, bool, std::uint64_t, std::uint64_t, bool, bool>(),
        py::arg("swap_dirs"), py::arg("host_budget"), py::arg("communicator"), py::arg("comm"),
        py::arg("threads"), py::arg("optimizer_json"), py::arg("tiers_json"),
        py::arg("service_json"), py::arg("keep_swap_files"), py::arg("swap_capacity"),
        py::arg("subgroup_size"), py::arg("resume"), py::arg("temporary") = false)
      .def("close", &PyOptimizer::close, py::arg("failed") = false, Release());
  bind_setup(c);
  bind_backward_and_step(c);
  bind_state(c);
  bind_introspection(c);
  m.def(
      "parse_size",
      [](const std::string& s, const std::string& what) { return parse_size(s, what.c_str()); },
      py::arg("text"), py::arg("what") = "size");
  m.def(
      "parse_count",
      [](const std::string& s, const std::string& what) {
        return parse_param_count(s, what.c_str());
      },
      py::arg("text"), py::arg("what") = "count");
  bind_temp_dir(m);
}
