// The clients' shared memory: one sealed memfd per client, mapped by the service (which locks
// its first part) and by the client, on transparent huge pages where the kernel lends them to
// shared memory.
//
// Why huge pages matter here: the tier manager's slabs live in this memory, so every NVMe read
// and write of a client lands in it. On 4 KiB pages a 512 KiB request is up to 128 scattered
// pages; on 2 MiB pages it is one. On the machine of bench/RESULTS.md 512 KiB reads at depth 4-8
// through the service ran at 0.9-1.1 GB/s into 4 KiB shared pages and at 2.7-2.8 GB/s into huge
// ones (bench/service_io.py; the in-process engine's buffers on huge pages: 3.05).
// Anonymous memory gets them with madvise(MADV_HUGEPAGE) when THP is "madvise"; shared memory
// only when /sys/kernel/mm/transparent_hugepage/shmem_enabled (or its 2 MiB entry) allows it,
// and Debian's default there is "never": the service says so at start (tools/systemd has a
// tmpfiles.d entry that sets "advise", which changes nothing for memory that does not ask).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <system_error>

#include "src/service/shared_memory.hpp"
#include "tierswap/log.hpp"
#include "tierswap/process_config.hpp"
#include "tierswap/units.hpp"

#include <fmt/format.h>

namespace tierswap::service {
namespace {

// The selected word of a sysfs THP setting ("always [advise] never" -> "advise"); empty when
// the file is missing (no THP in this kernel) or has no selection.
std::string selected(const char* path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  const auto a = line.find('['), b = line.find(']');
  return a == std::string::npos || b == std::string::npos || b < a ? std::string()
                                                                   : line.substr(a + 1, b - a - 1);
}

bool lends(const std::string& v) {
  return v == "always" || v == "within_size" || v == "advise";
}

}  // namespace

ShmemHugePages shmem_huge_pages() {
  constexpr const char* kTop = "/sys/kernel/mm/transparent_hugepage/shmem_enabled";
  constexpr const char* k2M = "/sys/kernel/mm/transparent_hugepage/hugepages-2048kB/shmem_enabled";
  ShmemHugePages h;
  h.asked = ProcessConfig::current().huge_pages;
  const std::string top = selected(kTop), two = selected(k2M);
  h.setting = top.empty() ? "unavailable" : top;
  if (!two.empty() && two != "inherit") h.setting += ", 2048kB: " + two;
  h.lent = h.asked && (two.empty() || two == "inherit" ? lends(top) : lends(two));
  return h;
}

std::string ShmemHugePages::describe() const {
  if (!asked) return "4 KiB pages (huge pages turned off: TIERSWAP_HUGE_PAGES=0)";
  if (lent) return fmt::format("transparent huge pages (shmem_enabled: {})", setting);
  return fmt::format("4 KiB pages (shmem_enabled: {})", setting);
}

SharedMemory::~SharedMemory() {
  if (data) ::munmap(data, bytes);
  if (fd >= 0) ::close(fd);
}

std::unique_ptr<SharedMemory> make_shared_memory(const std::string& name, std::uint64_t bytes,
                                                 std::uint64_t locked, bool huge) {
  auto m = std::make_unique<SharedMemory>();
  m->fd = ::memfd_create(("tierswap-" + name).c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (m->fd < 0) throw std::system_error(errno, std::system_category(), "memfd_create");
  if (::ftruncate(m->fd, static_cast<off_t>(bytes)) != 0)
    throw std::system_error(errno, std::system_category(), "ftruncate memfd");
  // The client must not shrink it under our mapping (a SIGBUS here) or grow it.
  if (::fcntl(m->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    throw std::system_error(errno, std::system_category(), "seal memfd");
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd, 0);
  if (p == MAP_FAILED) throw std::system_error(errno, std::system_category(), "mmap memfd");
  m->data = static_cast<std::byte*>(p);
  m->bytes = bytes;
  if (huge) advise_huge_pages(p, bytes);  // before mlock faults the locked part in
  if (locked > 0 && ::mlock(p, locked) != 0)
    log(LogLevel::warn, fmt::format("service: client {}: mlock of {} failed ({}): unpinned", name,
                                    format_bytes(locked), std::strerror(errno)));
  return m;
}

void advise_huge_pages(void* p, std::uint64_t bytes) noexcept {
#ifdef MADV_HUGEPAGE
  (void)::madvise(p, bytes, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

}  // namespace tierswap::service
