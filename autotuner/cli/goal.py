"""The options that state the training run a tune is for (`tune`, `report`, `plan --training`): declared once, as
one bundle, read into a Goal (autotuner.training_goal checks each)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any  # a bundle stands where typer's options would (bundles.py)

import typer

import autotuner

from .bundles import Bundle

TRAIN_TOKENS = typer.Option(None, "--train-tokens", metavar="N",
                            help="Tokens the training run is to see (with --seq-len, or the model's seq_length): "
                                 "each config's time to train, GPU-hours and cost.")
TRAIN_SAMPLES = typer.Option(None, "--train-samples", metavar="N", help="Or samples the training run is to see.")
SEQ_LEN = typer.Option(None, "--seq-len", metavar="N",
                       help="Tokens a sample, for --train-tokens [default: model_info's seq_length].")
GPU_HOUR_COST = typer.Option(None, "--gpu-hour-cost", metavar="PRICE",
                             help="The price of a GPU-hour: one (2.5), or per GPU type as the hostfile's gpu= "
                                  "names them (A100-80GB=2.5,H100=4).")
DEADLINE_DAYS = typer.Option(None, "--deadline-days", metavar="DAYS",
                             help="The training run's deadline: the cheapest config that meets it is named beside "
                                  "the fastest.")


@dataclass(frozen=True)
class GoalOptions:
    """The training run's options as given; `goal()` reads and checks them, inside the command's own `try`."""

    train_tokens: str | None = None
    train_samples: str | None = None
    seq_len: str | None = None
    gpu_hour_cost: str | None = None
    deadline_days: str | None = None

    def goal(self) -> autotuner.Goal:
        """Each option checked alone; how they agree is checked with what the tune states."""
        return autotuner.training_goal(self.train_tokens, self.train_samples, self.seq_len, self.gpu_hour_cost,
                                       self.deadline_days)


GOAL: Any = Bundle((("train_tokens", str | None, TRAIN_TOKENS), ("train_samples", str | None, TRAIN_SAMPLES),
                    ("seq_len", str | None, SEQ_LEN), ("gpu_hour_cost", str | None, GPU_HOUR_COST),
                    ("deadline_days", str | None, DEADLINE_DAYS)), GoalOptions)
