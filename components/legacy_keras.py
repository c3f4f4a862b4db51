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

`exempt_from_autograph` (called by `ensure_legacy_keras` once TensorFlow is
imported, and by every training task, `components.trainer.task.start`) gives
tf_keras the AutoGraph treatment Keras always had: TensorFlow's conversion
rules leave `keras` (and, before Keras left it, `tensorflow`) unconverted,
but do not know the `tf_keras` package, so every `tf.function` over a
tf_keras model (the train, test and predict steps, a serving signature)
re-transpiled tf_keras's own engine code on every trace: ~10 s of the first
training step of TFX's taxi example on a CPU, paid by no Keras before.
User code stays converted as before (a layer's `call` is converted by
tf_keras's base layer itself, as Keras 2 always did).
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
    exempt_from_autograph()
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


# AutoGraph's rule for the tf_keras package (see the module docstring).
TF_KERAS_MODULE = "tf_keras"


def exempt_from_autograph() -> bool:
    """Makes AutoGraph call tf_keras's own functions unconverted, as it does Keras's.

    Idempotent. Only speed depends on it: if TensorFlow's conversion rules
    are no longer where TF 2.16 keeps them, nothing is changed.

    Returns:
      True when the rule was added by this call.
    """
    try:
        from tensorflow.python.autograph.core import config
    except ImportError:
        return False
    rules = getattr(config, "CONVERSION_RULES", None)
    if not isinstance(rules, tuple) or not hasattr(config, "DoNotConvert"):
        return False
    if any(getattr(r, "_prefix", None) == TF_KERAS_MODULE for r in rules):
        return False
    # Appended: no rule before it matches a tf_keras module (the first match decides).
    config.CONVERSION_RULES = (*rules, config.DoNotConvert(TF_KERAS_MODULE))
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
