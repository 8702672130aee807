"""Whether the OS would start an experiment's launch: Linux refuses any one argument or environment string longer
than MAX_ARG_STRLEN (128 KiB), whatever the total. The ds_config travels as one argument, base64 (a third
larger), with the runner's autotuning section added; a 100 KiB config, a long `env` value or a long argument
would fail every attempt with "Argument list too long", retries included, after the sweep had started."""
from __future__ import annotations

import json

from .. import limits
from .model import Experiment

RUNNER_SECTION = 4096  # bytes the runner may add to a config before it is encoded (the autotuning section)


def may_be_too_long(text: int) -> bool:
    """Whether files of `text` characters in all could make a launch string too long: JSON writes a character in
    at most 6 bytes (`\\u00e9`), so what is built from less than a sixth of the limit cannot be (the check of
    every experiment is then skipped: 100,000 configs dumped again took half a second)."""
    return 6 * text + RUNNER_SECTION >= limits.ARGUMENT * 3 // 4


def launch_problem(experiment: Experiment) -> str | None:
    """Why no launch of `experiment` could start (None: one can)."""
    config = len(json.dumps(experiment.ds_config, sort_keys=True).encode()) + RUNNER_SECTION
    if 4 * -(-config // 3) > limits.ARGUMENT:
        return (f"its ds_config, {limits.size(config - RUNNER_SECTION)} as JSON, is handed to the script as one "
                f"base64 argument, and the OS takes no argument over {limits.size(limits.ARGUMENT)}")
    for arg in experiment.args:
        if len(arg.encode()) >= limits.ARGUMENT:
            return f"an argument of {limits.size(len(arg.encode()))} is more than the OS takes in one " \
                   f"({limits.size(limits.ARGUMENT)})"
    for key, value in experiment.env.items():
        if len(f"{key}={value}".encode()) >= limits.ARGUMENT:
            return f"env {key} is more than the OS takes in one variable ({limits.size(limits.ARGUMENT)})"
    return None
