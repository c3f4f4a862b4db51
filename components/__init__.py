"""tfxkit components: config-driven Transform, distributed Trainer, distillation.

TFX 1.16 runs on tf_keras (Keras 2): importing tensorflow_transform sets
TF_USE_LEGACY_KERAS=1. Setting it here too keeps one Keras in every process
that imports this package, whatever it imported first.
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
