#!/usr/bin/env bash
# The GPU check of issue 9, prepared to run in one call on a lent GPU machine (the device
# tool's H100/H200, no network): `bash scripts/gpu_check.sh`. It has not yet run on one.
#
# What it covers today: there is no CUDA runtime yet, so the GPU itself is reached through
# wgpu on NVIDIA's Vulkan driver (when the machine's driver ships its Vulkan ICD), and NVRTC
# compiles every emitted kernel for the card's architecture. Each step prints one
# `gpu_check: <step> ok|FAILED|skipped` line; the script exits non-zero if a step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp/rtx-xdg}"
mkdir -p -m 0700 "$XDG_RUNTIME_DIR"
status=0
step() {
    local name=$1
    shift
    if "$@"; then echo "gpu_check: $name ok"; else echo "gpu_check: $name FAILED"; status=1; fi
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || echo "gpu_check: nvidia-smi skipped"
ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)
echo "gpu_check: compute capability ${ARCH:-unknown}"

# libnvrtc: the CUDA toolkit's, else a pip wheel already on the machine.
for d in /usr/local/cuda/lib64 $(python3 -c 'import nvidia.cuda_nvrtc, os; print(os.path.join(list(nvidia.cuda_nvrtc.__path__)[0], "lib"))' 2>/dev/null); do
    [ -e "$d/libnvrtc.so.12" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done

step build cargo build --release -p models --features wgpu,cuda
step nvrtc env RTX_REQUIRE_NVRTC=1 cargo test --release -p models --features wgpu,cuda --test cuda_kernels
# The adapter wgpu picks (a discrete GPU before llvmpipe): every op, the models, training.
step wgpu_ops env RTX_TEST_DEVICE=wgpu cargo test --release -p rtx-core --features wgpu --test backend_vs_reference
step wgpu_models env RTX_REQUIRE_WGPU=1 cargo test --release -p models --features wgpu --test wgpu_kernels --test wgpu_training -- --nocapture
step wgpu_train_mlp target/release/models train --model mlp --device wgpu
step cpu_train_mlp target/release/models train --model mlp
exit $status
