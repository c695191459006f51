// The tier manager's manifest: its schema (the block table as JSON: written at commit, read back
// and checked at open; TierManager::Impl and read_manifest). The file that carries it is
// src/common/manifest_file.cpp's.

#include <stdexcept>
#include <system_error>

#include "src/tier/tier_impl.hpp"
#include "tierswap/checksum.hpp"
#include "tierswap/detail/file.hpp"
#include "tierswap/detail/json.hpp"
#include "tierswap/detail/manifest.hpp"
#include "tierswap/error.hpp"

#include <fmt/format.h>

namespace tierswap {

// ---- the manifest's schema: written at commit, read back at open ----------------------------
std::filesystem::path TierManager::Impl::manifest_path() const {
  return space.files().front().path.parent_path() / detail::kManifestName;
}

tier_internal::CommitRecord::CommitRecord(std::string record) {
  if (record.empty()) return;
  try {
    std::string quoted = detail::json_quoted(record);
    d_ = std::make_shared<const Data>(Data{std::move(record), std::move(quoted)});
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(fmt::format(
        "commit record: not valid UTF-8 text ({}); a manifest cannot hold it", e.what()));
  }
}

// The block table as it will be once the open generation is committed; the records, escaped
// once each (CommitRecord), are put in as text.
std::string TierManager::Impl::manifest_payload(const CommitRecord& previous_record) const {
  nlohmann::json j;
  j["format"] = "tierswap-manifest";
  j["space_uuid"] = space.uuid();
  j["generation"] = committed_gen + 1;
  j["shadow_slots"] = cfg.shadow_slots;
  j["alignment"] = align;
  auto arr = nlohmann::json::array();
  for (auto& bp : blocks) {
    const Block& b = *bp;
    const bool w = b.written && !b.desc.transient;
    const bool data = !b.desc.transient && !b.trimmed && (w || b.has_data);
    nlohmann::json e;
    e["name"] = b.desc.name;
    e["class"] = std::string(to_string(b.desc.cls));
    e["dtype"] = std::string(to_string(b.desc.dtype));
    e["numel"] = b.desc.numel;
    e["owner"] = {b.desc.owner.rank, b.desc.owner.group, b.desc.owner.subgroup};
    auto slots = nlohmann::json::array();
    for (int s = 0; s < b.nextents; ++s) slots.push_back({b.extent[s].offset, b.extent[s].length});
    e["slots"] = slots;
    e["committed_slot"] = w ? b.write_extent() : b.committed;
    e["has_data"] = data;
    if (b.desc.transient) e["transient"] = true;
    if (b.desc.memory_only) e["memory_only"] = true;
    e["generation"] = w ? committed_gen + 1 : b.data_gen;
    e["checksum"] = checksum_hex(w ? b.written_checksum : b.checksum);
    if (cfg.shadow_slots && !b.desc.transient && (w || b.trimmed))  // what this commit replaces
      e["previous"] = {b.committed, b.has_data, b.data_gen, checksum_hex(b.checksum)};
    arr.push_back(std::move(e));
  }
  j["blocks"] = std::move(arr);
  std::string text = j.dump();
  text.pop_back();  // the closing brace: the records go in before it
  text.reserve(text.size() + pending_record.quoted().size() + previous_record.quoted().size() + 32);
  if (!pending_record.empty()) text.append(R"(,"record":)").append(pending_record.quoted());
  if (!previous_record.empty())
    text.append(R"(,"previous_record":)").append(previous_record.quoted());
  text += '}';
  return text;
}

namespace {
// Exchanges a block's committed fields with those of its previous generation: the roll-back,
// and its undoing when the roll-back's manifest cannot be written.
void swap_with_previous(tier_internal::Block& b) {
  std::swap(b.committed, b.prev.extent);
  std::swap(b.has_data, b.prev.has_data);
  std::swap(b.data_gen, b.prev.gen);
  std::swap(b.checksum, b.prev.checksum);
}
}  // namespace

void TierManager::Impl::write_rolled_back_manifest() {
  const auto swap_all = [&] {
    for (auto& bp : blocks)
      if (bp->prev.valid) swap_with_previous(*bp);
  };
  swap_all();
  CommitRecord was_record = record, was_pending = pending_record;
  record = pending_record = prev_record;
  try {
    detail::write_manifest_file(manifest_path(), manifest_payload({}), cfg.durable,
                                /*recycle=*/true);
  } catch (...) {
    swap_all();
    record = std::move(was_record);
    pending_record = std::move(was_pending);
    throw;
  }
  prev_record = {};
}

void TierManager::Impl::load_manifest() {
  const auto path = manifest_path();
  const ManifestInfo info = read_manifest(path);
  auto bad = [&](const std::string& why) {
    return std::runtime_error(fmt::format("manifest {}: {}", path.string(), why));
  };
  if (info.space_uuid != space.uuid())
    throw bad(fmt::format("belongs to swap space {}, not to this one ({})", info.space_uuid,
                          space.uuid()));
  if (info.shadow_slots != cfg.shadow_slots)
    throw bad(fmt::format("written with shadow_slots={}, opened with shadow_slots={}",
                          info.shadow_slots, cfg.shadow_slots));
  committed_gen = info.generation;
  record = CommitRecord(info.record);
  pending_record = record;
  prev_record = CommitRecord(info.previous_record);
  for (const auto& m : info.blocks) {
    auto b = std::make_unique<Block>();
    b->desc = {m.name,       m.cls, m.dtype, m.numel, m.owner, m.transient || m.memory_only,
               m.memory_only};
    b->bytes = b->desc.bytes();
    b->alloc_bytes = round_up(b->bytes, align);
    b->nextents = static_cast<int>(m.slots.size());
    for (int s = 0; s < b->nextents; ++s) {
      b->extent[s] = m.slots[s];
      if (b->extent[s].length < b->alloc_bytes)
        throw bad(fmt::format("block '{}': slot {} is {} bytes, the block needs {}", m.name, s,
                              b->extent[s].length, b->alloc_bytes));
      try {
        alloc.reserve(b->extent[s]);
      } catch (const std::exception& x) {
        throw bad(fmt::format("block '{}': slot {}: {}", m.name, s, x.what()));
      }
    }
    b->committed = m.committed_slot;
    b->has_data = m.has_data;
    b->data_gen = m.generation;
    b->checksum = m.checksum;
    if (m.previous) {
      const auto& p = *m.previous;
      b->prev = {true, p.slot, p.has_data, p.generation, p.checksum};
    }
    b->id = static_cast<BlockId>(blocks.size());
    names.emplace(m.name, b->id);
    blocks.push_back(std::move(b));
  }
}

void TierManager::Impl::verify_extent(const Block& b, int extent, std::uint64_t sum,
                                      std::uint64_t gen) {
  // Through the node service, I/O lands only in the memory shared with it.
  AlignedBuffer own;
  std::byte* data = nullptr;
  if (engine.memory_is_shared()) {
    data = engine.allocate_shared(b.alloc_bytes);
    if (data == nullptr)
      throw std::system_error(ENOMEM, std::system_category(),
                              fmt::format("verifying block '{}': no room for {} in the memory "
                                          "shared with the node service",
                                          b.desc.name, format_bytes(b.alloc_bytes)));
  } else {
    own = AlignedBuffer(b.alloc_bytes, std::max<std::uint64_t>(4096, space.memory_alignment()));
    data = own.data();
  }
  struct Release {
    IoEngine& engine;
    std::byte* shared;
    ~Release() {
      if (shared != nullptr) engine.free_shared(shared);
    }
  } release{engine, own ? nullptr : data};
  engine.read(offset_of(b, extent), data, b.alloc_bytes).wait();
  const std::uint64_t got = checksum64(data, b.bytes);
  if (got != sum)
    throw std::runtime_error(
        fmt::format("manifest {}: block '{}' (generation {}): data checksum {} does not match the "
                    "manifest's {} (extent @{}+{}): the swap file is corrupt",
                    manifest_path().string(), b.desc.name, gen, checksum_hex(got),
                    checksum_hex(sum), b.extent[extent].offset, b.alloc_bytes));
}

void TierManager::Impl::verify_blocks() {
  for (auto& bp : blocks)
    if (bp->has_data) verify_extent(*bp, bp->committed, bp->checksum, bp->data_gen);
  checksums_verified = true;
}

namespace {

// A block's fields against each other, before anything uses them (a checksum proves the file is
// as written, not that what was written is consistent): its size fits each of its extents
// (numel x dtype size, without overflow), both extents are the same size and do not wrap.
template <class Bad>
void check_block_fields(const ManifestInfo::Block& b, const Bad& bad) {
  if (b.name.empty()) throw bad("a block with an empty name");
  if (b.numel == 0) throw bad(fmt::format("block '{}': numel is 0", b.name));
  const std::uint64_t es = dtype_size(b.dtype);
  for (std::size_t s = 0; s < b.slots.size(); ++s) {
    const Extent& x = b.slots[s];
    if (x.length == 0 || x.offset + x.length < x.offset)
      throw bad(fmt::format("block '{}': slot {} is @{}+{}", b.name, s, x.offset, x.length));
    if (b.numel > x.length / es)
      throw bad(fmt::format(
          "block '{}': numel {} of {} ({} bytes) does not fit slot {} of {} "
          "bytes",
          b.name, b.numel, to_string(b.dtype),
          b.numel <= UINT64_MAX / es ? std::to_string(b.numel * es) : std::string("over 2^64"), s,
          x.length));
  }
  if (b.slots.size() == 2 && b.slots[0].length != b.slots[1].length)
    throw bad(fmt::format("block '{}': slots of {} and {} bytes", b.name, b.slots[0].length,
                          b.slots[1].length));
}

// One entry of the block table, its slots checked against each other (the rest of its fields
// by check_block_fields).
template <class Bad>
ManifestInfo::Block read_block(const nlohmann::json& e, bool shadow_slots, const Bad& bad) {
  ManifestInfo::Block b;
  b.name = e.at("name").get<std::string>();
  b.cls = parse_block_class(e.at("class").get<std::string>());
  b.dtype = parse_dtype(e.at("dtype").get<std::string>());
  b.numel = detail::json_int<std::uint64_t>(e.at("numel"));
  const auto& o = e.at("owner");
  b.owner = {detail::json_int<int>(o.at(0)), detail::json_int<int>(o.at(1)),
             detail::json_int<int>(o.at(2))};
  for (auto& x : e.at("slots"))
    b.slots.push_back(
        {detail::json_int<std::uint64_t>(x.at(0)), detail::json_int<std::uint64_t>(x.at(1))});
  b.memory_only = e.value("memory_only", false);
  // Memory-only blocks have no NVMe extents (earlier manifests listed unused ones).
  if (b.slots.size() != (shadow_slots ? 2u : 1u) && !(b.memory_only && b.slots.empty()))
    throw bad(fmt::format("block '{}': {} slots", b.name, b.slots.size()));
  b.committed_slot = detail::json_int<int>(e.at("committed_slot"));
  if (!b.slots.empty() &&
      (b.committed_slot < 0 || b.committed_slot >= static_cast<int>(b.slots.size())))
    throw bad(fmt::format("block '{}': committed slot {}", b.name, b.committed_slot));
  b.has_data = e.at("has_data").get<bool>();
  if (b.has_data && b.slots.empty())
    throw bad(fmt::format("block '{}': committed data but no NVMe slot", b.name));
  b.generation = detail::json_int<std::uint64_t>(e.at("generation"));
  b.checksum = std::stoull(e.at("checksum").get<std::string>(), nullptr, 16);
  b.transient = e.value("transient", false);
  if (e.contains("previous")) {
    const auto& x = e.at("previous");
    ManifestInfo::Block::Previous p;
    p.slot = detail::json_int<int>(x.at(0));
    p.has_data = x.at(1).get<bool>();
    p.generation = detail::json_int<std::uint64_t>(x.at(2));
    p.checksum = std::stoull(x.at(3).get<std::string>(), nullptr, 16);
    if (p.slot < 0 || p.slot >= static_cast<int>(b.slots.size()))
      throw bad(fmt::format("block '{}': previous slot {}", b.name, p.slot));
    b.previous = p;
  }
  return b;
}

}  // namespace

ManifestInfo read_manifest(const std::filesystem::path& path) {
  const std::string payload = detail::read_manifest_file(path);
  auto bad = [&](const std::string& why) {
    return std::runtime_error(fmt::format("manifest {}: {}", path.string(), why));
  };
  ManifestInfo info;
  std::set<std::string> names;
  try {
    const auto j = nlohmann::json::parse(payload);
    if (j.at("format") != "tierswap-manifest") throw bad("not a tierswap manifest");
    info.space_uuid = j.at("space_uuid").get<std::string>();
    info.generation = detail::json_int<std::uint64_t>(j.at("generation"));
    info.shadow_slots = j.at("shadow_slots").get<bool>();
    if (j.contains("record")) info.record = j.at("record").get<std::string>();
    if (j.contains("previous_record"))
      info.previous_record = j.at("previous_record").get<std::string>();
    for (auto& e : j.at("blocks")) {
      ManifestInfo::Block b = read_block(e, info.shadow_slots, bad);
      check_block_fields(b, bad);
      if (!names.insert(b.name).second) throw bad(fmt::format("block '{}' listed twice", b.name));
      info.blocks.push_back(std::move(b));
    }
  } catch (const std::runtime_error&) {
    throw;
  } catch (const std::exception& e) {
    throw bad(std::string("malformed block table: ") + e.what());
  }
  return info;
}

}  // namespace tierswap
