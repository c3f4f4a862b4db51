"""One Keras in every process that imports tfxkit: tf_keras, as TFX 1.16 expects.

TensorFlow 2.16 resolves `tf.keras` lazily, on first use, from
`TF_USE_LEGACY_KERAS`: set, it is tf_keras (Keras 2, what TFX, TFT's
`TransformFeaturesLayer` and every TFX example module are written for);
unset, Keras 3. TFX itself touches `tf.keras` while it is imported and only
importing `tensorflow_transform` sets the variable, so a script that imports
`tfx` before this package would hand Keras 3 to the user's module file: which
Keras ran depended on import order.

`ensure_legacy_keras` (called when `components` is imported, and again by the
Trainer before it loads a user module) sets the variable and, when
`tf.keras` was already resolved to Keras 3, points `tf.keras` at tf_keras, so
every module imported afterwards (a user's module file included) sees
tf_keras whatever was imported first. Objects created with Keras 3 before
that stay Keras 3; `check_model_keras` names such a model when it reaches the
Trainer.
"""

from __future__ import annotations

import os
import sys

LEGACY_KERAS_ENV = "TF_USE_LEGACY_KERAS"
_TRUE = ("true", "True", "1")


class KerasMismatchError(RuntimeError):
    """A Keras 3 object reached a tf_keras (TFX 1.16) code path."""


def ensure_legacy_keras() -> bool:
    """Makes `tf.keras` tf_keras in this process, now and for later imports.

    Returns:
      True when `tf.keras` had already been resolved to Keras 3 and was
      re-pointed to tf_keras.

    Raises:
      KerasMismatchError: if `TF_USE_LEGACY_KERAS` is set to a false value
        (the user asked for Keras 3, which TFX 1.16 cannot run), or tf_keras is
        not installed.
    """
    value = os.environ.get(LEGACY_KERAS_ENV)
    if value is not None and value not in _TRUE:
        raise KerasMismatchError(
            f"{LEGACY_KERAS_ENV}={value!r}: TFX 1.16 and tfxkit need tf_keras (Keras 2) as tf.keras; "
            f"unset {LEGACY_KERAS_ENV} or set it to 1"
        )
    os.environ[LEGACY_KERAS_ENV] = "1"
    tf = sys.modules.get("tensorflow")
    if tf is None:
        # TensorFlow is not imported yet: it will read the variable itself.
        return False
    current = vars(tf).get("keras")
    if current is None or not _is_keras3(current):
        return False
    try:
        import tf_keras  # noqa: F401
    except ImportError as e:
        raise KerasMismatchError(
            "tensorflow was imported with Keras 3 and tf_keras is not installed; install tf_keras "
            "(TFX 1.16 needs it) or set TF_USE_LEGACY_KERAS=1 before importing tensorflow"
        ) from e
    from tensorflow.python.util import lazy_loader

    # A fresh lazy loader resolves from the (now set) variable on first use.
    tf.keras = lazy_loader.KerasLazyLoader(vars(tf))
    return True


def _is_keras3(keras_attr) -> bool:
    """Whether TensorFlow's `keras` attribute resolved to Keras 3 (without resolving it)."""
    from tensorflow.python.util import lazy_loader

    if isinstance(keras_attr, lazy_loader.KerasLazyLoader):
        # Unresolved (or resolved in place): its recorded version says which.
        return vars(keras_attr).get("_tfll_keras_version") == "keras_3"
    return getattr(keras_attr, "__name__", "").startswith("keras.")


def check_model_keras(model, where: str) -> None:
    """Fails naming `where` when `model` is a Keras 3 model (TFX 1.16 exports tf_keras).

    Raises:
      KerasMismatchError: for a Keras 3 model.
    """
    module = type(model).__module__
    if module.startswith("keras.") or module == "keras":
        raise KerasMismatchError(
            f"{where}: the model is a Keras 3 {type(model).__name__} ({module}), but TFX 1.16 runs on "
            "tf_keras; build it with tf.keras after importing tfxkit (or `import tf_keras`), or set "
            "TF_USE_LEGACY_KERAS=1 before importing tensorflow"
        )
