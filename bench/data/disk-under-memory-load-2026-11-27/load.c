// A background load for one core: "stream [GB/s]" copies 32 MiB pieces between two 256 MiB
// buffers (memory bandwidth; with a rate, in bursts at full speed with sleeps between them so
// that the average is that rate), "spin" does register arithmetic only. Runs until killed.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
int main(int argc, char** argv) {
  if (argc < 2) return 2;
  if (strcmp(argv[1], "stream") == 0) {
    const double rate = argc > 2 ? atof(argv[2]) * 1e9 : 0;  // bytes moved (read + written) per s
    const size_t n = 256ul << 20, piece = 32ul << 20;
    char* a = aligned_alloc(1 << 21, n);
    char* b = aligned_alloc(1 << 21, n);
    memset(a, 1, n), memset(b, 2, n);
    const double t0 = now();
    double moved = 0, report = t0 + 5;
    for (size_t off = 0;; off = (off + piece) % n) {
      memcpy(b + off, a + off, piece);
      moved += 2.0 * piece;
      if (rate > 0) {
        const double ahead = moved / rate - (now() - t0);
        if (ahead > 0) {
          struct timespec s = {(time_t)ahead, (long)((ahead - (time_t)ahead) * 1e9)};
          nanosleep(&s, NULL);
        }
      }
      if (now() > report)
        fprintf(stderr, "load: %.2f GB/s\n", moved / (now() - t0) / 1e9), report += 5;
    }
  }
  volatile unsigned long x = 1;
  for (;;) x = x * 6364136223846793005ul + 1442695040888963407ul;
}
