"""A stand-in for DeepSpeed's launcher and engine (named as such), for duration models: it reads the config the
runner hands over (--deepspeed_config, base64), "starts up" for $STEPS_STARTUP seconds, then takes as many steps
as DeepSpeed's engine would with autotuning on (end_profile_step + 1), each $STEPS_PER_SAMPLE x micro-batch
size seconds, and writes the metrics the engine writes (`latency`: microseconds per step). With $STEPS_PROGRESS
set it writes each step to the progress file as a script would (spec/progress.py) and, as a script's own metric,
no `latency`; with $STEPS_NOISE (a relative standard deviation) each step's throughput spread by that, seeded by
the step's number."""
import base64
import json
import os
import random
import sys
import time

config = json.loads(base64.urlsafe_b64decode(sys.argv[sys.argv.index("--deepspeed_config") + 1]))
section = config["autotuning"]
step = float(os.environ.get("STEPS_PER_SAMPLE", "0.02")) * config["train_micro_batch_size_per_gpu"]
progress = os.environ["AUTOTUNE_PROGRESS_PATH"] if os.environ.get("STEPS_PROGRESS") else None
time.sleep(float(os.environ.get("STEPS_STARTUP", "0.3")))
for number in range(section["end_profile_step"] + 1):
    time.sleep(step)
    if progress:
        with open(progress, "a") as f:
            spread = random.Random(number).gauss(0, float(os.environ.get("STEPS_NOISE", "0")))
            f.write(json.dumps({"step": number, "time": time.time(), "throughput": (1 + spread) / step}) + "\n")
with open(section["metric_path"], "w") as f:
    json.dump({"throughput": 1 / step} | ({} if progress else {"latency": step * 1e6}), f)
