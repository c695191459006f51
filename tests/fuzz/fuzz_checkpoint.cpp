// Checkpoints as load() reads them. Selector even: the input is the checkpoint manifest's payload
// (JSON: world size, layout, rank table), in a valid container beside a real save()'s rank files.
// Odd: the input is rank 0's index (sections, piece checksums), with the manifest's checksum of
// it updated so load() goes on to read the data file by what the index says.
#include <cstdint>
#include <exception>
#include <nlohmann/json.hpp>

#include "fuzz_model.hpp"
#include "tierswap/checksum.hpp"
#include "tierswap/detail/manifest.hpp"

using namespace tierswap;

namespace {

struct Setup {
  std::unique_ptr<TieredOptimizer> t = fuzz::small_model(fuzz::scratch() / "run", false);
  std::filesystem::path ckpt = fuzz::scratch() / "ckpt";
  std::filesystem::path manifest = ckpt / "tierswap.checkpoint", index;
  std::string manifest_payload, index_payload;
  Setup() {
    t->optimizer().save(ckpt);
    for (const auto& e : std::filesystem::directory_iterator(ckpt))
      if (e.path().extension() == ".json") index = e.path();
    manifest_payload = detail::read_manifest_file(manifest);
    index_payload = detail::read_manifest_file(index);
  }
  void restore() {
    detail::write_manifest_file(manifest, manifest_payload, false);
    detail::write_manifest_file(index, index_payload, false);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t n) {
  static Setup s;
  const auto [which, bytes] = fuzz::split(data, n);
  const std::string input(bytes);
  try {
    if (which % 2 == 0) {
      detail::write_manifest_file(s.manifest, input, false);
    } else {
      detail::write_manifest_file(s.index, input, false);
      auto m = nlohmann::json::parse(s.manifest_payload);
      m["ranks"][0]["checksum"] = checksum_hex(checksum64(input.data(), input.size()));
      detail::write_manifest_file(s.manifest, m.dump(), false);
    }
    s.t->optimizer().load(s.ckpt);
  } catch (const std::exception&) {
  }
  s.restore();
  return 0;
}
