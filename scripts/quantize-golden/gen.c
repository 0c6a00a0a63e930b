// Quantises one f32 matrix with llama.cpp's ggml_quantize_chunk (the code
// llama-quantize runs) and writes the blocks: the golden data of
// core/src/quantize/tests.rs. Built by scripts/quantize-golden.sh against the
// host build's libggml-base, which is compiled for baseline x86-64 (no FMA
// contraction), so its floats follow the C source operation by operation.
//
// usage: gen TYPE ROWS COLS IN.f32 IMATRIX.f32|- OUT.bin
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ggml.h"

static void *slurp(const char *path, size_t want) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(1); }
    void *buf = malloc(want);
    if (fread(buf, 1, want, f) != want) { fprintf(stderr, "%s: short file\n", path); exit(1); }
    fclose(f);
    return buf;
}

int main(int argc, char **argv) {
    if (argc != 7) { fprintf(stderr, "usage: gen TYPE ROWS COLS IN.f32 IMATRIX.f32|- OUT.bin\n"); return 2; }
    int type = -1;
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        const char *name = ggml_type_name((enum ggml_type) t);
        if (name && strcasecmp(name, argv[1]) == 0) type = t;
    }
    if (type < 0) { fprintf(stderr, "unknown type %s\n", argv[1]); return 2; }
    long rows = atol(argv[2]), cols = atol(argv[3]);
    float *src = slurp(argv[4], sizeof(float) * rows * cols);
    float *imatrix = strcmp(argv[5], "-") ? slurp(argv[5], sizeof(float) * cols) : NULL;
    size_t bytes = ggml_row_size((enum ggml_type) type, cols) * rows;
    void *dst = calloc(1, bytes);
    size_t done = ggml_quantize_chunk((enum ggml_type) type, src, dst, 0, rows, cols, imatrix);
    if (done != bytes) { fprintf(stderr, "wrote %zu of %zu bytes\n", done, bytes); return 1; }
    FILE *f = fopen(argv[6], "wb");
    if (!f || fwrite(dst, 1, bytes, f) != bytes) { perror(argv[6]); return 1; }
    fclose(f);
    return 0;
}
