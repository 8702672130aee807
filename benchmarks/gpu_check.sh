#!/usr/bin/env bash
# The real GPU paths, checked in a few minutes on a machine with an NVIDIA GPU (everything else in the tests runs
# them through fakes): nvidia-smi and NVML as `autotune hosts` and the runner read them, a real `autotune run` on
# one GPU with NCCL (its peak memory measured through NVML, a micro-batch far too large judged out of memory), and
# a real `autotune tune` on one GPU with the memory model on (a profile run, GPU memory read through NVML, real
# OOMs correcting the model), then its optimal command. It prints what it saw, one line a check, and exits 1 when
# a check failed.
#
#   bash benchmarks/gpu_check.sh [WORKDIR]          # from a checkout; PYTHON=... picks the interpreter
#
# Needs: an NVIDIA driver, a CUDA build of torch, DeepSpeed and this package's dependencies for $PYTHON (the
# checkout is put first on PYTHONPATH). Each step has a timeout (STEP_TIMEOUT, default 300 s).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
STEP_TIMEOUT=${STEP_TIMEOUT:-300}
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$(dirname "$(command -v "$PY" || echo /usr/bin/python3)"):$PATH"  # deepspeed beside the Python

die() { echo "gpu_check: $*" >&2; exit 1; }
ok() { echo "  ok: $*"; }
bad() { echo "  FAIL: $*"; }
step() { echo; echo "== $*"; }
autotune() { timeout "$STEP_TIMEOUT" "$PY" -m autotuner "$@"; }

# --- Before anything: a GPU, its driver, and a torch that can use it (one line and exit 1 otherwise).
command -v nvidia-smi >/dev/null 2>&1 || die "no NVIDIA GPU here: nvidia-smi not found (run this on a GPU machine)"
listed=$(timeout 30 nvidia-smi -L 2>&1) || die "nvidia-smi -L failed: $(tail -n 1 <<<"$listed")"
grep -q '^GPU [0-9]' <<<"$listed" || die "no NVIDIA GPU here: nvidia-smi -L lists none"
why=$("$PY" -c 'import torch, deepspeed, pynvml, autotuner
assert torch.cuda.is_available(), f"torch {torch.__version__} cannot use CUDA"' 2>&1 | tail -n 1) \
    || die "$PY is not ready for GPU runs: $why"
WORK=${1:-$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")}
mkdir -p "$WORK" || die "cannot make $WORK"

checks() {
echo "gpu_check: results in $WORK, $(date -u +%FT%TZ), step timeout ${STEP_TIMEOUT}s"
step "1. nvidia-smi"
echo "$listed" | sed 's/^/  /'
timeout 30 nvidia-smi --query-gpu=index,name,memory.used,memory.total,driver_version --format=csv | sed 's/^/  /'
COUNT=$(grep -c '^GPU [0-9]' <<<"$listed")
ok "$COUNT GPU(s); MIG instances: $(grep -c '^ *MIG ' <<<"$listed")"

step "2. NVML (what the runner and 'autotune run' read) against the probe of 'autotune hosts' (nvidia-smi)"
printf 'localhost slots=%s\n' "$COUNT" > "$WORK/hostfile"
if (exec 3<>/dev/tcp/127.0.0.1/22) 2>/dev/null; then
    autotune hosts -H "$WORK/hostfile" --accept-new-hosts --json > "$WORK/hosts.json"
    echo "  autotune hosts (over SSH to localhost): exit $?"
fi
if ! grep -q '"reachable": true' "$WORK/hosts.json" 2>/dev/null; then
    echo "  localhost:22 does not answer autotune's SSH: the probe 'autotune hosts' runs over SSH is run here"
    "$PY" - "$WORK/hosts.json" <<'EOF'
import json, subprocess, sys
from autotuner.backends.ssh.probe import parse_probe, probe_script
out = subprocess.run(["sh", "-c", probe_script(sys.executable)], capture_output=True, text=True, timeout=60)
json.dump([parse_probe("localhost", out.stdout).to_json()], open(sys.argv[1], "w"))
EOF
fi
"$PY" - "$WORK/hosts.json" <<'EOF' && ok "NVML and the probe agree" || bad "NVML and the probe disagree (above)"
import json, sys
from autotuner.gpu.nvml import find_gpus, local_inventory
probe = json.load(open(sys.argv[1]))[0]
gpus, why = find_gpus()
MiB = 1 << 20
print(f"  probe: reachable {probe['reachable']}, {len(probe['gpus'])} GPU(s), python {probe['python']}, "
      f"deepspeed {probe['deepspeed']}, gpu_error {probe['gpu_error']}")
for g in probe["gpus"]:
    print(f"    probe  {g['index']} {g['name']}: {g['memory_total'] // MiB} MiB, free {g['memory_free']}, mig {g['mig']}")
for g in gpus:
    print(f"    NVML   {g.index} {g.name}: {g.memory_total // MiB} MiB, free {g.memory_free // MiB} MiB, mig {g.mig}")
assert gpus, f"NVML found no GPU: {why}"
slots = local_inventory(None)
print(f"  autotune's slots here: {slots.count} {slots.accelerator}, type {slots.gpu_type}, {slots.memory} bytes")
assert len(gpus) == len(probe["gpus"]), "not the same number of GPUs"
for g, p in zip(gpus, probe["gpus"]):
    assert g.mig is not None or g.memory_total // MiB == p["memory_total"] // MiB, (g, p)
EOF

SLOT=$("$PY" -c 'from autotuner.gpu.nvml import local_inventory; print(local_inventory(None).gpus[0].slot_id)')
echo "  the runs below use slot localhost:$SLOT (the first GPU, or MIG instance, autotune lists)"

step "3. autotune run on one GPU (NCCL): peak memory through NVML, and an OOM from a micro-batch far too large"
cat > "$WORK/run.hjson" <<EOF
{
  name: gpucheck
  script: $ROOT/experiments/train.py
  args: ["--steps", "8", "--hidden", "4096"]
  num_gpus: 1
  timeout: 240
  env: {"NCCL_DEBUG": "INFO"}
  ds_config: {
    gradient_accumulation_steps: 1
    optimizer: {"type": "Adam", "params": {"lr": 0.001, "torch_adam": true}}
    steps_per_print: 1000
  }
  # 16,777,216 samples of 4,096 activations: 256 GiB for one layer's output, more than any GPU holds.
  space: {"train_micro_batch_size_per_gpu": [4096, 16777216]}
}
EOF
autotune run "$WORK/run.hjson" -o "$WORK/run" --include localhost:$SLOT --placement memory --fail-on no-result \
    > "$WORK/run.log" 2>&1
echo "  autotune run: exit $? (log $WORK/run.log)"
autotune report "$WORK/run" --format json > "$WORK/run.json" 2>>"$WORK/run.log"
"$PY" - "$WORK/run.json" "$WORK/run" <<'EOF'
import json, pathlib, sys
report, results = json.load(open(sys.argv[1])), pathlib.Path(sys.argv[2])
runs = {r["name"]: r for r in report["experiments"]}
for r in runs.values():
    print(f"  {r['name']}: {r['state']} {r['reason'] or ''} metric {r['metric']} peak_memory {r['peak_memory']} "
          f"detail {(r['detail'] or '')[:160]}")
fits, oom = runs.get("gpucheck_mbs4096"), runs.get("gpucheck_mbs16777216")
print("  ok:" if fits and fits["state"] == "succeeded" else "  FAIL:", "mbs 4096 trained and DeepSpeed wrote metrics")
print("  ok:" if fits and (fits["peak_memory"] or 0) > 0 else "  FAIL:",
      "its peak memory was measured through NVML (none: the container may hide pids from NVML; rerun with --debug)")
print("  ok:" if oom and oom["state"] == "failed" and oom["reason"] == "oom" else "  FAIL:",
      "mbs 16777216 was judged out of memory")
logs = " ".join(p.read_text(errors="replace") for p in results.glob("gpucheck_mbs4096/std*.log"))
print("  ok:" if "NCCL INFO" in logs else "  FAIL:", "NCCL was initialized (NCCL_DEBUG=INFO lines in the logs)")
print("  ok:" if logs and "terminate called" not in logs else "  FAIL:", "no abort at exit in the run's logs")
EOF

step "4. autotune tune on one GPU: the memory model on (profile run, GPU memory from NVML), real OOMs"
cat > "$WORK/tune.json" <<'EOF'
{
  "gradient_accumulation_steps": 1,
  "optimizer": {"type": "Adam", "params": {"lr": 0.001, "torch_adam": true}},
  "steps_per_print": 1000,
  "zero_optimization": {"stage": [0, 3]},
  "autotuning": {"enabled": true, "metric": "throughput", "start_profile_step": 3, "end_profile_step": 5,
                 "min_train_micro_batch_size_per_gpu": 1024, "max_train_micro_batch_size_per_gpu": 16777216}
}
EOF
autotune tune --num_gpus 1 --include localhost:$SLOT -o "$WORK/tune" --confirm 0 --deadline 180 \
    "$ROOT/experiments/train.py" --deepspeed_config "$WORK/tune.json" --steps 8 --hidden 1024 > "$WORK/tune.log" 2>&1
echo "  autotune tune: exit $? (log $WORK/tune.log)"
tail -n 4 "$WORK/tune.log" | sed 's/^/  | /'
autotune report "$WORK/tune" --format json > "$WORK/tune.json.out" 2>>"$WORK/tune.log"
"$PY" - "$WORK/tune.json.out" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
runs = report["experiments"]
for r in runs:
    print(f"  {r['name']}: {r['state']} {r['reason'] or ''} metric {r['metric']} peak_memory {r['peak_memory']}")
print(f"  memory: {report['memory']}")
profile = [r for r in runs if "_profile" in r["name"]]
print("  ok:" if profile and profile[0]["state"] == "succeeded" and profile[0]["metrics"].get("num_params")
      else "  FAIL:", "the profile run counted the parameters and measured the activations")
print("  ok:" if "GPUs of" in (report["memory"] or "") else "  FAIL:", "the memory model knew the GPU's memory")
print("  ok:" if report["best"] else "  FAIL:", f"a best was named: {report['best']}")
ooms = sum(r["reason"] == "oom" for r in runs)
print(f"  (runs out of memory: {ooms} of {len(runs)}; measured peaks: {sum(bool(r['peak_memory']) for r in runs)})")
EOF
if [ -f "$WORK/tune/cmd_optimal.txt" ]; then
    port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    command=$(sed "0,/deepspeed /s//deepspeed --master_port $port /" "$WORK/tune/cmd_optimal.txt")  # a free port
    (cd "$WORK" && timeout "$STEP_TIMEOUT" bash -c "$command") > "$WORK/optimal.log" 2>&1
    rc=$?
    grep -h '^trained ' "$WORK/optimal.log" | sed 's/^/  | /'
    [ "$rc" -eq 0 ] && grep -q '^trained 8 steps' "$WORK/optimal.log" \
        && ok "cmd_optimal.txt trained (exit 0)" || bad "cmd_optimal.txt: exit $rc (log $WORK/optimal.log)"
else
    bad "no cmd_optimal.txt"
fi
}

checks 2>&1 | tee "$WORK/gpu_check.txt"
passed=$(grep -c '^  ok:' "$WORK/gpu_check.txt")
failed=$(grep -c '^  FAIL:' "$WORK/gpu_check.txt")
echo
echo "gpu_check: $passed ok, $failed failed, in $SECONDS s; what it saw: $WORK/gpu_check.txt"
[ "$failed" -eq 0 ]
