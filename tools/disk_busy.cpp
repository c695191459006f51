// Disk-busy sampling for the benchmarks (see disk_busy.hpp).
#include "tools/disk_busy.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <stdexcept>

#include <fmt/format.h>

#include "tierswap/detail/paths.hpp"

namespace tierswap::cli {

namespace fs = std::filesystem;

namespace {

// /sys/block/<disk>/inflight of the whole disk holding `dir`; empty with `why` if there is none.
fs::path inflight_file(const fs::path& dir, std::string* why) {
  fs::path dev = detail::block_device_sysfs(dir, why);
  if (dev.empty()) return {};
  if (fs::exists(dev / "partition")) dev = dev.parent_path();  // the whole disk's counters
  if (!fs::exists(dev / "inflight")) {
    *why =
        fmt::format("{}: its block device {} has no inflight counters", dir.string(), dev.string());
    return {};
  }
  return dev / "inflight";
}

// Reads "<reads> <writes>" from an inflight file; false if it cannot.
bool read_inflight(int fd, std::uint64_t* n) {
  char buf[64];
  const ssize_t got = ::pread(fd, buf, sizeof buf - 1, 0);
  if (got <= 0) return false;
  buf[got] = '\0';
  unsigned long long r = 0, w = 0;
  if (std::sscanf(buf, "%llu %llu", &r, &w) != 2) return false;
  *n = r + w;
  return true;
}

}  // namespace

std::vector<fs::path> disk_inflight_files(const std::vector<fs::path>& dirs, std::string* why) {
  std::vector<fs::path> files;
  for (const auto& d : dirs) {
    fs::path f = inflight_file(d, why);
    if (f.empty()) return {};
    if (std::find(files.begin(), files.end(), f) == files.end()) files.push_back(std::move(f));
  }
  return files;
}

DiskBusySampler::DiskBusySampler(std::vector<fs::path> files) : files_(std::move(files)) {
  if (files_.empty()) throw std::invalid_argument("DiskBusySampler: no disk to sample");
}

DiskBusySampler::~DiskBusySampler() {
  if (th_.joinable()) {
    run_ = false;
    th_.join();
  }
}

void DiskBusySampler::start() {
  if (th_.joinable()) throw std::logic_error("DiskBusySampler::start: already sampling");
  samples_ = busy_ = inflight_ = 0;
  error_.clear();
  run_ = true;
  th_ = std::thread([this] { loop(); });
}

DiskBusy DiskBusySampler::stop() {
  if (!th_.joinable()) throw std::logic_error("DiskBusySampler::stop: not sampling");
  run_ = false;
  th_.join();
  if (!error_.empty()) throw std::runtime_error(error_);
  DiskBusy d;
  d.samples = samples_;
  if (samples_ == 0) return d;
  const double n = static_cast<double>(samples_ * files_.size());
  d.busy = static_cast<double>(busy_) / n;
  d.mean_inflight = static_cast<double>(inflight_) / n;
  return d;
}

void DiskBusySampler::loop() {
  std::vector<int> fds;
  for (const auto& f : files_) {
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      error_ = fmt::format("disk-busy sampling: cannot open {}", f.string());
      break;
    }
    fds.push_back(fd);
  }
  while (error_.empty() && run_) {
    for (std::size_t i = 0; i < fds.size(); ++i) {
      std::uint64_t n = 0;
      if (!read_inflight(fds[i], &n)) {
        error_ = fmt::format("disk-busy sampling: cannot read {}", files_[i].string());
        break;
      }
      busy_ += n > 0;
      inflight_ += n;
    }
    ++samples_;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (int fd : fds) ::close(fd);
}

}  // namespace tierswap::cli
