#!/usr/bin/env bash
# The GPU check of issue 9, for a lent GPU machine (the device tool's H100/H200: CUDA driver,
# PyTorch, no Rust toolchain, no network). Build first, here: `bash scripts/gpu_build.sh`,
# then run it there in one call, carrying `.gpu`: `bash scripts/gpu_check.sh`.
#
# It runs, against the CPU on fresh random inputs:
# - the CUDA runtime's own tests (buffers, emitted-style kernels, cuBLAS f32 and bf16
#   products against an f64 reference, out-of-memory);
# - every emitted CUDA kernel of every model, compiled for the card's architecture and run on
#   it (`cuda_runtime`), and NVRTC's sm_90 compile of whole modules (`cuda_kernels`);
# - every core op's test against its float64 reference on `Device::cuda(0)`
#   (`RTX_TEST_DEVICE=cuda`), and the models on it against the CPU: forward, gradients (MLP,
#   CNN, GPT), AdamW steps, clipping, GPT training steps and checkpoint, the digits MLP
#   trained to 0.97 (`cuda_training`); then `models train` for the MLP and the GPT on CUDA;
# - the wgpu op suite, kernels and model tests on the adapter wgpu finds (NVIDIA's Vulkan
#   driver when its ICD is there), skipped when there is none;
# then the benchmarks beside PyTorch on the same card (`scripts/bench_gpu_peers.py`).
# Each step prints one `gpu_check: <step> ok|FAILED` line; logs go to $OUT when it is set.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=/tmp/rtx-gpu/bin
LOG=${OUT:-/tmp/rtx-gpu-check}
mkdir -p "$LOG"
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp/rtx-xdg}"
mkdir -p -m 0700 "$XDG_RUNTIME_DIR"
export RTX_KERNEL_CACHE=/tmp/rtx-kernels
status=0
step() {
    local name=$1
    shift
    if "$@" >"$LOG/$name.log" 2>&1; then
        echo "gpu_check: $name ok"
    else
        echo "gpu_check: $name FAILED (rc $?)"
        tail -n 25 "$LOG/$name.log"
        status=1
    fi
}
[ -f .gpu/bin.tar.xz ] || { echo "gpu_check: no .gpu/bin.tar.xz: run scripts/gpu_build.sh here first and carry .gpu"; exit 2; }
mkdir -p /tmp/rtx-gpu && tar -C /tmp/rtx-gpu -xJf .gpu/bin.tar.xz

nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv || echo "gpu_check: nvidia-smi missing"

# cudarc looks for libnvrtc.so / libcublas.so (or their .12 names); the image has CUDA 13's
# wheels (nvidia/cu13/lib/lib*.so.13), whose C APIs the runtime uses unchanged: link them
# under the names cudarc tries.
LIBS=/tmp/rtx-cuda-libs
mkdir -p "$LIBS"
SITE=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)
DIRS=
for lib in nvrtc cublas cublasLt; do
    found=$(find /usr/local/cuda/lib64 $SITE -name "lib$lib.so*" 2>/dev/null | sort | tail -1)
    if [ -n "$found" ]; then
        ln -sf "$found" "$LIBS/lib$lib.so"
        # Their own folders too: NVRTC opens its builtins library by its versioned name.
        DIRS="$DIRS:$(dirname "$found")"
        echo "gpu_check: lib$lib from $found"
    else
        echo "gpu_check: lib$lib not found"
    fi
done
export LD_LIBRARY_PATH="$LIBS$DIRS:/usr/local/nvidia/lib64:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

export RTX_REQUIRE_CUDA=1 RTX_REQUIRE_NVRTC=1
step cuda_runtime_unit "$BIN/test_cuda" --nocapture
step cuda_model_kernels "$BIN/test_cuda_runtime" --nocapture
step nvrtc_modules "$BIN/test_cuda_kernels" --nocapture
step cuda_ops env RTX_TEST_DEVICE=cuda "$BIN/test_backend_vs_reference"
step cuda_training "$BIN/test_cuda_training" --nocapture
step cuda_train_mlp "$BIN/models" train --device cuda
step cuda_train_gpt "$BIN/models" train --model gpt --device cuda --steps 300 --eval-every 300
# Where a GPT training step's time goes on CUDA (each step synchronized).
step cuda_gpt_profile env RTX_PROFILE=1 "$BIN/models" train --model gpt --device cuda --steps 3 --eval-every 3 --eval-batches 1
# wgpu: whatever adapter is there (without a Vulkan driver these say skipped, by name).
step wgpu_unit "$BIN/test_wgpu" --nocapture
step wgpu_ops env RTX_TEST_DEVICE=wgpu "$BIN/test_backend_vs_reference"
step wgpu_kernels "$BIN/test_wgpu_kernels" --nocapture
step wgpu_training "$BIN/test_wgpu_training" --nocapture
# Where a GPT training step's time goes on the wgpu adapter (each step synchronized).
step wgpu_gpt_profile env RTX_PROFILE=1 "$BIN/models" train --model gpt --device wgpu --steps 3 --eval-every 3 --eval-batches 1
step bench_cuda "$BIN/models" bench --filter cuda_
step bench_vs_torch env PYTHONUNBUFFERED=1 python3 scripts/bench_gpu_peers.py --rtx-bin "$BIN/models"
echo "--- benchmarks"
cat "$LOG/bench_vs_torch.log"
echo "--- skipped tests"
grep -h "^skipped:" "$LOG"/*.log | sort | uniq -c | head -20
exit $status
