// Prometheus metrics: a text endpoint (exposition format 0.0.4) over HTTP, served by any process
// that links tierswap when ProcessConfig::metrics (TIERSWAP_METRICS) names an address, e.g.
// TIERSWAP_METRICS=127.0.0.1:9464 or TIERSWAP_METRICS=9464 (loopback). `GET /metrics` answers
// every sample of every registered source; names are `tierswap_`-prefixed, in base units (bytes,
// seconds), counters end in `_total`.
//
// Sources (a tier manager, an optimizer, the node service) register a fill function with the
// process's registry for as long as they live; the endpoint runs while at least one source is
// registered and the variable is set, so a process without tierswap objects listens on nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tierswap/process_config.hpp"

namespace tierswap {

enum class MetricType { counter, gauge };

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

/// Collects one scrape. family() starts a metric (written once per scrape however many sources
/// add to it; a second family() with the same name must agree on type); sample() adds a line to
/// the current family. Names and label names are checked against Prometheus' grammar and label
/// values escaped; a bad name or a sample repeated with the same labels throws std::logic_error
/// (a programming error, not input). Not thread-safe: one writer per scrape.
class MetricsWriter {
 public:
  void family(std::string_view name, std::string_view help, MetricType type);
  void sample(double value, const MetricLabels& labels = {});
  /// The exposition text, families in the order first started.
  std::string text() const;

 private:
  struct Family {
    std::string help;
    MetricType type;
    std::vector<std::string> lines;
    std::vector<std::string> label_sets;
  };
  std::vector<std::string> order_;
  std::map<std::string, Family> families_;
  Family* current_ = nullptr;
  std::string current_name_;
};

/// Serves `render()` at GET /metrics on its own thread until destroyed. Throws
/// std::system_error naming the address when it cannot listen.
class MetricsServer {
 public:
  MetricsServer(const ListenAddress& addr, std::function<std::string()> render);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;
  /// The bound port (the chosen one when the address asked for 0).
  int port() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// tierswap_build_info (version, CUDA built in) and the standard process_* metrics (CPU seconds,
/// resident and virtual memory, open and most descriptors, start time): the end of every
/// MetricsRegistry::render().
void fill_process_metrics(MetricsWriter& w);

/// The process's metric sources and its endpoint. Thread-safe.
class MetricsRegistry {
 public:
  using Fill = std::function<void(MetricsWriter&)>;

  /// Unregisters its source when destroyed (and stops the endpoint with the last one).
  class Source {
   public:
    Source() = default;
    Source(Source&& o) noexcept : id_(std::exchange(o.id_, 0)) {}
    Source& operator=(Source&& o) noexcept;
    ~Source();

   private:
    friend class MetricsRegistry;
    explicit Source(std::uint64_t id) : id_(id) {}
    std::uint64_t id_ = 0;
  };

  static MetricsRegistry& process();

  /// Registers `fill`, called on every scrape (from the endpoint's thread) while the Source
  /// lives: it must only read state it synchronizes itself. With ProcessConfig::metrics set,
  /// the first source starts the endpoint; if it cannot listen, a warning is logged and the
  /// sources stay registered (render() still works).
  Source add(Fill fill);
  /// Every source's samples, as the endpoint answers them.
  std::string render();
  /// The endpoint's port, or 0 when none is running.
  int endpoint_port();
  /// A number unique in this process, for a source's label (e.g. manager="3").
  std::uint64_t next_instance();

 private:
  MetricsRegistry() = default;
  void remove(std::uint64_t id);

  std::mutex mu_;
  std::mutex render_mu_;  // held while sources fill: remove() waits for a scrape in progress
  std::map<std::uint64_t, Fill> sources_;
  std::uint64_t next_id_ = 1;
  std::uint64_t next_instance_ = 0;
  std::unique_ptr<MetricsServer> server_;
};

}  // namespace tierswap
