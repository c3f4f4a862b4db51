"""Tiny real training inputs for Trainer tests: Palmer penguins through real TFT.

The inputs themselves live in `testkit/penguins.py` (the fault benchmark
trains the same model); this module adds what only the tests use.
"""

from __future__ import annotations

import json

from testkit.penguins import (
    BUCKETIZED_FEATURE,
    EVAL_ROWS,
    FLOAT_FEATURES,
    LABEL,
    PENGUINS_CSV,
    Materialized,
    inputs_for,
    layer_weights,
    materialize,
    penguins_config,
    raw_examples,
    read_rows,
    with_sections,
)

__all__ = [
    "BUCKETIZED_FEATURE",
    "EVAL_ROWS",
    "FLOAT_FEATURES",
    "LABEL",
    "PENGUINS_CSV",
    "Materialized",
    "inputs_for",
    "layer_weights",
    "materialize",
    "penguins_config",
    "raw_examples",
    "read_rows",
    "with_sections",
    "write_spec",
]


def write_spec(path: str, spec: dict) -> str:
    with open(path, "w") as f:
        json.dump(spec, f)
    return path
