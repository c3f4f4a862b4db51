"""TFX's user-code wheel unpacked instead of pip-installed: the same module on the path, other wheels to pip."""

from __future__ import annotations

import os
import sys
import zipfile

import pytest
from tfx.components.util import udf_utils
from tfx.utils import import_utils

from components.compat import user_code

MODULE = """
def answer():
    return 42
"""


@pytest.fixture(scope="module")
def tfx_wheel(tmp_path_factory):
    """A user-code wheel built by TFX itself, as a pipeline with a module_file gets one."""
    source = tmp_path_factory.mktemp("module")
    (source / "tfxkit_user_module.py").write_text(MODULE)
    root = tmp_path_factory.mktemp("pipeline_root")
    wheel, module_path = udf_utils.package_user_module_file(
        "Trainer", str(source / "tfxkit_user_module.py"), str(root)
    )
    return wheel, module_path


def test_a_tfx_user_code_wheel_is_unpacked_onto_the_path(tfx_wheel):
    wheel, _ = tfx_wheel
    assert user_code.unpackable(wheel)
    with user_code.unpacked_wheels():
        context = udf_utils.TempPipInstallContext([wheel])
        context.__enter__()
        try:
            assert context.temp_directory in sys.path
            with zipfile.ZipFile(wheel) as archive:
                expected = {n for n in archive.namelist() if not n.endswith("/")}
            found = {
                os.path.relpath(os.path.join(d, f), context.temp_directory)
                for d, _, files in os.walk(context.temp_directory)
                for f in files
            }
            # Exactly the wheel's files: no pip INSTALLER record, no byte-compiled copies.
            assert found == expected
        finally:
            context.__exit__(None, None, None)
    assert context.temp_directory not in sys.path


def test_functions_load_from_the_unpacked_wheel(tfx_wheel):
    _, module_path = tfx_wheel
    sys.modules.pop("tfxkit_user_module", None)
    with user_code.unpacked_wheels():
        answer = import_utils.import_func_from_module(module_path, "answer")
    assert answer() == 42
    sys.modules.pop("tfxkit_user_module", None)


def test_tfx_install_is_restored_after_nested_blocks():
    with user_code.unpacked_wheels():
        with user_code.unpacked_wheels():
            assert udf_utils.install_to_temp_directory is not user_code.TFX_INSTALL
        assert udf_utils.install_to_temp_directory is not user_code.TFX_INSTALL
    assert udf_utils.install_to_temp_directory is user_code.TFX_INSTALL


def _wheel(
    path, *, metadata="Metadata-Version: 2.1\nName: x\nVersion: 0.0\n", purelib="true", extra=()
):
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("mod.py", "x = 1\n")
        archive.writestr("x-0.0.dist-info/METADATA", metadata)
        archive.writestr(
            "x-0.0.dist-info/WHEEL", f"Wheel-Version: 1.0\nRoot-Is-Purelib: {purelib}\n"
        )
        for name in extra:
            archive.writestr(name, "")
    return str(path)


def test_only_plain_pure_python_wheels_are_unpacked(tmp_path):
    assert user_code.unpackable(_wheel(tmp_path / "plain-0.0-py3-none-any.whl"))
    # Each of these needs pip (or is not a wheel to trust): it goes to TFX's install.
    needs_pip = {
        "requirements": _wheel(
            tmp_path / "req-0.0-py3-none-any.whl",
            metadata="Metadata-Version: 2.1\nName: x\nVersion: 0.0\nRequires-Dist: numpy\n",
        ),
        "platlib": _wheel(tmp_path / "plat-0.0-cp311-none-any.whl", purelib="false"),
        "data directory": _wheel(
            tmp_path / "data-0.0-py3-none-any.whl", extra=("x-0.0.data/scripts/run",)
        ),
        "path outside the target": _wheel(
            tmp_path / "slip-0.0-py3-none-any.whl", extra=("../escape.py",)
        ),
    }
    for reason, path in needs_pip.items():
        assert not user_code.unpackable(path), reason
    broken = tmp_path / "broken-0.0-py3-none-any.whl"
    broken.write_bytes(b"not a zip")
    assert not user_code.unpackable(str(broken))
    assert not user_code.unpackable("numpy==1.26.4")
    assert not user_code.unpackable(str(tmp_path / "missing-0.0-py3-none-any.whl"))
