#!/usr/bin/env bash
# The shim's checks on a real NVIDIA GPU: builds the shim and its test programs against the
# machine's libcuda, then runs the same pytest suite that CI runs against the simulated driver
# (tests/shim, unchanged: the kernel is PTX loaded with cuModuleLoadData) with the real driver
# libraries behind the shim, plus the overhead benchmark. Writes the results to
# tests/gpu/results/shim-<date>.txt (commit it).
#
#   tests/gpu/run_shim_gpu_checks.sh [DRIVER_LIB_DIR]
#
# DRIVER_LIB_DIR holds NVIDIA's libcuda.so.1 and libnvidia-ml.so.1 (default: found with
# ldconfig). Needs the repository's .venv (make venv).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
DRIVER_DIR=${1:-$(dirname "$(ldconfig -p | awk '/libcuda.so.1 / {print $NF; exit}')")}
[ -e "$DRIVER_DIR/libcuda.so.1" ] || { echo "no libcuda.so.1 in $DRIVER_DIR" >&2; exit 2; }
mkdir -p tests/gpu/results
OUT=tests/gpu/results/shim-$(date -u +%Y%m%d-%H%M).txt
{
  echo "# Tessera shim GPU checks, $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -nm)"
  nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv,noheader || true
  echo
  # TESSERA_SHIM_DRIVER_DIR makes tests/shim run against these libraries instead of simgpu.
  TESSERA_SHIM_DRIVER_DIR="$DRIVER_DIR" timeout 1800 $PY -m pytest tests/shim -q -rA -p no:cacheprovider 2>&1 || true
  echo
  timeout 600 $PY benchmarks/shim/overhead.py --driver-dir "$DRIVER_DIR" 2>&1 && cat benchmarks/shim/results/overhead.md || true
} | tee "$OUT"
echo "results: $OUT"
