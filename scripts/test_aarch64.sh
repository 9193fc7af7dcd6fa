#!/usr/bin/env bash
# Runs the test suite for aarch64 (the NEON GEMM kernel, and every path that is not x86-64)
# under qemu user-mode emulation, on an x86-64 machine. Not part of CI: it needs the aarch64
# standard library from rustup (`rustup target add aarch64-unknown-linux-gnu`), which CI's
# network does not reach. One-time set-up on Debian/Ubuntu:
#   apt-get install -y qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross
# Usage: scripts/test_aarch64.sh [cargo test arguments, default: --workspace]
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
if [ "$#" -eq 0 ]; then set -- --workspace --exclude ui-tests; fi
cargo test --target aarch64-unknown-linux-gnu "$@"
