// Memory bandwidth ceiling on 2 threads: in-place read-modify-write (the fused AdamW kernel's
// pattern for master/m/v) and a non-temporal copy; GB/s counts bytes read + written.
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define N (256000000UL)
static float *A, *B, *C;
static unsigned short *G, *P;
static int mode;
static int nth = 2;
static double now() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
static void* work(void* arg) {
  long t = (long)arg;
  size_t b = N / nth * t, e = N / nth * (t + 1);
  __m512 k = _mm512_set1_ps(0.999f);
  if (mode == 0) {
    for (size_t i = b; i < e; i += 16) {
      _mm512_store_ps(A + i, _mm512_mul_ps(_mm512_load_ps(A + i), k));
    }
  } else if (mode == 1) {
    for (size_t i = b; i < e; i += 16) {
      __m512 a = _mm512_load_ps(A + i), bb = _mm512_load_ps(B + i), c = _mm512_load_ps(C + i);
      __m256i g = _mm256_load_si256((__m256i*)(G + i));
      __m512 gf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(g), 16));
      bb = _mm512_fmadd_ps(bb, k, gf);
      c = _mm512_fmadd_ps(c, k, _mm512_mul_ps(gf, gf));
      a = _mm512_sub_ps(a, _mm512_mul_ps(bb, _mm512_rsqrt14_ps(_mm512_add_ps(c, k))));
      _mm512_store_ps(A + i, a);
      _mm512_store_ps(B + i, bb);
      _mm512_store_ps(C + i, c);
      _mm256_stream_si256((__m256i*)(P + i),
                          _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(a), 16)));
    }
  } else {
    for (size_t i = b; i < e; i += 16) {
      _mm512_stream_ps(B + i, _mm512_load_ps(A + i));
    }
  }
  return 0;
}
static double run(int m) {
  mode = m;
  pthread_t th[8];
  double t0 = now();
  for (long t = 0; t < nth; t++) pthread_create(&th[t], 0, work, (void*)t);
  for (int t = 0; t < nth; t++) pthread_join(th[t], 0);
  return now() - t0;
}
int main() {
  A = aligned_alloc(2 << 20, N * 4);
  B = aligned_alloc(2 << 20, N * 4);
  C = aligned_alloc(2 << 20, N * 4);
  G = aligned_alloc(2 << 20, N * 2);
  P = aligned_alloc(2 << 20, N * 2);
  memset(A, 0, N * 4);
  memset(B, 0, N * 4);
  memset(C, 0, N * 4);
  memset(G, 0, N * 2);
  memset(P, 0, N * 2);
  const char* nm[] = {"rmw 1 array (8 B/elem)", "adam-like 28 B/param", "nt copy (8 B/elem)"};
  double by[] = {8, 28, 8};
  for (int m = 0; m < 3; m++) {
    double best = 1e9, ts[7];
    for (int r = 0; r < 7; r++) {
      ts[r] = run(m);
      if (ts[r] < best) best = ts[r];
    }
    // median
    for (int i = 0; i < 7; i++)
      for (int j = i + 1; j < 7; j++)
        if (ts[j] < ts[i]) {
          double x = ts[i];
          ts[i] = ts[j];
          ts[j] = x;
        }
    printf("%-26s median %.4f s  %.1f GB/s  best %.1f GB/s\n", nm[m], ts[3],
           by[m] * N / ts[3] / 1e9, by[m] * N / best / 1e9);
  }
}
