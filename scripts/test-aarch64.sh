#!/usr/bin/env bash
# Run pocket-core's kernel, quantisation and thread-pool tests on aarch64 under
# qemu-aarch64, twice:
#   -cpu max         NEON + DotProd (sdot) + I8MM (smmla): the i8mm path runs
#   -cpu cortex-a53  plain ARMv8.0 NEON: dotprod/i8mm would SIGILL, so this
#                    also proves that run-time detection picks the plain path
# Every available path is tested against the scalar reference on each CPU;
# the `show_isa` test prints which path was selected. pocket-core is built
# here without its `gpu` feature, so the GPU stand-in's tests run here too
# (on x86-64 the workspace enables the feature). Gemma 4's fixture logits run
# here too (the NEON paths against llama.cpp's and transformers' logits), and
# model_logits: the qwen3moe, qwen35moe and gemma3 tiny fixtures (Q2_K..Q8_0)
# and, where it is present, the real Gemma 3 270M (the binary takes about
# 100 s per CPU under qemu; Gemma 3 270M's test is the longest, over 60 s),
# and three speculative-verification tests end to end (release, -cpu max).
# budget_change runs the routed experts interleaved at load (mapped) and in
# the file's layout (under a budget) and holds the text to the same tokens.
# The tiny synthetic models' tests read $POCKET_SYNTH_TINY (made here by
# scripts/synth-tiny.sh when unset), as the fixture tests read $POCKET_FIXTURES.
# Needs: rustup target aarch64-unknown-linux-gnu, aarch64-linux-gnu-gcc, qemu-aarch64.
set -euo pipefail
cd "$(dirname "$0")/.."
export POCKET_SYNTH_TINY="${POCKET_SYNTH_TINY:-$(scripts/synth-tiny.sh)}"

TARGET=aarch64-unknown-linux-gnu
QEMU="qemu-aarch64 -L /usr/aarch64-linux-gnu"
FILTERS=(kernels quant threads gpu::)
# The tiny synthetic models of the families without shipped fixtures (made
# here, on the host, when test.sh has not already).
export POCKET_SYNTH_TINY="${POCKET_SYNTH_TINY:-$(scripts/synth-tiny.sh)}"

run() {
    local cpu=$1
    echo "== aarch64, qemu -cpu $cpu =="
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="$QEMU -cpu $cpu" \
        cargo test -q -p pocket-core --target "$TARGET" --lib -- "${FILTERS[@]}" --nocapture 2>&1 \
        | grep -E "kernels: selected|^test result|FAILED|error"
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="$QEMU -cpu $cpu" \
        cargo test -q -p pocket-core --target "$TARGET" --test dequant_fixtures --test gpu_backend --test gemma4_logits \
            --test deepseek2_logits --test granitehybrid_logits --test lfm2moe_logits --test gptoss_logits \
            --test olmoe_logits --test ernie4_5_moe_logits --test model_logits --test budget_change 2>&1 \
        | grep -E "^test result|FAILED|error"
}

run max
run cortex-a53

# The kernels once more as built for release: `asm!` operand mistakes (an
# output sharing an input's register) only show with the release register
# allocation.
echo "== aarch64 release kernels, qemu -cpu max =="
CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="$QEMU -cpu max" \
    cargo test -q --release -p pocket-core --target "$TARGET" --lib -- kernels 2>&1 \
    | grep -E "^test result|FAILED|error"

# Speculative verification end to end on the NEON path (release, -cpu max;
# the whole file takes ~15 minutes under qemu, these ~2): drafts accepted and
# rejected on every fixture architecture, greedy and seeded sampling, through
# the exact kernels, one-row mode and the hybrid's rollbacks.
echo "== aarch64 release speculation, qemu -cpu max =="
CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="$QEMU -cpu max" \
    cargo test -q --release -p pocket-core --target "$TARGET" --test speculation -- --exact \
        greedy_is_identical_through_accepted_and_rejected_drafts_on_every_fixture_architecture \
        seeded_sampling_on_the_quantised_hybrid_through_many_rejecting_passes \
        a_verify_pass_longer_than_the_delta_rules_chunk_is_exact 2>&1 \
    | grep -E "^test result|FAILED|error"
