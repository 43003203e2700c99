#!/usr/bin/env bash
# The device checks the open issues' done-when items ask for, in the order a session with a short
# device budget should spend it; each step bounded, each log under $OUT (or ./gpu-logs), a
# one-line result per step printed last.
#   usage: scripts/open_issue_checks.sh [STEP ...]   (default: every step)
#   steps: suite multi multi2 dropped jaxwhole jaxstep reduce diffs corpus
# A device call runs at most 10 minutes: give each call the steps that fit (suite alone; multi,
# then multi2, each alone on a two-GPU machine: the multi-GPU corpus in two halves; dropped alone:
# its planted kernels each cost a verification with poisoned and reference replays; jaxwhole,
# jaxstep, reduce and diffs; corpus alone).
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/device_setup.sh || exit 1
out="${OUT:-gpu-logs}"
mkdir -p "$out"
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(suite multi multi2 dropped jaxwhole jaxstep reduce diffs corpus)
results=()
step() {  # name, seconds, command...
  local name=$1 limit=$2
  shift 2
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local code=$?
  results+=("$name: exit $code ($(tail -1 "$out/$name.log" | cut -c1-150))")
}
for s in "${steps[@]}"; do
  case $s in
    suite) step suite 560 python3 -m pytest -q -p no:cacheprovider -n 4 tests/gpu ;;
    multi) step multi 560 bash scripts/multi_gpu_check.sh benchmarks/corpus_multi/torch_two_device_pipeline.py \
      benchmarks/corpus_multi/torch_ddp_step.py benchmarks/corpus_multi/torch_fsdp2_step.py \
      benchmarks/corpus_multi/jax_sharded_step.py ;;
    multi2) step multi2 560 bash scripts/multi_gpu_check.sh benchmarks/corpus_multi/torch_tensor_parallel_step.py \
      benchmarks/corpus_multi/torch_p2p_pipeline_step.py benchmarks/corpus_multi/jax_zero_shard_map_step.py ;;
    dropped) step dropped 540 python3 scripts/issue44_dropped_results.py --out /tmp/i44 ;;
    jaxwhole) step jaxwhole 240 python3 benchmarks/jax_whole_bench.py --check ;;
    jaxstep) step jaxstep 400 python3 benchmarks/jax_step_bench.py --check ;;
    reduce) step reduce 400 python3 benchmarks/reduce_demo.py --work /tmp/reduce_demo --steps capture,offbyone,oob,command,jit --max-seconds 100 ;;
    diffs) step diffs 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_diff_reruns_gpu.py ;;
    corpus) step corpus 560 python3 benchmarks/corpus.py --shard 1/2 --budget 480 ;;
    *) echo "unknown step $s"; exit 2 ;;
  esac
done
printf '%s\n' "${results[@]}"
