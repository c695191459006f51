#!/usr/bin/env bash
# Run 3 (2026-11-27, H200): the split step (half the state on the GPU) with the GPU lane's waits
# spinning (TIERSWAP_CUDA_SPIN_SYNC=1: cudaStreamSynchronize) against blocking (an event made with
# cudaEventBlockingSync), concurrent and serial, alternating; then the split at 1B parameters.
# Built with run3-blocking-sync.patch applied to src/device/cuda_runtime.cu (not kept: no gain).
#   run3-sync-ab.sh build/tierswap OUT_DIR
CLI=$1; OUT=$2
plan=$(mktemp --suffix=.json)
cat > "$plan" <<'PLAN'
{"format": "tierswap.plan", "version": 1, "persist_resident_state": false, "subgroups": [
  {"numel": 500, "state_tier": "host", "step_device": "cpu"},
  {"numel": 500, "state_tier": "gpu", "step_device": "gpu"}]}
PLAN
one() {  # label, size, budget, sub-group, steps, extra env..., -- args
  local label=$1 size=$2 budget=$3 sg=$4 steps=$5; shift 5
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  env "${envs[@]}" "$CLI" demo --params $size --sub-group $sg --steps $steps --host-budget $budget \
    --plan "$plan" --max-grad-norm 0 --json "$@" 2>>"$OUT/ab.err" | python3 -c '
import json,sys
j=json.load(sys.stdin); s=j["steps"]
print(json.dumps({"label": sys.argv[1], "digests": j["digests"], "seconds": [x["seconds"] for x in s], "gpu_seconds": [x["gpu_seconds"] for x in s]}))' "$label" >> "$OUT/ab.jsonl" || echo "$label failed" >> "$OUT/ab.jsonl"
}
for r in 1 2 3 4 5; do
  one conc.spin 128M 3GiB 8M 6 TIERSWAP_CUDA_SPIN_SYNC=1 --
  one conc.block 128M 3GiB 8M 6 --
  one serial.spin 128M 3GiB 8M 6 TIERSWAP_CUDA_SPIN_SYNC=1 -- --serial-gpu-step
  one serial.block 128M 3GiB 8M 6 -- --serial-gpu-step
done
for r in 1 2; do
  one big.conc 1B 16GiB 32M 4 --
  one big.serial 1B 16GiB 32M 4 -- --serial-gpu-step
done
