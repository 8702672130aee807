"""The options that state the training run a tune is for (`tune`, `report`): declared once, read into a Goal
(autotuner.training_goal checks each)."""
from __future__ import annotations

import typer

import autotuner

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


def goal(tokens: str | None, samples: str | None, seq_len: str | None, cost: str | None,
         deadline: str | None) -> autotuner.Goal:
    """The options read and checked (each alone; how they agree is checked with what the tune states)."""
    return autotuner.training_goal(tokens, samples, seq_len, cost, deadline)
