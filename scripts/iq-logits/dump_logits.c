// Teacher-forced logits of a prompt, as the fixture store's dump_logits:
// n_ctx 256, one batch of the prompt with logits for every position, KV cache
// F32, flash attention off, 2 threads, no extra (repacking) buffer types.
// usage: dump_logits model.gguf out.f32 tok0 tok1 ...
#include <stdio.h>
#include <stdlib.h>
#include "llama.h"

int main(int argc, char ** argv) {
    if (argc < 4) { fprintf(stderr, "usage: %s model out tokens...\n", argv[0]); return 2; }
    int n = argc - 3;
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.use_extra_bufts = false;
    struct llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "load failed\n"); return 1; }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 256; cp.n_batch = 256; cp.n_ubatch = 256;
    cp.n_threads = 2; cp.n_threads_batch = 2;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k = GGML_TYPE_F32; cp.type_v = GGML_TYPE_F32;
    struct llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "context failed\n"); return 1; }
    struct llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        b.token[i] = atoi(argv[3 + i]); b.pos[i] = i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = 1;
    }
    b.n_tokens = n;
    if (llama_decode(ctx, b)) { fprintf(stderr, "decode failed\n"); return 1; }
    int nv = llama_vocab_n_tokens(llama_model_get_vocab(model));
    FILE * f = fopen(argv[2], "wb");
    for (int i = 0; i < n; i++) fwrite(llama_get_logits_ith(ctx, i), sizeof(float), nv, f);
    fclose(f);
    fprintf(stderr, "%d x %d logits\n", n, nv);
    llama_batch_free(b); llama_free(ctx); llama_model_free(model);
    return 0;
}
