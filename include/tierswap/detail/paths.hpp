// Directories tierswap writes state into or reads it back from (swap directories, their rank
// subdirectories, checkpoint directories) must be ones no other user can tamper with: a symbolic
// link could point the files anywhere; a directory owned by another user, or world-writable
// without the sticky bit, lets someone else replace them. Also: which block device a directory
// lives on, for what sysfs says of it.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace tierswap::detail {

/// Throws std::invalid_argument naming `role` and `dir` unless `dir` exists, is a directory and
/// not a symbolic link, is owned by this user or by root, and is not writable by others without
/// the sticky bit (/var/tmp and /tmp, 1777 root, pass). `private_dir`: also not writable by group
/// or others at all (a directory tierswap made for itself, 0700). `if_missing`: what the
/// refusal of a missing `dir` tells the user to do (appended after ": ").
void check_trusted_dir(const std::filesystem::path& dir, std::string_view role,
                       bool private_dir = false, std::string_view if_missing = {});

/// The sysfs directory of the block device holding `path` (/sys/dev/block/MAJ:MIN resolved: a
/// partition's, or a whole disk's). Empty, with `why` set, when there is none: `path` cannot be
/// stat'ed, or its file system has no block device sysfs knows (tmpfs, overlayfs, NFS).
std::filesystem::path block_device_sysfs(const std::filesystem::path& path, std::string* why);

/// A node service's job id: 1-64 of [A-Za-z0-9._-], not "." or "..": usable as a file name.
bool valid_job_id(std::string_view job) noexcept;

}  // namespace tierswap::detail
