// The manifest file (internal). Layout, version 1:
//   [0, 64)   header: magic "TSWAPMF\0", u32 version, u32 flags (0), u64 payload bytes,
//             u64 XXH3-64 of the payload, 24 reserved bytes (0), u64 XXH3-64 of bytes [0, 56)
//   [64, ...) payload: UTF-8 JSON (the block table; see tier_manager.cpp)
// Written to "<path>.tmp", fsynced (durable), renamed over <path>, directory fsynced (durable).
//
// A manifest rewritten at every commit (the tier manager's; the node service's client manifests
// and registry) recycles the file it replaces: the old manifest stays linked as "<path>.old"
// across the rename and becomes the next "<path>.tmp", overwritten in place. A commit then frees
// no disk blocks. Freeing them is not free: on ext4 mounted with `discard` and no journal, the
// rename's eviction of the old file waits for a discard, which took up to seconds per commit on
// a virtio disk (bench/RESULTS.md, issue 16).
#pragma once

#include <filesystem>
#include <string>

#include "tierswap/detail/file.hpp"  // fsync_directory

namespace tierswap::detail {

inline constexpr std::uint32_t kManifestVersion = 1;
inline constexpr std::string_view kManifestName = "tierswap.manifest";

/// Writes the payload atomically. Throws std::system_error naming the path on failure (the old
/// manifest is then untouched). `recycle`: keep the replaced file as the next write's "<path>.tmp"
/// (see above; where hard links are refused, the replaced file is freed as without it). A durable
/// recycling write whose directory sync fails after the rename puts the earlier state back (the
/// replaced file, or no manifest where there was none) before it throws, so that what is on disk
/// matches what a caller that saw the write fail keeps to; its error says whether it could.
void write_manifest_file(const std::filesystem::path& path, const std::string& payload,
                         bool durable, bool recycle = false);
/// Removes the manifest and the files a recycling write keeps beside it; errors ignored.
void remove_manifest_file(const std::filesystem::path& path) noexcept;
/// Reads and verifies the header and checksums; returns the payload. Throws std::runtime_error
/// naming the path and the problem (truncated, bad magic, newer version, checksum mismatch).
std::string read_manifest_file(const std::filesystem::path& path);

}  // namespace tierswap::detail
