// TieredOptimizer: the one-object setup (see the header). The parts are built at finalize(),
// when the parameters say how large the swap space must be.
#include "tierswap/tiered_optimizer.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <exception>
#include <optional>
#include <set>
#include <stdexcept>
#include <system_error>
#include <thread>

#include "src/optim/optimizer_impl.hpp"
#include "tierswap/aligned_buffer.hpp"
#include "tierswap/checksum.hpp"
#include "tierswap/communicator.hpp"
#include "tierswap/detail/env.hpp"
#include "tierswap/detail/file.hpp"
#include "tierswap/detail/manifest.hpp"
#include "tierswap/detail/paths.hpp"
#include "tierswap/detail/process.hpp"
#include "tierswap/error.hpp"
#include "tierswap/io_engine.hpp"
#include "tierswap/log.hpp"
#include "tierswap/service.hpp"
#include "tierswap/swap_space.hpp"
#include "tierswap/thread_pool.hpp"
#include "tierswap/units.hpp"

namespace tierswap {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;
// Extent rounding headroom per block: the swap alignment is at most this (queried at creation).
constexpr std::uint64_t kBlockRounding = 64 * 1024;

// Bytes per element of a group's state blocks (master and moments; bf16 moments with
// bf16_moments, as the optimizer stores them) and, in *blocks, how many blocks a sub-group has
// (the gradient's included).
std::uint64_t state_bytes_per_element(const GroupConfig& g, const OptimizerConfig& c,
                                      std::uint64_t* blocks) {
  std::uint64_t bytes = 0, n = 0;
  for (int slot = 0; slot < kStateSlots; ++slot) {
    if (!keeps_slot(g, slot)) continue;
    ++n;
    bytes += slot == kMaster || slot == kMomentum || !c.bf16_moments ? 4 : 2;
  }
  *blocks = n + 1;
  return bytes;
}

void check_free_space(const std::vector<std::filesystem::path>& dirs, std::uint64_t capacity) {
  const std::uint64_t per_dir = (capacity + dirs.size() - 1) / dirs.size() + kMiB;
  for (const auto& d : dirs) {
    const std::uint64_t free = detail::filesystem_free_bytes(d);
    if (free < per_dir)
      throw std::runtime_error(fmt::format(
          "swap directory {}: needs {} ({} B) for this rank's share of {} of swap space "
          "(parameters' state x 2 generation slots + gradients + headroom), but its filesystem "
          "has {} free; free space, add swap directories (striping), or lower the state "
          "(bf16_moments)",
          d.string(), format_bytes(per_dir), per_dir, format_bytes(capacity), format_bytes(free)));
  }
}

// `<dir>/tierswap-rank<R>`, created 0700 if missing. Whether it holds an earlier run's space
// goes to *earlier; that is refused unless `resume`.
std::filesystem::path rank_dir(const std::filesystem::path& dir, int rank, bool resume,
                               bool* earlier) {
  std::error_code ec;
  detail::check_trusted_dir(
      dir, "swap_dirs:", false,
      fmt::format("create it on the drive meant for the swap files (mkdir -p {}); tierswap does "
                  "not, so that a drive not mounted is never filled through its mount point",
                  dir.string()));
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw std::invalid_argument(fmt::format("swap_dirs: {} is not writable", dir.string()));
  auto sub = dir / fmt::format("tierswap-rank{}", rank);
  if (::mkdir(sub.c_str(), 0700) != 0 && errno != EEXIST)
    throw std::system_error(errno, std::system_category(), "mkdir " + sub.string());
  detail::check_trusted_dir(sub, "swap directory", /*private_dir=*/true);
  if (std::filesystem::exists(sub / SwapSpace::kFileName, ec))  // a live run's, said as such
    detail::close_lock(detail::open_lock(sub / SwapSpace::kFileName, "swap file"));
  for (auto name : {SwapSpace::kFileName, detail::kManifestName}) {
    if (!std::filesystem::exists(sub / name, ec)) continue;
    *earlier = true;
    if (!resume)
      throw std::runtime_error(fmt::format(
          "swap directory {} holds the swap space of an earlier run that did not end cleanly "
          "({}); tierswap will not overwrite it: resume from it (TieredOptions::resume, "
          "resume=True in Python), remove the directory to start afresh, or restore a save() "
          "checkpoint with load() after starting in an empty one",
          sub.string(), (sub / name).string()));
  }
  return sub;
}

}  // namespace

OptimizerConfig TieredOptions::automatic_optimizer_config() {
  OptimizerConfig c = OptimizerConfig::from_env();
  if (std::getenv("TIERSWAP_SUBGROUP_SIZE") == nullptr) c.subgroup_size = 0;
  return c;
}

std::uint64_t swap_bytes_needed(const std::vector<std::pair<GroupConfig, std::uint64_t>>& groups,
                                int world, const OptimizerConfig& cfg, bool shadow_slots) {
  const std::uint64_t slots = shadow_slots ? 2 : 1;
  const std::uint64_t grad = cfg.accumulate_fp32 ? 4 : 2;
  const std::uint64_t sg = std::max<std::uint64_t>(cfg.subgroup_size, kGradStatsChunk);
  std::uint64_t total = 0;
  for (const auto& [g, numel] : groups) {
    if (numel == 0) continue;
    std::uint64_t blocks = 0;
    const std::uint64_t bpe = state_bytes_per_element(g, cfg, &blocks) + grad;
    const std::uint64_t per_rank = (numel + world - 1) / world;
    const std::uint64_t part = (per_rank + kGradStatsChunk - 1) / kGradStatsChunk * kGradStatsChunk;
    const std::uint64_t subs = (part + sg - 1) / sg;
    total += slots * (part * bpe + subs * blocks * kBlockRounding);
  }
  return total + total / 64 + 16 * kMiB;
}

namespace {

// Bytes of this rank's 16-bit (or fp32 accumulation) gradients, with the chunk rounding of the
// partitions.
std::uint64_t grad_bytes_needed(const std::vector<std::pair<GroupConfig, std::uint64_t>>& groups,
                                int world, const OptimizerConfig& cfg) {
  const std::uint64_t grad = cfg.accumulate_fp32 ? 4 : 2;
  std::uint64_t total = 0;
  for (const auto& [g, numel] : groups) {
    const std::uint64_t per_rank = (numel + world - 1) / world;
    total += (per_rank + kGradStatsChunk - 1) / kGradStatsChunk * kGradStatsChunk * grad;
  }
  return total;
}

// The locked shared memory a rank asks the node service for: its host budget and two slabs of
// slack (what opening a committed space reads to verify it, one block at a time).
std::uint64_t attach_bytes(const TierConfig& tc) {
  return round_up(tc.host_budget + 2 * tc.host_slab_size, 4096);
}

// The two slabs of slack the host pools need beside their budget (what opening a committed
// space reads to verify it), for pools that must fit in `charge` bytes: the slabs are sized again
// for the smaller budget, to at most an eighth of it.
std::uint64_t slack_within(std::uint64_t charge, std::uint64_t slab) {
  return 2 * std::min(slab, std::bit_floor(std::max<std::uint64_t>(charge / 8, 4096)));
}

// The smallest host budget taken from a service's offer (below it, give host_budget).
constexpr std::uint64_t kMinServiceBudget = 4 * kMiB;

// The ranks on this node that share a node service's budget: what the launcher says (torchrun,
// Open MPI, MPICH), else 1.
std::uint32_t local_ranks() {
  for (const char* name : {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
    const std::uint64_t n = detail::env_u64(name, 0, false);
    if (n > 0) return static_cast<std::uint32_t>(std::min<std::uint64_t>(n, 1u << 20));
  }
  return 1;
}

}  // namespace

std::uint64_t automatic_subgroup_size(std::uint64_t host_budget, const OptimizerConfig& oc,
                                      std::uint64_t state_bytes_per_param) {
  const std::uint64_t per =
      3 * (oc.prefetch_depth + 2ull) * std::max<std::uint64_t>(state_bytes_per_param, 4);
  const std::uint64_t sg =
      std::clamp<std::uint64_t>(host_budget / per, kGradStatsChunk, kDefaultSubgroupSize);
  return sg / kGradStatsChunk * kGradStatsChunk;
}

void tune_tier_config(TierConfig& tc, const OptimizerConfig& oc, std::uint64_t state_blocks) {
  tc.lookahead = std::min<std::uint32_t>(
      4096, (oc.prefetch_depth + 1) *
                static_cast<std::uint32_t>(std::max<std::uint64_t>(1, state_blocks)));
  tc.max_dirty_bytes = tc.host_budget / 4;
  // Whole huge pages (HostPool carves slabs from huge-page chunks: a slab of whole pages shares
  // none with the next, and the slab slack the service is asked for stays page-aligned).
  tc.host_slab_size = std::min<std::uint64_t>(
      64 * kMiB, round_up(oc.subgroup_size * 4, std::uint64_t{kHugePageBytes}));
}

void size_pageable_budget(TierConfig& tc, const OptimizerConfig& oc, std::uint64_t grad_bytes) {
  if (tc.pageable_budget == 0 && oc.grad_tier == Tier::host)
    tc.pageable_budget = grad_bytes + 2 * tc.host_slab_size;
}

struct TieredOptimizer::Impl {
  TieredOptions o;
  std::shared_ptr<Communicator> comm;
  std::vector<std::pair<GroupConfig, std::string>> groups;
  std::vector<std::pair<int, ParamSpec>> params;
  std::vector<std::uint64_t> group_numel;
  std::set<std::string> names;
  std::vector<std::filesystem::path> dirs;
  // Built at finalize(), destroyed in reverse order. Through the node service (o.service),
  // `storage` owns the space and the engine; `space` and `engine` then point into it.
  std::unique_ptr<ServiceStorage> storage;
  std::unique_ptr<SwapSpace> own_space;
  std::unique_ptr<IoEngine> own_engine;
  SwapSpace* space = nullptr;
  IoEngine* engine = nullptr;
  std::unique_ptr<TierManager> tiers;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<ShardedOptimizer> opt;

  // The process that made it. A child forked from it (a DataLoader worker, os.fork()) has its
  // memory and descriptors but none of its threads: it cannot use it, and its copy is never torn
  // down there (that would wait for threads that do not exist and remove the parent's files).
  pid_t owner = detail::current_pid();
  bool inherited() const noexcept { return detail::current_pid() != owner; }

  void require(const char* what) const {
    if (inherited())
      throw std::logic_error(fmt::format(
          "TieredOptimizer::{}: this optimizer belongs to process {}, and this is a child forked "
          "from it (pid {}): its threads and I/O stay in the parent; make one in the child, on "
          "a swap directory of its own",
          what, owner, ::getpid()));
    if (!opt)
      throw std::logic_error(fmt::format("TieredOptimizer::{}: call finalize() first", what));
  }
  bool created = false;  // this object made the swap files (a failed finalize() removes them)
  bool resumed = false;
  bool failed = false;  // mark_failed()
  bool keeps_after_failure(bool failing) const noexcept;
  void warn_kept() const noexcept;
  void remove_files() noexcept;
  void build();
  /// build()'s part of this rank alone (the swap space, engine, tier manager, pool and
  /// optimizer with its groups and parameters), before the ranks agree that every one has it.
  void build_parts(TierConfig& tc, OptimizerConfig& oc,
                   std::vector<std::pair<GroupConfig, std::uint64_t>>& sizes);
  void size_to_budget(TierConfig& tc, OptimizerConfig& oc, bool auto_subgroup, std::uint64_t bpe,
                      std::uint64_t blocks) const;
  ServiceOffer fit_to_service(TierConfig& tc) const;
  void fit_slack_within(TierConfig& tc, OptimizerConfig& oc, bool auto_subgroup, std::uint64_t bpe,
                        std::uint64_t blocks);
  std::uint64_t service_charge = 0;  // the shared memory asked of the service (fit_slack_within)
  void fit_pageable_to_offer(TierConfig& tc, const ServiceOffer& offer) const;
  void open_space(const std::vector<std::pair<GroupConfig, std::uint64_t>>& sizes,
                  const OptimizerConfig& oc, const TierConfig& tc, bool earlier);
  void attach_service(std::uint64_t capacity, const TierConfig& tc, bool earlier);
  SwapSpace open_earlier_space() const;
  void finalize_optimizer(const std::vector<std::pair<GroupConfig, std::uint64_t>>& sizes,
                          const OptimizerConfig& oc, const TierConfig& tc);
  void drop_storage() noexcept {
    engine = nullptr;
    space = nullptr;
    own_engine.reset();
    storage.reset();
  }
};

void TieredOptimizer::Impl::remove_files() noexcept {
  if (own_space) own_space->remove_files();
  std::error_code ec;
  for (const auto& d : dirs) {
    detail::remove_manifest_file(d / detail::kManifestName);
    std::filesystem::remove(d, ec);  // only when empty
  }
}

// The sub-group size (when automatic) and the tier settings that follow the host budget.
void TieredOptimizer::Impl::size_to_budget(TierConfig& tc, OptimizerConfig& oc, bool auto_subgroup,
                                           std::uint64_t bpe, std::uint64_t blocks) const {
  if (auto_subgroup) oc.subgroup_size = automatic_subgroup_size(tc.host_budget, oc, bpe);
  if (o.tune_tiers) tune_tier_config(tc, oc, blocks);
  if (tc.host_slab_size > tc.host_budget / 8)
    tc.host_slab_size = std::max<std::uint64_t>(4096, std::bit_floor(tc.host_budget / 8));
}

// No host_budget given and a node service named: this rank's budget is tiers.host_budget or, when
// that does not fit, what the service offers it (1/local ranks of the node's budget, within the
// per-client quota and what is free); fit_slack_within() then makes room for the slack in it.
ServiceOffer TieredOptimizer::Impl::fit_to_service(TierConfig& tc) const {
  const std::uint32_t share = local_ranks();
  const ServiceOffer offer =
      service_offer(o.service.socket, share, o.service.timeout_seconds, o.service.wait_seconds);
  if (round_up(tc.host_budget, 4096) <= offer.bytes) return offer;
  const std::uint64_t slack = slack_within(offer.bytes, tc.host_slab_size);
  if (offer.bytes < slack + kMinServiceBudget)
    throw std::runtime_error(fmt::format(
        "tierswap service {}: it offers this rank {} (1/{} of its {} budget, quota {}, {} "
        "free): too little for a host budget of at least {} and its {} of slab slack; start it "
        "with a larger --host-budget, or give host_budget",
        o.service.socket, format_bytes(offer.bytes), share, format_bytes(offer.budget),
        format_bytes(offer.quota), format_bytes(offer.free), format_bytes(kMinServiceBudget),
        format_bytes(slack)));
  log(LogLevel::info,
      fmt::format("host budget {} (of {} asked): what the tierswap service at {} offers this "
                  "rank (1/{} of its {}, {} free)",
                  format_bytes(offer.bytes), format_bytes(tc.host_budget), o.service.socket, share,
                  format_bytes(offer.budget), format_bytes(offer.free)));
  tc.host_budget = offer.bytes;
  return offer;
}

// Through the node service the host budget is all the rank takes from the node's budget: the
// charge is the budget (in whole pages), and the pools' slab slack comes out of it. One pass
// fits: the slabs sized again for the smaller budget are no larger than before, nor than an
// eighth of the charge, which is the slack taken off.
void TieredOptimizer::Impl::fit_slack_within(TierConfig& tc, OptimizerConfig& oc,
                                             bool auto_subgroup, std::uint64_t bpe,
                                             std::uint64_t blocks) {
  const std::uint64_t charge = round_up(tc.host_budget, 4096);
  const std::uint64_t slack = slack_within(charge, tc.host_slab_size);
  if (charge < slack + 4 * 4096)
    throw std::invalid_argument(fmt::format(
        "host_budget {} through the tierswap service {}: too little for its {} of slab slack, "
        "which is part of what the rank takes from the service's budget",
        format_bytes(tc.host_budget), o.service.socket, format_bytes(slack)));
  tc = o.tiers;  // as build() began, with the budget less the slack
  tc.host_budget = (charge - slack) / 4096 * 4096;
  size_to_budget(tc, oc, auto_subgroup, bpe, blocks);
  if (attach_bytes(tc) > charge) tc.host_budget = (charge - 2 * tc.host_slab_size) / 4096 * 4096;
  service_charge = charge;
  log(LogLevel::debug, fmt::format("host budget {} of the {} taken from the tierswap service "
                                   "(the rest: two slabs of {})",
                                   format_bytes(tc.host_budget), format_bytes(charge),
                                   format_bytes(tc.host_slab_size)));
}

// The pageable pool sized to the gradients, within what the service offers this rank of its
// unlocked memory (the ask adds a slab of slack): the gradients that do not fit spill to NVMe
// (2 + 2 B/param) rather than the rank being refused at attach. Under a slab, no pool: they
// share the pinned budget.
void TieredOptimizer::Impl::fit_pageable_to_offer(TierConfig& tc, const ServiceOffer& offer) const {
  const std::uint64_t slab = tc.host_slab_size;
  if (offer.pageable_bytes == ServiceOffer::kUnknown || tc.pageable_budget == 0 ||
      round_up(tc.pageable_budget + slab, 4096) <= offer.pageable_bytes)
    return;
  const std::uint64_t asked = tc.pageable_budget;
  const std::uint64_t room = offer.pageable_bytes > slab ? offer.pageable_bytes - slab : 0;
  tc.pageable_budget = room >= slab ? room / 4096 * 4096 : 0;
  log(LogLevel::warn,
      fmt::format("pageable memory for the gradients: {} of the {} they need, what the tierswap "
                  "service at {} offers this rank (1/{} of its {}, {} free); {} (tierswap serve "
                  "--pageable-budget)",
                  format_bytes(tc.pageable_budget), format_bytes(asked), o.service.socket,
                  local_ranks(), format_bytes(offer.pageable_budget),
                  format_bytes(offer.pageable_free),
                  tc.pageable_budget ? "the rest spill to NVMe" : "they share the pinned budget"));
}

// The ranks agree before the optimizer's finalize() or resume(), which are collective: one rank
// whose swap directory, space or budget is refused would otherwise leave the others waiting.
void TieredOptimizer::Impl::build() {
  TierConfig tc = o.tiers;
  OptimizerConfig oc = o.optimizer;
  std::vector<std::pair<GroupConfig, std::uint64_t>> sizes;
  agree_on_failure(*comm, thrown_by([&] { build_parts(tc, oc, sizes); }), {},
                   fmt::format("finalize: rank {}: another rank could not set up its swap space "
                               "and tiers (its error says why); this rank's are undone",
                               comm->rank()));
  finalize_optimizer(sizes, oc, tc);
}

void TieredOptimizer::Impl::build_parts(TierConfig& tc, OptimizerConfig& oc,
                                        std::vector<std::pair<GroupConfig, std::uint64_t>>& sizes) {
  if (o.host_budget != 0) tc.host_budget = o.host_budget;
  std::uint64_t bpe = 0, blocks = 0;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    sizes.emplace_back(groups[g].first, group_numel[g]);
    std::uint64_t b = 0;
    bpe = std::max(bpe, state_bytes_per_element(groups[g].first, oc, &b));
    blocks = std::max(blocks, b - 1);  // state blocks (the gradient's is not read ahead)
  }
  const bool auto_subgroup = oc.subgroup_size == 0;
  size_to_budget(tc, oc, auto_subgroup, bpe, blocks);
  std::optional<ServiceOffer> offer;
  if (!o.service.socket.empty()) {
    if (o.host_budget == 0) offer = fit_to_service(tc);
    fit_slack_within(tc, oc, auto_subgroup, bpe, blocks);
  }
  // The gradients of CPU-stepped sub-groups need no pinning on their way to the step: they wait
  // in pageable memory beside the pinned budget, sized to hold them all (spilling them would cost
  // 2 + 2 B/param of NVMe). A pageable_budget set by the caller stays.
  // Through the node service the pageable pool is shared memory the service does not lock and
  // does not count in the node's budget: host_budget is all this rank takes from that budget.
  if (o.tune_tiers && tc.pageable_budget == 0) {
    size_pageable_budget(tc, oc, grad_bytes_needed(sizes, comm->size(), oc));
    if (offer) fit_pageable_to_offer(tc, *offer);
  }
  bool earlier = false;
  for (const auto& d : o.swap_dirs) dirs.push_back(rank_dir(d, comm->rank(), o.resume, &earlier));
  open_space(sizes, oc, tc, earlier);
  if (!storage) {
    own_engine = std::make_unique<IoEngine>(*space, IoEngineConfig::from_env());
    engine = own_engine.get();
  }
  tiers = std::make_unique<TierManager>(*space, *engine, tc);
  const unsigned threads =
      o.threads != 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  pool = std::make_unique<ThreadPool>(threads, tc.numa_node);
  opt = std::make_unique<ShardedOptimizer>(*tiers, *comm, oc, pool.get());
  for (const auto& [cfg, name] : groups) opt->add_group(cfg, name);
  for (const auto& [g, spec] : params) opt->add_param(g, spec);
}

// The optimizer's finalize() (or resume()); a given swap_capacity too small for the parameters is
// an error that says what they need.
void TieredOptimizer::Impl::finalize_optimizer(
    const std::vector<std::pair<GroupConfig, std::uint64_t>>& sizes, const OptimizerConfig& oc,
    const TierConfig& tc) {
  try {
    if (o.resume)
      resumed = opt->resume();
    else
      opt->finalize();
  } catch (const std::system_error& e) {
    if (e.code().value() != ENOSPC || o.swap_capacity == 0 || !created) throw;
    // A new space of the caller's capacity, not the parameters', was too small: say what they need.
    throw std::invalid_argument(fmt::format(
        "swap_capacity={} is too small for these parameters: they need about {} (the state in "
        "{} generation slot(s), the gradients and headroom; 0 sizes it from the parameters): {}",
        format_bytes(o.swap_capacity),
        format_bytes(swap_bytes_needed(sizes, comm->size(), oc, tc.shadow_slots)),
        tc.shadow_slots ? 2 : 1, e.what()));
  }
}

// The earlier run's swap space, for resume (SwapSpace::open checks that the directories given
// hold one space, and all of it).
SwapSpace TieredOptimizer::Impl::open_earlier_space() const {
  std::error_code ec;
  const bool any = std::any_of(dirs.begin(), dirs.end(), [&](const auto& d) {
    return std::filesystem::exists(d / SwapSpace::kFileName, ec);
  });
  if (!any) {  // a manifest without its swap file: nothing to resume from
    std::vector<std::string> where;
    for (const auto& d : dirs) where.push_back(d.string());
    throw std::runtime_error(fmt::format(
        "resume: {} holds a manifest but no swap file {}: the earlier run's state is gone; "
        "remove the directory to start afresh",
        fmt::join(where, ", "), SwapSpace::kFileName));
  }
  return SwapSpace::open(dirs);
}

// The earlier run's space (resume), else a new one sized from the parameters.
void TieredOptimizer::Impl::open_space(
    const std::vector<std::pair<GroupConfig, std::uint64_t>>& sizes, const OptimizerConfig& oc,
    const TierConfig& tc, bool earlier) {
  const std::uint64_t capacity = o.swap_capacity != 0
                                     ? o.swap_capacity
                                     : swap_bytes_needed(sizes, comm->size(), oc, tc.shadow_slots);
  if (!o.service.socket.empty()) return attach_service(capacity, tc, earlier);
  if (earlier) {
    own_space = std::make_unique<SwapSpace>(open_earlier_space());
    space = own_space.get();
    return;
  }
  SwapSpaceConfig sc;
  sc.dirs = dirs;
  sc.capacity = capacity;
  check_free_space(dirs, sc.capacity);
  own_space = std::make_unique<SwapSpace>(SwapSpace::create(sc));
  space = own_space.get();
  created = true;
}

// The state in a region of the node service's swap space, the host pools in the memory it
// shares; the rank directory keeps the tier manager's manifest. The job id (service.job,
// else one derived from the first swap directory's path) and the rank name the region.
void TieredOptimizer::Impl::attach_service(std::uint64_t capacity, const TierConfig& tc,
                                           bool earlier) {
  ServiceClientConfig cc;
  cc.socket = o.service.socket;
  cc.job = o.service.job;
  cc.timeout_seconds = o.service.timeout_seconds;
  cc.wait_seconds = o.service.wait_seconds;
  if (cc.job.empty()) {
    const std::string where = std::filesystem::weakly_canonical(o.swap_dirs.front()).string();
    cc.job = "run-" + checksum_hex(checksum64(where.data(), where.size()));
  }
  cc.rank = static_cast<std::uint32_t>(comm->rank());
  // The host pools carve their slabs from the shared memory: the pinned pool from the locked part,
  // whose slack holds what opening a committed space reads to verify it (one block at a time);
  // the pageable pool from the unlocked part (one slab of slack: its last slab may be smaller).
  cc.memory_bytes = service_charge;
  if (tc.pageable_budget > 0)
    cc.pageable_bytes = round_up(tc.pageable_budget + tc.host_slab_size, 4096);
  cc.region_bytes = capacity;
  cc.release_when_detached = o.temporary_swap_dirs;
  storage = std::make_unique<ServiceStorage>(cc, dirs.front(), IoEngineConfig::from_env());
  if (earlier && !storage->reattached())
    throw std::runtime_error(fmt::format(
        "resume: {} holds a manifest, but the tierswap service at {} has no region for job {} "
        "rank {}: the earlier run's state is gone (another service, or its files were removed)",
        dirs.front().string(), o.service.socket, cc.job, cc.rank));
  space = &storage->space();
  engine = &storage->engine();
}

TieredOptimizer::TieredOptimizer(TieredOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.o = std::move(options);
  if (m.o.swap_dirs.empty())
    throw std::invalid_argument("swap_dirs: at least one swap directory is needed");
  std::set<std::filesystem::path> uniq;
  for (const auto& d : m.o.swap_dirs)
    if (!uniq.insert(std::filesystem::weakly_canonical(d)).second)
      throw std::invalid_argument(fmt::format("swap_dirs: {} is given twice", d.string()));
  if (m.o.temporary_swap_dirs && (m.o.resume || m.o.keep_swap_files))
    throw std::invalid_argument(
        "temporary_swap_dirs: nothing resumes from or keeps temporary swap directories (resume, "
        "keep_swap_files)");
  m.o.tiers.validate();
  m.comm = m.o.comm ? m.o.comm : std::shared_ptr<Communicator>(make_communicator(m.o.communicator));
}

// A run that ends by an error after committing a step keeps its files, as a crash would: the
// next run resumes from them (removing them would lose every step since the start).
bool TieredOptimizer::Impl::keeps_after_failure(bool failing) const noexcept {
  return failing && !o.temporary_swap_dirs && opt && opt->step_count() > 0;
}

void TieredOptimizer::Impl::warn_kept() const noexcept try {
  std::vector<std::string> where;
  for (const auto& d : dirs) where.push_back(d.string());
  log(LogLevel::warn,
      fmt::format("swap files in {} kept: the run ends by an error after step {}; resume "
                  "(TieredOptions::resume, resume=True in Python) continues from them, or remove "
                  "the directory to start afresh",
                  fmt::join(where, ", "), opt->step_count()));
} catch (...) {
  // out of memory while saying it: the files are kept all the same
}

TieredOptimizer::~TieredOptimizer() {
  Impl& m = *impl_;
  if (m.inherited()) {  // a forked child's copy: the parent's to close (see Impl::owner)
    (void)impl_.release();
    return;
  }
  const bool keep =
      m.o.keep_swap_files || m.keeps_after_failure(m.failed || std::uncaught_exceptions() > 0);
  if (keep && !m.o.keep_swap_files) m.warn_kept();
  m.opt.reset();
  m.pool.reset();
  m.tiers.reset();
  if (m.storage && !keep) m.storage->release_on_close();
  m.drop_storage();
  if (!keep) m.remove_files();
  m.own_space.reset();
}

void TieredOptimizer::mark_failed() noexcept {
  impl_->failed = true;
}

int TieredOptimizer::add_group(const GroupConfig& cfg, std::string name) {
  Impl& m = *impl_;
  if (m.opt) throw std::logic_error("add_group: after finalize()");
  cfg.validate();
  m.groups.emplace_back(cfg, std::move(name));
  m.group_numel.push_back(0);
  return static_cast<int>(m.groups.size() - 1);
}

ParamId TieredOptimizer::add_param(int group, const ParamSpec& spec) {
  Impl& m = *impl_;
  if (m.opt) throw std::logic_error("add_param: after finalize()");
  if (group < 0 || group >= static_cast<int>(m.groups.size()))
    throw std::invalid_argument(fmt::format("add_param '{}': no group {}", spec.name, group));
  if (spec.name.empty()) throw std::invalid_argument("add_param: a parameter needs a name");
  if (spec.dtype != Dtype::bf16 && spec.dtype != Dtype::f16)
    throw std::invalid_argument(
        fmt::format("add_param '{}': dtype {} is not a 16-bit dtype (bf16 "
                    "or f16)",
                    spec.name, to_string(spec.dtype)));
  const std::uint64_t n = spec.numel();  // throws for an empty or negative shape
  if (!m.names.insert(spec.name).second)
    throw std::invalid_argument(
        fmt::format("add_param '{}': a parameter of that name exists", spec.name));
  if (spec.requires_grad) m.group_numel[group] += n;
  m.params.emplace_back(group, spec);
  return static_cast<ParamId>(m.params.size() - 1);
}

void TieredOptimizer::finalize() {
  Impl& m = *impl_;
  if (m.opt) throw std::logic_error("finalize: called twice");
  try {
    m.build();
  } catch (...) {
    m.opt.reset();
    m.pool.reset();
    m.tiers.reset();
    if (m.storage && !m.storage->reattached()) m.storage->release_on_close();  // a fresh region
    m.drop_storage();
    if (m.created) m.remove_files();  // never an earlier run's files
    std::error_code ec;
    for (const auto& d : m.dirs) std::filesystem::remove(d, ec);  // only when empty
    m.own_space.reset();
    m.dirs.clear();
    m.created = false;
    throw;
  }
}

bool TieredOptimizer::resumed() const noexcept {
  return impl_->resumed;
}

bool TieredOptimizer::finalized() const noexcept {
  return impl_->opt != nullptr;
}

ShardedOptimizer& TieredOptimizer::optimizer() {
  impl_->require("optimizer");
  return *impl_->opt;
}

TierManager& TieredOptimizer::tiers() {
  impl_->require("tiers");
  return *impl_->tiers;
}

IoEngine& TieredOptimizer::engine() {
  impl_->require("engine");
  return *impl_->engine;
}

SwapSpace& TieredOptimizer::swap_space() {
  impl_->require("swap_space");
  return *impl_->space;
}

Communicator& TieredOptimizer::communicator() {
  return *impl_->comm;
}

const TieredOptions& TieredOptimizer::options() const noexcept {
  return impl_->o;
}

const std::vector<std::filesystem::path>& TieredOptimizer::rank_dirs() const noexcept {
  return impl_->dirs;
}

}  // namespace tierswap
