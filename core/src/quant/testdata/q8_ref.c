/* Makes q8_ref.bin: 1024 f32 inputs, then their quantisation by the
 * activation quantisers llama.cpp runs on x86-64 (Q8_0, Q8_1: the AVX2 code of
 * ggml-cpu's `quantize_row_q8_0/1`, multiplier 127/amax, round half to even;
 * Q8_K: `quantize_row_q8_K`, which is the reference code), in file layout.
 * pocket's quantisers must reproduce them bit for bit on every ISA.
 * Build against a CPU build of llama.cpp (commit 0c1e570, GGML_NATIVE on x86-64):
 *   gcc -O2 q8_ref.c -L build/bin -lggml-cpu -lggml-base -lm -o q8_ref
 *   LD_LIBRARY_PATH=build/bin ./q8_ref > q8_ref.bin
 */
#include <stdio.h>
#include <stdint.h>
#include <math.h>
#include <string.h>
void quantize_row_q8_0(const float * x, void * y, int64_t k);
void quantize_row_q8_K(const float * x, void * y, int64_t k);
void quantize_row_q8_1(const float * x, void * y, int64_t k);
/* deterministic input shared with the Rust test: see q8 golden test */
static float input(int i) {
    uint32_t h = (uint32_t)i * 2654435761u; h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    float v = ((float)(h & 0xffff) / 65536.0f - 0.5f) * 4.0f;
    if (i % 97 == 5) v *= 30.0f;
    if (i % 256 == 17) v = 2.5f; /* ties after scaling are rare; exact ones below */
    return v;
}
int main(void) {
    enum { K = 1024 };
    float x[K];
    for (int i = 0; i < K; i++) x[i] = input(i);
    /* block 3 (of Q8_K) and blocks 24..31 (of Q8_0): exact ties */
    for (int j = 0; j < 256; j++) x[768 + j] = (j % 7) - 3 + 0.5f;
    x[768] = -127.0f;
    static unsigned char y0[K/32*34], y1[K/32*36], yk[K/256*292];
    quantize_row_q8_0(x, y0, K);
    quantize_row_q8_1(x, y1, K);
    quantize_row_q8_K(x, yk, K);
    fwrite(x, 4, K, stdout); fwrite(y0, 1, sizeof y0, stdout); fwrite(y1, 1, sizeof y1, stdout); fwrite(yk, 1, sizeof yk, stdout);
    return 0;
}
