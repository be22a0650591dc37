#!/usr/bin/env bash
# Every GPU check in one run, for a machine with a CUDA device (issue 19): builds charm with
# the GPU kernels for that device's architecture, runs the GPU tests (ctest -L gpu; each
# compares the GPU with the CPU bit for bit) and requires them to pass: here a skip (no
# usable device) is a failure. Results go to $OUT (default ./gpu-check): nvidia-smi, the
# build log, the test log, and the VRAM tier's benchmark (scripts/bench_vram.py: the
# synthetic OLMoE checkpoint with every expert in RAM, in VRAM, and half in VRAM).
#   scripts/gpu_check.sh            # needs the packages scripts/setup.sh installs, and nvcc
# Environment: CHARM_BUILD_DIR (default build-gpu), CHARM_CUDA_ARCH (default: the device's,
# from nvidia-smi's compute capability, e.g. 90 for H100/H200), CHARM_BENCH_LAYERS (the
# benchmark checkpoint's layers, default 4; 0 skips the benchmark).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-check}"
mkdir -p "$out"
build_dir="${CHARM_BUILD_DIR:-build-gpu}"

nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || { echo "gpu_check: nvidia-smi failed (no driver?)"; cat "$out/nvidia-smi.txt"; exit 1; }
arch="${CHARM_CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '.')}"
echo "gpu_check: building for sm_$arch in $build_dir"
{
  cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DCHARM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch"
  cmake --build "$build_dir" -j"$(nproc)" --target charm charm_cuda test_gpu_matmul test_gpu_experts
} > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }

# A skipped GPU test is reported by ctest as "Skipped"; here that is a failure.
set +e
ctest --test-dir "$build_dir" -L gpu --output-on-failure 2>&1 | tee "$out/ctest.log"
status=${PIPESTATUS[0]}
set -e
if grep -q "Skipped" "$out/ctest.log"; then
  echo "gpu_check: a GPU test was skipped on a machine that should have a device"
  exit 1
fi
layers="${CHARM_BENCH_LAYERS:-4}"
if ((layers > 0)); then
  python3 scripts/bench_vram.py --charm "$build_dir/charm" --layers "$layers" --repeat 2 \
    --out "$out/bench_vram.json" 2>&1 | tee "$out/bench_vram.log" || status=1
fi
exit "$status"
