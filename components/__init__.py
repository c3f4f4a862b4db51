"""tfxkit components: config-driven Transform, distributed Trainer, distillation.

TFX 1.16 runs on tf_keras (Keras 2). Importing this package makes `tf.keras`
tf_keras in this process, whatever was imported first (see
`components.legacy_keras`).
"""

from components.legacy_keras import ensure_legacy_keras

ensure_legacy_keras()
