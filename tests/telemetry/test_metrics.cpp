// The Prometheus endpoint: the text writer's grammar and escaping, the listen address, and a live
// optimizer's samples scraped over HTTP (cpp-httplib's client) with every line parsed strictly.
#include <httplib.h>

#include "metrics_scrape.hpp"
#include "optim_fixture.hpp"
#include "tierswap/metrics.hpp"
#include "tierswap/process_config.hpp"

namespace tierswap {
namespace {

using optim_test::Rig;
using test::parse_exposition;
using test::Scrape;

TEST(Metrics, TheWriterFollowsTheExpositionFormat) {
  MetricsWriter w;
  w.family("tierswap_a_bytes", "Help with a \\ and a\nnewline.", MetricType::gauge);
  w.sample(1.5, {{"k", "quote \" backslash \\ newline \n"}});
  w.family("tierswap_b_total", "B.", MetricType::counter);
  w.sample(3);
  w.family("tierswap_a_bytes", "Help.", MetricType::gauge);  // a second source adds to it
  w.sample(2, {{"k", "other"}});
  const std::string t = w.text();
  EXPECT_EQ(t,
            "# HELP tierswap_a_bytes Help with a \\\\ and a\\nnewline.\n"
            "# TYPE tierswap_a_bytes gauge\n"
            "tierswap_a_bytes{k=\"quote \\\" backslash \\\\ newline \\n\"} 1.5\n"
            "tierswap_a_bytes{k=\"other\"} 2\n"
            "# HELP tierswap_b_total B.\n"
            "# TYPE tierswap_b_total counter\n"
            "tierswap_b_total 3\n");
  const Scrape s = parse_exposition(t);
  EXPECT_EQ(s.samples.size(), 3u);
}

TEST(Metrics, TheWriterRefusesBadNamesRepeatsAndTypeConflicts) {
  MetricsWriter w;
  EXPECT_THROW(w.sample(1), std::logic_error);  // no family yet
  EXPECT_THROW(w.family("1bad", "", MetricType::gauge), std::logic_error);
  EXPECT_THROW(w.family("bad-name", "", MetricType::gauge), std::logic_error);
  w.family("ok", "", MetricType::gauge);
  EXPECT_THROW(w.sample(1, {{"__reserved", "x"}}), std::logic_error);
  EXPECT_THROW(w.sample(1, {{"a b", "x"}}), std::logic_error);
  w.sample(1, {{"a", "x"}});
  EXPECT_THROW(w.sample(2, {{"a", "x"}}), std::logic_error);
  EXPECT_THROW(w.family("ok", "", MetricType::counter), std::logic_error);
  MetricsWriter special;
  special.family("v", "", MetricType::gauge);
  special.sample(std::numeric_limits<double>::infinity(), {{"x", "1"}});
  special.sample(std::nan(""), {{"x", "2"}});
  EXPECT_NE(special.text().find("v{x=\"1\"} +Inf\nv{x=\"2\"} NaN\n"), std::string::npos);
}

TEST(Metrics, ListenAddressesAreCheckedNamingTheVariable) {
  EXPECT_EQ(parse_listen_address("9464", "K").host, "127.0.0.1");
  EXPECT_EQ(parse_listen_address("9464", "K").port, 9464);
  EXPECT_EQ(parse_listen_address("127.0.0.2:80", "K").host, "127.0.0.2");
  EXPECT_EQ(parse_listen_address("[::1]:0", "K").host, "::1");
  EXPECT_EQ(parse_listen_address("localhost:1", "K").port, 1);
  for (const char* bad :
       {"", "x", "65536", "127.0.0.1:", ":80", "host.example:80", "1:2:3", "127.0.0.1:-1",
        "[::1]:99999", "0.0.0.0:9100", "10.1.2.3:80", "[::]:80"}) {
    try {
      parse_listen_address(bad, "TIERSWAP_METRICS");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("TIERSWAP_METRICS"), std::string::npos) << e.what();
    }
  }
  // Elsewhere only when the operator says so (serve --metrics-any-host); still a real address.
  EXPECT_EQ(parse_listen_address("0.0.0.0:9100", "K", true).host, "0.0.0.0");
  EXPECT_EQ(parse_listen_address("[::]:80", "K", true).host, "::");
  EXPECT_EQ(parse_listen_address("10.1.2.3:80", "K", true).port, 80);
  for (const char* bad : {"0.0.0.0:", "host.example:80", ":80", "[::]:99999"})
    EXPECT_THROW(parse_listen_address(bad, "K", true), std::invalid_argument) << bad;
  EXPECT_EQ(ProcessConfig::from_json(R"({"metrics": "127.0.0.1:9464"})").metrics, "127.0.0.1:9464");
  EXPECT_THROW(ProcessConfig::from_json(R"({"metrics": "nine"})"), std::invalid_argument);
}

TEST(Metrics, ABusyPortIsAnErrorNamingTheAddress) {
  MetricsServer first({"127.0.0.1", 0}, [] { return std::string("x 1\n"); });
  try {
    MetricsServer second({"127.0.0.1", first.port()}, [] { return std::string(); });
    ADD_FAILURE() << "two servers on port " << first.port();
  } catch (const std::system_error& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(first.port())), std::string::npos);
    EXPECT_EQ(e.code().value(), EADDRINUSE) << e.what();
    EXPECT_NE(std::string(e.what()).find("another process listens there"), std::string::npos)
        << e.what();
  }
  try {  // an address not of this machine
    MetricsServer other({"192.0.2.1", 0}, [] { return std::string(); });
    ADD_FAILURE() << "listening on 192.0.2.1";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code().value(), EADDRNOTAVAIL) << e.what();
  }
}

TEST(Metrics, ALiveOptimizerIsScrapedOverHttpWithEveryLineParsed) {
  OptimizerConfig oc = test::model_config();
  oc.state_tier = OptimizerConfig::StateTier::nvme;
  Rig r(optim_test::tier_config(2 * optim_test::kMiB, 128 * optim_test::kKiB), oc);
  auto m = test::start_model(*r.opt);
  const auto results = test::train(*r.opt, m, 1, 4, 0, 1);
  MetricsServer server({"127.0.0.1", 0}, [] { return MetricsRegistry::process().render(); });
  httplib::Client client("127.0.0.1", server.port());
  const auto res = client.Get("/metrics");
  ASSERT_TRUE(res) << "no answer from 127.0.0.1:" << server.port();
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  const Scrape s = parse_exposition(res->body);

  const std::string mgr = std::to_string(r.tiers->instance());
  const std::string lab = "{manager=\"" + mgr + "\",rank=\"0\"}";
  std::uint64_t taken = 0, skipped = 0;
  double seconds = 0, commit = 0;
  for (const auto& x : results) {
    (x.skipped ? skipped : taken) += 1;
    seconds += x.seconds;
    commit += x.commit_seconds;
  }
  EXPECT_EQ(s.samples.at("tierswap_steps_total" + lab), taken);
  EXPECT_EQ(s.samples.at("tierswap_skipped_steps_total" + lab), skipped);
  EXPECT_NEAR(s.samples.at("tierswap_step_seconds_total" + lab), seconds, 1e-6 * seconds + 1e-9);
  EXPECT_GT(commit, 0);
  EXPECT_NEAR(s.samples.at("tierswap_step_commit_seconds_total" + lab), commit,
              1e-6 * commit + 1e-9);
  EXPECT_EQ(s.types.at("tierswap_steps_total"), "counter");

  const TierCounters c = r.tiers->counters();
  const std::string ml = "{manager=\"" + mgr + "\"}";
  EXPECT_GT(s.samples.at("tierswap_nvme_written_bytes_total" + ml), 0);
  EXPECT_EQ(s.samples.at("tierswap_nvme_read_bytes_total" + ml),
            c.bytes_out[static_cast<int>(Tier::nvme)]);
  EXPECT_EQ(s.samples.at("tierswap_nvme_written_bytes_total" + ml),
            c.bytes_in[static_cast<int>(Tier::nvme)]);
  EXPECT_EQ(s.samples.at("tierswap_commits_total" + ml), c.commits);
  EXPECT_EQ(s.samples.at("tierswap_discards_total" + ml), c.discards);
  EXPECT_EQ(s.samples.at("tierswap_tier_capacity_bytes{manager=\"" + mgr + "\",tier=\"host\"}"),
            2 * optim_test::kMiB);
  EXPECT_EQ(s.types.at("tierswap_tier_resident_bytes"), "gauge");
  EXPECT_EQ(client.Get("/other")->status, 404);

  // A destroyed source is gone from the next scrape.
  r.opt.reset();
  const Scrape after = parse_exposition(client.Get("/metrics")->body);
  EXPECT_EQ(after.samples.count("tierswap_steps_total" + lab), 0u);
  EXPECT_EQ(after.samples.count("tierswap_commits_total" + ml), 1u);
}

}  // namespace
}  // namespace tierswap
