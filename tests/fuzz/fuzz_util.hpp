// Shared by the libFuzzer targets: a scratch directory per process, files written whole, and the
// rule every target follows: bad input may throw std::exception (the documented way tierswap
// refuses it); anything else (a crash, a sanitizer report, another exception type) is a finding.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace tierswap::fuzz {

/// A directory of this process, made once, removed at exit.
inline const std::filesystem::path& scratch() {
  static const std::filesystem::path dir = [] {
    ::setenv("TIERSWAP_LOG_LEVEL", "off", 0);
    std::string tmpl = (std::filesystem::temp_directory_path() / "tierswap-fuzz-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch(), ec);
    });
    return std::filesystem::path(tmpl);
  }();
  return dir;
}

inline void write_file(const std::filesystem::path& p, std::string_view bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// Stands for the swap space's uuid in seeds of files that name it (a tier manifest, the
/// service's registry and client manifests): each target's space has a uuid of its own, and a
/// file naming another is refused before anything else in it is read.
inline constexpr std::string_view kUuidToken = "@SPACE_UUID@";

/// `bytes` with every kUuidToken replaced by `uuid`.
inline std::string with_uuid(std::string_view bytes, const std::string& uuid) {
  std::string out;
  out.reserve(bytes.size());
  for (std::size_t i = 0; i < bytes.size();) {
    if (bytes.substr(i, kUuidToken.size()) == kUuidToken) {
      out += uuid;
      i += kUuidToken.size();
    } else {
      out += bytes[i++];
    }
  }
  return out;
}

/// The input's first byte (a selector) and the rest.
inline std::pair<std::uint8_t, std::string_view> split(const std::uint8_t* data, std::size_t n) {
  if (n == 0) return {0, {}};
  return {data[0], std::string_view(reinterpret_cast<const char*>(data + 1), n - 1)};
}

}  // namespace tierswap::fuzz
