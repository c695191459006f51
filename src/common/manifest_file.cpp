// The manifest file: a checksummed header and a payload, written atomically, the replaced file
// recycled (include/tierswap/detail/manifest.hpp). Below its two users: the tier manager's
// manifest (src/tier/manifest.cpp) and the node service's registry and client manifests.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <system_error>

#include "tierswap/checksum.hpp"
#include "tierswap/detail/file.hpp"
#include "tierswap/detail/manifest.hpp"
#include "tierswap/error.hpp"

namespace tierswap::detail {
namespace {
constexpr char kMagic[8] = {'T', 'S', 'W', 'A', 'P', 'M', 'F', '\0'};
constexpr std::size_t kHeader = 64;

template <class T>
void put(unsigned char* p, T v) {
  std::memcpy(p, &v, sizeof v);
}
template <class T>
T get(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// What a recycling write did with the manifest it replaces.
enum class Replaced {
  none,  ///< there was none yet
  kept,  ///< linked as "<path>.old", so that the rename does not free it
  lost,  ///< not kept: not a recycling write, or hard links refused (the rename frees it)
};

Replaced keep_replaced(const std::string& path, const std::string& old) noexcept {
  if (::link(path.c_str(), old.c_str()) == 0) return Replaced::kept;
  if (errno == ENOENT) return Replaced::none;
  if (errno != EEXIST) return Replaced::lost;
  ::unlink(old.c_str());  // left by a write that was cut off
  return ::link(path.c_str(), old.c_str()) == 0 ? Replaced::kept : Replaced::lost;
}

// The directory sync after the rename failed: the new manifest is in place but may not survive a
// power loss, and the caller, told the write failed, keeps to the state the old one describes and
// may overwrite what only the new one names. So a recycling write puts the old state back: the
// replaced file (now "<path>.tmp") renamed over the new one, or no manifest where there was none.
[[noreturn]] void put_back_replaced(const std::filesystem::path& path, const std::string& tmp,
                                    Replaced replaced, const std::system_error& e) {
  bool back = false;
  if (replaced == Replaced::kept) back = ::rename(tmp.c_str(), path.c_str()) == 0;
  if (replaced == Replaced::none) back = ::unlink(path.c_str()) == 0;
  throw std::system_error(e.code(),
                          fmt::format("{}; {}", e.what(),
                                      back ? "the manifest's earlier state was put back"
                                           : "the new manifest " + path.string() +
                                                 " is in place and may not survive a power loss"));
}
}  // namespace

void write_manifest_file(const std::filesystem::path& path, const std::string& payload,
                         bool durable, bool recycle) {
  unsigned char h[kHeader] = {};
  std::memcpy(h, kMagic, 8);
  put<std::uint32_t>(h + 8, kManifestVersion);
  put<std::uint32_t>(h + 12, 0);
  put<std::uint64_t>(h + 16, payload.size());
  put<std::uint64_t>(h + 24, checksum64(payload.data(), payload.size()));
  put<std::uint64_t>(h + 56, checksum64(h, 56));
  const std::string tmp = path.string() + ".tmp", old = path.string() + ".old";
  try {  // a recycled file is overwritten, then cut to size (no O_TRUNC: that would free it)
    const File f = File::open(tmp, O_WRONLY | O_CREAT | (recycle ? 0 : O_TRUNC));
    f.pwrite_all(h, kHeader, 0);
    f.pwrite_all(payload.data(), payload.size(), kHeader);
    if (::ftruncate(f.fd(), static_cast<off_t>(kHeader + payload.size())) != 0)
      throw_errno(errno, "truncate " + tmp);
    if (durable) f.sync();
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  Replaced replaced = recycle ? keep_replaced(path.string(), old) : Replaced::lost;
  const bool kept = replaced == Replaced::kept;
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    if (kept) ::unlink(old.c_str());
    throw_errno(err, fmt::format("rename {} -> {}", tmp, path.string()));
  }
  if (kept && ::rename(old.c_str(), tmp.c_str()) != 0) {
    ::unlink(old.c_str());
    replaced = Replaced::lost;
  }
  if (durable) try {
      fsync_directory(path.parent_path().empty() ? "." : path.parent_path());
    } catch (const std::system_error& e) {
      put_back_replaced(path, tmp, replaced, e);
    }
}

void remove_manifest_file(const std::filesystem::path& path) noexcept {
  for (const char* suffix : {"", ".tmp", ".old"}) ::unlink((path.string() + suffix).c_str());
}

std::string read_manifest_file(const std::filesystem::path& path) {
  const std::string data = File::open(path, O_RDONLY).read_to_end();
  auto bad = [&](const std::string& why) {
    return std::runtime_error(fmt::format("manifest {}: {}", path.string(), why));
  };
  if (data.size() < kHeader)
    throw bad(fmt::format("truncated ({} bytes, the header alone is {})", data.size(), kHeader));
  const auto* h = reinterpret_cast<const unsigned char*>(data.data());
  if (std::memcmp(h, kMagic, 8) != 0) throw bad("not a tierswap manifest (bad magic)");
  if (get<std::uint64_t>(h + 56) != checksum64(h, 56)) throw bad("header checksum mismatch");
  const auto version = get<std::uint32_t>(h + 8);
  if (version != kManifestVersion)
    throw bad(
        fmt::format("format version {} (this build reads version {})", version, kManifestVersion));
  const auto len = get<std::uint64_t>(h + 16);
  if (data.size() - kHeader != len)
    throw bad(fmt::format("truncated or padded: payload is {} bytes, the header says {}",
                          data.size() - kHeader, len));
  std::string payload = data.substr(kHeader);
  if (checksum64(payload.data(), payload.size()) != get<std::uint64_t>(h + 24))
    throw bad("payload checksum mismatch (corrupt)");
  return payload;
}

}  // namespace tierswap::detail
