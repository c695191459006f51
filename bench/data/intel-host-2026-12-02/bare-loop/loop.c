// A bare liburing loop over a 1 GiB file (O_DIRECT, 1 MiB, depth 32, registered file and buffers):
// reads, or with WR=1 writes a freshly fallocated file (SYNC=1: fsynced, then 0.5 s, first).
// loop FILE thp|tlb DEFER(0|1) BATCH; prints GB/s. gcc -O2 -o loop loop.c -luring
#define _GNU_SOURCE
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
int main(int argc, char** argv) {
  // rd FILE BUFKIND(thp|tlb) DEFER(0|1) BATCH(1|2|0) [size]
  const char* path = argv[1];
  int tlb = !strcmp(argv[2], "tlb");
  int defer = atoi(argv[3]);
  int batch = atoi(argv[4]);
  size_t size = 1ul << 30, bs = 1 << 20;
  int depth = 32;
  size_t rb = bs * depth;
  void* buf;
  if (tlb) {
    buf = mmap(0, rb, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
    if (buf == MAP_FAILED) {
      perror("hugetlb");
      return 1;
    }
  } else {
    if (posix_memalign(&buf, 2 << 20, rb)) return 1;
    madvise(buf, rb, MADV_HUGEPAGE);
  }
  int wr = getenv("WR") != 0;
  int fd = open(path, (wr ? O_RDWR | O_CREAT : O_RDONLY) | O_DIRECT, 0644);
  if (wr && fallocate(fd, 0, 0, size)) {
    perror("falloc");
    return 1;
  }
  if (wr && getenv("SYNC")) {
    fsync(fd);
    usleep(500000);
  }
  if (fd < 0) {
    perror("open");
    return 1;
  }
  struct io_uring ring;
  struct io_uring_params p = {0};
  if (defer)
    p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_COOP_TASKRUN;
  if (io_uring_queue_init_params(depth + 2, &ring, &p) < 0) {
    fprintf(stderr, "init\n");
    return 1;
  }
  struct iovec iov[32];
  for (int i = 0; i < depth; i++) {
    iov[i].iov_base = (char*)buf + i * bs;
    iov[i].iov_len = bs;
  }
  if (io_uring_register_buffers(&ring, iov, depth) < 0) {
    fprintf(stderr, "regbuf\n");
    return 1;
  }
  memset(buf, 1, rb);
  if (io_uring_register_files(&ring, &fd, 1) < 0) {
    fprintf(stderr, "regfile\n");
    return 1;
  }
  size_t off = 0, done = 0;
  int infl = 0, pend = 0;
  unsigned long nreq = size / bs;
  unsigned long sub = 0;
  int freeslot[32];
  int nfree = depth;
  for (int i = 0; i < depth; i++) freeslot[i] = i;
  double t0 = now();
  while (done < nreq) {
    while (nfree > 0 && sub < nreq) {
      int s = freeslot[--nfree];
      struct io_uring_sqe* e = io_uring_get_sqe(&ring);
      if (wr)
        io_uring_prep_write_fixed(e, 0, iov[s].iov_base, bs, off, s);
      else
        io_uring_prep_read_fixed(e, 0, iov[s].iov_base, bs, off, s);
      e->flags |= IOSQE_FIXED_FILE;
      io_uring_sqe_set_data64(e, s);
      off += bs;
      sub++;
      infl++;
      pend++;
      if (batch > 0 && pend >= batch) {
        io_uring_submit(&ring);
        pend = 0;
      }
    }
    struct io_uring_cqe* c;
    int r = io_uring_submit_and_wait(&ring, 1);
    pend = 0;
    (void)r;
    unsigned head, n = 0;
    io_uring_for_each_cqe(&ring, head, c) {
      if (c->res != (int)bs) {
        fprintf(stderr, "res %d\n", c->res);
        return 1;
      }
      freeslot[nfree++] = (int)c->user_data;
      n++;
      done++;
      infl--;
    }
    io_uring_cq_advance(&ring, n);
  }
  double t = now() - t0;
  printf("%.4f\n", size / t / 1e9);
  return 0;
}
