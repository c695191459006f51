// `tierswap serve`: the node service (include/tierswap/service.hpp) in the foreground until
// SIGINT or SIGTERM; under systemd it takes the socket it is handed (socket activation) and
// reports readiness (sd_notify). `tierswap release JOB.RANK`: an operator frees the region of a
// client that ended without releasing it (a job that kept its swap files, or one that died);
// `--older-than D` / `--all-of-job J`: every such region of the caller's that matches.
#include <errno.h>
#include <signal.h>
#include <systemd/sd-daemon.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include "tierswap/detail/paths.hpp"
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
                        metrics, region_ttl;
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

// The service, or ExitStatus(kExitNeedsOperator) when what stops it needs an operator (a setting,
// a corrupt or orphaned file: a restart would fail the same way); a system error (a socket in
// use, a drive's I/O error) stays an exit status of 1, which systemd may retry.
SwapService start_service(const ServiceConfig& c) {
  try {
    return SwapService(c, inherited_socket());
  } catch (const std::system_error&) {
    throw;
  } catch (const std::exception& e) {
    throw ExitStatus(kExitNeedsOperator,
                     fmt::format("{} (exit status {}: tierswap.service does not restart until "
                                 "this is fixed)",
                                 e.what(), kExitNeedsOperator));
  }
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
  if (!o.region_ttl.empty()) c.region_ttl_seconds = parse_duration(o.region_ttl, "--region-ttl");
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
  SwapService service = start_service(c);
  const auto st = nlohmann::json::parse(service.status_json());  // the budgets as resolved
  fmt::print(stderr,
             "tierswap serve: listening on {} ({} of shared memory for all clients, {} pageable "
             "beside it{}{})\n",
             service.socket_path().string(), format_bytes(c.host_budget),
             format_bytes(st.at("pageable_budget").get<std::uint64_t>()),
             c.region_ttl_seconds > 0 ? fmt::format(", regions unused for {} released",
                                                    format_duration(c.region_ttl_seconds))
                                      : std::string(),
             metrics ? fmt::format(", metrics on port {}", metrics->port()) : std::string());
  sd_notify(0, "READY=1");
  int sig = 0;
  sigwait(&set, &sig);
  sd_notify(0, "STOPPING=1");
  fmt::print(stderr, "tierswap serve: signal {}: stopping\n", sig);
  service.stop(o.drain_seconds);
}

struct ReleaseOptions {
  std::string client, socket, older_than, job;
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
// (block or raw) is fixed at its first attach; unknown (`raw` empty), the block kind is tried
// first, and the service names the other kind with EPROTOTYPE. Its committed generation.
std::uint64_t release_one(const ReleaseOptions& o, const std::string& job, std::uint32_t rank,
                          std::optional<bool> raw) {
  ServiceClientConfig c;
  c.job = job;
  c.rank = rank;
  c.socket = o.socket;
  c.memory_bytes = 4096;  // the least an attach asks; no region: only a known client attaches
  c.timeout_seconds = o.timeout;
  for (const bool kind : {false, true}) {
    if (raw && *raw != kind) continue;
    c.raw = kind;
    try {
      ServiceClient client(c);
      const std::uint64_t generation = client.attached_generation();
      client.release();
      return generation;
    } catch (const std::system_error& e) {
      if (kind || raw || e.code().value() != EPROTOTYPE) throw;
    }
  }
  throw std::logic_error("release_one: no kind tried");
}

// --older-than and --all-of-job: every region of this uid (all of them for root and the
// service's uid) that matches both, but for attached ones (named, kept). Throws when one failed.
void release_matching(const ReleaseOptions& o) {
  const double age = o.older_than.empty() ? 0 : parse_duration(o.older_than, "--older-than");
  if (!o.job.empty() && !detail::valid_job_id(o.job))
    throw std::invalid_argument(
        fmt::format("release: --all-of-job '{}': not a job id ([A-Za-z0-9._-], 1 to 64)", o.job));
  std::size_t released = 0, kept = 0, failed = 0;
  for (const ServiceRegion& r : service_regions(o.socket, o.timeout)) {
    if ((!o.job.empty() && r.job != o.job) || (!o.older_than.empty() && r.attached)) continue;
    if (static_cast<double>(r.idle_seconds) < age) continue;
    if (r.attached) {
      fmt::print("tierswap release: {} is attached: kept\n", r.key());
      ++kept;
      continue;
    }
    try {
      const std::uint64_t generation = release_one(o, r.job, r.rank, r.raw);
      fmt::print("tierswap release: {} released ({} unused for {}{})\n", r.key(),
                 format_bytes(r.bytes), format_duration(static_cast<double>(r.idle_seconds)),
                 r.raw ? "" : fmt::format(", committed generation {}", generation));
      ++released;
    } catch (const std::system_error& e) {  // attached meanwhile, or another's: the next one
      fmt::print(stderr, "tierswap release: {}: {}\n", r.key(), e.what());
      ++failed;
    }
  }
  fmt::print("tierswap release: {} released, {} attached and kept, {} failed\n", released, kept,
             failed);
  if (failed > 0)
    throw std::runtime_error(fmt::format("release: {} of the regions failed", failed));
}

void run_release(const ReleaseOptions& o) {
  const bool matching = !o.older_than.empty() || !o.job.empty();
  if (o.client.empty() == !matching)
    throw std::invalid_argument(
        "release: name one client (JOB.RANK), or select regions with --older-than and/or "
        "--all-of-job");
  if (matching) return release_matching(o);
  const auto [job, rank] = parse_client_key(o.client);
  const std::uint64_t generation = release_one(o, job, rank, std::nullopt);
  fmt::print(
      "tierswap release: {} released (its region and its committed generation {} are gone)\n",
      o.client, generation);
}

}  // namespace

void add_release(CLI::App& app) {
  auto o = std::make_shared<ReleaseOptions>();
  auto* r = app.add_subcommand(
      "release",
      "Free node-service clients' NVMe regions and state (ones that ended without releasing "
      "them)");
  r->add_option("client", o->client, "The client as `tierswap ps` lists it: JOB.RANK");
  r->add_option("--older-than", o->older_than,
                "Instead: every region of yours no client attached to for this long (90s, 15m, "
                "12h, 7d)");
  r->add_option("--all-of-job", o->job,
                "Instead: every region of job J (with --older-than: those idle that long); "
                "attached ones are kept");
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
      ->required();
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
  s->add_option("--region-ttl", o->region_ttl,
                "Release a region no client attached to for this long (90s, 15m, 12h, 7d; "
                "default: keep it until `tierswap release`)");
  s->add_option("--drain-seconds", o->drain_seconds,
                "At SIGTERM: how long attached clients may take to reach their next commit "
                "before they are cut off")
      ->capture_default_str()
      ->check(seconds_validator(true));
  s->callback([o] { run_serve(*o); });
}

}  // namespace tierswap::cli
