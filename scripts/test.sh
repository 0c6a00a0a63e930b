#!/usr/bin/env bash
# The whole test suite. Installs what it needs on a fresh Debian machine
# (apt packages, rustup targets, the demo model), then runs every test.
# Reference data comes from $POCKET_FIXTURES (default ../shared/fixtures);
# the suite fails, loudly, when it is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
step() { printf '\n==== %s\n' "$*"; }

# ---- prerequisites -------------------------------------------------------------
need_apt=()
command -v aarch64-linux-gnu-gcc >/dev/null || need_apt+=(gcc-aarch64-linux-gnu)
[ -d /usr/aarch64-linux-gnu/lib ] || need_apt+=(libc6-dev-arm64-cross)
command -v qemu-aarch64 >/dev/null || need_apt+=(qemu-user)
command -v python3 >/dev/null || need_apt+=(python3 python3-pip)
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

export POCKET_FIXTURES="${POCKET_FIXTURES:-$root/../shared/fixtures}"
if [ ! -f "$POCKET_FIXTURES/manifest.json" ]; then
    echo "FAIL: fixture store not found at $POCKET_FIXTURES (set POCKET_FIXTURES)" >&2
    exit 1
fi
step "demo model"
export POCKET_GEMMA=$(scripts/fetch-demo-model.sh)
export POCKET_REQUIRE_GEMMA=1

# ---- checks ----------------------------------------------------------------------
step "cargo fmt --check"
cargo fmt --all -- --check

step "x86-64 tests (cargo test --workspace)"
cargo test --workspace

if [ -x scripts/test-aarch64.sh ]; then
    step "aarch64 tests under qemu"
    scripts/test-aarch64.sh
fi

step "all tests passed"
