// The clients' shared memory (shared_memory.cpp): a sealed memfd per client, on transparent huge
// pages where the kernel lends them to shared memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace tierswap::service {

// A client's shared memory: a sealed memfd mapped here (and, through the passed fd, there).
struct SharedMemory {
  int fd = -1;
  std::byte* data = nullptr;
  std::uint64_t bytes = 0;
  SharedMemory() = default;
  SharedMemory(const SharedMemory&) = delete;
  ~SharedMemory();
};

// Whether shared memory can be on transparent huge pages here (sysfs shmem_enabled, and
// ProcessConfig::huge_pages: TIERSWAP_HUGE_PAGES=0 turns them off).
struct ShmemHugePages {
  bool asked = true;    // huge pages not turned off
  bool lent = false;    // asked, and the kernel gives them to memory that advises them
  std::string setting;  // the sysfs selection, as read ("never", "advise", ...)
  std::string describe() const;
};
ShmemHugePages shmem_huge_pages();

// A client's memfd of `bytes`, sealed at that size and mapped, its first `locked` bytes mlocked;
// on transparent huge pages when `huge` (advised before the lock faults them in).
std::unique_ptr<SharedMemory> make_shared_memory(const std::string& name, std::uint64_t bytes,
                                                 std::uint64_t locked, bool huge);
/// madvise(MADV_HUGEPAGE) (best effort): the client does it on its mapping too.
void advise_huge_pages(void* p, std::uint64_t bytes) noexcept;

}  // namespace tierswap::service
