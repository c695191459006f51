// The optimizer's Prometheus samples (metrics.hpp): steps taken and skipped and the time they
// took, labelled with the tier manager's instance and this rank.
#include "src/optim/optimizer_impl.hpp"

namespace tierswap {

void ShardedOptimizer::Impl::record_step(const StepResult& r) {
  std::lock_guard lk(totals.mu);
  ++(r.skipped ? totals.skipped : totals.steps);
  totals.seconds += r.seconds;
  totals.io_wait_seconds += r.io_wait_seconds;
  totals.commit_seconds += r.commit_seconds;
  totals.last_seconds = r.seconds;
  totals.loss_scale = r.next_loss_scale;
}

void ShardedOptimizer::Impl::register_metrics() {
  const MetricLabels labels = {{"manager", std::to_string(tiers.instance())},
                               {"rank", std::to_string(rank)}};
  metrics = MetricsRegistry::process().add([this, labels](MetricsWriter& w) {
    std::lock_guard lk(totals.mu);
    w.family("tierswap_steps_total", "Optimizer steps taken.", MetricType::counter);
    w.sample(static_cast<double>(totals.steps), labels);
    w.family("tierswap_skipped_steps_total", "Steps skipped for a non-finite gradient.",
             MetricType::counter);
    w.sample(static_cast<double>(totals.skipped), labels);
    w.family("tierswap_step_seconds_total", "Wall time of step(), taken and skipped.",
             MetricType::counter);
    w.sample(totals.seconds, labels);
    w.family("tierswap_step_io_wait_seconds_total",
             "Time step()'s acquires waited for transfers (reads landing).", MetricType::counter);
    w.sample(totals.io_wait_seconds, labels);
    w.family("tierswap_step_commit_seconds_total",
             "Time step()'s commits took (the last writes landing, the manifest).",
             MetricType::counter);
    w.sample(totals.commit_seconds, labels);
    w.family("tierswap_last_step_seconds", "Wall time of the last step().", MetricType::gauge);
    w.sample(totals.last_seconds, labels);
    w.family("tierswap_loss_scale", "The loss scale of the next step.", MetricType::gauge);
    w.sample(totals.loss_scale, labels);
  });
}

}  // namespace tierswap
