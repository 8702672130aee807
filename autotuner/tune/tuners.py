"""The tuner a tune's record names, built: the one place that knows every tuner (`tuner_type`)."""
from __future__ import annotations

from .gridsearch import MicroBatchSearch
from .model_based import ModelSearch
from .random_tuner import RandomSearch
from .search import Search
from .space import SearchSpec
from .worlds import WorldSearch


def search_for(spec: SearchSpec) -> Search | WorldSearch:
    """The tuner the spec names (model_based imports Optuna: a UserError when it is not installed); with several
    world sizes, one for each (worlds.py)."""
    if spec.worlds:
        return WorldSearch(spec, [_tuner(s) for s in spec.world_specs()])
    return _tuner(spec)


def _tuner(spec: SearchSpec) -> Search:
    if spec.tuner == "random":
        return RandomSearch(spec)
    if spec.tuner == "model_based":
        return ModelSearch(spec)
    return MicroBatchSearch(spec)
