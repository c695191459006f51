// service_regions(): the regions a node service keeps for this uid, asked with a Status as a
// connection's first message, the answer checked as any peer's message is.
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/service/client_impl.hpp"
#include "tierswap/detail/json.hpp"
#include "tierswap/detail/paths.hpp"
#include "tierswap/service.hpp"

#include <fmt/format.h>

namespace tierswap {
namespace {

// One entry of the status JSON's "clients"; std::invalid_argument saying what is wrong.
ServiceRegion parse_region(const nlohmann::json& e) {
  if (!e.is_object()) throw std::invalid_argument("a region is not an object");
  ServiceRegion r;
  const auto& job = e.at("job");
  if (!job.is_string() || !detail::valid_job_id(job.get<std::string>()))
    throw std::invalid_argument("bad job id " + job.dump());
  r.job = job.get<std::string>();
  r.rank = detail::json_int<std::uint32_t>(e.at("rank"));
  r.bytes = detail::json_int<std::uint64_t>(e.at("region_bytes"));
  r.owner_uid = detail::json_int<std::uint32_t>(e.at("owner_uid"));
  r.idle_seconds = detail::json_int<std::int64_t>(e.at("idle_seconds"));
  if (!e.at("raw").is_boolean() || !e.at("attached").is_boolean() || r.idle_seconds < 0)
    throw std::invalid_argument("bad raw, attached or idle_seconds in " + r.key());
  r.raw = e.at("raw").get<bool>();
  r.attached = e.at("attached").get<bool>();
  return r;
}

std::vector<ServiceRegion> parse_regions(const std::string& text) {
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("clients") || !j.at("clients").is_array())
    throw std::invalid_argument("not a status with a list of clients");
  std::map<std::string, ServiceRegion> by_key;
  for (const auto& e : j.at("clients")) {
    ServiceRegion r = parse_region(e);
    if (!by_key.emplace(r.key(), r).second)
      throw std::invalid_argument("region " + r.key() + " listed twice");
  }
  std::vector<ServiceRegion> out;
  for (auto& [k, r] : by_key) out.push_back(std::move(r));
  return out;
}

}  // namespace

std::vector<ServiceRegion> service_regions(const std::filesystem::path& socket,
                                           double timeout_seconds) {
  ServiceClient::Impl m;
  m.path = socket.empty() ? default_service_socket() : socket;
  if (!(timeout_seconds > 0)) m.fail(EINVAL, "regions: the timeout must be positive");
  m.cfg.timeout_seconds = timeout_seconds;
  m.connect();
  m.fb.Finish(m.conn->message(m.fb, wire::Body::Status, wire::CreateStatus(m.fb).Union()),
              wire::MessageIdentifier());
  const wire::Message& msg =
      m.exchange(nullptr,
                 "closed the connection without listing its regions: a service older than this "
                 "client does so; run `tierswap serve` of this version");
  const auto* r = msg.body_as_Reply();
  if (!r)
    m.fail(EPROTO, "regions answered with " + std::string(wire::EnumNameBody(msg.body_type())));
  if (r->error() != 0)
    m.fail(r->error(), "regions refused: " + (r->message() ? r->message()->str() : std::string()));
  try {
    return parse_regions(r->text() ? r->text()->str() : std::string());
  } catch (const std::exception& e) {  // json's type errors and out_of_range included
    m.fail(EPROTO, fmt::format("regions answered with a bad list: {}", e.what()));
  }
}

}  // namespace tierswap
