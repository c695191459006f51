// resume(): continuing from the swap directory after a crash. Every commit of the optimizer
// writes a commit record (records.cpp) into the tier manager's manifest, atomically with the
// generation it describes; resume() checks it against this optimizer, lays out with the stored
// sub-group size, adopts the stored blocks instead of creating them and takes the step count,
// loss scaler and hyper-parameters from the record.
#include <fmt/format.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "src/optim/optimizer_impl.hpp"
#include "tierswap/detail/json.hpp"
#include "tierswap/error.hpp"
#include "tierswap/log.hpp"
#include "tierswap/units.hpp"

namespace tierswap {
namespace {

std::runtime_error record_error(const TierManager& tiers, const std::string& why) {
  return std::runtime_error(fmt::format("resume from {}: {}", tiers.manifest_path().string(), why));
}

nlohmann::json parse_record(const TierManager& tiers, const std::string& text) {
  try {
    nlohmann::json j = nlohmann::json::parse(text);
    if (!j.is_object() || j.value("format", "") != "tierswap-optimizer-record")
      throw record_error(tiers, "the commit record is not an optimizer record");
    return j;
  } catch (const nlohmann::json::exception& e) {
    throw record_error(tiers, std::string("malformed commit record: ") + e.what());
  }
}

}  // namespace

void ShardedOptimizer::Impl::check_record(const nlohmann::json& j) {
  auto bad = [&](const std::string& why) { return record_error(tiers, why); };
  try {
    if (detail::json_int<std::uint32_t>(j.at("version")) != 1)
      throw bad(fmt::format("record version {} (this build reads 1)", j.at("version").dump()));
    const auto version = j.at("tierswap").get<std::string>();
    if (version != TIERSWAP_VERSION_STRING)
      throw bad(
          fmt::format("written by tierswap {}, this is {}: resume needs the same version "
                      "(a save() checkpoint loads across versions of the same format)",
                      version, TIERSWAP_VERSION_STRING));
    const int w = detail::json_int<int>(j.at("world_size")),
              r = detail::json_int<int>(j.at("rank"));
    if (w != world)
      throw bad(
          fmt::format("written at world size {}, this run has {}: resume needs the same "
                      "world size (load() a save() checkpoint to change it)",
                      w, world));
    if (r != rank)
      throw bad(fmt::format("the swap directory of rank {}, opened by rank {}", r, rank));
    if (j.at("moment_dtype").get<std::string>() != to_string(moment_dtype()))
      throw bad(fmt::format("moments stored as {}, this optimizer keeps {} (bf16_moments)",
                            j.at("moment_dtype").get<std::string>(), to_string(moment_dtype())));
    if (j.at("accumulate_fp32").get<bool>() != cfg.accumulate_fp32)
      throw bad("accumulate_fp32 differs from the run that wrote it");
    if (j.at("memory_only_state").get<bool>())
      throw bad(
          "part of the state lived in memory only (persist_resident_state=false) and was "
          "lost; restore a save() checkpoint");
    const auto sg = detail::json_int<std::uint64_t>(j.at("subgroup_size"));
    if (sg == 0 || sg % kGradStatsChunk != 0)
      throw bad(fmt::format("sub-group size {} is not a multiple of {}", sg, kGradStatsChunk));
    if (sg != cfg.subgroup_size && cfg.subgroup_size != 0)
      log(LogLevel::info, fmt::format("resume: sub-groups of {} elements, as stored (not {})", sg,
                                      cfg.subgroup_size));
    cfg.subgroup_size = sg;
    (void)detail::json_int<std::uint64_t>(j.at("step"));
    if (!(j.at("loss_scale").get<double>() > 0)) throw bad("loss scale is not positive");
    (void)detail::json_int<std::uint32_t>(j.at("growth_tracker"));
  } catch (const std::runtime_error&) {
    throw;
  } catch (const std::exception& e) {
    throw bad(std::string("malformed commit record: ") + e.what());
  }
}

void ShardedOptimizer::Impl::check_record_layout() {
  const nlohmann::json j = parse_record(tiers, resume_record);
  auto bad = [&](const std::string& why) { return record_error(tiers, why); };
  std::vector<std::uint64_t> part;
  try {
    check_groups(j.at("groups"), bad, &part);
  } catch (const std::runtime_error&) {
    throw;
  } catch (const std::exception& e) {
    throw bad(std::string("malformed commit record: ") + e.what());
  }
  for (std::size_t gi = 0; gi < groups.size(); ++gi)
    if (part[gi] != groups[gi].part)
      throw bad(fmt::format("group {}: partitions of {} elements, this layout's are {}", gi,
                            part[gi], groups[gi].part));
}

// The ranks commit a step one after the other: a job killed between their commits leaves some
// ranks one step ahead. Those step back to the generation before (its data is still in the
// other slot: no rank can write the next step's state before every rank reduced its gradients).
void ShardedOptimizer::Impl::agree_on_step() {
  const auto step_of = [&] {
    return detail::json_int<std::uint64_t>(parse_record(tiers, resume_record).at("step"));
  };
  const std::uint64_t mine = step_of();
  std::vector<double> steps(world, 0.0);  // exact: steps are far below 2^53
  steps[rank] = static_cast<double>(mine);
  comm.all_reduce_sum(steps.data(), steps.size());
  const auto [lo, hi] = std::minmax_element(steps.begin(), steps.end());
  if (*hi - *lo > 1)
    throw record_error(tiers, fmt::format("the ranks committed steps {} to {}: more than one "
                                          "apart, not from one run; restore a save() checkpoint",
                                          *lo, *hi));
  std::string err;
  if (static_cast<double>(mine) == *hi && *hi != *lo) {
    try {
      if (!tiers.roll_back_generation())
        err = "no earlier generation to step back to";
      else if (resume_record = tiers.commit_record(); step_of() + 1 != mine)
        err = fmt::format("the earlier generation holds step {}, not {}", step_of(), mine - 1);
    } catch (const std::exception& e) {
      err = e.what();
    }
    if (err.empty())
      log(LogLevel::info, fmt::format("resume: rank {} committed step {} before the job stopped, "
                                      "other ranks did not: stepped back to step {}",
                                      rank, mine, mine - 1));
  }
  if (comm.all_reduce_or(!err.empty()))
    throw record_error(tiers, fmt::format("the ranks committed steps {} and {} and rank {} could "
                                          "not step back{}{}; restore a save() checkpoint",
                                          *lo, *hi, rank, err.empty() ? "" : ": ", err));
}

void ShardedOptimizer::Impl::restore_from_record() {
  agree_on_step();
  agree_on_failure(comm, thrown_by([&] { restore_local(); }), {},
                   "resume: another rank could not restore its state (its error says why)");
  gather_param16();
  p16out.refill();
}

void ShardedOptimizer::Impl::restore_local() {
  const nlohmann::json j = parse_record(tiers, resume_record);
  std::vector<std::uint64_t> part, bases;
  const Bad bad = [&](const std::string& why) { return record_error(tiers, why); };
  const auto cfgs = check_groups(j.at("groups"), bad, &part, &bases);
  step_count = detail::json_int<std::uint64_t>(j.at("step"));
  set_step_bases(bases, step_count, bad);
  scale = j.at("loss_scale").get<double>();
  growth_tracker = detail::json_int<std::uint32_t>(j.at("growth_tracker"));
  for (std::size_t gi = 0; gi < groups.size(); ++gi) groups[gi].cfg = cfgs[gi];
  drop_all_grads();
  for (const auto& s : subs) refresh_sub16(s);
}

bool ShardedOptimizer::resume() {
  impl_->settle_commit();
  Impl& m = *impl_;
  if (m.finalized) throw std::logic_error("resume: already finalized");
  const std::string rec = m.tiers.commit_record();
  const bool have = !rec.empty();
  const bool any = m.comm.all_reduce_or(have), all = !m.comm.all_reduce_or(!have);
  if (any && !all)
    throw std::runtime_error(fmt::format(
        "resume: rank {}'s swap directory {} a committed optimizer state, but another rank's "
        "{}: the ranks' directories are not from one run",
        m.rank, have ? "holds" : "does not hold", have ? "does not" : "does"));
  if (!have) {
    finalize();
    return false;
  }
  m.adopt_blocks = true;
  try {
    agree_on_failure(
        m.comm, thrown_by([&] {
          m.check_record(parse_record(m.tiers, rec));
          m.resume_record = rec;
          m.finalize_local();
        }),
        [&] { m.finalized = false; },
        "resume: another rank's swap directory or layout was refused (its error says why)");
    m.restore_from_record();
  } catch (...) {
    m.adopt_blocks = false;
    throw;
  }
  m.adopt_blocks = false;
  log(LogLevel::info,
      fmt::format("resume: continuing after step {} (generation {}, {} of state)", m.step_count,
                  m.tiers.committed_generation(), format_bytes(state_bytes())));
  return true;
}

}  // namespace tierswap
