// Measurement probe of 2026-11-27 (bench/RESULTS.md, tierswap.torch against torch): an in-place
// update over two 1 GiB fp32 arrays. gcc -O3 -march=native -fopenmp update_bw.c; OMP_NUM_THREADS=2.
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
int main() {
  size_t n = 256u << 20;
  float *a = aligned_alloc(64, n * 4), *b = aligned_alloc(64, n * 4);
#pragma omp parallel for
  for (size_t i = 0; i < n; i++) {
    a[i] = i;
    b[i] = 1;
  }
  for (int r = 0; r < 5; r++) {
    double t = now();
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
      a[i] = a[i] * 0.999f + b[i];
    }
    t = now() - t;
    printf("update a+=b: %.1f GB/s (read 2, write 1 arrays)\n", 3.0 * n * 4 / t / 1e9);
  }
  return 0;
}
