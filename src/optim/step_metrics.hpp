// The optimizer's Prometheus samples: steps taken and skipped and the time they took, labelled
// with the tier manager's instance and the rank. Registered for the object's lifetime; step()
// records into it and the metrics endpoint's thread reads it.
#pragma once

#include <cstdint>
#include <mutex>

#include "tierswap/metrics.hpp"
#include "tierswap/optimizer.hpp"

namespace tierswap {

class StepMetrics {
 public:
  StepMetrics(const MetricLabels& labels, double loss_scale);
  ~StepMetrics() { source_ = {}; }  // unregistered before the totals go
  StepMetrics(const StepMetrics&) = delete;
  StepMetrics& operator=(const StepMetrics&) = delete;

  void record(const StepResult& r);

 private:
  void write(MetricsWriter& w, const MetricLabels& labels) const;

  mutable std::mutex mu_;
  std::uint64_t steps_ = 0, skipped_ = 0;
  double seconds_ = 0, io_wait_seconds_ = 0, commit_seconds_ = 0, last_seconds_ = 0;
  double loss_scale_ = 1;
  MetricsRegistry::Source source_;  // last: registered once the totals exist
};

}  // namespace tierswap
