#include "tierswap/swap_space.hpp"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <system_error>

#include "tierswap/aligned_buffer.hpp"
#include "tierswap/checksum.hpp"
#include "tierswap/error.hpp"
#include "tierswap/log.hpp"
#include "tierswap/units.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include "tierswap/detail/config_table.hpp"
#include "tierswap/detail/file.hpp"
#include "tierswap/detail/json.hpp"
#include "tierswap/detail/paths.hpp"

namespace tierswap {
namespace {

constexpr char kMagic[8] = {'T', 'S', 'W', 'A', 'P', 'S', 'P', '\0'};
constexpr std::uint64_t kHeaderBlock = 4096;
constexpr std::uint64_t kDataAlign = 1024 * 1024;

// Little-endian on every supported target (x86-64, aarch64); the layout is fixed-size.
struct FileHeader {
  char magic[8];
  std::uint32_t version;
  std::uint32_t file_index;
  std::uint32_t file_count;
  std::uint32_t reserved;
  std::uint64_t data_offset;
  std::uint64_t stripe_size;
  std::uint64_t capacity;
  std::uint64_t data_bytes;
  std::uint8_t uuid[16];
  std::uint64_t checksum;  // XXH3 of every byte before this field
};
static_assert(sizeof(FileHeader) == 80);

std::string path_str(const std::filesystem::path& p) {
  return p.string();
}

// Opens `path` (no symlink following) with O_DIRECT per `mode`, fills alignment fields.
// The buffer and offset alignment direct I/O on `fd` needs (statx's STATX_DIOALIGN, else 4096
// and the block size); false when the filesystem says it cannot do direct I/O on this file.
bool dio_alignment(int fd, const struct stat& st, std::uint32_t* mem, std::uint32_t* off) {
  struct statx stx {};
  if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 &&
      (stx.stx_mask & STATX_DIOALIGN) != 0) {
    if (stx.stx_dio_mem_align == 0 || stx.stx_dio_offset_align == 0) return false;
    *mem = stx.stx_dio_mem_align;
    *off = stx.stx_dio_offset_align;
    return true;
  }
  *mem = 4096;  // conservative when the kernel does not report DIO alignment
  *off = static_cast<std::uint32_t>(std::max<blksize_t>(st.st_blksize, 512));
  return true;
}

SwapFile open_file(const std::filesystem::path& path, DirectIo mode, bool create) {
  SwapFile f;
  f.path = path;
  int base = O_RDWR | O_CLOEXEC | O_NOFOLLOW;
  if (create) {
    int fd = ::open(path.c_str(), base | O_CREAT | O_EXCL, 0600);
    if (fd < 0 && errno == EEXIST)
      throw_errno(EEXIST, fmt::format("create swap file {}: one is there already (a swap space "
                                      "of another run: open it, or remove it to start anew)",
                                      path_str(path)));
    if (fd < 0) throw_errno(errno, fmt::format("create swap file {}", path_str(path)));
    ::close(fd);
  }
  int fd = -1;
  bool direct = false;
  if (mode != DirectIo::off) {
    fd = ::open(path.c_str(), base | O_DIRECT);
    if (fd >= 0) {
      direct = true;
    } else if (errno != EINVAL || mode == DirectIo::on) {
      throw_errno(errno, fmt::format("open swap file {} with O_DIRECT", path_str(path)));
    }
  }
  if (fd < 0) {
    fd = ::open(path.c_str(), base);
    if (fd < 0) throw_errno(errno, fmt::format("open swap file {}", path_str(path)));
  }
  detail::File guard(fd, path_str(path));
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw_errno(errno, fmt::format("stat {}", path_str(path)));
  if (!S_ISREG(st.st_mode))
    throw std::invalid_argument(fmt::format("swap file {} is not a regular file", path_str(path)));
  std::uint32_t mem_align = 1, off_align = 1;
  if (direct) {
    direct = dio_alignment(fd, st, &mem_align, &off_align);
    if (!direct) {
      if (mode == DirectIo::on)
        throw std::system_error(EINVAL, std::system_category(),
                                fmt::format("O_DIRECT unsupported for {}", path_str(path)));
      guard.close();
      fd = ::open(path.c_str(), base);
      if (fd < 0) throw_errno(errno, fmt::format("open swap file {}", path_str(path)));
      guard = detail::File(fd, path_str(path));
    }
  }
  if (!direct && mode == DirectIo::automatic)
    log(LogLevel::warn, fmt::format("{}: filesystem does not support O_DIRECT; using buffered I/O "
                                    "(page cache)",
                                    path_str(path)));
  // One process at a time: a second one (a resume started beside a live run, two jobs given
  // one directory) would write over the first's state and remove its files at exit.
  f.lock_fd = detail::open_lock(path, "swap file");
  f.fd = guard.release();
  f.direct = direct;
  f.mem_align = mem_align;
  f.offset_align = off_align;
  return f;
}

void pwrite_all(const SwapFile& f, const void* buf, std::size_t n, std::uint64_t off) {
  detail::pwrite_all(f.fd, path_str(f.path), buf, n, off);
}

void pread_all(const SwapFile& f, void* buf, std::size_t n, std::uint64_t off) {
  detail::pread_all(f.fd, path_str(f.path), buf, n, off);
}

void fsync_dir(const std::filesystem::path& dir) {
  try {
    detail::fsync_directory(dir);
  } catch (const std::system_error&) {  // best effort: the files themselves are synced
  }
}

std::filesystem::path file_in(const std::filesystem::path& dir) {
  return dir / std::string(SwapSpace::kFileName);
}

void check_dirs(const std::vector<std::filesystem::path>& dirs) {
  if (dirs.empty()) throw std::invalid_argument("swap space: dirs is empty (give at least one)");
  for (std::size_t i = 0; i < dirs.size(); ++i) {
    std::error_code ec;
    if (!std::filesystem::is_directory(dirs[i], ec))
      throw std::invalid_argument(
          fmt::format("swap space: dirs[{}]={} is not an existing directory", i, dirs[i].string()));
    detail::check_trusted_dir(dirs[i], fmt::format("swap space: dirs[{}]", i));
    for (std::size_t j = 0; j < i; ++j) {
      if (std::filesystem::equivalent(dirs[i], dirs[j], ec))
        throw std::invalid_argument(fmt::format(
            "swap space: dirs[{}]={} is the same directory as dirs[{}]", i, dirs[i].string(), j));
    }
  }
}

// Opening a striped space: a directory given that holds none of its files is named, with where
// they are (a run resumed with another drive's directory in its list); none anywhere is left to
// the open itself.
void check_files_present(const std::vector<std::filesystem::path>& dirs) {
  std::vector<std::string> with, without;
  std::error_code ec;
  for (const auto& d : dirs)  // a link counts as there: opening it is refused by name
    (std::filesystem::exists(std::filesystem::symlink_status(file_in(d), ec)) ? with : without)
        .push_back(d.string());
  if (!with.empty() && !without.empty())
    throw std::invalid_argument(fmt::format(
        "{} holds no file of the swap space whose files are in {}: give every directory it was "
        "made with (in any order)",
        fmt::join(without, ", "), fmt::join(with, ", ")));
}

// Refuses a space whose files do not fit: each filesystem (several directories may share one)
// needs per_dir bytes (and a header's worth) for each of its directories.
void check_free_space(const std::vector<std::filesystem::path>& dirs, std::uint64_t per_dir) {
  std::map<dev_t, std::pair<std::uint64_t, std::filesystem::path>> need;  // per filesystem
  for (const auto& d : dirs) {
    struct stat st {};
    if (::stat(d.c_str(), &st) != 0) throw_errno(errno, fmt::format("stat {}", d.string()));
    auto& e = need[st.st_dev];
    e.first += per_dir + 64 * KiB;
    e.second = d;
  }
  for (auto& [dev, e] : need) {
    struct statvfs vfs {};
    if (::statvfs(e.second.c_str(), &vfs) != 0)
      throw_errno(errno, fmt::format("statvfs {}", e.second.string()));
    const std::uint64_t avail = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    if (avail < e.first)
      throw std::system_error(
          ENOSPC, std::system_category(),
          fmt::format("swap space: {} needs {} on its filesystem but only {} is free",
                      e.second.string(), format_bytes(e.first), format_bytes(avail)));
  }
}

void preallocate(const SwapFile& f, std::uint64_t total, const std::filesystem::path& path) {
  if (::fallocate(f.fd, 0, 0, static_cast<off_t>(total)) == 0) return;
  int err = errno;
  if (err == EOPNOTSUPP) err = ::posix_fallocate(f.fd, 0, static_cast<off_t>(total));
  if (err != 0)
    throw std::system_error(err, std::system_category(),
                            fmt::format("preallocate {} bytes for {}", total, path.string()));
}

// The header block (h, checksummed here, in the file's first aligned block), made durable.
void write_header(const SwapFile& f, FileHeader h, const std::filesystem::path& path) {
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = SwapSpace::kFormatVersion;
  h.checksum = checksum64(&h, offsetof(FileHeader, checksum));
  const std::uint64_t hdr = round_up(kHeaderBlock, f.offset_align);
  AlignedBuffer block(hdr, std::max<std::size_t>(4096, f.mem_align));
  std::memset(block.data(), 0, block.size());
  std::memcpy(block.data(), &h, sizeof h);
  pwrite_all(f, block.data(), hdr, 0);
  if (::fdatasync(f.fd) != 0) throw_errno(errno, fmt::format("fdatasync {}", path.string()));
}

// File f's header, read and checked (magic, version, checksum, geometry, the file's size); f's
// data_offset and data_bytes are taken from it.
FileHeader read_header(SwapFile& f) {
  const std::string path = f.path.string();
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) throw_errno(errno, "fstat " + path);
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size < kHeaderBlock)
    throw std::invalid_argument(
        fmt::format("swap file {} is truncated: {} bytes, smaller than its header", path, size));
  const std::uint64_t hdr = round_up(kHeaderBlock, f.offset_align);
  AlignedBuffer block(hdr, std::max<std::size_t>(4096, f.mem_align));
  pread_all(f, block.data(), hdr, 0);
  FileHeader h;
  std::memcpy(&h, block.data(), sizeof h);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0)
    throw std::invalid_argument(fmt::format("{} is not a tierswap swap file (bad magic)", path));
  if (h.version != SwapSpace::kFormatVersion)
    throw std::invalid_argument(
        fmt::format("{}: unsupported swap format version {} (this build reads version {})", path,
                    h.version, SwapSpace::kFormatVersion));
  if (h.checksum != checksum64(&h, offsetof(FileHeader, checksum)))
    throw std::invalid_argument(
        fmt::format("{}: swap file header checksum mismatch (corrupt header)", path));
  if (h.data_offset < kHeaderBlock || h.data_offset % f.offset_align != 0 || h.stripe_size == 0 ||
      h.data_bytes % h.stripe_size != 0)
    throw std::invalid_argument(fmt::format("{}: inconsistent header geometry", path));
  if (size < h.data_offset + h.data_bytes)
    throw std::invalid_argument(fmt::format("swap file {} is truncated: {} bytes, expected {}",
                                            path, size, h.data_offset + h.data_bytes));
  f.data_offset = h.data_offset;
  f.data_bytes = h.data_bytes;
  return h;
}

// The files of one space, each once: the same uuid and geometry, indices 0..n-1.
void check_one_space(const std::vector<std::pair<FileHeader, SwapFile>>& found) {
  const FileHeader& h0 = found.front().first;
  if (h0.file_count != found.size())
    throw std::invalid_argument(fmt::format(
        "swap space of {} is striped over {} files but {} directories were given: give every "
        "directory it was made with (in any order)",
        found.front().second.path.string(), h0.file_count, found.size()));
  std::vector<int> seen(found.size(), 0);
  for (const auto& [h, f] : found) {
    if (std::memcmp(h.uuid, h0.uuid, sizeof h.uuid) != 0 || h.capacity != h0.capacity ||
        h.stripe_size != h0.stripe_size || h.file_count != h0.file_count)
      throw std::invalid_argument(fmt::format("{} belongs to a different swap space than {}",
                                              f.path.string(), found.front().second.path.string()));
    if (h.file_index >= found.size() || seen[h.file_index]++)
      throw std::invalid_argument(
          fmt::format("{}: duplicate or invalid file index {}", f.path.string(), h.file_index));
  }
}

}  // namespace

// ---- config -----------------------------------------------------------------------------------

void SwapSpaceConfig::validate() const {
  if (dirs.empty()) throw std::invalid_argument("swap space: dirs is empty (give at least one)");
  if (capacity == 0) throw_invalid("capacity", "0", "the swap space needs a capacity > 0");
  if (stripe_size == 0 || stripe_size % 4096 != 0)
    throw_invalid("stripe_size", std::to_string(stripe_size), "must be a multiple of 4096");
}

namespace {

using C = SwapSpaceConfig;

DirectIo parse_direct(std::string_view s, std::string_view key) {
  if (s == "auto") return DirectIo::automatic;
  if (s == "on" || s == "1") return DirectIo::on;
  if (s == "off" || s == "0") return DirectIo::off;
  throw_invalid(key, s, "expected auto, on or off");
}

// Every setting of SwapSpaceConfig, in the configuration page's order.
const std::array<detail::ConfigField<C>, 5> kSwapFields = {{
    {"dirs", "TIERSWAP_SWAP_DIRS", "—", "one directory per drive (the variable: `:`-separated)",
     [](C& c, const nlohmann::json& v, const std::string& k) {
       if (!v.is_array()) throw_invalid(k, v.dump(), "expected an array of paths");
       c.dirs.clear();
       for (const auto& d : v) c.dirs.emplace_back(detail::json_string(d, k));
     },
     [](C& c, const char* n) {
       const char* v = std::getenv(n);
       if (v == nullptr) return;
       c.dirs.clear();
       for (std::string_view s(v); !s.empty();) {  // ':'-separated, empty parts skipped
         const auto p = s.find(':');
         if (p != 0) c.dirs.emplace_back(std::string(s.substr(0, p)));
         if (p == std::string_view::npos) break;
         s.remove_prefix(p + 1);
       }
     }},
    detail::size_field<C, &C::capacity>("capacity", "TIERSWAP_SWAP_CAPACITY", "—",
                                        "logical bytes (rounded up to whole stripes)"),
    detail::size_field<C, &C::stripe_size>("stripe_size", "TIERSWAP_STRIPE_SIZE", "1 MiB",
                                           "stripe unit (multiple of 4 KiB)"),
    {"direct", "TIERSWAP_DIRECT_IO", "`auto`", "`auto`, `on`, `off`",
     [](C& c, const nlohmann::json& v, const std::string& k) {
       c.direct = parse_direct(detail::json_string(v, k), k);
     },
     [](C& c, const char* n) {
       if (const char* v = std::getenv(n)) c.direct = parse_direct(v, n);
     }},
    detail::bool_field<C, &C::check_free_space>("check_free_space", "", "true",
                                                "refuse a space larger than the free disk"),
}};

}  // namespace

SwapSpaceConfig SwapSpaceConfig::from_env() {
  return from_env(SwapSpaceConfig{});
}

SwapSpaceConfig SwapSpaceConfig::from_env(SwapSpaceConfig c) {
  detail::apply_env<SwapSpaceConfig>(c, kSwapFields);
  return c;
}

SwapSpaceConfig SwapSpaceConfig::from_json(std::string_view text) {
  auto c = detail::config_from_json<SwapSpaceConfig>(text, kSwapFields, "swap space config");
  return c;
}

std::vector<Setting> SwapSpaceConfig::settings() {
  return detail::settings_of<SwapSpaceConfig>(kSwapFields);
}

// ---- SwapSpace --------------------------------------------------------------------------------

SwapSpace::SwapSpace(SwapSpace&& o) noexcept {
  *this = std::move(o);
}

SwapSpace& SwapSpace::operator=(SwapSpace&& o) noexcept {
  if (this != &o) {
    close_all();
    files_ = std::move(o.files_);
    o.files_.clear();
    capacity_ = o.capacity_;
    stripe_ = o.stripe_;
    alignment_ = o.alignment_;
    mem_alignment_ = o.mem_alignment_;
    std::memcpy(uuid_, o.uuid_, sizeof uuid_);
  }
  return *this;
}

SwapSpace::~SwapSpace() {
  close_all();
}

void SwapSpace::close_all() noexcept {
  for (auto& f : files_) {
    if (f.fd >= 0) ::close(f.fd);
    detail::close_lock(f.lock_fd);  // the lock goes with it
    f.fd = f.lock_fd = -1;
  }
}

void SwapSpace::remove_files() noexcept {
  close_all();
  for (auto& f : files_) ::unlink(f.path.c_str());
  files_.clear();
}

bool SwapSpace::all_direct() const noexcept {
  return std::all_of(files_.begin(), files_.end(), [](const SwapFile& f) { return f.direct; });
}

std::string SwapSpace::uuid() const {
  std::string s;
  for (auto b : uuid_) s += fmt::format("{:02x}", b);
  return s;
}

PhysicalSpan SwapSpace::map(std::uint64_t logical, std::uint64_t max_length) const noexcept {
  const std::uint64_t n = files_.size();
  const std::uint64_t stripe_idx = logical / stripe_;
  const std::uint64_t within = logical % stripe_;
  PhysicalSpan s;
  s.file = static_cast<std::uint32_t>(stripe_idx % n);
  s.offset = files_[s.file].data_offset + (stripe_idx / n) * stripe_ + within;
  // With one file the stripes lie end to end in it, so a span may cross them (a request larger
  // than the stripe stays one request); with several, a span ends at its stripe's end.
  s.length = n == 1 ? std::min(max_length, capacity_ - logical)
                    : std::min({max_length, stripe_ - within, capacity_ - logical});
  return s;
}

SwapSpace SwapSpace::region(std::uint64_t capacity, std::uint32_t alignment,
                            std::string_view uuid_hex, const std::filesystem::path& dir,
                            std::string label) {
  if (capacity == 0 || alignment == 0 || (alignment & (alignment - 1)) != 0 ||
      capacity % alignment != 0)
    throw std::invalid_argument(
        fmt::format("SwapSpace::region: capacity {} / alignment {}", capacity, alignment));
  SwapSpace s;
  SwapFile f;
  f.path = dir / kFileName;
  f.label = std::move(label);
  f.data_bytes = capacity;
  s.files_.push_back(std::move(f));
  s.capacity_ = capacity;
  s.stripe_ = capacity;
  s.alignment_ = alignment;
  s.mem_alignment_ = 4096;
  for (std::size_t i = 0; i < sizeof s.uuid_ && 2 * i + 1 < uuid_hex.size(); ++i)
    s.uuid_[i] =
        static_cast<std::uint8_t>(std::stoi(std::string(uuid_hex.substr(2 * i, 2)), nullptr, 16));
  return s;
}

void SwapSpace::sync() const {
  for (const auto& f : files_)
    if (f.fd >= 0 && ::fdatasync(f.fd) != 0)
      throw_errno(errno, fmt::format("fdatasync {}", f.path.string()));
}

SwapSpace SwapSpace::create(const SwapSpaceConfig& config) {
  config.validate();
  check_dirs(config.dirs);
  const std::uint64_t n = config.dirs.size();
  const std::uint64_t capacity = round_up(config.capacity, config.stripe_size * n);
  const std::uint64_t data_bytes = capacity / n;
  if (config.check_free_space) check_free_space(config.dirs, data_bytes);

  SwapSpace s;
  s.capacity_ = capacity;
  s.stripe_ = config.stripe_size;
  if (::getrandom(s.uuid_, sizeof s.uuid_, 0) != sizeof s.uuid_)
    throw_errno(errno, "getrandom for the swap space uuid");

  std::vector<std::filesystem::path> created;
  try {
    for (std::uint32_t i = 0; i < n; ++i) {
      auto path = file_in(config.dirs[i]);
      SwapFile f = open_file(path, config.direct, /*create=*/true);
      created.push_back(path);
      // Data starts 1 MiB in, so stripes (and block-size requests) stay aligned to the device's
      // large boundaries; only the first 4 KiB hold the header.
      f.data_offset = round_up(kDataAlign, std::max<std::uint64_t>(f.offset_align, 4096));
      f.data_bytes = data_bytes;
      s.files_.push_back(f);
      preallocate(f, f.data_offset + data_bytes, path);
      FileHeader h{};
      h.file_index = i;
      h.file_count = static_cast<std::uint32_t>(n);
      h.data_offset = f.data_offset;
      h.stripe_size = s.stripe_;
      h.capacity = capacity;
      h.data_bytes = data_bytes;
      std::memcpy(h.uuid, s.uuid_, sizeof h.uuid);
      write_header(f, h, path);
      fsync_dir(config.dirs[i]);
    }
  } catch (...) {
    s.close_all();
    for (auto& p : created) ::unlink(p.c_str());
    s.files_.clear();
    throw;
  }
  for (auto& f : s.files_) {
    s.alignment_ = std::max(s.alignment_, f.offset_align);
    s.mem_alignment_ = std::max(s.mem_alignment_, f.mem_align);
  }
  return s;
}

SwapSpace SwapSpace::open(const std::vector<std::filesystem::path>& dirs, DirectIo direct) {
  check_dirs(dirs);
  check_files_present(dirs);
  SwapSpace s;
  std::vector<std::pair<FileHeader, SwapFile>> found;
  try {
    for (const auto& d : dirs) {
      found.push_back({FileHeader{}, open_file(file_in(d), direct, /*create=*/false)});
      found.back().first = read_header(found.back().second);
    }
    check_one_space(found);
    std::sort(found.begin(), found.end(),
              [](auto& a, auto& b) { return a.first.file_index < b.first.file_index; });
    const FileHeader& h0 = found.front().first;
    s.capacity_ = h0.capacity;
    s.stripe_ = h0.stripe_size;
    std::memcpy(s.uuid_, h0.uuid, sizeof s.uuid_);
    for (auto& [h, f] : found) s.files_.push_back(f);
  } catch (...) {
    for (auto& [h, f] : found) {
      ::close(f.fd);
      detail::close_lock(f.lock_fd);
    }
    s.files_.clear();
    throw;
  }
  for (auto& f : s.files_) {
    s.alignment_ = std::max(s.alignment_, f.offset_align);
    s.mem_alignment_ = std::max(s.mem_alignment_, f.mem_align);
  }
  return s;
}

SwapSpace SwapSpace::open_or_create(const SwapSpaceConfig& config, bool* created) {
  config.validate();
  const bool none = std::none_of(config.dirs.begin(), config.dirs.end(), [](const auto& d) {
    struct stat st {};
    return ::lstat(file_in(d).c_str(), &st) == 0;
  });
  if (created) *created = none;
  if (none) return create(config);
  SwapSpace s = open(config.dirs, config.direct);  // names a directory without its file
  const std::uint64_t want = round_up(config.capacity, config.stripe_size * config.dirs.size());
  if (s.stripe_size() != config.stripe_size || s.capacity() != want)
    throw std::invalid_argument(fmt::format(
        "swap space in {} exists with capacity {} and stripe {}, but capacity {} and stripe {} "
        "were asked; remove it or ask for the same geometry",
        config.dirs.front().string(), s.capacity(), s.stripe_size(), want, config.stripe_size));
  return s;
}

}  // namespace tierswap
