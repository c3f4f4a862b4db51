"""TFX's user-code wheel, installed by unpacking it instead of by a pip process.

TFX packages a component's `module_file` into a wheel under the pipeline root
(`_wheels/tfx_user_code_<component>-0.0+<hash>-py3-none-any.whl`), and every
time an executor loads a function from it, `udf_utils.install_to_temp_directory`
runs `python -m pip install --target <new temporary directory> <wheel>`: a
new Python process that imports pip, resolves the wheel's (empty) dependency
list and byte-compiles its files. The Transform does it three times (its
`preprocessing_fn`, its `stats_options_updater_fn` and once more around its
Beam pipeline), the Trainer once per function it loads; on 2 cores each took
about 2-4 s of the execution's time.

What pip does with such a wheel is to unpack it into the target: it is pure
Python (`Root-Is-Purelib: true`), declares no dependencies and carries no
`.data` directory. `unpacked_wheels()` replaces the install, for a block of
code, by that unpacking (milliseconds), for exactly those wheels; any other
dependency (a requirement string, a remote path, a wheel that declares
requirements or data, a malformed archive) goes to TFX's pip install as
before. The target directory and what lands on `sys.path` are the same.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import zipfile
from email.parser import Parser

from absl import logging
from tfx.components.util import udf_utils

from components.compat import patching

# TFX's own install, restored when the outermost block exits.
TFX_INSTALL = udf_utils.install_to_temp_directory


def _dist_info_file(names: list[str], name: str) -> str | None:
    found = [n for n in names if n.count("/") == 1 and n.endswith(f".dist-info/{name}")]
    return found[0] if len(found) == 1 else None


def unpackable(path: str) -> bool:
    """Whether `path` is a local pure-Python wheel that needs nothing but unpacking.

    True when the archive opens, every member stays inside the target (no
    absolute path, no `..`), its WHEEL file says `Root-Is-Purelib: true`, its
    METADATA declares no `Requires-Dist` and it has no `.data` directory.
    """
    if not path.endswith(".whl") or not os.path.isfile(path):
        return False
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            wheel, metadata = _dist_info_file(names, "WHEEL"), _dist_info_file(names, "METADATA")
            if wheel is None or metadata is None:
                return False
            wheel_info = Parser().parsestr(archive.read(wheel).decode("utf-8"))
            meta = Parser().parsestr(archive.read(metadata).decode("utf-8"))
    except (OSError, zipfile.BadZipFile, UnicodeDecodeError):
        return False
    for name in names:
        parts = name.split("/")
        if name.startswith("/") or ".." in parts or "\\" in name:
            return False
        if parts[0].endswith(".data"):
            return False
    return (wheel_info.get("Root-Is-Purelib") or "").strip().lower() == "true" and not meta.get_all(
        "Requires-Dist"
    )


def unpack(path: str, temp_dir: str) -> str:
    """Unpacks the wheel at `path` into `temp_dir` (what pip's `--target` install leaves there)."""
    with zipfile.ZipFile(path) as archive:
        archive.extractall(temp_dir)
    return temp_dir


def _install(pip_dependency: str, temp_dir: str | None = None) -> str:
    if not unpackable(pip_dependency):
        return TFX_INSTALL(pip_dependency, temp_dir=temp_dir)
    if not temp_dir:
        temp_dir = tempfile.mkdtemp()
    logging.info(
        "Unpacking the user-code wheel %r into %s (no pip process).", pip_dependency, temp_dir
    )
    return unpack(pip_dependency, temp_dir)


def _use_unpacking() -> None:
    udf_utils.install_to_temp_directory = _install


def _use_pip() -> None:
    udf_utils.install_to_temp_directory = TFX_INSTALL


_PATCH = patching.SharedPatch(_use_unpacking, _use_pip)


def unpacked_wheels() -> contextlib.AbstractContextManager[None]:
    """Installs TFX user-code wheels by unpacking them until the block exits.

    Re-entrant and thread-safe (`components.compat.patching`): the outermost block
    installs the replacement and restores TFX's own install when it exits.
    """
    return _PATCH.active()
