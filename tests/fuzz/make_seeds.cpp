// Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/) from real artifacts:
// a small swap file, a tier manifest (file and payload), a checkpoint manifest and rank index, a
// commit record, a residency snapshot, and the configs, profiles, plans and strings a user writes.
//   make_seeds OUT_DIR PROFILE_JSON...
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "fuzz_model.hpp"
#include "tierswap/detail/manifest.hpp"
#include "tierswap/placement.hpp"
#include "tierswap/swap_space.hpp"

using namespace tierswap;

namespace {

std::filesystem::path out_root;

void seed(const std::string& target, const std::string& name, const std::string& bytes,
          int selector = -1) {
  const auto dir = out_root / target;
  std::filesystem::create_directories(dir);
  std::ofstream f(dir / name, std::ios::binary | std::ios::trunc);
  if (selector >= 0) f.put(static_cast<char>(selector));
  f << bytes;
}

std::string slurp(const std::filesystem::path& p, std::size_t max = SIZE_MAX) {
  std::ifstream f(p, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(f)), {});
  return s.substr(0, std::min(max, s.size()));
}

void tier_and_record_seeds() {
  const auto dir = fuzz::scratch() / "seed";
  auto t = fuzz::small_model(dir, false);
  const auto rank = dir / "tierswap-rank0";
  const std::string manifest = slurp(rank / detail::kManifestName);
  const std::string payload = detail::read_manifest_file(rank / detail::kManifestName);
  seed("tier_manifest", "file", manifest, 0);
  seed("tier_manifest", "payload", payload, 1);
  seed("commit_record", "record", nlohmann::json::parse(payload).at("record").get<std::string>());
  seed("residency_answer", "snapshot", t->tiers().snapshot().to_json());
  t->optimizer().save(fuzz::scratch() / "ckpt");
  for (const auto& e : std::filesystem::directory_iterator(fuzz::scratch() / "ckpt")) {
    if (e.path().extension() == ".json")
      seed("checkpoint", "index", detail::read_manifest_file(e.path()), 1);
    if (e.path().filename() == "tierswap.checkpoint")
      seed("checkpoint", "manifest", detail::read_manifest_file(e.path()), 0);
  }
}

void swap_seed() {
  const auto dir = fuzz::scratch() / "swap-seed";
  std::filesystem::create_directories(dir);
  SwapSpaceConfig sc;
  sc.dirs = {dir};
  sc.capacity = 4096;
  sc.stripe_size = 4096;
  sc.direct = DirectIo::off;
  { SwapSpace::create(sc); }
  // The header block: what open() parses (the 1 MiB of data behind it would only slow fuzzing).
  seed("swap_header", "small_space", slurp(dir / SwapSpace::kFileName, 4096));
}

void text_seeds(int argc, char** argv) {
  for (const char* s : {"8GiB", "256M", "1.5T", "4096", "bf16", "exp_avg_sq", "adamw", "uring",
                        "0x10", "-1", "18446744073709551616"})
    seed("strings", s, s);
  seed("config_json", "optimizer",
       R"({"subgroup_size": 1048576, "prefetch_depth": 2, "state_tier": "nvme",
           "max_grad_norm": 1.0, "overlap": true, "loss_scaler": {"mode": "dynamic",
           "init_scale": 65536, "growth_interval": 2000}})",
       0);
  seed("config_json", "tiers",
       R"({"host_budget": "1GiB", "shadow_slots": true, "durable": false, "lookahead": 8})", 1);
  seed("config_json", "swap", R"({"dirs": ["/tmp/a", "/tmp/b"], "capacity": "8GiB",
           "stripe_size": "1MiB", "direct": "auto"})",
       2);
  seed("config_json", "engine", R"({"backend": "uring", "queue_depth": 64,
           "block_size": "1MiB", "posix_threads": 4})",
       3);
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path p = argv[i];
    seed("placement_json", p.stem().string(), slurp(p), 0);
    const auto profile = HardwareProfile::from_json(slurp(p), p.string());
    PlanOptions rq;
    rq.params = 64ull << 20;
    seed("placement_json", "plan-" + p.stem().string(), make_plan(profile, rq).to_json(), 1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: make_seeds OUT_DIR PROFILE_JSON...\n";
    return 2;
  }
  out_root = argv[1];
  try {
    tier_and_record_seeds();
    swap_seed();
    text_seeds(argc - 1, argv + 1);
  } catch (const std::exception& e) {
    std::cerr << "make_seeds: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
