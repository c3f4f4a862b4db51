"""One Keras whatever the import order: user code sees tf_keras as tf.keras, as TFX 1.16 expects.

Each case runs in a fresh interpreter, since the import order is the thing
under test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TIMEOUT_S = 300
USER_MODULE = textwrap.dedent(
    """
    import tensorflow as tf

    def run_fn(fn_args):
        return tf.keras.Model.__module__
    """
)
# Loads a user module file the way TFX's Trainer does, and prints what it sees.
LOAD_USER_MODULE = textwrap.dedent(
    """
    from tfx.utils import import_utils
    run_fn = import_utils.import_func_from_source({path!r}, "run_fn")
    import tensorflow as tf
    print("USER", run_fn(None))
    print("TF", tf.keras.Model.__module__)
    """
)


def _run(tmp_path, code: str, **env_overrides) -> subprocess.CompletedProcess:
    module = tmp_path / "user_module.py"
    module.write_text(USER_MODULE)
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("TF_USE_LEGACY_KERAS", None)
    env.update(env_overrides)
    script = textwrap.dedent(code) + LOAD_USER_MODULE.format(path=str(module))
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=str(tmp_path),
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def _seen(result) -> dict[str, str]:
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)


@pytest.mark.multiprocess
def test_tensorflow_and_tfx_imported_first_still_give_user_code_tf_keras(tmp_path):
    result = _run(
        tmp_path,
        """
        import tensorflow as tf
        print("BEFORE", tf.keras.Model.__module__)  # resolved to Keras 3 here
        from tfx import v1 as tfx
        import components
        """,
    )
    seen = _seen(result)
    assert seen["BEFORE"].startswith("keras.")  # the case that used to leak Keras 3
    assert seen["USER"].startswith("tf_keras.") and seen["TF"] == seen["USER"]


@pytest.mark.multiprocess
def test_product_imported_first_gives_the_same_tf_keras(tmp_path):
    seen = _seen(
        _run(
            tmp_path,
            """
            import components
            import tensorflow as tf
            """,
        )
    )
    assert seen["USER"].startswith("tf_keras.") and seen["TF"] == seen["USER"]


@pytest.mark.multiprocess
def test_keras3_asked_for_explicitly_fails_at_import_naming_the_variable(tmp_path):
    result = _run(tmp_path, "import components\n", TF_USE_LEGACY_KERAS="0")
    assert result.returncode != 0
    assert "KerasMismatchError: TF_USE_LEGACY_KERAS='0': TFX 1.16 and tfxkit need tf_keras" in (
        result.stderr
    )


# --------------------------------------------------------------------------- #
# AutoGraph while saving: tf_keras's code called as it is, user code converted
# --------------------------------------------------------------------------- #


def test_tf_keras_is_unconverted_only_while_the_context_is_open():
    import tf_keras as keras
    from tensorflow.python.autograph.core import config as autograph_config
    from tensorflow.python.autograph.impl import conversion

    from components import legacy_keras

    def user_function(x):
        return x

    before = autograph_config.CONVERSION_RULES
    # A method nothing else in this process has called through AutoGraph.
    assert not conversion.is_allowlisted(keras.layers.Dense.compute_output_signature)
    with legacy_keras.keras_unconverted():
        assert conversion.is_allowlisted(keras.layers.Dense.compute_output_signature)
        assert not conversion.is_allowlisted(user_function)
    assert autograph_config.CONVERSION_RULES == before
    assert not conversion.is_allowlisted(keras.layers.Dense.compute_output_signature)


def test_after_a_product_save_a_user_model_with_python_control_flow_trains_and_saves(tmp_path):
    """A user's layer `call` and `train_step` that branch in Python on
    tensors work in `fit` only when AutoGraph converts them. A product model
    saved under `keras_unconverted` first (as the Trainer exports in the
    same process as a user's run_fn under BeamDagRunner) leaves both
    converted, and the user's model still saves and loads back."""
    import numpy as np
    import tensorflow as tf
    import tf_keras as keras

    from components import legacy_keras

    class SignFlip(keras.layers.Layer):
        def call(self, x):
            if tf.reduce_sum(x) > 0:
                return x
            return -x

    class Counting(keras.Model):
        def train_step(self, data):
            result = super().train_step(data)
            if tf.reduce_sum(data[0]) > 0:
                self.positive.assign_add(1)
            return result

    product_inputs = keras.Input([3])
    product = keras.Model(product_inputs, keras.layers.Dense(2)(product_inputs))
    with legacy_keras.keras_unconverted():
        product.save(str(tmp_path / "product"), save_format="tf")

    inputs = keras.Input([3])
    model = Counting(inputs, keras.layers.Dense(2)(SignFlip()(inputs)))
    model.positive = tf.Variable(0, trainable=False)
    model.compile(optimizer="sgd", loss="mse")
    x = np.concatenate([np.ones([4, 3]), -np.ones([4, 3])]).astype("float32")
    model.fit(x, np.zeros([8, 2], "float32"), batch_size=4, epochs=1, shuffle=False, verbose=0)
    assert int(model.positive.numpy()) == 1  # the step's branch ran in the graph
    signs = keras.Model(inputs, model.layers[1].output)
    np.testing.assert_allclose(signs.predict(x, batch_size=4, verbose=0), np.abs(x))
    # tf_keras cannot save a layer branching in Python on a tensor at all (with
    # or without the rule); the user's step is saved with a plain layer.
    plain = Counting(inputs, keras.layers.Dense(2)(inputs))
    plain.save(str(tmp_path / "model"), save_format="tf")
    loaded = keras.models.load_model(str(tmp_path / "model"))
    np.testing.assert_allclose(loaded.predict(x, verbose=0), plain.predict(x, verbose=0))
