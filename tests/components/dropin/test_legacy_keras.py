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
