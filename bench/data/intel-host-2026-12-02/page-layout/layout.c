// How physically contiguous a process's freshly faulted 4 KiB pages are (measurement only, not
// part of the build; needs root for the frame numbers in /proc/self/pagemap).
// Maps 32 MiB of anonymous memory with huge pages off, faults it in one of these ways, and prints
// the mean run of physically consecutive pages and the segments a 1 MiB request over it would
// carry (a virtio disk's cost follows them):
//   touch     one CPU write per page, ascending
//   populate  madvise(MADV_POPULATE_WRITE)
//   mlock     mlock()
//   pin       io_uring_register_buffers (32 x 1 MiB), as fio --fixedbufs and tierswap do
// gcc -O2 -o layout layout.c -luring
#define _GNU_SOURCE
#include <fcntl.h>
#include <liburing.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

static int fault_in(char* b, size_t n, const char* how) {
  if (!strcmp(how, "touch")) {
    for (size_t i = 0; i < n; i += 4096) b[i] = 1;
    return 0;
  }
  if (!strcmp(how, "populate")) return madvise(b, n, MADV_POPULATE_WRITE);
  if (!strcmp(how, "mlock")) return mlock(b, n);
  if (!strcmp(how, "pin")) {
    static struct io_uring ring;
    struct iovec v[32];
    if (io_uring_queue_init(8, &ring, 0) < 0) return -1;
    for (int i = 0; i < 32; i++) v[i] = (struct iovec){b + i * (1 << 20), 1 << 20};
    return io_uring_register_buffers(&ring, v, 32);
  }
  return -1;
}

int main(int argc, char** argv) {
  const size_t n = 32 << 20, pages = n / 4096;
  if (argc != 2) return fprintf(stderr, "usage: layout touch|populate|mlock|pin\n"), 2;
  char* b = mmap(0, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  madvise(b, n, MADV_NOHUGEPAGE);
  if (fault_in(b, n, argv[1]) != 0) return perror(argv[1]), 1;
  uint64_t* e = malloc(pages * 8);
  const int fd = open("/proc/self/pagemap", O_RDONLY);
  if (fd < 0 || pread(fd, e, pages * 8, (off_t)((uintptr_t)b / 4096) * 8) != (ssize_t)(pages * 8))
    return perror("pagemap"), 1;
  size_t runs = 0, segments = 0;
  for (size_t i = 0; i < pages; i++) {
    const uint64_t pfn = e[i] & ((1ull << 55) - 1), prev = i ? e[i - 1] & ((1ull << 55) - 1) : 0;
    if (!(e[i] >> 63) || pfn == 0) return fprintf(stderr, "page %zu: no frame (not root?)\n", i), 1;
    const int joined = i > 0 && pfn == prev + 1;
    runs += !joined;
    segments += !joined || i % 256 == 0;
  }
  printf("%-8s run %6.2f pages, %6.1f segments per MiB\n", argv[1], (double)pages / runs,
         (double)segments / 32);
  return 0;
}
