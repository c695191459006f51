// The optimizer's commit record (what resume() reads back from the tier manifest: world size,
// rank, version, sub-group size, layout, step count, loss scaler): the input replaces the record
// of a real swap directory, which a new optimizer then resumes from.
#include <cstdint>
#include <exception>
#include <nlohmann/json.hpp>

#include "fuzz_model.hpp"
#include "tierswap/detail/manifest.hpp"

using namespace tierswap;

namespace {

struct Setup {
  std::filesystem::path dir = fuzz::scratch() / "resume";
  std::filesystem::path manifest = dir / "tierswap-rank0" / detail::kManifestName;
  std::string payload;
  Setup() {
    fuzz::small_model(dir, true);  // a run that stepped once and kept its files
    payload = detail::read_manifest_file(manifest);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t n) {
  static Setup s;
  auto j = nlohmann::json::parse(s.payload);
  j["record"] = std::string(reinterpret_cast<const char*>(data), n);
  try {
    detail::write_manifest_file(s.manifest, j.dump(), false);
    auto t = fuzz::small_model(s.dir, true);
  } catch (const std::exception&) {
  }
  detail::write_manifest_file(s.manifest, s.payload, false);
  return 0;
}
