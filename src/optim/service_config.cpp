// NodeServiceConfig: how the one-object setup reaches the node service, its settings table.
#include <array>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "tierswap/detail/config_table.hpp"
#include "tierswap/detail/paths.hpp"
#include "tierswap/error.hpp"
#include "tierswap/tiered_optimizer.hpp"

namespace tierswap {
namespace {

using C = NodeServiceConfig;

// Every setting of NodeServiceConfig, in the configuration page's order.
const std::array<detail::ConfigField<C>, 4> kFields = {{
    detail::string_field<C, &C::socket>(
        "service", "TIERSWAP_SERVICE", "—",
        "the node service's socket (`tierswap serve`): the one-object setup and `tierswap.torch` "
        "keep the state in a region of the service's swap space, through memory shared with it; "
        "the swap directory then holds only the manifest"),
    detail::string_field<C, &C::job>(
        "service_job", "TIERSWAP_SERVICE_JOB", "—",
        "the job id the service knows this run by (with the rank it names the "
        "region a restarted run reattaches to); default: derived from the swap "
        "directory's path"),
    detail::number_field<C, &C::timeout_seconds>(
        "service_timeout", "TIERSWAP_SERVICE_TIMEOUT", "30",
        "seconds a request to the service waits for its answer; a service that does not answer "
        "(stopped, hung) fails the step with `ETIMEDOUT`, and the connection is not used again"),
    detail::number_field<C, &C::wait_seconds>(
        "service_wait", "TIERSWAP_SERVICE_WAIT", "0",
        "seconds attaching waits for a service that is restarting or stopping (its socket missing "
        "or refusing, or the hello refused with `ESHUTDOWN`), trying every 0.5 s; 0: fail at once"),
}};

}  // namespace

void NodeServiceConfig::validate() const {
  if (!job.empty() && !detail::valid_job_id(job))
    throw_invalid("service_job", job, "expected 1-64 of [A-Za-z0-9._-]");
  if (!(timeout_seconds > 0) || timeout_seconds > 86400)
    throw_invalid("service_timeout", std::to_string(timeout_seconds),
                  "must be in (0, 86400] seconds");
  if (!(wait_seconds >= 0) || wait_seconds > 86400)
    throw_invalid("service_wait", std::to_string(wait_seconds), "must be in [0, 86400] seconds");
}

NodeServiceConfig NodeServiceConfig::from_env() {
  NodeServiceConfig c;
  detail::apply_env<C>(c, kFields);
  c.validate();
  return c;
}

NodeServiceConfig NodeServiceConfig::from_json(std::string_view text, NodeServiceConfig base) {
  detail::apply_json<C>(base, kFields, detail::parse_config_object(text, "service config"),
                        "service config");
  base.validate();
  return base;
}

NodeServiceConfig NodeServiceConfig::from_json(std::string_view text) {
  return from_json(text, NodeServiceConfig{});
}

std::vector<Setting> NodeServiceConfig::settings() {
  return detail::settings_of<C>(kFields);
}

}  // namespace tierswap
