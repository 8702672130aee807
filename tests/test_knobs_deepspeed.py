"""Real DeepSpeed on CPU accepts the ZeRO knob values full mode generates: for each stage, an engine starts and
takes optimizer steps with every knob of the stage's space at its other values at once (two configs a stage, so
that each bucket size of the table is used). Every combination was checked once on 2 ranks (README, Full mode);
this keeps the check cheap for CI, in its own process (DeepSpeed's distributed state stays out of pytest's)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.deepspeed  # one real DeepSpeed test at a time (conftest.py)

SCRIPT = """
import json, os, sys
import torch, deepspeed
from autotuner.tune.knobs import KNOBS
deepspeed.init_distributed(dist_backend="gloo")
done = []
for stage in (1, 2, 3):
    for pick in (1, 2):
        knobs = {k.key: k.values[pick % len(k.values)] for k in KNOBS if stage in k.searched}
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
                  "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
                  "zero_optimization": {"stage": stage, **knobs}}
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        for _ in range(2):
            engine.backward(engine(torch.randn(2, 8)).pow(2).mean())
            engine.step()
        zero = engine._config.zero_config  # as DeepSpeed read the config
        seen = {k: getattr(zero, k.removeprefix("stage3_")) for k in knobs}
        done.append({"stage": stage, "knobs": knobs, "engine": seen, "steps": engine.global_steps})
print("RESULT " + json.dumps(done))
"""


def test_deepspeed_starts_with_the_knob_values_full_mode_generates(tmp_path):
    env = os.environ | {"DS_ACCELERATOR": "cpu", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517", "RANK": "0",
                        "WORLD_SIZE": "1", "LOCAL_RANK": "0", "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    done = json.loads(next(line for line in run.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert [d["stage"] for d in done] == [1, 1, 2, 2, 3, 3] and all(d["steps"] == 2 for d in done)
    for d in done:  # the engine took what the config said
        assert d["engine"] == d["knobs"], d
    used = {(key, value) for d in done for key, value in d["knobs"].items()}
    assert {("reduce_bucket_size", v) for v in (50_000_000, 1_000_000_000)} <= used
