// llama.cpp logits of a token list, every position of one batch, as raw f32
// (positions x vocabulary), with the fixtures' settings: F32 KV cache, flash
// attention off, 2 threads. usage: llama-logits MODEL OUT.f32 tok,tok,...
#include "llama.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
    if (argc < 4) return 2;
    int toks[256], n = 0;
    for (char *p = strtok(argv[3], ","); p && n < 256; p = strtok(NULL, ",")) toks[n++] = atoi(p);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *m = llama_model_load_from_file(argv[1], mp);
    if (!m) return 1;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 256; cp.n_batch = 256; cp.n_ubatch = 256; cp.n_threads = 2; cp.n_threads_batch = 2;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED; cp.type_k = GGML_TYPE_F32; cp.type_v = GGML_TYPE_F32;
    struct llama_context *c = llama_init_from_model(m, cp);
    struct llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        b.token[i] = toks[i]; b.pos[i] = i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = 1;
    }
    b.n_tokens = n;
    if (llama_decode(c, b)) return 1;
    int nv = llama_vocab_n_tokens(llama_model_get_vocab(m));
    FILE *f = fopen(argv[2], "wb");
    for (int i = 0; i < n; i++) fwrite(llama_get_logits_ith(c, i), sizeof(float), nv, f);
    fclose(f);
    return 0;
}
