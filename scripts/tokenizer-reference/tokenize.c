// llama.cpp's token ids for a corpus, as test-tokenizer-0 makes its `.out`
// files: the `.inp` strings (separated by "\n__ggml_vocab_test__\n") each
// tokenised without BOS/EOS and without parsing special tokens, one line of
// space-separated ids per string. For vocabularies the llama.cpp tree has no
// `.out` for (built by scripts/tokenizer-reference.sh).
//
// usage: tokenize VOCAB.gguf IN.inp OUT.out
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llama.h"

static const char *SEP = "\n__ggml_vocab_test__\n";

static void quiet(enum ggml_log_level level, const char *text, void *data) {
    (void) level; (void) text; (void) data;
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: tokenize VOCAB.gguf IN.inp OUT.out\n"); return 2; }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "%s: cannot load\n", argv[1]); return 1; }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);

    FILE *f = fopen(argv[2], "rb");
    if (!f) { perror(argv[2]); return 1; }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *raw = malloc(n + 1);
    if (fread(raw, 1, n, f) != (size_t) n) { perror(argv[2]); return 1; }
    raw[n] = 0;
    fclose(f);

    FILE *out = fopen(argv[3], "wb");
    if (!out) { perror(argv[3]); return 1; }
    int cap = 1 << 16;
    llama_token *ids = malloc(sizeof(llama_token) * cap);
    long pos = 0;
    while (pos < n) {
        char *next = strstr(raw + pos, SEP);
        long len = next ? next - (raw + pos) : n - pos;
        int k = llama_tokenize(vocab, raw + pos, (int32_t) len, ids, cap, false, false);
        if (k < 0) { fprintf(stderr, "string at %ld: too many tokens\n", pos); return 1; }
        for (int i = 0; i < k; i++) fprintf(out, " %d", ids[i]);
        fputc('\n', out);
        pos += len + (next ? (long) strlen(SEP) : 0);
    }
    fclose(out);
    llama_model_free(model);
    return 0;
}
