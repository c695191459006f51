// The optimizer's Prometheus samples (step_metrics.hpp).
#include "src/optim/step_metrics.hpp"

namespace tierswap {

StepMetrics::StepMetrics(const MetricLabels& labels, double loss_scale) : loss_scale_(loss_scale) {
  source_ = MetricsRegistry::process().add([this, labels](MetricsWriter& w) { write(w, labels); });
}

void StepMetrics::record(const StepResult& r) {
  std::lock_guard lk(mu_);
  ++(r.skipped ? skipped_ : steps_);
  seconds_ += r.seconds;
  io_wait_seconds_ += r.io_wait_seconds;
  commit_seconds_ += r.commit_seconds;
  last_seconds_ = r.seconds;
  loss_scale_ = r.next_loss_scale;
}

void StepMetrics::write(MetricsWriter& w, const MetricLabels& labels) const {
  std::lock_guard lk(mu_);
  w.family("tierswap_steps_total", "Optimizer steps taken.", MetricType::counter);
  w.sample(static_cast<double>(steps_), labels);
  w.family("tierswap_skipped_steps_total", "Steps skipped for a non-finite gradient.",
           MetricType::counter);
  w.sample(static_cast<double>(skipped_), labels);
  w.family("tierswap_step_seconds_total", "Wall time of step(), taken and skipped.",
           MetricType::counter);
  w.sample(seconds_, labels);
  w.family("tierswap_step_io_wait_seconds_total",
           "Time step()'s acquires waited for transfers (reads landing).", MetricType::counter);
  w.sample(io_wait_seconds_, labels);
  w.family("tierswap_step_commit_seconds_total",
           "Time step()'s commits took (the last writes landing, the manifest).",
           MetricType::counter);
  w.sample(commit_seconds_, labels);
  w.family("tierswap_last_step_seconds", "Wall time of the last step().", MetricType::gauge);
  w.sample(last_seconds_, labels);
  w.family("tierswap_loss_scale", "The loss scale of the next step.", MetricType::gauge);
  w.sample(loss_scale_, labels);
}

}  // namespace tierswap
