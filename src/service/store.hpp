// The service's persistent state (internal): which NVMe region of the swap space each client
// (job + rank) owns, and each client's blocks with their two shadow extents, committed slot and
// checksums. Loaded at start, written atomically (detail/manifest.hpp's container).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tierswap/extent_allocator.hpp"

namespace tierswap::service {

struct BlockRecord {
  std::uint64_t length = 0;
  std::uint64_t extent[2] = {};  ///< offsets in the client's region
  int committed = -1;            ///< slot holding the committed data, -1: none yet
  std::uint64_t sum[2] = {};     ///< checksum64 of each slot's data
  bool open = false;             ///< put since the last commit (into the other slot)
  int readable() const noexcept { return open ? (committed == 0 ? 1 : 0) : committed; }
  int writable() const noexcept { return committed == 0 ? 1 : 0; }
};

/// One client's region and blocks.
struct ClientRecord {
  std::string job;
  std::uint32_t rank = 0;
  std::uint64_t base = 0;   ///< where the region starts in the swap space
  std::uint64_t bytes = 0;  ///< region size
  std::uint64_t generation = 0;
  bool raw = false;  ///< addresses its region itself (a tier manager); no blocks here
  /// The uid that made the region: only it (and the service's own uid) may attach it, read it
  /// or release it. A registry written before regions had owners: the service's uid.
  std::uint32_t uid = 0;
  /// When a client last attached or detached (Unix seconds): a detached region idle for the
  /// service's region TTL is released. A registry of version 1 (before it): the load's time.
  std::int64_t last_used = 0;
  std::map<std::uint64_t, BlockRecord> blocks;

  std::string key() const { return job + "." + std::to_string(rank); }
  /// Allocates a block's two extents in the region (std::system_error ENOSPC naming the client).
  void place(std::uint64_t block, std::uint64_t length, std::uint64_t align);
  /// Rebuilds the region's allocator from the blocks (after a load).
  void rebuild(std::uint64_t align);

  std::unique_ptr<ExtentAllocator> alloc;
};

/// Where the service keeps its files (the first swap directory).
struct ServiceFiles {
  std::filesystem::path dir;
  std::filesystem::path registry() const { return dir / "tierswap.service"; }
  std::filesystem::path manifest(const ClientRecord& c) const {
    return dir / "service-clients" / (c.key() + ".manifest");
  }
};

/// The regions of every known client, keyed by ClientRecord::key(); blocks and generation from
/// each client's manifest. Throws std::runtime_error naming the file when one is corrupt or of
/// another swap space. Records without an owner (an older registry) get `service_uid`; without a
/// last use (version 1), `now`.
std::map<std::string, ClientRecord> load_clients(const ServiceFiles& f, const std::string& uuid,
                                                 std::uint64_t align, std::uint32_t service_uid,
                                                 std::int64_t now);
/// The clients ("job.rank") and swap space uuid a registry names, whatever swap space is there
/// (to say what a lost swap file took with it). Throws std::runtime_error naming a corrupt file.
std::pair<std::vector<std::string>, std::string> registry_summary(const ServiceFiles& f);

void save_registry(const ServiceFiles& f, const std::string& uuid,
                   const std::map<std::string, ClientRecord>& clients);
void save_manifest(const ServiceFiles& f, const std::string& uuid, const ClientRecord& c);

}  // namespace tierswap::service
