#!/usr/bin/env bash
# On the device machine (issue 16, JAX): the example alone, its capture with XLA's default settings
# (timed), dump, verify, benchmark; the instrumented capture (scripts/jax_capture_trace.py) only
# when the plain one fails; then the GPU tests for bounded snapshots. Logs under $OUT.
set -u
export PYTHONUNBUFFERED=1
out="${OUT:-gpu-logs}"
mkdir -p "$out"
work=$(mktemp -d)
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
python3 -c "import jax, jaxlib; print('jax', jax.__version__, jaxlib.__version__, jax.devices())" 2>&1 | tail -1
/usr/bin/time -f "program alone: %e s" python3 examples/capture/jax_jit.py 2>&1 | tail -2
/usr/bin/time -f "capture: %e s" timeout 120 python3 -m replayfmt.capture -o "$work/jax.kreplay" --keep-partial \
  examples/capture/jax_jit.py >"$out/capture.log" 2>&1
rc=$?
tail -25 "$out/capture.log"
echo "capture rc $rc"
if [ -f "$work/jax.kreplay" ]; then
  ls -la "$work/jax.kreplay"
  timeout 60 dump-replay --summary "$work/jax.kreplay" 2>&1 | head -30
  timeout 60 dump-replay --format=jsonl "$work/jax.kreplay" >"$out/dump.jsonl" 2>&1
  grep -c '"kind":"state"' "$out/dump.jsonl"
  timeout 60 run-replay --verify --tolerance "$work/jax.kreplay" 2>&1 | tail -12
  timeout 60 benchmark-replay --repetitions=3 "$work/jax.kreplay" 2>&1 | tail -12
fi
if ! grep -q "replayable: yes" "$out/capture.log"; then
  timeout 100 python3 scripts/jax_capture_trace.py "$work/trace.kreplay" >"$out/trace.out" 2>&1
  echo "trace rc $?"
  grep -vE "EVENT launch" "$out/trace-events.log" | head -120
  grep -E "SNAPSHOT|READ|ERROR|table|live" "$out/trace-events.log" | tail -40
fi
t=tests/gpu/test_capture_frameworks_gpu.py
timeout 200 python3 -m pytest -q -p no:cacheprovider "$t::test_torch_bounded_snapshot_skips_free_blocks" \
  "$t::test_jax_jit_default_arena" "$t::test_jax_jit_donated_params" 2>&1 | tee "$out/gpu-tests.log" | tail -40
# the whole arena, as before bounded snapshots (where the CUDA_ERROR_INVALID_VALUE came from)
/usr/bin/time -f "whole-arena capture: %e s" timeout 100 python3 -m replayfmt.capture -o "$work/whole.kreplay" \
  --keep-partial --whole-allocations --max-snapshot-gib 80 examples/capture/jax_jit.py >"$out/whole.log" 2>&1
grep -E "snapshots|error|replayable|unsupported" "$out/whole.log" | head -20
tail -2 "$out/whole.log"
