"""TFX's `tfx.v1` with this product's Trainer and Transform: the one-line swap.

Every stock example writes `from tfx import v1 as tfx` and then
`tfx.components.Trainer(...)`, `tfx.components.Transform(...)`. Changing
that one line to

    from components import tfx_v1 as tfx

gives the same module tree (`tfx.dsl`, `tfx.proto`, `tfx.orchestration`,
every other stock component) with `tfx.components.Trainer` and
`tfx.components.Transform` this product's: no other line changes. Importing
this module imports `tfx.v1` (and so its Google Cloud extensions), as the
line it replaces did.
"""

from __future__ import annotations

import types as _types

from tfx import v1 as _stock

from components.trainer.component import Trainer
from components.transform.component import Transform

components = _types.ModuleType(
    f"{__name__}.components", "`tfx.v1.components` with this product's Trainer and Transform."
)
components.__dict__.update(
    {name: value for name, value in vars(_stock.components).items() if not name.startswith("__")}
)
components.Trainer = Trainer
components.Transform = Transform

dsl = _stock.dsl
extensions = _stock.extensions
orchestration = _stock.orchestration
proto = _stock.proto
testing = _stock.testing
types = _stock.types
utils = _stock.utils

__all__ = [
    "components",
    "dsl",
    "extensions",
    "orchestration",
    "proto",
    "testing",
    "types",
    "utils",
]
