#include "src/service/store.hpp"

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <system_error>

#include "tierswap/detail/json.hpp"
#include "tierswap/detail/manifest.hpp"
#include "tierswap/detail/paths.hpp"
#include "tierswap/units.hpp"

#include <fmt/format.h>

namespace tierswap::service {

void ClientRecord::place(std::uint64_t block, std::uint64_t length, std::uint64_t align) {
  BlockRecord r;
  r.length = length;
  const auto a = alloc->try_allocate(length);
  const auto b = a ? alloc->try_allocate(length) : std::nullopt;
  if (!b) {
    if (a) alloc->free(*a);
    throw std::system_error(
        ENOSPC, std::system_category(),
        fmt::format("client {}: block {} needs 2 x {} and the region of {} has {} free", key(),
                    block, format_bytes(round_up(length, align)), format_bytes(bytes),
                    format_bytes(alloc->stats().free)));
  }
  r.extent[0] = a->offset;
  r.extent[1] = b->offset;
  blocks.emplace(block, r);
}

void ClientRecord::rebuild(std::uint64_t align) {
  alloc = std::make_unique<ExtentAllocator>(bytes, align);
  for (auto& [id, b] : blocks)
    for (std::uint64_t e : b.extent) alloc->reserve({e, round_up(b.length, align)});
}

namespace {

[[noreturn]] void corrupt(const std::filesystem::path& p, const std::string& why) {
  throw std::runtime_error(fmt::format("{}: {}", p.string(), why));
}

// The registry's version: 2 records each client's last use; 1 (read, never written) does not.
constexpr int kRegistryVersion = 2;

// The file's format and swap space checked; returns its version, 1 up to `newest`.
int check_header(const nlohmann::json& j, const std::filesystem::path& p, const char* format,
                 const std::string& uuid, int newest) {
  if (!j.is_object() || j.value("format", "") != format)
    corrupt(p, fmt::format("not a {} file", format));
  const nlohmann::json v = j.value("version", nlohmann::json());
  if (!v.is_number_integer() || v.get<std::int64_t>() < 1 || v.get<std::int64_t>() > newest)
    corrupt(p,
            fmt::format("unsupported version {} (this tierswap reads 1 to {})", v.dump(), newest));
  if (j.value("space_uuid", "") != uuid) corrupt(p, "belongs to another swap space");
  return v.get<int>();
}

std::uint64_t u64(const nlohmann::json& j) {
  return detail::json_int<std::uint64_t>(j);
}

void load_blocks(const ServiceFiles& f, const std::string& uuid, ClientRecord& c) {
  const auto p = f.manifest(c);
  if (!std::filesystem::exists(p)) return;
  const auto j = nlohmann::json::parse(detail::read_manifest_file(p), nullptr, false);
  check_header(j, p, "tierswap.service-client", uuid, 1);
  try {
    if (j.at("job") != c.job || j.at("rank") != c.rank) corrupt(p, "names another client");
    c.generation = u64(j.at("generation"));
    for (const auto& b : j.at("blocks")) {
      BlockRecord r;
      r.length = u64(b.at("length"));
      r.committed = detail::json_int<int>(b.at("committed"));
      for (int s = 0; s < 2; ++s) {
        r.extent[s] = u64(b.at("extents").at(s));
        r.sum[s] = u64(b.at("sums").at(s));
      }
      if (r.committed < -1 || r.committed > 1 || r.length == 0) corrupt(p, "bad block record");
      c.blocks.emplace(u64(b.at("id")), r);
    }
  } catch (const nlohmann::json::exception& e) {
    corrupt(p, std::string("bad block table: ") + e.what());
  } catch (const std::invalid_argument& e) {
    corrupt(p, std::string("bad block table: ") + e.what());
  }
}

}  // namespace

std::map<std::string, ClientRecord> load_clients(const ServiceFiles& f, const std::string& uuid,
                                                 std::uint64_t align, std::uint32_t service_uid,
                                                 std::int64_t now) {
  std::map<std::string, ClientRecord> out;
  if (!std::filesystem::exists(f.registry())) return out;
  const auto j = nlohmann::json::parse(detail::read_manifest_file(f.registry()), nullptr, false);
  const int version = check_header(j, f.registry(), "tierswap.service", uuid, kRegistryVersion);
  try {
    for (const auto& e : j.at("clients")) {
      ClientRecord c;
      c.job = e.at("job");
      c.rank = detail::json_int<std::uint32_t>(e.at("rank"));
      c.base = u64(e.at("base"));
      c.bytes = u64(e.at("bytes"));
      c.raw = e.value("raw", false);
      c.uid = e.contains("uid") ? detail::json_int<std::uint32_t>(e.at("uid")) : service_uid;
      c.last_used = version >= 2 ? detail::json_int<std::int64_t>(e.at("last_used")) : now;
      if (c.last_used < 0) corrupt(f.registry(), "bad last use of " + c.key());
      if (!detail::valid_job_id(c.job)) corrupt(f.registry(), "bad job id '" + c.job + "'");
      load_blocks(f, uuid, c);
      try {
        c.rebuild(align);
      } catch (const std::exception& ex) {
        corrupt(f.manifest(c), std::string("extents do not fit the region: ") + ex.what());
      }
      out.emplace(c.key(), std::move(c));
    }
  } catch (const nlohmann::json::exception& e) {
    corrupt(f.registry(), std::string("bad client table: ") + e.what());
  } catch (const std::invalid_argument& e) {
    corrupt(f.registry(), std::string("bad client table: ") + e.what());
  }
  return out;
}

std::pair<std::vector<std::string>, std::string> registry_summary(const ServiceFiles& f) {
  const auto j = nlohmann::json::parse(detail::read_manifest_file(f.registry()), nullptr, false);
  std::vector<std::string> keys;
  try {
    for (const auto& e : j.at("clients"))
      keys.push_back(e.at("job").get<std::string>() + "." +
                     std::to_string(detail::json_int<std::uint32_t>(e.at("rank"))));
    return {keys, j.at("space_uuid").get<std::string>()};
  } catch (const std::exception& e) {  // json's errors and json_int's
    corrupt(f.registry(), std::string("bad client table: ") + e.what());
  }
}

void save_registry(const ServiceFiles& f, const std::string& uuid,
                   const std::map<std::string, ClientRecord>& clients) {
  nlohmann::json j = {
      {"format", "tierswap.service"}, {"version", kRegistryVersion}, {"space_uuid", uuid}};
  j["clients"] = nlohmann::json::array();
  for (const auto& [k, c] : clients)
    j["clients"].push_back({{"job", c.job},
                            {"rank", c.rank},
                            {"base", c.base},
                            {"bytes", c.bytes},
                            {"raw", c.raw},
                            {"uid", c.uid},
                            {"last_used", c.last_used}});
  detail::write_manifest_file(f.registry(), j.dump(), true, /*recycle=*/true);
}

void save_manifest(const ServiceFiles& f, const std::string& uuid, const ClientRecord& c) {
  nlohmann::json j = {{"format", "tierswap.service-client"},
                      {"version", 1},
                      {"space_uuid", uuid},
                      {"job", c.job},
                      {"rank", c.rank},
                      {"generation", c.generation}};
  j["blocks"] = nlohmann::json::array();
  for (const auto& [id, b] : c.blocks) {
    if (b.committed < 0) continue;  // never committed: nothing to reopen
    j["blocks"].push_back({{"id", id},
                           {"length", b.length},
                           {"committed", b.committed},
                           {"extents", {b.extent[0], b.extent[1]}},
                           {"sums", {b.sum[0], b.sum[1]}}});
  }
  std::filesystem::create_directories(f.manifest(c).parent_path());
  detail::write_manifest_file(f.manifest(c), j.dump(), true, /*recycle=*/true);
}

}  // namespace tierswap::service
