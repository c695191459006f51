// What every scrape of the process's endpoint ends with: tierswap_build_info, and the process
// metrics Prometheus's client libraries export under the same names (CPU, memory, descriptors,
// start time), read from /proc/self.
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tierswap/metrics.hpp"

namespace tierswap {
namespace {

#ifdef TIERSWAP_HAVE_CUDA
constexpr const char* kCuda = "yes";
#else
constexpr const char* kCuda = "no";
#endif

struct ProcStat {
  double cpu_seconds = 0, start_time = 0, virtual_bytes = 0, resident_bytes = 0;
  bool ok = false;
};

// /proc/self/stat's fields 14-15 (utime, stime), 22 (starttime), 23 (vsize), 24 (rss), after the
// command name (which may hold spaces: the fields start after its closing parenthesis).
ProcStat read_proc_stat() {
  ProcStat p;
  std::ifstream f("/proc/self/stat");
  std::string line;
  if (!std::getline(f, line)) return p;
  const auto close = line.rfind(')');
  if (close == std::string::npos) return p;
  std::istringstream in(line.substr(close + 2));
  std::string field[23];
  for (auto& x : field)
    if (!(in >> x)) return p;
  const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(::sysconf(_SC_PAGESIZE));
  // field[0] is the state (the stat file's field 3): field k is the file's field k + 3.
  p.cpu_seconds = (std::stod(field[11]) + std::stod(field[12])) / tick;
  p.virtual_bytes = std::stod(field[20]);
  p.resident_bytes = std::stod(field[21]) * page;
  std::ifstream up("/proc/uptime");
  double uptime = 0;
  if (!(up >> uptime)) return p;
  const double boot = static_cast<double>(std::time(nullptr)) - uptime;
  p.start_time = boot + std::stod(field[19]) / tick;
  p.ok = true;
  return p;
}

double open_fds() {
  std::error_code ec;
  double n = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    ++n;
  return n;
}

}  // namespace

void fill_process_metrics(MetricsWriter& w) {
  w.family("tierswap_build_info", "The tierswap build serving these metrics (always 1).",
           MetricType::gauge);
  w.sample(1, {{"version", TIERSWAP_VERSION_STRING}, {"cuda", kCuda}});
  if (const ProcStat p = read_proc_stat(); p.ok) {
    w.family("process_cpu_seconds_total", "User and system CPU time spent, in seconds.",
             MetricType::counter);
    w.sample(p.cpu_seconds);
    w.family("process_resident_memory_bytes", "Resident memory size in bytes.", MetricType::gauge);
    w.sample(p.resident_bytes);
    w.family("process_virtual_memory_bytes", "Virtual memory size in bytes.", MetricType::gauge);
    w.sample(p.virtual_bytes);
    w.family("process_start_time_seconds", "Start time of the process since the Unix epoch.",
             MetricType::gauge);
    w.sample(p.start_time);
  }
  w.family("process_open_fds", "Open file descriptors.", MetricType::gauge);
  w.sample(open_fds());
  if (rlimit r{}; ::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur != RLIM_INFINITY) {
    w.family("process_max_fds", "The most file descriptors the process may open.",
             MetricType::gauge);
    w.sample(static_cast<double>(r.rlim_cur));
  }
}

}  // namespace tierswap
