// Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/) from real artifacts:
// a small swap file, a tier manifest (file and payload), a checkpoint manifest and rank index, a
// commit record, a residency snapshot, and the configs, profiles, plans and strings a user writes.
//   make_seeds OUT_DIR PROFILE_JSON...
#include <cerrno>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "fuzz_model.hpp"
#include "src/service/protocol.hpp"
#include "tierswap/detail/manifest.hpp"
#include "tierswap/placement.hpp"
#include "tierswap/service.hpp"
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

// A payload naming its swap space (space_uuid), with that uuid written as fuzz::kUuidToken: the
// fuzz target puts its own space's uuid in its place.
std::string uuid_as_token(const std::string& payload) {
  const std::string uuid = nlohmann::json::parse(payload).at("space_uuid");
  std::string out = payload;
  for (std::size_t at; (at = out.find(uuid)) != std::string::npos;)
    out.replace(at, uuid.size(), fuzz::kUuidToken);
  return out;
}

void tier_and_record_seeds() {
  const auto dir = fuzz::scratch() / "seed";
  auto t = fuzz::small_model(dir, false);
  const auto rank = dir / "tierswap-rank0";
  const std::string manifest = slurp(rank / detail::kManifestName);
  const std::string payload = detail::read_manifest_file(rank / detail::kManifestName);
  seed("tier_manifest", "file", manifest, 0);
  seed("tier_manifest", "payload", uuid_as_token(payload), 1);
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
  seed("config_json", "service",
       R"({"service": "/run/tierswap/tierswap.sock", "service_job": "lm-1",
           "service_timeout": 30, "service_wait": 2.5})",
       4);
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path p = argv[i];
    seed("placement_json", p.stem().string(), slurp(p), 0);
    const auto profile = HardwareProfile::from_json(slurp(p), p.string());
    PlanOptions rq;
    rq.params = 64ull << 20;
    seed("placement_json", "plan-" + p.stem().string(), make_plan(profile, rq).to_json(), 1);
  }
}

// A service's swap space of 16 MiB in `dir`, a 1 MiB budget.
ServiceConfig seed_service(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  ServiceConfig c;
  c.swap_dirs = {dir};
  c.capacity = 16ull << 20;
  c.host_budget = 1 << 20;
  c.socket = dir / "s.sock";
  c.lock_memory = false;
  return c;
}

ServiceClientConfig seed_client(const ServiceConfig& c, const char* job, std::uint32_t rank) {
  ServiceClientConfig cc;
  cc.socket = c.socket;
  cc.job = job;
  cc.rank = rank;
  cc.memory_bytes = 4096;
  cc.region_bytes = 1 << 20;
  return cc;
}

// Frames as a client sends them (service::frame): a hello and an offer (selector 0), requests
// after a hello (selector 1), a real registry payload (selector 2) and a client's manifest (3).
void service_seeds() {
  flatbuffers::FlatBufferBuilder fb;
  fb.Finish(wire::CreateMessage(fb, 1, wire::Body::Offer,
                                wire::CreateOffer(fb, service::kProtocolVersion, 2).Union()),
            wire::MessageIdentifier());
  seed("service_message", "offer", service::frame(fb), 0);
  fb.Clear();
  const auto h = wire::CreateHello(fb, service::kProtocolVersion, fb.CreateString("seed"), 0,
                                   64 << 10, 1 << 20);
  fb.Finish(wire::CreateMessage(fb, 1, wire::Body::Hello, h.Union()), wire::MessageIdentifier());
  seed("service_message", "hello", service::frame(fb), 0);
  fb.Clear();
  fb.Finish(wire::CreateMessage(fb, 1, wire::Body::Status, wire::CreateStatus(fb).Union()),
            wire::MessageIdentifier());
  seed("service_message", "status", service::frame(fb), 0);  // the regions, without a hello
  std::string reqs;
  std::uint64_t seq = 2;
  auto add = [&](wire::Body t, flatbuffers::Offset<void> body) {
    fb.Finish(wire::CreateMessage(fb, seq++, t, body), wire::MessageIdentifier());
    reqs += service::frame(fb);
    fb.Clear();
  };
  fb.Clear();
  add(wire::Body::Put, wire::CreatePut(fb, 1, 0, 4096).Union());
  add(wire::Body::Commit, wire::CreateCommit(fb).Union());
  add(wire::Body::Get, wire::CreateGet(fb, 1, 4096, 4096).Union());
  add(wire::Body::Put, wire::CreatePut(fb, 2, 8192, 8192).Union());
  add(wire::Body::Discard, wire::CreateDiscard(fb).Union());
  add(wire::Body::Status, wire::CreateStatus(fb).Union());
  seed("service_message", "requests", reqs, 1);
  reqs.clear();
  add(static_cast<wire::Body>(200), wire::CreateCommit(fb).Union());  // a newer protocol's type
  seed("service_message", "unknown_type", reqs, 1);
  const auto dir = fuzz::scratch() / "service";
  const ServiceConfig c = seed_service(dir);
  {
    SwapService svc(c);
    for (std::uint32_t r = 0; r < 2; ++r) {
      ServiceClient cl(seed_client(c, "seed", r));
      cl.put(1, 0, 4096);
      cl.commit();
    }
  }
  seed("service_message", "registry",
       uuid_as_token(detail::read_manifest_file(dir / "tierswap.service")), 2);
  seed("service_message", "client_manifest",
       uuid_as_token(detail::read_manifest_file(dir / "service-clients" / "seed.0.manifest")), 3);
}

// The service's answers a client reads (fuzz_service_answer): an offer (selector 0), a refused
// hello (1), a welcome whose sizes match the 64 KiB memfd the fake service passes (2), and a
// live service's status listing its regions (3).
void service_answer_seeds() {
  flatbuffers::FlatBufferBuilder fb;
  auto answer = [&](const char* name, int selector, wire::Body t, flatbuffers::Offset<void> body) {
    fb.Finish(wire::CreateMessage(fb, 1, t, body), wire::MessageIdentifier());
    seed("service_answer", name, service::frame(fb), selector);
    fb.Clear();
  };
  answer("offered", 0, wire::Body::Offered,
         wire::CreateOffered(fb, 1 << 20, 4 << 20, 4 << 20, 4 << 20, 2 << 20, 8 << 20, 8 << 20,
                             4 << 20)
             .Union());
  answer("refused", 1, wire::Body::Reply,
         wire::CreateReply(fb, EINVAL, fb.CreateString("client fuzz.0 asks too much")).Union());
  const auto uuid = fb.CreateString("0123456789abcdef");
  answer("welcome", 2, wire::Body::Welcome,
         wire::CreateWelcome(fb, 64 << 10, 1 << 20, 0, false, 4096, uuid, 0).Union());
  const ServiceConfig c = seed_service(fuzz::scratch() / "regions");
  SwapService svc(c);
  { ServiceClient ended(seed_client(c, "ended", 0)); }
  ServiceClient running(seed_client(c, "running", 0));
  answer("regions", 3, wire::Body::Reply,
         wire::CreateReply(fb, 0, 0, 0, fb.CreateString(svc.status_json())).Union());
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
    service_seeds();
    service_answer_seeds();
    text_seeds(argc - 1, argv + 1);
  } catch (const std::exception& e) {
    std::cerr << "make_seeds: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
