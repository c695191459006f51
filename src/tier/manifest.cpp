#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <system_error>

#include "tierswap/checksum.hpp"
#include "tierswap/detail/manifest.hpp"
#include "tierswap/error.hpp"

#include <fmt/format.h>

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

void write_all(int fd, const void* data, std::size_t n, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw_errno(w < 0 ? errno : EIO, "write " + path);
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}
}  // namespace

void write_manifest_file(const std::filesystem::path& path, const std::string& payload,
                         bool durable) {
  unsigned char h[kHeader] = {};
  std::memcpy(h, kMagic, 8);
  put<std::uint32_t>(h + 8, kManifestVersion);
  put<std::uint32_t>(h + 12, 0);
  put<std::uint64_t>(h + 16, payload.size());
  put<std::uint64_t>(h + 24, checksum64(payload.data(), payload.size()));
  put<std::uint64_t>(h + 56, checksum64(h, 56));
  const std::string tmp = path.string() + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) throw_errno(errno, "create " + tmp);
  try {
    write_all(fd, h, kHeader, tmp);
    write_all(fd, payload.data(), payload.size(), tmp);
    if (durable && ::fsync(fd) != 0) throw_errno(errno, "fsync " + tmp);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw_errno(err, fmt::format("rename {} -> {}", tmp, path.string()));
  }
  if (durable) fsync_directory(path.parent_path().empty() ? "." : path.parent_path());
}

void fsync_directory(const std::filesystem::path& dir) {
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) throw_errno(errno, "open directory " + dir.string());
  const int rc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  if (rc != 0) throw_errno(err, "fsync directory " + dir.string());
}

std::string read_manifest_file(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) throw_errno(errno, "open manifest " + path.string());
  std::string data;
  char buf[1 << 16];
  for (;;) {
    const ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      ::close(fd);
      throw_errno(err, "read manifest " + path.string());
    }
    if (r == 0) break;
    data.append(buf, static_cast<std::size_t>(r));
  }
  ::close(fd);
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
