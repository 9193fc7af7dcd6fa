#!/usr/bin/env bash
# Builds, on this machine, everything `scripts/gpu_check.sh` runs on a lent GPU machine (which
# has CUDA, PyTorch and a driver but no Rust toolchain and no network): the release `models`
# binary and the release test binaries of the GPU tests, with `--features wgpu,cuda`, stripped
# and packed into `.gpu/bin.tar.xz` (about 11 MB of the 64 MiB a device call may carry;
# ignored by git; the device tool carries it: `carry: [".gpu"]`).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu && mkdir -p .gpu/bin
cargo build --release -p models --features wgpu,cuda
cp target/release/models .gpu/bin/models
# Each test target's executable, as cargo reports it.
tests() {
    cargo test --release --no-run --message-format=json "$@" 2>/dev/null |
        python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])
'
}
{
    tests -p rtx-backends --features wgpu,cuda --test cuda --test wgpu
    tests -p rtx-core --features wgpu,cuda --test backend_vs_reference
    tests -p models --features wgpu,cuda --test cuda_runtime --test cuda_kernels \
        --test cuda_training --test wgpu_kernels --test wgpu_training
} | while read -r name exe; do
    cp "$exe" ".gpu/bin/test_$name"
done
strip .gpu/bin/*
ls -la .gpu/bin
tar -C .gpu -cJf .gpu/bin.tar.xz bin
rm -rf .gpu/bin
ls -la .gpu
