// How busy a benchmark pass kept the disks under its swap directories: a thread reads each
// disk's /sys/block/<disk>/inflight (requests the block layer has issued and not completed, reads
// and writes) every millisecond while the pass runs. On a shared or virtual disk whose speed
// swings between passes, two passes that kept it equally busy differ by the disk, not by the
// software: the fraction of samples with a request in flight says which.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace tierswap::cli {

/// What one sampled pass saw, averaged over the distinct disks sampled.
struct DiskBusy {
  double busy = 0;           ///< fraction of samples with at least one request in flight
  double mean_inflight = 0;  ///< requests in flight, reads + writes, mean over the samples
  std::uint64_t samples = 0;
};

/// The `inflight` files of the whole disks holding `dirs` (each disk once). Empty, with `why`
/// set, when one of them is not on a block device with statistics (tmpfs, overlayfs, NFS).
std::vector<std::filesystem::path> disk_inflight_files(
    const std::vector<std::filesystem::path>& dirs, std::string* why);

class DiskBusySampler {
 public:
  explicit DiskBusySampler(std::vector<std::filesystem::path> files);
  ~DiskBusySampler();
  DiskBusySampler(const DiskBusySampler&) = delete;
  DiskBusySampler& operator=(const DiskBusySampler&) = delete;

  /// Starts sampling (a pass begins).
  void start();
  /// Stops sampling and returns what the samples since start() saw.
  DiskBusy stop();

 private:
  void loop();

  std::vector<std::filesystem::path> files_;
  std::atomic<bool> run_{false};
  std::thread th_;
  std::uint64_t samples_ = 0, busy_ = 0, inflight_ = 0;  // written by th_, read after join
  std::string error_;                                    // a read that failed, from th_
};

}  // namespace tierswap::cli
