#!/usr/bin/env bash
# The whole GPU suite, on the device machine (see /work/.library/device): installs the wheels the
# image lacks (from .whl, made by ../shared/device/prepare-wheels.sh) and the project, then runs
# tests/gpu and the GPU benchmarks. Logs go to $OUT (or ./gpu-logs).
#   usage: scripts/run_gpu_suite.sh [tests|bench|all]    (default all)
set -uo pipefail
cd "$(dirname "$0")/.."
what="${1:-all}"
out="${OUT:-gpu-logs}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >"$out/install.log" 2>&1 || { cat "$out/install.log"; exit 1; }
export PATH="$HOME/.local/bin:/usr/local/cuda/bin:$PATH"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
status=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  python3 -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tee "$out/gpu-tests.log"
  status=${PIPESTATUS[0]}
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  # --check: a missed goal fails the suite (each benchmark prints its misses last)
  python3 benchmarks/replay_bench.py --check 2>&1 | tee "$out/replay_bench.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  python3 benchmarks/fidelity_bench.py --check 2>&1 | tee "$out/fidelity_bench.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  python3 benchmarks/tune_bench.py --check 2>&1 | tee "$out/tune_bench.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  python3 benchmarks/capture_bench.py --check 2>&1 | tee "$out/capture_bench.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  python3 benchmarks/native_capture_bench.py --check 2>&1 | tee "$out/native_capture_bench.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  python3 benchmarks/verify_bench.py --check 2>&1 | tee "$out/verify_bench.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  # the timing goals the GPU tests do not assert (they hold the behaviour, under any load)
  python3 benchmarks/timing_goals_bench.py --check 2>&1 | tee "$out/timing_goals_bench.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
exit "$status"
