// SwapSpace: the NVMe tier's backing store. One preallocated file per directory (one directory per
// drive); logical offsets are striped across the files so N drives add their bandwidth.
//
// On-disk format (version 1), per file "tierswap.swap":
//   [0, data_offset)     header: magic "TSWAPSP\0", version, geometry, space uuid, XXH3 checksum
//   [data_offset, ...)   data stripes
// Logical offset L lives in file (L / stripe) % N at data_offset + (L / stripe / N) * stripe +
// L % stripe. Files are created 0600 with O_EXCL|O_NOFOLLOW, opened O_NOFOLLOW, with O_DIRECT
// where the filesystem allows it (alignment from statx STATX_DIOALIGN, else the block size).
//
// Thread-safety: after construction every const member is safe to call concurrently.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tierswap/setting.hpp"

namespace tierswap {

enum class DirectIo { automatic, on, off };

struct SwapSpaceConfig {
  /// One directory per drive; each gets one file. At least one.
  std::vector<std::filesystem::path> dirs;
  /// Logical capacity in bytes (rounded up to stripe_size x dirs.size()).
  std::uint64_t capacity = 0;
  /// Stripe unit: a multiple of 4096.
  std::uint64_t stripe_size = 1024 * 1024;
  /// automatic: O_DIRECT where supported, buffered with a warning elsewhere (tmpfs);
  /// on: fail when O_DIRECT is unsupported; off: always buffered.
  DirectIo direct = DirectIo::automatic;
  /// Refuse to create files that would not fit in the free space of their filesystems.
  bool check_free_space = true;

  /// Overrides from the environment: each setting's variable as settings() lists it
  /// (TIERSWAP_SWAP_DIRS ':'-separated; tools/docs/configuration.md).
  static SwapSpaceConfig from_env();
  static SwapSpaceConfig from_env(SwapSpaceConfig base);
  /// Loads a JSON object of the keys settings() lists ("dirs": [...], "capacity": "8GiB" or a
  /// number, "direct": "auto"|"on"|"off"); unknown keys or bad values throw std::invalid_argument
  /// naming the key.
  static SwapSpaceConfig from_json(std::string_view json);
  /// Every setting, in the configuration page's order (its table is generated from them).
  static std::vector<Setting> settings();
  /// Throws std::invalid_argument naming the offending key.
  void validate() const;
};

/// One backing file.
struct SwapFile {
  std::filesystem::path path;
  int fd = -1;
  /// A descriptor of its own holding the file's flock (one process at a time), never given to
  /// an I/O backend: an io_uring keeps the files registered with it open until the kernel tears
  /// the ring down, after the space is closed, and the lock must go when the space does.
  int lock_fd = -1;
  bool direct = false;             ///< opened with O_DIRECT
  std::uint32_t mem_align = 1;     ///< required buffer alignment for direct I/O (1 if buffered)
  std::uint32_t offset_align = 1;  ///< required offset/length alignment (1 if buffered)
  std::uint64_t data_offset = 0;   ///< where stripe data starts in the file
  std::uint64_t data_bytes = 0;    ///< bytes of stripe data in this file
  /// What error messages call it (a region of the node service: the service and the region).
  std::string label;
  std::string name() const { return label.empty() ? path.string() : label; }
};

/// A logical range's piece that lies in one file, up to the next stripe boundary.
struct PhysicalSpan {
  std::uint32_t file = 0;
  std::uint64_t offset = 0;  ///< byte offset in the file
  std::uint64_t length = 0;
};

class SwapSpace {
 public:
  static constexpr std::string_view kFileName = "tierswap.swap";
  static constexpr std::uint32_t kFormatVersion = 1;

  /// Creates new files (fails with std::system_error(EEXIST) naming the path if one exists).
  static SwapSpace create(const SwapSpaceConfig& config);
  /// Opens an existing space, verifying every header (magic, version, checksum, same uuid and
  /// geometry across files, file sizes). `direct` as in SwapSpaceConfig.
  static SwapSpace open(const std::vector<std::filesystem::path>& dirs,
                        DirectIo direct = DirectIo::automatic);
  /// open() when every file exists with the requested geometry, create() when none exists;
  /// anything in between is an error (nothing is overwritten). `*created` (if given) tells which.
  static SwapSpace open_or_create(const SwapSpaceConfig& config, bool* created = nullptr);

  SwapSpace(SwapSpace&&) noexcept;
  SwapSpace& operator=(SwapSpace&&) noexcept;
  SwapSpace(const SwapSpace&) = delete;
  SwapSpace& operator=(const SwapSpace&) = delete;
  ~SwapSpace();  ///< closes the files (they stay on disk unless remove_files() was called)

  std::uint64_t capacity() const noexcept { return capacity_; }
  std::uint64_t stripe_size() const noexcept { return stripe_; }
  const std::vector<SwapFile>& files() const noexcept { return files_; }
  /// Largest offset alignment over the files: extents aligned to this never need read-modify-write.
  std::uint32_t alignment() const noexcept { return alignment_; }
  /// Largest buffer alignment over the files.
  std::uint32_t memory_alignment() const noexcept { return mem_alignment_; }
  bool all_direct() const noexcept;
  /// 128-bit identity shared by all files of this space, hex.
  std::string uuid() const;

  /// Maps [logical, logical + max_length) to its first piece inside one file (up to the end of
  /// its stripe when the space has several files; with one file the stripes are contiguous).
  /// Precondition: logical < capacity().
  PhysicalSpan map(std::uint64_t logical, std::uint64_t max_length) const noexcept;

  /// A space whose bytes live elsewhere: a region of the node service's swap space
  /// (service.hpp's ServiceStorage). One file entry without a descriptor, named
  /// `<dir>/tierswap.swap` (where a tier manager over it keeps its manifest), buffered (no
  /// alignment of its own beyond `alignment`); the engine over it must run through the service.
  static SwapSpace region(std::uint64_t capacity, std::uint32_t alignment,
                          std::string_view uuid_hex, const std::filesystem::path& dir,
                          std::string label);

  /// fdatasync every file (a region has none: its engine syncs through the service); throws
  /// std::system_error naming the file on failure.
  void sync() const;
  /// Closes and unlinks the files (used for temporary spaces).
  void remove_files() noexcept;

 private:
  SwapSpace() = default;
  void close_all() noexcept;

  std::vector<SwapFile> files_;
  std::uint64_t capacity_ = 0;
  std::uint64_t stripe_ = 0;
  std::uint32_t alignment_ = 1;
  std::uint32_t mem_alignment_ = 1;
  std::uint8_t uuid_[16] = {};
};

}  // namespace tierswap
