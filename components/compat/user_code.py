"""User code the executors call: TFX's user-code wheel, unpacked instead of pip-installed.

`unpacked_wheels()` replaces TFX's `pip install --target` of a module file's wheel, for a
block of code, by unpacking it (`unpack`) into the same directory (any other dependency,
see `unpackable`, goes to pip); `call_user_fn` re-raises a user function's exception as a
`UserCodeError` naming the function and its module.
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


class UserCodeError(RuntimeError):
    """An exception raised by a user's function that the product called.

    The message names the function and its module; the user's own exception
    is the `__cause__`.
    """


def call_user_fn(fn, where: str, *args, **kwargs):
    """`fn(*args, **kwargs)`; an exception from it is re-raised naming `where`.

    Args:
      where: The function and its module, as the user wrote them (for
        example "student_fn of module_file 'student.py'").

    Raises:
      UserCodeError: from the user's exception, naming `where`.
    """
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        raise UserCodeError(f"{where} raised {type(e).__name__}: {e}") from e
