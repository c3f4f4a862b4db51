"""Package attributes loaded on first use (PEP 562), so importing a package stays light."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def exports(
    package: str, namespace: dict, names: Mapping[str, str]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """A package's `__getattr__` and `__dir__` for `names` (public name -> defining module).

    Args:
      package: The package's name, for the error of an unknown attribute.
      namespace: The package's `globals()`: a loaded name is kept there.
      names: Each public name and the module that defines it.
    """

    def __getattr__(name: str):
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names))

    return __getattr__, __dir__
