"""One name for a value as json or hjson parsed it: a DeepSpeed config, an experiment spec, a metrics document,
the ledger's meta, a knob's value, the value of a swept key, a payload the dashboard serves.

`JSON` is `Any` on purpose. json.loads and hjson return Any by their API, and a DeepSpeed config is whatever the
user wrote: the exact recursive type (None | bool | int | float | str | list[JSON] | dict[str, JSON]) would force
an isinstance narrowing at every read of a config key. Each value's shape is checked where the code reads it (the
spec readers refuse a wrong one with file and line); the alias says which values these are.
"""
from __future__ import annotations

from typing import Any

JSON = Any  # a value as json/hjson parse it; its shape is checked where it is read
JSONObject = dict[str, JSON]  # a JSON object, as json/hjson parse it
