#!/usr/bin/env bash
# The checks that need a GPU, in one run, on a machine with one (the CI machine has none, so
# these paths skip there): first tierswap.torch with the model on the GPU (its pytest module,
# tinylm at widths 256 and 1024 bit-identical to the CPU path with state on the host and on
# NVMe, tokens/s against torch's fused AdamW on GPU-resident masters), then every test binary with the GPU visible (the CUDA kernels against the
# scalar reference, the optimizer and tier manager with a real device tier present), the demo's
# GPU-stepped sub-groups against the CPU bit for bit (state digests), the split step's time with
# the GPU part beside the CPU part and in turn, the CUDA kernels' bandwidth and the pinned copy
# rates, and the placement probe with a plan made from it, measured.
#
#   bench/gpu_check.sh CLI TESTS_DIR OUT_DIR
#     CLI        the tierswap binary (build/tierswap)
#     TESTS_DIR  where the test binaries are (build/tests)
#     OUT_DIR    receives summary.txt, torch.log, torch_gpu.jsonl, tests.log, demo.jsonl,
#                kernels.json, probe.json
#   PLAN_PARAMS (environment) sizes the planned demo of step 4 (default 2B).
#   PYTHON (environment): an interpreter whose torch has CUDA (default python3); the tierswap
#   module is the build's (the directory of CLI, python/).
set -u
CLI=${1:?usage: gpu_check.sh CLI TESTS_DIR OUT_DIR}
TESTS=${2:?usage: gpu_check.sh CLI TESTS_DIR OUT_DIR}
OUT=${3:?usage: gpu_check.sh CLI TESTS_DIR OUT_DIR}
SRC=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
S="$OUT/summary.txt"
say() { echo "$*" | tee -a "$S"; }

say "== $(date -u +%FT%TZ) $(git -C "$SRC" rev-parse --short HEAD 2>/dev/null)"
nvidia-smi -L 2>&1 | tee -a "$S"
"$CLI" info 2>&1 | tee -a "$S"

# 0. tierswap.torch on the GPU: the device path's pytest module (its CUDA test runs here), the
# exactness check, and the speed against the in-memory recipe.
say "== tierswap.torch on the GPU"
PY=${PYTHON:-python3}
export PYTHONPATH="$(cd "$(dirname "$CLI")" && pwd)/python:$SRC/tests/python"
timeout 240 "$PY" -m pytest -q -p no:cacheprovider -rs "$SRC/tests/python/test_torch_device.py" \
  > "$OUT/torch.log" 2>&1
tail -5 "$OUT/torch.log" | tee -a "$S"
timeout 240 "$PY" "$SRC/bench/torch_gpu.py" check --widths 256,1024 --steps 4 \
  > "$OUT/torch_gpu.jsonl" 2>> "$OUT/torch.log"
timeout 300 "$PY" "$SRC/bench/torch_gpu.py" speed --width 1024 --steps 10 --reps 3 \
  >> "$OUT/torch_gpu.jsonl" 2>> "$OUT/torch.log"
cat "$OUT/torch_gpu.jsonl" | tee -a "$S"

# 1. Every test binary, eight at a time, each in its own temporary directory.
say "== tests"
run_one() {
  local t=$1 log
  log=$(mktemp)
  local start=$SECONDS
  TMPDIR=$(mktemp -d) timeout 180 "$t" --gtest_brief=1 > "$log" 2>&1
  local rc=$?
  echo "$(basename "$t") rc=$rc $((SECONDS - start)) s" > "$log.head"
  cat "$log.head" "$log"
}
export -f run_one
ls "$TESTS"/test_* | xargs -P 8 -I{} bash -c 'run_one {}' > "$OUT/tests.log" 2>&1
grep -E "^test_.* rc=" "$OUT/tests.log" | tee -a "$S"
grep -E "\[  FAILED  \]|\[  SKIPPED \]" "$OUT/tests.log" | sort -u | tee -a "$S"

# 2. The demo: half the parameters' memory-only state on the GPU, stepped there. The digests of
# the final master, moments and 16-bit parameters must equal the CPU-only run's.
say "== demo (digests must be equal; seconds are steps 2-4)"
plan=$(mktemp --suffix=.json)
cat > "$plan" <<'PLAN'
{"format": "tierswap.plan", "version": 1, "persist_resident_state": false, "subgroups": [
  {"numel": 500, "state_tier": "host", "step_device": "cpu"},
  {"numel": 500, "state_tier": "gpu", "step_device": "gpu"}]}
PLAN
demo() {  # label, env assignments..., -- demo arguments...
  local label=$1
  shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  env "${envs[@]}" "$CLI" demo --params 128M --sub-group 8M --steps 4 --host-budget 3GiB \
    --json "$@" > "$OUT/demo.$label.json" 2>> "$OUT/demo.err"
  local rc=$?
  if [ "$rc" -ne 0 ] && [ -z "${debugged:-}" ] && command -v cuda-gdb > /dev/null; then
    debugged=1  # the first failure once more under a debugger, for its backtrace
    env "${envs[@]}" cuda-gdb -batch -ex run -ex bt --args "$CLI" demo --params 128M \
      --sub-group 8M --steps 4 --host-budget 3GiB "$@" 2>&1 | tail -40 >> "$OUT/demo.err"
  fi
  python3 - "$label" "$rc" "$OUT/demo.$label.json" <<'PY' | tee -a "$S"
import json, sys
label, rc, path = sys.argv[1:]
try:
    j = json.load(open(path))
except Exception as e:
    print(f"{label}: rc={rc}, no JSON ({e})"); sys.exit()
steps = j["steps"]
print(f"{label}: rc={rc} tier={j['device_tier']} digests={j['digests']} "
      f"seconds={[round(s['seconds'], 4) for s in steps[1:]]} "
      f"gpu_seconds={[round(s['gpu_seconds'], 4) for s in steps[1:]]} "
      f"dev_in={[s['device_in_bytes'] for s in steps[1:]]} "
      f"d16_match={j['param16_device_copy_matches']}")
PY
}
for clip in 0 1; do
  demo cpu$clip TIERSWAP_DEVICE_TIER=off -- --max-grad-norm $clip
  demo gpu$clip -- --plan "$plan" --max-grad-norm $clip
  demo serial$clip -- --plan "$plan" --max-grad-norm $clip --serial-gpu-step
  demo overlap$clip -- --plan "$plan" --max-grad-norm $clip --overlap
  demo sim$clip TIERSWAP_DEVICE_TIER=simulated TIERSWAP_DEVICE_BUDGET=2GiB -- --plan "$plan" --max-grad-norm $clip
done
for r in 1 2 3; do  # the split step's time, alternating
  demo concurrent.r$r -- --plan "$plan" --max-grad-norm 0
  demo serial.r$r -- --plan "$plan" --max-grad-norm 0 --serial-gpu-step
done
( for f in "$OUT"/demo.*.json; do python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))))' "$f" 2>/dev/null; done ) > "$OUT/demo.jsonl"
rm -f "$OUT"/demo.*.json

# 3. The CUDA kernels against a device-to-device copy; the pinned copy rates.
say "== kernels"
"$CLI" bench kernels --device gpu --params 256M --reps 9 > "$OUT/kernels.txt" 2>&1
cat "$OUT/kernels.txt" | tee -a "$S"
"$CLI" bench kernels --device gpu --params 256M --reps 9 --json > "$OUT/kernels.json" 2>&1

# 4. The placement probe (GPU attributes, copy rates, the CPU kernel, NVMe in /tmp), a plan for
# PLAN_PARAMS parameters (default 2B: 20 GiB of GPU state) made from it, and the demo stepping by
# that plan: the cost model's predicted step against the measured one.
say "== probe, plan, the demo by the plan"
"$CLI" probe --nvme-dir /tmp --out "$OUT/probe.json" 2>&1 | tail -3 | tee -a "$S"
python3 -c 'import json,sys; p=json.load(open(sys.argv[1])); print(p["description"]); print(json.dumps(p.get("gpus"), indent=1))' "$OUT/probe.json" 2>&1 | tee -a "$S"
pplan=$(mktemp --suffix=.json)
"$CLI" plan --params "${PLAN_PARAMS:-2B}" --profile "$OUT/probe.json" --no-overlap --backward-s 0 \
  --out "$pplan" 2>&1 | tail -5 | tee -a "$S"
"$CLI" demo --params "${PLAN_PARAMS:-2B}" --host-budget 16GiB --steps 4 --plan "$pplan" \
  --max-grad-norm 0 --json 2>> "$OUT/demo.err" | python3 -c '
import json, sys
s = json.load(sys.stdin)["steps"]
print("measured by the plan: seconds", [round(x["seconds"], 4) for x in s[1:]],
      "gpu_seconds", [round(x["gpu_seconds"], 4) for x in s[1:]])' 2>&1 | tee -a "$S"
say "== done $(date -u +%FT%TZ)"
