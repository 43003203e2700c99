#!/usr/bin/env bash
# The multi-GPU corpus (benchmarks/corpus_multi) on a machine with two GPUs: each program alone,
# then captured, verified and timed (GPU busy time beside the original's), a capture holding
# several ranks (one process on two devices) verified with a planted wrong reduction too; a job's ranks also
# replayed together (their collectives among them), verified, with a planted wrong reduction
# (which must fail), and timed. Logs go to $OUT.
#   usage: scripts/multi_gpu_check.sh [PROGRAM ...]     (default: every program of the folder)
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/device_setup.sh || exit 1
out="${OUT:-gpu-logs}"
mkdir -p "$out"
work=$(mktemp -d)
nvidia-smi -L
programs=("$@")
[ ${#programs[@]} -gt 0 ] || programs=(benchmarks/corpus_multi/*.py)
for program in "${programs[@]}"; do
  name=$(basename "$program" .py)
  launcher=(python3)
  grep -q "torchrun" "$program" && launcher=(torchrun --standalone --nproc_per_node 2)
  echo "=== $name: alone"
  timeout 120 "${launcher[@]}" "$program" 2>&1 | tail -3
  echo "=== $name: capture"
  if [ "${launcher[0]}" = torchrun ]; then  # every rank's lines, prefixed [rankN]:
    timeout 180 "${launcher[@]}" --tee 3 -m replayfmt.capture -o "$work/$name.kreplay" --scope step "$program" \
      >"$out/$name.capture.log" 2>&1
  else
    timeout 180 python3 -m replayfmt.capture -o "$work/$name.kreplay" --scope step "$program" >"$out/$name.capture.log" 2>&1
  fi
  grep -E "error|Error|replayable|collectives|not recorded|rank[0-9]+\]:.*(loss|Traceback)" "$out/$name.capture.log" | tail -20
  for capture in "$work/$name"*.kreplay; do
    [ -f "$capture" ] || continue
    echo "=== $name: $(basename "$capture"): dump"
    python3 -m replayfmt_tools.dump_replay "$capture" 2>&1 | head -12
    echo "=== $name: $(basename "$capture"): verify"
    timeout 120 python3 -m replayfmt_tools.run_replay --verify "$capture" 2>&1 | tail -6
    echo "=== $name: $(basename "$capture"): benchmark"
    timeout 120 python3 -m replayfmt_tools.benchmark_replay --scope step "$capture" 2>&1 | tail -8
    # one capture holding several ranks (one process on two devices): a planted wrong reduction must fail
    op=$(python3 -m replayfmt_tools.dump_replay --format=jsonl --kind=collective "$capture" 2>/dev/null \
      | python3 -c 'import json,sys; rows=[json.loads(l) for l in sys.stdin]; ranks={r.get("rank") for r in rows}
print(next((r["index"] for r in rows if r.get("operation") == "AllReduce") if len(ranks) > 1 else (), ""))')
    if [ -n "$op" ]; then
      echo "=== $name: $(basename "$capture"): planted wrong reduction at operation $op (must fail)"
      timeout 180 python3 -m replayfmt_tools.run_replay --verify --collective-reduction "$op=max" "$capture" 2>&1 | tail -6
    fi
  done
  ranks=("$work/$name".rank*.kreplay)
  if [ -f "${ranks[0]}" ] && [ ${#ranks[@]} -gt 1 ]; then  # the ranks together, NCCL among them
    echo "=== $name: ranks together: verify"
    timeout 180 python3 -m replayfmt_tools.run_replay --verify "${ranks[@]}" 2>&1 | grep -v "^\[rank" | tail -8
    op=$(python3 -m replayfmt_tools.dump_replay --format=jsonl --kind=collective "${ranks[0]}" 2>/dev/null \
      | python3 -c 'import json,sys; print(next((r["index"] for r in map(json.loads, sys.stdin) if r.get("operation") == "AllReduce"), ""))')
    if [ -n "$op" ]; then
      echo "=== $name: ranks together: planted wrong reduction at operation $op (must fail)"
      timeout 180 python3 -m replayfmt_tools.run_replay --verify --collective-reduction "$op=max" "${ranks[@]}" 2>&1 \
        | grep -v "^\[rank" | tail -8
    fi
    echo "=== $name: ranks together: benchmark"
    timeout 180 python3 -m replayfmt_tools.benchmark_replay --scope step --repetitions 20 "${ranks[@]}" 2>&1 | tail -24
  fi
done 2>&1 | tee "$out/multi_gpu.log"
