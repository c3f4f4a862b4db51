"""Which Keras runs where: the product's code on tf_keras by name, a user's module on what stock gives it.

Nothing here changes which Keras a user's module gets (the Distiller wraps a Keras 3
student, `components.distillation.keras3`); `ensure_legacy_keras` is for the product's
own scripts. `check_one_keras` refuses a module holding both Kerases; `keep_libraries_unconverted` gives tf_keras, TFT, tfx_bsl and
tensorflow_metadata the AutoGraph rule TensorFlow gives `keras`.
"""

from __future__ import annotations

import os
import sys
import types

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
    keep_libraries_unconverted()
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


# AutoGraph's rules for tf_keras (see `keep_libraries_unconverted`): its
# training engine, through which a user's `train_step` / `test_step` /
# `predict_step` is reached, stays converted; the rest is called as it is.
TF_KERAS_MODULE = "tf_keras"
TF_KERAS_TRAINING_ENGINE = "tf_keras.src.engine.training"
# TFX's libraries that a user's tf.function reaches (a serving function calls
# `TFTransformOutput.raw_feature_spec()` and the `TransformFeaturesLayer`,
# which go through tfx_bsl's and tensorflow_metadata's schema code). Each
# also runs in TF1 graph mode (`force_tf_compat_v1`), where nothing is
# converted, so its code is written for graphs as TensorFlow's own is.
TFX_LIBRARIES = ("tensorflow_transform", "tfx_bsl", "tensorflow_metadata")


def keep_libraries_unconverted() -> None:
    """Makes AutoGraph call tf_keras's and TFX's libraries' own code as it is, as it calls keras's.

    TensorFlow's AutoGraph never transpiles TensorFlow's or Keras's own code
    (its conversion rules hold `DoNotConvert("keras")`), but tf_keras, the
    same Keras 2 under the package name TFX 1.16 runs on, is not in those
    rules: every `tf.function` that reaches Keras code re-transpiled
    tf_keras's engine. Measured here (2 cores): the first training step of
    TFX's taxi model took 13.6 s instead of 1.4 s, and the default signature
    `model.save` traces 5 of the 7 s of saving the product's taxi model.
    TFX's libraries (`TFX_LIBRARIES`) are not in them either: tracing the
    serving signature of TFX's taxi example transpiled TFT's
    `raw_feature_spec`, `TransformFeaturesLayer` and tfx_bsl's schema code
    (about 300 functions) on every export.

    What stays converted is what must: a user's layer `call`, loss and
    metric functions (Keras converts them explicitly), and tf_keras's
    training engine (`TF_KERAS_TRAINING_ENGINE`), whose step functions call a
    user's `train_step`, `test_step` or `predict_step`. Idempotent; called
    when tf_keras becomes `tf.keras` with TensorFlow imported
    (`ensure_legacy_keras`) and when a training task starts.

    TensorFlow 2.21 lists `DoNotConvert("tf_keras")` itself, its engine
    included, so there a user's `train_step` that branches on a tensor fails
    unless the engine's `Convert` goes first: that rule, not tf_keras's
    `DoNotConvert`, tells whether this already ran.
    """
    from tensorflow.python.autograph.core import config as autograph_config

    rules = autograph_config.CONVERSION_RULES
    if any(
        isinstance(rule, autograph_config.Convert)
        and rule.matches(TF_KERAS_TRAINING_ENGINE)
        and not rule.matches(TF_KERAS_MODULE)
        for rule in rules
    ):
        return
    # The first rule that matches decides: the engine's Convert goes first.
    # tf_keras's DoNotConvert is added where TensorFlow (2.16) has none.
    tf_keras_known = any(
        isinstance(rule, autograph_config.DoNotConvert) and rule.matches(TF_KERAS_MODULE)
        for rule in rules
    )
    autograph_config.CONVERSION_RULES = (
        autograph_config.Convert(TF_KERAS_TRAINING_ENGINE),
        *(() if tf_keras_known else (autograph_config.DoNotConvert(TF_KERAS_MODULE),)),
        *(autograph_config.DoNotConvert(library) for library in TFX_LIBRARIES),
        *rules,
    )


def tf_keras_module():
    """The Keras module `tf.keras` resolves to now (resolving it, as user code would)."""
    import tensorflow as tf

    keras = tf.keras
    # The lazy loader forwards attributes; its resolved module says which Keras.
    return sys.modules[keras.Model.__module__.split(".", 1)[0]]


def is_keras3_now() -> bool:
    """Whether `tf.keras` is Keras 3 in this process (resolving it)."""
    return tf_keras_module().__name__ == "keras"


def check_one_keras(module, where: str) -> None:
    """Fails when a user module holds both Keras: tf_keras and Keras 3 objects do not mix.

    Args:
      module: The user's imported module, or its globals.
      where: What to name (e.g. "module_file 'penguin_utils.py'").

    Raises:
      KerasMismatchError: naming both, when the module's globals reference
        tf_keras (imported by name) and Keras 3 (`import keras`, or
        `from tensorflow import keras` resolved to Keras 3).
    """
    legacy, keras3 = [], []
    names = module if isinstance(module, dict) else vars(module)
    for name, value in names.items():
        root = getattr(value, "__name__", "") if isinstance(value, types.ModuleType) else ""
        if root == "tf_keras" or root.startswith("tf_keras."):
            legacy.append(name)
        elif root == "keras" or root.startswith("keras."):
            keras3.append(name)
    if legacy and keras3:
        raise KerasMismatchError(
            f"{where}: mixes two Kerases: {', '.join(sorted(legacy))} is tf_keras (Keras 2) and "
            f"{', '.join(sorted(keras3))} is Keras 3; their models, layers and callbacks do not "
            "mix. Use one: tf.keras (what stock TFX gives the module) or tf_keras by name"
        )


def _is_keras3(keras_attr) -> bool:
    """Whether TensorFlow's `keras` attribute resolved to Keras 3 (without resolving it)."""
    from tensorflow.python.util import lazy_loader

    if isinstance(keras_attr, lazy_loader.KerasLazyLoader):
        # Unresolved (or resolved in place): its recorded version says which.
        return vars(keras_attr).get("_tfll_keras_version") == "keras_3"
    return getattr(keras_attr, "__name__", "").startswith("keras.")
