"""What differs between the two stacks (TFX 1.16 / TF 2.16 and TFX 1.21 / TF 2.21), by name.

`coordination_config_pb2` is the coordination service's proto module
(MultiWorkerMirroredStrategy's `CoordinatedJob`): `tensorflow.tsl.protobuf` in
TensorFlow 2.16, `tensorflow.compiler.xla.tsl.protobuf` in TensorFlow 2.21.
`TRAINER_TAKES_STATISTICS`: TFX 1.21's `Trainer` takes a `statistics` channel as
its first argument, TFX 1.16's has none.
"""

from __future__ import annotations

import inspect

from tfx.components import Trainer as _StockTrainer

try:  # TensorFlow 2.21 (TFX 1.21)
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
except ImportError:  # TensorFlow 2.16 (TFX 1.16)
    from tensorflow.tsl.protobuf import coordination_config_pb2

TRAINER_TAKES_STATISTICS: bool = list(inspect.signature(_StockTrainer.__init__).parameters)[
    1:2
] == ["statistics"]

__all__ = ["TRAINER_TAKES_STATISTICS", "coordination_config_pb2"]
