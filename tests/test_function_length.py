"""No function in `components/` or `pipelines/` is longer than `MAX_LINES`.

Read from the source (AST), as `test_imports.py` reads imports. A function's
length runs from its `def` line to its last line, docstring and nested
functions included (a nested function is measured on its own too). A long body
is read as a recipe of named steps, each testable alone (issue 58).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("components", "pipelines")
MAX_LINES = 100


def _lengths(path: Path, root: Path = ROOT) -> dict[str, int]:
    """`<path under root>::<qualified name>` -> lines, for every function and method in `path`."""
    out = {}
    relative = path.relative_to(root).as_posix()

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    out[f"{relative}::{name}"] = child.end_lineno - child.lineno + 1
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(), filename=str(path)), "")
    return out


def _all_lengths() -> dict[str, int]:
    lengths = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            lengths.update(_lengths(path))
    return lengths


def test_no_function_is_longer_than_the_limit():
    too_long = {name: lines for name, lines in _all_lengths().items() if lines > MAX_LINES}
    assert not too_long, (
        f"functions over {MAX_LINES} lines (make each a short recipe of named steps): "
        + ", ".join(f"{name} ({lines})" for name, lines in sorted(too_long.items()))
    )


def test_lengths_are_measured_def_to_last_line_nested_functions_apart(tmp_path):
    source = tmp_path / "pkg" / "m.py"
    source.parent.mkdir()
    source.write_text(
        "@decorator\n"
        "def outer():\n"
        '    """Doc."""\n'
        "    def inner():\n"
        "        return 1\n"
        "    return inner\n"
        "\n"
        "class C:\n"
        "    def method(self):\n"
        "        pass\n"
    )
    # The decorator line is not counted; the docstring and `inner` are.
    assert _lengths(source, root=tmp_path) == {
        "pkg/m.py::outer": 5,
        "pkg/m.py::outer.inner": 2,
        "pkg/m.py::C.method": 2,
    }
