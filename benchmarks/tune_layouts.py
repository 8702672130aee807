"""`autotune tune` over layouts (tensor parallel x ZeRO x micro-batch, and gradient checkpointing as a script knob)
against the grid, through the real runner, on the fake-GPU stand-in (tests/oom_standin.sh: AutoTP shards the
parameters but 5% and the activations but 30%, ZeRO partitions over world / TP, a step costs 10% more per doubling of
TP; checkpointing keeps a quarter of the activations and makes a step 0.75 times as fast; DeepSpeed's throughput
written as it counts it under TP, which autotune divides back).

  python benchmarks/tune_layouts.py --seconds 0.05

The model: 2e9 parameters in fp16 with Adam, 4e9 bytes of activations a sample, 4 GPUs of 80e9 bytes a run. By the
stand-in's rule it fits no ZeRO stage at the best micro-batch without TP: the largest sizes that fit are 11-17 at
TP 1, 22-26 at TP 2, 35-36 at TP 4, and the fastest layout is TP 4 at ZeRO 0, micro-batch 36. The grid is every
stage x TP size (1, 2, 4) x the powers of two up to 64: 84 experiments (168 with checkpointing on and off). Each
case runs with the memory known (`gpu=A100-80GB`, `model_info` stating the parameters, activations and shape) and
unknown (no GPU type, no model_info): experiments, OOM runs, the winner against the grid's best (the rule's best
over every size, not only the powers of two).

--real also tunes the small Llama on two CPU ranks (experiments/tp_llama.py, AutoTP 1 and 2, ZeRO 1, fixed
train_batch_size 8, micro-batch 2 to 4) and prints what each layout measured.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import autotuner

ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "tests" / "oom_standin.sh"
PARAMS, PER_SAMPLE, GPU, WORLD = 2e9, 4e9, 80e9, 4
STAGES, SIZES, LARGEST = (0, 1, 2, 3), (1, 2, 4), 64
INFO = {"num_params": int(PARAMS), "activation_mem_per_gpu": int(PER_SAMPLE), "num_attention_heads": 32,
        "num_key_value_heads": 8, "hidden_size": 3200, "vocab_size": 31250}


def need(stage: int, mbs: int, tp: int, gc: bool) -> float:
    """The stand-in's bytes of one GPU (oom_standin.sh's rule)."""
    held = PARAMS * 0.05 + PARAMS * 0.95 / tp
    dp = WORLD // tp
    weights = 2 * held / dp if stage >= 3 else 2 * held
    grads = 2 * held / dp if stage >= 2 else 2 * held
    adam = 12 * held / dp if stage >= 1 else 12 * held
    return weights + grads + adam + PER_SAMPLE * (0.3 + 0.7 / tp) * (0.25 if gc else 1.0) * mbs + 1.5e9


def samples(stage: int, mbs: int, tp: int, gc: bool) -> float:
    """The samples trained per second the stand-in's rule gives (what autotune records as throughput)."""
    value = mbs * 100 / (1 + mbs / 64) * (1 - 0.05 * stage)
    return value * (0.75 if gc else 1.0) / (1 + 0.1 * math.log2(tp))


def grid(knob: bool) -> tuple[int, tuple[int, int, int, bool]]:
    """The grid's size (powers of two) and the rule's best over every size that fits."""
    gcs = (False, True) if knob else (False,)
    powers = [m for m in range(1, LARGEST + 1) if m & (m - 1) == 0]
    points = [(z, m, tp, gc) for z in STAGES for m in range(1, LARGEST + 1) for tp in SIZES for gc in gcs
              if need(z, m, tp, gc) <= GPU]
    return len(STAGES) * len(SIZES) * len(gcs) * len(powers), max(points, key=lambda p: samples(*p))


def tune(work: Path, known: bool, knob: bool, slots: int) -> autotuner.Snapshot:
    (work / "train.py").write_text("# stand-in: the launcher never runs it\n")
    autotuning: dict = {"enabled": True, "metric": "throughput", "max_train_micro_batch_size_per_gpu": LARGEST}
    if known:
        autotuning["model_info"] = INFO
    if knob:
        autotuning["script_knobs"] = {"--gradient_checkpointing": [False, True]}
    config = {"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True}, "autotuning": autotuning,
              "optimizer": {"type": "Adam", "params": {"lr": 1e-4}}, "zero_optimization": {"stage": list(STAGES)},
              "tensor_parallel": {"autotp_size": list(SIZES)}}
    (work / "ds.json").write_text(json.dumps(config))
    (work / "hostfile").write_text(f"localhost slots={slots}{' gpu=A100-80GB' if known else ''}\n")
    os.environ["OOM_STANDIN_LOG"] = str(work / "launches.log")
    os.environ["OOM_STANDIN_MODEL"] = f"{PARAMS} {PER_SAMPLE} {GPU}"
    cluster = autotuner.load_cluster(hostfile=work / "hostfile")
    directory = autotuner.prepare_tune(str(work / "train.py"), ["--deepspeed_config", "ds.json"], cluster,
                                       work / "res", num_gpus=WORLD, launcher=["sh", str(STANDIN)], cwd=work)
    return autotuner.execute(directory, autotuner.Options(grace=1.0)).snapshot


def point_of(snap: autotuner.Snapshot, name: str) -> tuple[int, int, int, bool]:
    e = snap.experiments[name]
    tp = (e.ds_config.get("tensor_parallel") or {}).get("autotp_size", 1)
    return (e.ds_config["zero_optimization"]["stage"], e.ds_config["train_micro_batch_size_per_gpu"], tp,
            "--gradient_checkpointing" in e.args and e.args[e.args.index("--gradient_checkpointing") + 1] == "true")


def table(slots: int) -> None:
    print(f"the real runner, {slots} slots ({WORLD} a run), {os.environ['OOM_STANDIN_SECONDS']} s a run\n")
    print("| space | GPU memory | experiments (grid) | OOMs | winner | winner / grid's best | wall s |\n"
          "|---|---|---:|---:|---|---:|---:|")
    for knob in (False, True):
        size, best = grid(knob)
        for known in (True, False):
            with tempfile.TemporaryDirectory() as tmp:
                snap = tune(Path(tmp), known, knob, slots)
                ran = [a for a in snap.attempts if a.started_at is not None and not a.name.endswith("_confirm1")]
                assert snap.best is not None, snap.counts()
                quality = samples(*point_of(snap, snap.best.name)) / samples(*best)
                wall = max(a.finished_at for a in snap.attempts if a.finished_at) - \
                    min(a.started_at for a in ran if a.started_at)
                oom = sum(1 for a in ran if a.reason == "oom")
                space = "TP x ZeRO x mbs" + (" x checkpointing" if knob else "")
                print(f"| {space} | {'known, model_info' if known else 'unknown (no gpu=)'} | {len(ran)} ({size}) | "
                      f"{oom} | {snap.best.name.removeprefix('train_')} | {quality:.3f} | {wall:.1f} |", flush=True)
        print(f"\n(grid's best: z{best[0]} mbs{best[1]} tp{best[2]}{' gc' if best[3] else ''})\n")


def real() -> None:
    """The small Llama on two CPU ranks: AutoTP 1 and 2, ZeRO 1, what each layout measured."""
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "res"
        run = subprocess.run([sys.executable, "-m", "autotuner.cli", "tune", "--slots", "2", "--num_gpus", "2",
                              "-o", str(results), "--confirm", "2", "tp_llama.py", "--deepspeed_config", "ds_tp.json"],
                             capture_output=True, text=True, cwd=ROOT / "experiments",
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        print(run.stdout[-3000:] + run.stderr[-2000:])
        shown = subprocess.run([sys.executable, "-m", "autotuner.cli", "report", str(results), "--format", "md"],
                               capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        print(shown.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=0.05)
    parser.add_argument("--real", action="store_true", help="Only the small Llama on two CPU ranks.")
    opts = parser.parse_args()
    os.environ["OOM_STANDIN_SECONDS"] = str(opts.seconds)
    if opts.real:
        real()
        return
    table(opts.slots)


if __name__ == "__main__":
    main()
