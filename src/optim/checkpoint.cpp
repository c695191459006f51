// Checkpoints of the sharded optimizer. Layout of a checkpoint directory (format version 1):
//   tierswap.checkpoint            the manifest (rank 0; written last: the commit point)
//   rank-RRRRR-ID.json             rank R's index: sections and per-piece XXH3 checksums
//   rank-RRRRR-ID.bin              rank R's state: per group, per state slot, its partition
// JSON files use the manifest container (magic, version, header and payload checksums). ID is
// drawn anew at every save, so a save that dies half-way leaves the previous checkpoint whole;
// files of earlier saves are removed once the new manifest is in place.
//
// A section is one (group, slot) range [begin, end) of the group's flat space, stored as the
// state's dtype, checksummed in pieces of kPiece elements counted from `begin`. Loading at another
// world size reads, for each new partition, the overlapping pieces of the old ranks' sections and
// verifies each piece it reads.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <system_error>

#include "src/optim/optimizer_impl.hpp"
#include "tierswap/checksum.hpp"
#include "tierswap/detail/file.hpp"
#include "tierswap/detail/json.hpp"
#include "tierswap/detail/manifest.hpp"
#include "tierswap/detail/paths.hpp"
#include "tierswap/error.hpp"
#include "tierswap/log.hpp"
#include "tierswap/units.hpp"

namespace tierswap {
namespace {

constexpr std::uint32_t kCheckpointVersion = 1;
constexpr std::uint64_t kPiece = 1ull << 20;  // elements per checksummed piece
constexpr const char* kManifest = "tierswap.checkpoint";

using detail::File;

struct Section {
  int group = 0, slot = 0;
  std::uint64_t begin = 0, end = 0, offset = 0;
  Dtype dtype = Dtype::f32;
  std::vector<std::uint64_t> sums;
};

struct RankIndex {
  std::filesystem::path data;
  std::uint64_t data_bytes = 0;
  std::vector<Section> sections;
  const Section* find(int group, int slot) const {
    for (const auto& s : sections)
      if (s.group == group && s.slot == slot) return &s;
    return nullptr;
  }
};

std::runtime_error bad_file(const std::filesystem::path& p, const std::string& why) {
  return std::runtime_error(fmt::format("checkpoint {}: {}", p.string(), why));
}

// The manifest's own fields: format, version, world size, step, loss scaler, moment dtype.
struct Head {
  int world = 0;
  std::uint64_t step = 0;
  double scale = 1;
  std::uint32_t tracker = 0;
};

Head read_head(const nlohmann::json& man, const std::filesystem::path& path, Dtype moments) {
  if (man.at("format") != "tierswap-checkpoint") throw bad_file(path, "not a tierswap checkpoint");
  if (detail::json_int<std::uint32_t>(man.at("version")) != kCheckpointVersion)
    throw bad_file(path, fmt::format("format version {} (this build reads {})",
                                     man.at("version").dump(), kCheckpointVersion));
  const auto stored = man.at("moment_dtype").get<std::string>();
  if (stored != to_string(moments))
    throw bad_file(path, fmt::format("moments stored as {}, this optimizer keeps {}", stored,
                                     to_string(moments)));
  return {detail::json_int<int>(man.at("world_size")),
          detail::json_int<std::uint64_t>(man.at("step")), man.at("loss_scale").get<double>(),
          detail::json_int<std::uint32_t>(man.at("growth_tracker"))};
}

// One section of a rank index, checked against the index's data file size and the group count.
Section parse_section(const nlohmann::json& js, std::size_t groups, std::uint64_t data_bytes,
                      const std::filesystem::path& ip) {
  Section s;
  s.group = detail::json_int<int>(js.at("group"));
  const std::string sn = js.at("slot").get<std::string>();
  s.slot = -1;
  for (int slot = 0; slot < kStateSlots; ++slot)
    if (slot_name(slot) == sn) s.slot = slot;
  s.dtype = parse_dtype(js.at("dtype").get<std::string>());
  s.begin = detail::json_int<std::uint64_t>(js.at("begin"));
  s.end = detail::json_int<std::uint64_t>(js.at("end"));
  s.offset = detail::json_int<std::uint64_t>(js.at("offset"));
  for (const auto& h : js.at("checksums"))
    s.sums.push_back(std::stoull(h.get<std::string>(), nullptr, 16));
  const std::uint64_t n = s.end - s.begin, es = dtype_size(s.dtype);
  if (s.slot < 0 || s.group < 0 || s.group >= static_cast<int>(groups) || s.end < s.begin ||
      n > data_bytes / es || s.sums.size() != n / kPiece + (n % kPiece != 0) ||
      s.offset > data_bytes - n * es)
    throw bad_file(ip, "malformed section table");
  return s;
}

// Rank r's index, as the manifest's rank table `entry` names it (and binds it by checksum), with
// its data file's size checked.
RankIndex read_rank_index(const std::filesystem::path& dir, const nlohmann::json& entry, int r,
                          std::size_t groups) {
  const auto ip = dir / entry.at("index").get<std::string>();
  if (!std::filesystem::exists(ip))
    throw bad_file(ip, "missing (written by rank " + std::to_string(r) + ")");
  const std::string payload = detail::read_manifest_file(ip);
  if (checksum_hex(checksum64(payload.data(), payload.size())) != entry.at("checksum"))
    throw bad_file(ip, "does not belong to this checkpoint's manifest (checksum mismatch)");
  const auto j = nlohmann::json::parse(payload);
  RankIndex ri;
  ri.data = dir / j.at("data").get<std::string>();
  ri.data_bytes = detail::json_int<std::uint64_t>(j.at("data_bytes"));
  if (detail::json_int<std::uint64_t>(j.at("piece")) != kPiece)
    throw bad_file(ip, "unexpected piece size");
  if (!std::filesystem::exists(ri.data)) throw bad_file(ri.data, "missing");
  const File f = File::open(ri.data, O_RDONLY);
  if (f.size() != ri.data_bytes)
    throw bad_file(
        ri.data, fmt::format("{} bytes, the index says {} (truncated?)", f.size(), ri.data_bytes));
  for (const auto& js : j.at("sections"))
    ri.sections.push_back(parse_section(js, groups, ri.data_bytes, ip));
  return ri;
}

}  // namespace

void ShardedOptimizer::Impl::require_checkpointable(const char* what) {
  require_finalized(what);
  if (in_backward) throw std::logic_error(fmt::format("{}: a backward pass is in progress", what));
  if (spec_pending())
    throw std::logic_error(
        fmt::format("{}: speculative steps of an overlapped backward wait for step()", what));
}

std::pair<nlohmann::json, std::uint64_t> ShardedOptimizer::Impl::write_rank_state(
    const std::filesystem::path& path) {
  const File f = File::open(path, O_WRONLY | O_CREAT | O_TRUNC);
  nlohmann::json sections = nlohmann::json::array();
  std::uint64_t offset = 0;
  std::vector<std::byte> piece;
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    const OptGroup& g = groups[gi];
    for (int slot = 0; slot < kStateSlots; ++slot) {
      if (!g.has_slot(slot)) continue;
      const Dtype dt = slot_dtype(slot);
      nlohmann::json sums = nlohmann::json::array();
      const std::uint64_t start = offset;
      std::size_t fill = 0;
      piece.resize(kPiece * dtype_size(dt));
      auto flush_piece = [&] {
        if (fill == 0) return;
        sums.push_back(checksum_hex(checksum64(piece.data(), fill)));
        f.pwrite_all(piece.data(), fill, offset);
        offset += fill;
        fill = 0;
      };
      for (std::size_t k = 0; k < g.nsubs; ++k) {
        const OptSub& s = subs[g.first_sub + k];
        BlockView v = tiers.acquire(s.state[slot], Tier::host);
        for (std::size_t done = 0; done < v.bytes();) {
          const std::size_t n = std::min(v.bytes() - done, piece.size() - fill);
          std::memcpy(piece.data() + fill, v.data() + done, n);
          fill += n;
          done += n;
          if (fill == piece.size()) flush_piece();
        }
        tiers.release(v, false);
        if (s.streaming) tiers.write_back(s.state[slot]);
      }
      flush_piece();
      sections.push_back({{"group", gi},
                          {"slot", slot_name(slot)},
                          {"dtype", std::string(to_string(dt))},
                          {"begin", g.lo},
                          {"end", g.hi},
                          {"offset", start},
                          {"checksums", std::move(sums)}});
    }
  }
  f.sync();
  return {std::move(sections), offset};
}

void ShardedOptimizer::Impl::write_checkpoint_manifest(const std::filesystem::path& dir,
                                                       std::uint64_t id,
                                                       const std::string& index_payload) {
  std::vector<std::uint64_t> sums(world);
  for (int r = 0; r < world; ++r) {
    std::uint64_t s = r == rank ? checksum64(index_payload.data(), index_payload.size()) : 0;
    comm.broadcast(&s, sizeof s, r);
    sums[r] = s;
  }
  if (rank != 0) return;
  nlohmann::json ranks = nlohmann::json::array();
  for (int r = 0; r < world; ++r)
    ranks.push_back({{"index", fmt::format("rank-{:05}-{:016x}.json", r, id)},
                     {"checksum", checksum_hex(sums[r])}});
  nlohmann::json man = {{"format", "tierswap-checkpoint"},
                        {"version", kCheckpointVersion},
                        {"world_size", world},
                        {"step", step_count},
                        {"loss_scale", scale},
                        {"growth_tracker", growth_tracker},
                        {"moment_dtype", std::string(to_string(moment_dtype()))},
                        {"groups", groups_json()},
                        {"ranks", std::move(ranks)}};
  detail::write_manifest_file(dir / kManifest, man.dump(), true);
  detail::fsync_directory(dir);
}

namespace {

// Rank `rank`'s files of the save `id` (keep == false) or of every save but `id` (keep == true).
void remove_saves(const std::filesystem::path& dir, int rank, std::uint64_t id, bool keep) {
  const std::string mine = fmt::format("rank-{:05}-", rank);
  const std::string current = fmt::format("{:016x}", id);
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(mine, 0) == 0 && (n.find(current) == std::string::npos) == keep)
      std::filesystem::remove(e.path(), ec);
  }
}

// Rank 0's flock on a checkpoint directory: exclusive while a save writes it, shared while a load
// reads it (any number of loads at once; no save while one reads, no load while one writes).
struct DirLock {
  int fd = -1;
  DirLock() = default;
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  ~DirLock() { detail::close_lock(fd); }
};

// A refused directory (std::invalid_argument) as it is; any other failure (null: another rank's)
// as std::runtime_error saying that the checkpoint already there is kept.
[[noreturn]] void throw_save_failure(const std::filesystem::path& dir,
                                     const std::exception_ptr& failed) {
  try {
    if (failed) std::rethrow_exception(failed);
  } catch (const std::invalid_argument&) {
    throw;
  } catch (...) {
  }
  throw std::runtime_error(fmt::format(
      "save to {} failed: {}; the checkpoint there before (if any) is kept", dir.string(),
      failed ? what_of(failed) : "another rank could not write its part (its error says why)"));
}

}  // namespace

std::string ShardedOptimizer::Impl::write_rank_files(const std::filesystem::path& dir,
                                                     const std::string& tag, int* lock_fd) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw_errno(ec.value(), "create checkpoint directory " + dir.string());
  detail::check_trusted_dir(dir, "save: checkpoint directory");
  if (lock_fd != nullptr) *lock_fd = detail::open_lock(dir, "save: checkpoint directory");
  const std::uint64_t need = state_bytes(), free = detail::filesystem_free_bytes(dir);
  if (free < need)
    throw std::runtime_error(fmt::format(
        "checkpoint directory {}: this rank's state needs {} ({} B), its filesystem has {} free "
        "(a checkpoint already there is removed only once the new one is complete)",
        dir.string(), format_bytes(need), need, format_bytes(free)));
  const auto data_path = dir / (tag + ".bin");
  auto [sections, bytes] = write_rank_state(dir / (tag + ".bin.tmp"));
  std::filesystem::rename(dir / (tag + ".bin.tmp"), data_path);
  const nlohmann::json index = {{"format", "tierswap-checkpoint-rank"},
                                {"version", kCheckpointVersion},
                                {"rank", rank},
                                {"world_size", world},
                                {"data", data_path.filename().string()},
                                {"data_bytes", bytes},
                                {"piece", kPiece},
                                {"sections", std::move(sections)}};
  std::string payload = index.dump();
  detail::write_manifest_file(dir / (tag + ".json"), payload, true);
  return payload;
}

// Rank 0 holds a lock on the directory (flock) from before its files to after every rank's removal
// of the earlier saves' files: two saves into one directory at once (two jobs given one path) would
// otherwise each remove the other's files, leaving a manifest whose files are gone; the second
// fails at once naming the holder. Two agreements make a failed save leave the directory as it
// was on every rank: after the rank files (if any rank failed, every rank removes its files of
// this save; none writes the manifest), and after the manifest (whether it was renamed into place
// or not, the previous save's files are still there, and the next save removes what no manifest
// names).
void ShardedOptimizer::save(const std::filesystem::path& dir) {
  impl_->settle_commit();
  Impl& m = *impl_;
  m.require_checkpointable("save");
  m.require_state("save");
  std::uint64_t id = 0;  // drawn anew: a save that dies half-way leaves the previous one whole
  if (m.rank == 0) id = std::random_device{}() * 0x100000001ull ^ std::random_device{}();
  m.comm.broadcast(&id, sizeof id, 0);
  const std::string tag = fmt::format("rank-{:05}-{:016x}", m.rank, id);
  std::string index_payload;
  DirLock lock;  // rank 0's: one save at a time into the directory, and no load meanwhile
  std::exception_ptr failed = thrown_by(
      [&] { index_payload = m.write_rank_files(dir, tag, m.rank == 0 ? &lock.fd : nullptr); });
  bool any = m.comm.all_reduce_or(failed != nullptr);
  if (any) {  // no manifest names this save: its files go, on every rank, before any returns
    remove_saves(dir, m.rank, id, false);
    m.comm.barrier();
  } else {
    failed = thrown_by([&] { m.write_checkpoint_manifest(dir, id, index_payload); });
    any = m.comm.all_reduce_or(failed != nullptr);
  }
  if (any) throw_save_failure(dir, failed);
  remove_saves(dir, m.rank, id, true);
  // Rank 0's lock goes only once every rank has removed its earlier files: a save that took the
  // lock while another rank still removed them would lose its files to that removal.
  m.comm.barrier();
}

namespace {

// The saved state of every old rank, read piece by piece: each piece read is verified against its
// checksum. Each old rank's data file is opened once.
struct OldState {
  std::vector<RankIndex> ranks;
  std::vector<std::uint64_t> partition;  // per group: the old ranks' partition size
  std::vector<File> files;
  std::vector<std::byte> buf;

  // Elements [x, end) of (group gi, slot) as dtype dt: verified, and copied to dst (element x at
  // dst[0]) unless dst is null.
  void read(std::size_t gi, int slot, Dtype dt, std::uint64_t x, std::uint64_t end,
            std::byte* dst) {
    const std::size_t es = dtype_size(dt);
    const std::byte* const out0 = dst;
    const std::uint64_t x0 = x;
    while (x < end) {
      const int q = static_cast<int>(std::min<std::uint64_t>(x / partition[gi], ranks.size() - 1));
      const Section* sec = ranks[q].find(static_cast<int>(gi), slot);
      if (sec == nullptr || x < sec->begin || x >= sec->end || sec->dtype != dt)
        throw bad_file(ranks[q].data,
                       fmt::format("no {} data for group {} element {}", slot_name(slot), gi, x));
      const std::uint64_t pi = (x - sec->begin) / kPiece;
      const std::uint64_t pb = sec->begin + pi * kPiece;
      const std::uint64_t pn = std::min(kPiece, sec->end - pb);
      buf.resize(pn * es);
      if (!files[q]) files[q] = File::open(ranks[q].data, O_RDONLY);
      files[q].pread_all(buf.data(), buf.size(), sec->offset + pi * kPiece * es);
      if (checksum64(buf.data(), buf.size()) != sec->sums[pi])
        throw bad_file(ranks[q].data,
                       fmt::format("{} of group {}, elements [{}, {}): checksum mismatch "
                                   "(corrupt data)",
                                   slot_name(slot), gi, pb, pb + pn));
      const std::uint64_t n = std::min(end, pb + pn) - x;
      if (out0 != nullptr) std::memcpy(dst + (x - x0) * es, buf.data() + (x - pb) * es, n * es);
      x += n;
    }
  }
};

}  // namespace

void ShardedOptimizer::Impl::load_state_pass(int pass, const ReadState& read) {
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    const OptGroup& g = groups[gi];
    for (int slot = 0; slot < kStateSlots; ++slot) {
      if (!g.has_slot(slot)) continue;
      const Dtype dt = slot_dtype(slot);
      for (std::size_t k = 0; k < g.nsubs; ++k) {
        const OptSub& s = subs[g.first_sub + k];
        if (pass == 1 && !s.memory_only) continue;
        if (pass == 0 && s.memory_only) {  // verified only
          read(gi, slot, dt, s.begin, s.begin + s.numel, nullptr);
          continue;
        }
        BlockView v = tiers.acquire(s.state[slot], Tier::host, Access::overwrite);
        read(gi, slot, dt, s.begin, s.begin + s.numel, v.data());
        tiers.release(v, true);
        if (s.streaming) tiers.write_back(s.state[slot]);
        promote_memory_only_gpu(s, s.state[slot]);
      }
    }
  }
}

namespace {

nlohmann::json read_checkpoint_manifest(const std::filesystem::path& dir) {
  const auto man_path = dir / kManifest;
  if (std::filesystem::exists(dir)) detail::check_trusted_dir(dir, "load: checkpoint directory");
  if (!std::filesystem::exists(man_path))
    throw std::runtime_error(
        fmt::format("checkpoint {}: no {} (not a checkpoint, or its save did not finish)",
                    dir.string(), kManifest));
  try {
    return nlohmann::json::parse(detail::read_manifest_file(man_path));
  } catch (const nlohmann::json::exception& e) {
    throw bad_file(man_path, std::string("malformed manifest: ") + e.what());
  }
}

// What load() reads before it touches any state.
struct Tables {
  Head head;
  OldState old;
  std::vector<GroupConfig> cfgs;
  std::vector<std::uint64_t> step_bases;
};

// The manifest and every rank's index, validated (check_groups: Impl::check_groups).
template <class CheckGroups>
void read_tables(const std::filesystem::path& dir, Dtype moments, std::size_t ngroups,
                 const CheckGroups& check_groups, Tables& t) {
  const nlohmann::json man = read_checkpoint_manifest(dir);
  const auto man_path = dir / kManifest;
  auto bad = [&](const std::string& why) { return bad_file(man_path, why); };
  try {
    t.head = read_head(man, man_path, moments);
    t.cfgs = check_groups(man.at("groups"), bad, &t.old.partition, &t.step_bases);
    const auto& ranks = man.at("ranks");
    if (static_cast<int>(ranks.size()) != t.head.world || t.head.world < 1)
      throw bad("rank table does not match the world size");
    for (int r = 0; r < t.head.world; ++r)
      t.old.ranks.push_back(read_rank_index(dir, ranks[r], r, ngroups));
  } catch (const std::runtime_error&) {
    throw;
  } catch (const std::exception& e) {
    throw bad(std::string("malformed: ") + e.what());
  }
  t.old.files.resize(t.old.ranks.size());
}

}  // namespace

// Every rank agrees on each phase before the next (a rank that failed would otherwise leave the
// others waiting in a collective, or with a state from another step): the tables and the copy of
// the state into a new generation (any rank failed: every rank discards it), then the commit.
// Rank 0 holds a shared lock on the directory meanwhile, so that no save removes files under it.
void ShardedOptimizer::load(const std::filesystem::path& dir) {
  impl_->settle_commit();
  Impl& m = *impl_;
  m.require_checkpointable("load");
  Tables t;
  auto check_groups = [&m](const nlohmann::json& g, const auto& bad, auto* part, auto* bases) {
    return m.check_groups(g, bad, part, bases);
  };
  bool copying = false;
  const Impl::ReadState read = [&](std::size_t gi, int slot, Dtype dt, std::uint64_t b,
                                   std::uint64_t e,
                                   std::byte* dst) { t.old.read(gi, slot, dt, b, e, dst); };
  // Pass 0 copies the state that lives in generations (a failure discards it) and only reads and
  // verifies what goes to memory-only state, which no discard can restore; pass 1 copies that
  // after the commit, once every piece has been verified.
  DirLock lock;
  const std::exception_ptr failed = thrown_by([&] {
    // (Not a directory, or a symbolic link: read_tables() says what it is.)
    if (m.rank == 0 && std::filesystem::is_directory(std::filesystem::symlink_status(dir)))
      lock.fd = detail::open_lock(dir, "load: checkpoint directory", /*shared=*/true);
    read_tables(dir, m.moment_dtype(), m.groups.size(), check_groups, t);
    for (std::size_t gi = 0; gi < t.step_bases.size(); ++gi)
      if (t.step_bases[gi] > t.head.step)
        throw std::runtime_error(
            fmt::format("load {}: group {} was added at step {}, after step {}", dir.string(), gi,
                        t.step_bases[gi], t.head.step));
    copying = true;
    m.load_state_pass(0, read);
  });
  const std::string where = fmt::format("load {}: another rank ", dir.string());
  agree_on_failure(
      m.comm, failed,
      [&] {
        if (copying && m.tiers.config().shadow_slots) m.tiers.discard();  // stored state kept
      },
      where + "could not read or verify its part (its error says why); the state is unchanged");
  for (std::size_t gi = 0; gi < m.groups.size(); ++gi) m.groups[gi].cfg = t.cfgs[gi];
  m.step_count = t.head.step;
  for (std::size_t gi = 0; gi < m.groups.size(); ++gi) m.groups[gi].step_base = t.step_bases[gi];
  m.scale = t.head.scale;
  m.growth_tracker = t.head.tracker;
  m.drop_all_grads();
  m.commit_replaced_state(fmt::format("load({})", dir.string()), Impl::Param16::refresh,
                          [&] { m.load_state_pass(1, read); });
}

}  // namespace tierswap
