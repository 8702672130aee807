#!/bin/sh
# A stand-in for DeepSpeed's launcher on a fake GPU (named as such): it reads the config the runner hands over
# (--deepspeed_config, base64), "needs" memory that grows with the ZeRO stage and the micro-batch size, and past
# the fake GPU's 100 GiB fails with the runtime's own OOM message; otherwise it writes the metrics DeepSpeed's
# engine would, with a throughput that is a known function. Each run is logged to $OOM_STANDIN_LOG, and takes
# $OOM_STANDIN_SECONDS (default 0). $OOM_STANDIN_LUCKY="STAGE MBS FACTOR": that config's first run measures its
# throughput times FACTOR (a lucky outlier), its later runs the true value.
while [ $# -gt 0 ]; do case "$1" in --deepspeed_config) cfg="$2"; shift;; esac; shift; done
exec python3 - "$cfg" <<'PY'
import base64, json, os, sys, time
config = json.loads(base64.urlsafe_b64decode(sys.argv[1]))
stage, mbs = config["zero_optimization"]["stage"], config["train_micro_batch_size_per_gpu"]
with open(os.environ["OOM_STANDIN_LOG"], "a") as log:
    log.write(f"z{stage} mbs{mbs}\n")
with open(os.environ["OOM_STANDIN_LOG"]) as log:
    first = log.read().splitlines().count(f"z{stage} mbs{mbs}") == 1
time.sleep(float(os.environ.get("OOM_STANDIN_SECONDS", "0")))
if {0: 40, 1: 30, 2: 20, 3: 10}[stage] + 2.0 * mbs > 100:
    sys.exit("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
throughput = mbs * 100 / (1 + mbs / 64) * (1 - 0.05 * stage)
lucky = os.environ.get("OOM_STANDIN_LUCKY", "").split()
if lucky and (int(lucky[0]), int(lucky[1])) == (stage, mbs) and first:
    throughput *= float(lucky[2])
with open(config["autotuning"]["metric_path"], "w") as f:
    json.dump({"throughput": throughput, "latency": 1 / throughput, "FLOPS_per_gpu": 1.0}, f)
PY
