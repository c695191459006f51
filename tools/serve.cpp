// `tierswap serve`: the node service (include/tierswap/service.hpp) in the foreground until
// SIGINT or SIGTERM; under systemd it takes the socket it is handed (socket activation) and
// reports readiness (sd_notify). `tierswap release JOB.RANK`: an operator frees the region of a
// client that ended without releasing it (a job that kept its swap files, or one that died).
#include <errno.h>
#include <signal.h>
#include <systemd/sd-daemon.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include "tierswap/log.hpp"
#include "tierswap/metrics.hpp"
#include "tierswap/process_config.hpp"
#include "tierswap/service.hpp"
#include "tierswap/units.hpp"
#include "tools/commands.hpp"

#include <fmt/format.h>

namespace tierswap::cli {
namespace {

struct ServeOptions {
  std::vector<std::string> dirs;
  std::string capacity, host_budget = "1GiB", quota, pageable_quota, pageable_budget, socket,
                        metrics;
  bool allow_other_users = false, no_lock = false, metrics_any_host = false;
  double drain_seconds = 30;
};

int inherited_socket() {
  const int n = sd_listen_fds(1);
  if (n < 0) throw std::runtime_error(fmt::format("sd_listen_fds: error {}", -n));
  if (n > 1) throw std::runtime_error("systemd handed over more than one socket; expected one");
  if (n == 1 && sd_is_socket_unix(SD_LISTEN_FDS_START, SOCK_STREAM, 1, nullptr, 0) <= 0)
    throw std::runtime_error(
        "the socket systemd handed over is not a listening Unix stream socket");
  return n == 1 ? SD_LISTEN_FDS_START : -1;
}

// A service's log: what happens to its clients (attach, detach, refusals, commit failures: info
// and up) unless TIERSWAP_LOG_LEVEL says otherwise, each line with its time, or with its syslog
// priority when journald (which stamps lines itself) takes stderr.
void configure_service_log() {
  if (std::getenv("TIERSWAP_LOG_LEVEL") == nullptr && log_level() < LogLevel::info)
    set_log_level(LogLevel::info);
  set_log_prefix(std::getenv("JOURNAL_STREAM") != nullptr ? LogPrefix::journald
                                                          : LogPrefix::timestamp);
}

void run_serve(const ServeOptions& o) {
  configure_service_log();
  ServiceConfig c;
  for (const auto& d : o.dirs) c.swap_dirs.emplace_back(d);
  if (!o.capacity.empty()) c.capacity = parse_size(o.capacity, "--capacity");
  c.host_budget = parse_size(o.host_budget, "--host-budget");
  if (!o.quota.empty()) c.client_quota = parse_size(o.quota, "--client-quota");
  if (!o.pageable_quota.empty())
    c.pageable_quota = parse_size(o.pageable_quota, "--pageable-quota");
  if (!o.pageable_budget.empty())
    c.pageable_budget = parse_size(o.pageable_budget, "--pageable-budget");
  c.socket = o.socket;
  c.allow_other_users = o.allow_other_users;
  c.lock_memory = !o.no_lock;
  std::unique_ptr<MetricsServer> metrics;
  if (!o.metrics.empty())
    metrics = std::make_unique<MetricsServer>(
        parse_listen_address(o.metrics, "--metrics", o.metrics_any_host),
        [] { return MetricsRegistry::process().render(); });
  // Block the signals before any thread starts, so only sigwait below sees them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  SwapService service(c, inherited_socket());
  const auto st = nlohmann::json::parse(service.status_json());  // the budgets as resolved
  fmt::print(stderr,
             "tierswap serve: listening on {} ({} of shared memory for all clients, {} pageable "
             "beside it{})\n",
             service.socket_path().string(), format_bytes(c.host_budget),
             format_bytes(st.at("pageable_budget").get<std::uint64_t>()),
             metrics ? fmt::format(", metrics on port {}", metrics->port()) : std::string());
  sd_notify(0, "READY=1");
  int sig = 0;
  sigwait(&set, &sig);
  sd_notify(0, "STOPPING=1");
  fmt::print(stderr, "tierswap serve: signal {}: stopping\n", sig);
  service.stop(o.drain_seconds);
}

struct ReleaseOptions {
  std::string client, socket;
  double timeout = 30;
};

// "JOB.RANK" (the key `tierswap ps` and the service's log show): the rank follows the last dot.
std::pair<std::string, std::uint32_t> parse_client_key(const std::string& key) {
  const auto dot = key.rfind('.');
  const std::string rank = dot == std::string::npos ? "" : key.substr(dot + 1);
  if (dot == 0 || rank.empty() || rank.size() > 9 ||
      rank.find_first_not_of("0123456789") != std::string::npos)
    throw std::invalid_argument(fmt::format(
        "release: client '{}': expected JOB.RANK, as `tierswap ps` lists it (e.g. lm.0)", key));
  return {key.substr(0, dot), static_cast<std::uint32_t>(std::stoul(rank))};
}

// Attaches as the client (the service refuses while it is attached) and asks to be forgotten:
// its region, blocks and manifest go, as at the end of a run that keeps nothing. A client's kind
// (block or raw) is fixed at its first attach; the service names the other kind with EPROTOTYPE.
void run_release(const ReleaseOptions& o) {
  ServiceClientConfig c;
  std::tie(c.job, c.rank) = parse_client_key(o.client);
  c.socket = o.socket;
  c.memory_bytes = 4096;  // the least an attach asks; no region: only a known client attaches
  c.timeout_seconds = o.timeout;
  for (const bool raw : {false, true}) {
    c.raw = raw;
    try {
      ServiceClient client(c);
      const std::uint64_t generation = client.attached_generation();
      client.release();
      fmt::print(
          "tierswap release: {} released (its region and its committed generation {} "
          "are gone)\n",
          o.client, generation);
      return;
    } catch (const std::system_error& e) {
      if (raw || e.code().value() != EPROTOTYPE) throw;
    }
  }
}

}  // namespace

void add_release(CLI::App& app) {
  auto o = std::make_shared<ReleaseOptions>();
  auto* r = app.add_subcommand(
      "release",
      "Free a node-service client's NVMe region and state (one that ended without releasing it)");
  r->add_option("client", o->client, "The client as `tierswap ps` lists it: JOB.RANK")->required();
  r->add_option("--socket", o->socket,
                "The service's Unix socket (default: TIERSWAP_SERVICE, else "
                "/run/tierswap/service.sock when it exists, else <runtime dir>/service.sock)");
  r->add_option("--timeout", o->timeout, "Seconds to wait for the service")
      ->capture_default_str()
      ->check(seconds_validator(false));
  r->callback([o] { run_release(*o); });
}

void add_serve(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  auto* s = app.add_subcommand(
      "serve", "The node service: one swap space and one memory budget for every rank and job");
  s->add_option("--swap-dir", o->dirs, "A swap directory (repeat: one per drive, striped)")
      ->required()
      ->check(CLI::ExistingDirectory);
  s->add_option("--capacity", o->capacity,
                "Swap space to create when the directories hold none (e.g. 64GiB)");
  s->add_option("--host-budget", o->host_budget, "Shared memory for all clients together")
      ->capture_default_str();
  s->add_option("--client-quota", o->quota, "Most shared memory one client may hold");
  s->add_option("--pageable-quota", o->pageable_quota,
                "Most unlocked shared memory one client may hold beside it, outside the budget "
                "(its gradients; default: a quarter of the node's memory)");
  s->add_option("--pageable-budget", o->pageable_budget,
                "Unlocked shared memory for all clients together (default: half the node's "
                "memory)");
  s->add_option(
      "--socket", o->socket,
      "Unix socket (default: TIERSWAP_SERVICE, else /run/tierswap/service.sock when it exists, "
      "else <runtime dir>/service.sock)");
  s->add_option("--metrics", o->metrics,
                "Serve Prometheus metrics on [HOST:]PORT (HOST: a loopback address unless "
                "--metrics-any-host)");
  s->add_flag("--metrics-any-host", o->metrics_any_host,
              "Let --metrics listen on any address, 0.0.0.0 included (the endpoint has no "
              "authentication: firewall it)");
  s->add_flag("--allow-other-users", o->allow_other_users,
              "Accept clients of other uids (the socket becomes world-connectable)");
  s->add_flag("--no-lock", o->no_lock, "Do not mlock the clients' shared memory");
  s->add_option("--drain-seconds", o->drain_seconds,
                "At SIGTERM: how long attached clients may take to reach their next commit "
                "before they are cut off")
      ->capture_default_str()
      ->check(seconds_validator(true));
  s->callback([o] { run_serve(*o); });
}

}  // namespace tierswap::cli
