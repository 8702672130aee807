"""A stand-in for DeepSpeed's launcher and engine (named as such), for duration models: it reads the config the
runner hands over (--deepspeed_config, base64), "starts up" for $STEPS_STARTUP seconds, then takes as many steps
as DeepSpeed's engine would with autotuning on (end_profile_step + 1), each $STEPS_PER_SAMPLE x micro-batch
size seconds, and writes the metrics the engine writes (`latency`: microseconds per step)."""
import base64
import json
import os
import sys
import time

config = json.loads(base64.urlsafe_b64decode(sys.argv[sys.argv.index("--deepspeed_config") + 1]))
section = config["autotuning"]
step = float(os.environ.get("STEPS_PER_SAMPLE", "0.02")) * config["train_micro_batch_size_per_gpu"]
time.sleep(float(os.environ.get("STEPS_STARTUP", "0.3")) + (section["end_profile_step"] + 1) * step)
with open(section["metric_path"], "w") as f:
    json.dump({"throughput": 1 / step, "latency": step * 1e6}, f)
