"""What the tuned configuration is for: the training run it will do (`Goal`): how much is to be trained (tokens
with a sequence length, or samples), the price of a GPU-hour (one, or one per GPU type), and a deadline. Read
from `tune` / `report`'s options or the config's `autotuning` section, checked here before anything runs, and
recorded with the search so that `report` can price the candidates later (views/cost.py).
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TypeVar

from .. import limits
from ..errors import UserError, shown
from ..jsonvalues import JSON, JSONObject
from ..spec.reading import Source

MOST = 10 ** 18  # the most tokens or samples a goal may state (a trillion is 10 ** 12)
MOST_SEQ = 10 ** 8  # the longest sequence a goal may state
MOST_DAYS = 36_500  # the longest deadline: a hundred years
# The `autotuning` keys of a goal: ours, beside DeepSpeed's (tune/inputs.py KEYS).
SECTION_KEYS = ("train_tokens", "train_samples", "seq_len", "gpu_hour_cost", "deadline_days")
_T = TypeVar("_T")
_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")  # a GPU type as a hostfile's gpu= names it


@dataclass(frozen=True)
class Goal:
    """The training run a tune is for. Empty (`wanted` false) when nothing is to be trained."""

    tokens: int | None = None
    samples: int | None = None
    seq_len: int | None = None  # tokens per sample; None: the model's (model_info's seq_length) is used
    price: float | None = None  # per GPU-hour, of any GPU type not in `prices`
    prices: Mapping[str, float] = field(default_factory=dict)  # GPU type -> per GPU-hour
    deadline_days: float | None = None

    @property
    def wanted(self) -> bool:
        return self.tokens is not None or self.samples is not None

    @property
    def priced(self) -> bool:
        return self.price is not None or bool(self.prices)

    def price_of(self, gpu_type: str | None) -> float | None:
        """The price of a GPU-hour of this type: its own, else the one for every type; None when not priced."""
        return self.prices.get(gpu_type, self.price) if gpu_type is not None else self.price

    def over(self, other: Goal) -> Goal:
        """This goal's stated keys over `other`'s (options over the recorded section)."""
        stated = (("tokens", self.tokens), ("samples", self.samples), ("seq_len", self.seq_len),
                  ("price", self.price), ("deadline_days", self.deadline_days))
        keep: dict[str, object] = {k: v for k, v in stated if v is not None}
        if self.tokens is not None or self.samples is not None:  # one amount replaces the other
            keep.setdefault("tokens", None)
            keep.setdefault("samples", None)
        if self.prices or self.price is not None:
            keep["prices"] = dict(self.prices)
        return replace(other, **keep)  # type: ignore[arg-type]

    def to_json(self) -> JSONObject:
        return {"tokens": self.tokens, "samples": self.samples, "seq_len": self.seq_len, "price": self.price,
                "prices": dict(self.prices), "deadline_days": self.deadline_days}

    @classmethod
    def from_json(cls, data: Mapping[str, JSON] | None) -> Goal:
        if not data:
            return cls()
        prices = data.get("prices") or {}
        return cls(**{k: data.get(k) for k in ("tokens", "samples", "seq_len", "price", "deadline_days")},
                   prices=dict(prices) if isinstance(prices, dict) else {})

    def check(self, where: str = "") -> None:
        """The goal's keys agree: one amount; a price or deadline only with an amount. `where`: how the
        message names the keys (option names, or the section's)."""
        option = _names(where)
        if self.tokens is not None and self.samples is not None:
            raise UserError(f"{option['tokens']} and {option['samples']}: give one amount to train, not both")
        if not self.wanted:
            for key, value in (("price", self.priced or None), ("deadline_days", self.deadline_days),
                               ("seq_len", self.seq_len)):
                if value is not None:
                    raise UserError(f"{option[key]} needs what is to be trained: {option['tokens']} (with the "
                                    f"sequence length) or {option['samples']}")

    def sequence(self, model_seq: int | None, where: str = "") -> int | None:
        """Tokens per sample: the goal's own, else the model's; a token goal with neither is refused."""
        seq = self.seq_len or model_seq
        if self.tokens is not None and seq is None:
            option = _names(where)
            raise UserError(f"{option['tokens']} needs the sequence length: {option['seq_len']} N, or "
                            "seq_length in the config's autotuning.model_info (or its hf_config)")
        return seq


def _names(where: str) -> dict[str, str]:
    """How a message names each key: as options, or as keys of the autotuning section."""
    if where == "section":
        return {"tokens": "autotuning.train_tokens", "samples": "autotuning.train_samples",
                "seq_len": "autotuning.seq_len", "price": "autotuning.gpu_hour_cost",
                "deadline_days": "autotuning.deadline_days"}
    return {"tokens": "--train-tokens", "samples": "--train-samples", "seq_len": "--seq-len",
            "price": "--gpu-hour-cost", "deadline_days": "--deadline-days"}


def amount(value: str | float | int, name: str, most: int = MOST) -> int:
    """A positive whole number of tokens, samples or tokens per sample (`1e12` as JSON or a shell writes it)."""
    number = _number(value, name)
    if not number.is_integer() or not 1 <= number <= most:
        raise UserError(f"{name} must be a positive whole number (at most {most:.0e}), not {shown(value)}")
    return int(number)


def days(value: str | float | int, name: str) -> float:
    number = _number(value, name)
    if not 0 < number <= MOST_DAYS:
        raise UserError(f"{name} must be a number of days above 0 (at most {MOST_DAYS:,}), not {shown(value)}")
    return number


def price(value: str | float | int, name: str) -> float:
    number = _number(value, name)
    if not 0 <= number <= limits.PRICE:
        raise UserError(f"{name} must be a price from 0 to {limits.PRICE:,} a GPU-hour, not {shown(value)}")
    return number


def prices(text: str, name: str = "--gpu-hour-cost") -> tuple[float | None, dict[str, float]]:
    """`2.5` (every GPU type), or `A100-80GB=2.5,H100=4` (per type, as a hostfile's gpu= names them; a bare
    number among them is the price of any other type)."""
    one: float | None = None
    each: dict[str, float] = {}
    for part in text.split(","):
        kind, eq, value = part.strip().rpartition("=")
        if not eq:
            if one is not None:
                raise UserError(f"{name} {shown(text)}: one price for every type, not two")
            one = price(value, name)
            continue
        if _TYPE.fullmatch(kind) is None:
            raise UserError(f"{name} {shown(text)}: {shown(kind)} is not a GPU type (as a hostfile's gpu= names "
                            "one: letters, digits, . _ + -)")
        if kind in each:
            raise UserError(f"{name} {shown(text)}: GPU type {shown(kind)} priced twice")
        each[kind] = price(value, f"{name} {kind}")
    return one, each


def _number(value: str | float | int, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise UserError(f"{name} must be a number, not {shown(value)}")
    try:
        number = float(value.replace("_", "")) if isinstance(value, str) else float(value)
    except (ValueError, OverflowError):
        raise UserError(f"{name} must be a number, not {shown(value)}") from None
    if not math.isfinite(number):
        raise UserError(f"{name} must be a finite number, not {shown(value)}")
    return number


def from_options(tokens: str | None, samples: str | None, seq_len: str | None, cost: str | None,
                 deadline: str | None) -> Goal:
    """The goal `tune` / `report`'s options state (each checked on its own; `check` for how they agree)."""
    one, each = prices(cost) if cost is not None else (None, {})
    return Goal(tokens=amount(tokens, "--train-tokens") if tokens is not None else None,
                samples=amount(samples, "--train-samples") if samples is not None else None,
                seq_len=amount(seq_len, "--seq-len", MOST_SEQ) if seq_len is not None else None,
                price=one, prices=each, deadline_days=days(deadline, "--deadline-days") if deadline is not None
                else None)


def from_section(src: Source, section: JSONObject, shape: Mapping[str, int] | None = None) -> Goal:
    """The goal the config's autotuning section states (its keys in SECTION_KEYS); each problem at its line.
    `shape`: the model's (its seq_length is a token goal's sequence length when the section states none)."""
    def checked(key: str, read: Callable[[float, str], _T]) -> _T | None:
        value = section.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise src.error(f"autotuning.{key} must be a number, not {shown(value)}", key)
        try:
            return read(value, f"autotuning.{key}")
        except UserError as e:
            raise src.error(e.message, key) from None

    one, each = None, {}
    cost = section.get("gpu_hour_cost")
    if isinstance(cost, dict):
        for kind, value in cost.items():
            if _TYPE.fullmatch(kind) is None or isinstance(value, bool) or not isinstance(value, (int, float)):
                raise src.error(f"autotuning.gpu_hour_cost: {shown(kind)}: {shown(value)} is not a GPU type (as a "
                                "hostfile's gpu= names one) with a price", "gpu_hour_cost")
            try:
                each[kind] = price(value, f"autotuning.gpu_hour_cost.{kind}")
            except UserError as e:
                raise src.error(e.message, "gpu_hour_cost") from None
    else:
        one = checked("gpu_hour_cost", price)
    goal = Goal(tokens=checked("train_tokens", amount), samples=checked("train_samples", amount),
                seq_len=checked("seq_len", lambda v, n: amount(v, n, MOST_SEQ)), price=one, prices=each,
                deadline_days=checked("deadline_days", days))
    try:
        goal.check("section")
    except UserError as e:
        stated = next(k for k in SECTION_KEYS if k in section)
        raise src.error(e.message, stated) from None
    try:
        goal.sequence((shape or {}).get("seq_length"), "section")
    except UserError as e:
        raise src.error(e.message, "train_tokens") from None
    return goal
