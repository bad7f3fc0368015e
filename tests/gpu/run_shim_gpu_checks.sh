#!/usr/bin/env bash
# The shim's checks on a real NVIDIA GPU: builds the shim and its test programs against the
# machine's libcuda, then runs the same pytest suite that CI runs against the simulated driver
# (tests/shim, unchanged: the kernel is PTX loaded with cuModuleLoadData) with the real driver
# libraries behind the shim - the accounting stress and concurrent double free, IPC and exported
# VMM handles in an NCCL-like ring, sleep mode, two GPUs per process where the machine has them,
# a CUDA graph under a compute cap - plus the overhead benchmark (cuMemGetInfo_v2 and graph
# launches included). Writes the results to
# $RESULTS_DIR/shim-<date>.txt and $RESULTS_DIR/overhead.{md,json} (RESULTS_DIR defaults to
# tests/gpu/results: commit them after a run on a real GPU). Exits 1 if the suite or the
# benchmark failed (the results are written either way).
#
#   tests/gpu/run_shim_gpu_checks.sh [DRIVER_LIB_DIR]
#
# DRIVER_LIB_DIR holds NVIDIA's libcuda.so.1 and libnvidia-ml.so.1 (default: found with
# ldconfig). Needs the repository's .venv (make venv). A dry run of the script itself against
# the simulated driver: SIMGPU_CONFIG=<node config> RESULTS_DIR=/tmp/... $0 build/simgpu
# (never commit a simulator run's results).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
LDCONFIG=$(command -v ldconfig || echo /sbin/ldconfig)
DRIVER_DIR=${1:-$(dirname "$("$LDCONFIG" -p | awk '/libcuda\.so\.1 / {print $NF; exit}')")}
[ -e "$DRIVER_DIR/libcuda.so.1" ] || { echo "no libcuda.so.1 in $DRIVER_DIR" >&2; exit 2; }
# Absolute: the shim's installation links to the driver libraries by this path.
DRIVER_DIR=$(realpath "$DRIVER_DIR")
RESULTS_DIR=${RESULTS_DIR:-tests/gpu/results}
mkdir -p "$RESULTS_DIR"
OUT=$RESULTS_DIR/shim-$(date -u +%Y%m%d-%H%M).txt
status=0
{
  status=0
  echo "# Tessera shim GPU checks, $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -nm), driver $DRIVER_DIR"
  nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv,noheader 2>&1 || true
  echo
  # TESSERA_SHIM_DRIVER_DIR makes tests/shim run against these libraries instead of simgpu.
  TESSERA_SHIM_DRIVER_DIR="$DRIVER_DIR" timeout 1800 $PY -m pytest tests/shim -q -rA -p no:cacheprovider 2>&1 \
    || { echo "tests/shim FAILED"; status=1; }
  echo
  { timeout 600 $PY benchmarks/shim/overhead.py --driver-dir "$DRIVER_DIR" --out "$RESULTS_DIR" 2>&1 \
      && cat "$RESULTS_DIR/overhead.md"; } || { echo "overhead benchmark FAILED"; status=1; }
  exit $status
} | tee "$OUT" || status=$?
echo "results: $OUT"
exit $status
