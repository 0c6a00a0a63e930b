#!/usr/bin/env bash
# The whole test suite. Installs what it needs on a fresh Debian machine
# (apt packages, rustup targets, the demo model), then runs every test.
# Reference data comes from $POCKET_FIXTURES (default ../shared/fixtures);
# the suite fails, loudly, when it is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
# Each step's duration is printed when the next begins, and all of them at the end.
suite_start=$SECONDS step_start=$SECONDS step_name="" durations=""
step() {
    if [ -n "$step_name" ]; then
        durations+=$(printf '%6ds  %s' $((SECONDS - step_start)) "$step_name")$'\n'
        printf '(%ds)\n' $((SECONDS - step_start))
    fi
    step_name="$*" step_start=$SECONDS
    printf '\n==== %s\n' "$*"
}

# ---- prerequisites -------------------------------------------------------------
need_apt=()
command -v aarch64-linux-gnu-gcc >/dev/null || need_apt+=(gcc-aarch64-linux-gnu)
[ -d /usr/aarch64-linux-gnu/lib ] || need_apt+=(libc6-dev-arm64-cross)
command -v qemu-aarch64 >/dev/null || need_apt+=(qemu-user)
command -v python3 >/dev/null || need_apt+=(python3 python3-pip)
# The GPU tests run on Mesa's software Vulkan driver (lavapipe).
compgen -G '/usr/share/vulkan/icd.d/lvp_icd.*.json' >/dev/null || need_apt+=(mesa-vulkan-drivers)
ldconfig -p | grep -q 'libvulkan\.so\.1' || need_apt+=(libvulkan1)
if [ ${#need_apt[@]} -gt 0 ]; then
    step "installing ${need_apt[*]}"
    sudo_cmd=""; [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
if ! command -v cargo >/dev/null; then
    echo "cargo not found: install Rust with rustup (https://rustup.rs) and rerun" >&2
    exit 1
fi
rustup target list --installed | grep -q aarch64-unknown-linux-gnu || rustup target add aarch64-unknown-linux-gnu

# Disk: CI machines have had only a few GB free, and a debug build of the
# workspace with full debug info and incremental caches wrote ~14 GB (one CI run
# died of a full disk in the aarch64 step). Line tables keep panics' locations;
# nothing here reuses an incremental cache on a clean machine.
export CARGO_INCREMENTAL=0
export CARGO_PROFILE_DEV_DEBUG=line-tables-only
step "disk: $(df -Ph . | awk 'NR==2 {print $4}') free at $(pwd)"

export POCKET_FIXTURES="${POCKET_FIXTURES:-$root/../shared/fixtures}"
if [ ! -f "$POCKET_FIXTURES/manifest.json" ]; then
    echo "FAIL: fixture store not found at $POCKET_FIXTURES (set POCKET_FIXTURES)" >&2
    exit 1
fi
step "demo model"
export POCKET_GEMMA=$(scripts/fetch-demo-model.sh)
export POCKET_REQUIRE_GEMMA=1
step "chat model (the demo's SmolLM2-135M-Instruct)"
export POCKET_SMOLLM2=$(scripts/fetch-chat-model.sh)
# The families without shipped fixtures are checked on tiny synthetic files
# (fixed seed; each test checks its file's sha256 and llama.cpp's logits of it
# are committed in core/tests/data/synth).
step "tiny synthetic models (scripts/synth-tiny.sh)"
export POCKET_SYNTH_TINY=$(scripts/synth-tiny.sh)
step "llama.cpp source tree (its vocabulary corpora)"
cargo xtask llama-source
export POCKET_REQUIRE_LLAMA_SRC=1

# ---- checks ----------------------------------------------------------------------
step "cargo fmt --check"
cargo fmt --all -- --check

# Includes xtask's tests: the JNA pin in android/pocket/build.gradle.kts (>= 5.18.1, for
# 16 KB pages) and the ELF alignment checker on hand-made libraries, aligned and not.
step "x86-64 tests (cargo test --workspace)"
# The CLI enables pocket-core's `gpu` feature, so the workspace's core tests
# include the GPU kernels on lavapipe; with the driver installed above, a
# missing adapter is a failure, not a skip.
export POCKET_REQUIRE_GPU=1
cargo test --workspace

# The workspace run above took the GPU kernels' tests through every form
# (shader-f16 and subgroups on and off) and the fixture models through the
# adapter's form (f16+subgroups on lavapipe); this takes them through the
# portable form: the same test binary run again (cargo selecting one target
# resolves other features and rebuilds everything, ~5 minutes on 2 cores).
step "GPU-backend logits on lavapipe, portable kernels"
built() { # the test executable of target $1 from the workspace build above
    cargo test --workspace --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == sys.argv[1] and m.get("executable"):
        print(m["executable"])' "$1"
}
gpu_backend=$(built gpu_backend)
[ -x "$gpu_backend" ] || { echo "FAIL: no gpu_backend test executable" >&2; exit 1; }
(cd core && POCKET_GPU_KERNELS=portable "$gpu_backend")

# Constrained output through the CLI on the real models (the base Gemma 3
# 270M and the instruct SmolLM2), sampled, every answer validated by
# Python's jsonschema and re; bad constraints refused by name.
step "structured output through the CLI on real models (scripts/structured-check.py)"
python3 -c "import jsonschema" 2>/dev/null || python3 -m pip install -q jsonschema || python3 -m pip install -q --break-system-packages jsonschema
# The CLI the workspace's tests built (a separate `cargo build` resolves
# features without dev-dependencies and rebuilds everything).
[ -x target/debug/pocket ] || cargo build -p pocket-cli
python3 scripts/structured-check.py target/debug/pocket "$POCKET_SMOLLM2" "$POCKET_GEMMA"
# Tool calls on the fixture tool suite (BFCL cases), in the file's generic form
# and in Qwen3.5's and Llama 3.2's syntax: names among the tools, arguments valid.
python3 scripts/tool-check.py target/debug/pocket "$POCKET_SMOLLM2" "$POCKET_FIXTURES/structured/tool_suite.json" \
    --cases 4 --template "$POCKET_FIXTURES/templates/Qwen3.5-4B.jinja" \
    --template "$POCKET_FIXTURES/templates/meta-llama-Llama-3.2-3B-Instruct.jinja"

if [ -x scripts/test-aarch64.sh ]; then
    step "aarch64 tests under qemu"
    scripts/test-aarch64.sh
fi

# ---- SDK: the bindings from Python and Kotlin, the mobile static libraries ------------
# Set POCKET_SDK_TESTS=0 to skip. Installs what it needs: pytest, Debian's JNA,
# the Kotlin compiler (npm package, cached in ~/.cache/pocket/tools), rustup targets.
if [ "${POCKET_SDK_TESTS:-1}" != 0 ]; then
    tools="${POCKET_CACHE:-$HOME/.cache/pocket}/tools"
    sdk_apt=()
    command -v java >/dev/null || sdk_apt+=(default-jre-headless)
    [ -f /usr/share/java/jna.jar ] || sdk_apt+=(libjna-java)
    command -v npm >/dev/null || sdk_apt+=(npm)
    if [ ${#sdk_apt[@]} -gt 0 ]; then
        step "SDK: installing ${sdk_apt[*]}"
        sudo_cmd=""; [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
        $sudo_cmd apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${sdk_apt[@]}" >/dev/null
    fi
    python3 -c "import pytest" 2>/dev/null || python3 -m pip install -q pytest || python3 -m pip install -q --break-system-packages pytest
    if [ ! -f "$tools/node_modules/kotlin-compiler/lib/kotlin-compiler.jar" ]; then
        step "SDK: installing kotlin-compiler@2.4.20 into $tools"
        mkdir -p "$tools"
        npm install --prefix "$tools" --no-audit --no-fund --silent kotlin-compiler@2.4.20
    fi
    export KOTLIN_HOME="$tools/node_modules/kotlin-compiler"
    installed=$(rustup target list --installed)
    for t in aarch64-apple-ios aarch64-linux-android armv7-linux-androideabi x86_64-linux-android; do
        grep -qx "$t" <<<"$installed" || rustup target add "$t"
    done

    step "SDK: Python binding tests (pytest)"
    cargo xtask test-bindings python

    step "SDK: Kotlin binding tests on the JVM (committed bindings checked, kotlinc + JNA)"
    cargo xtask test-bindings kotlin

    step "SDK: pocket-ffi for iOS and Android (static libraries for arm64, checks for the rest)"
    cross="${POCKET_CACHE:-$HOME/.cache/pocket}/cross-target"
    # arm64 (what phones run; `asm!` kernels compiled for real) as static
    # libraries; 32-bit ARM and the x86-64 emulator ABI type-checked; the GPU
    # backend (wgpu: most of a build's time) type-checked for the arm64 targets.
    # Without pocket-ffi's `tls` feature (https for downloads: ring compiles C
    # for its target, and no iOS SDK or Android NDK is assumed here); the
    # download code itself (http://) is compiled for every target.
    cargo xtask staticlibs --quick --no-gpu --no-tls --target-dir "$cross" aarch64-apple-ios aarch64-linux-android
    for t in armv7-linux-androideabi x86_64-linux-android; do
        cargo check --release -p pocket-ffi --lib --no-default-features --target "$t" --target-dir "$cross"
    done
    for t in aarch64-apple-ios aarch64-linux-android; do
        cargo check --release -p pocket-ffi --lib --no-default-features --features gpu --target "$t" --target-dir "$cross"
    done
fi

step "disk: $(du -sh target 2>/dev/null | cut -f1) in target/, $(df -Ph . | awk 'NR==2 {print $4}') free"
step "all tests passed"
printf '\nstep durations:\n%s%6ds  total\n' "$durations" $((SECONDS - suite_start))
