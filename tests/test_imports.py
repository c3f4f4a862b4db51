"""The import graph of `components/` and `pipelines/`: no circles, nothing runs back up.

Read from the source (AST), not by importing: every `import` / `from ...
import` of a `components` or `pipelines` module is an edge, `TYPE_CHECKING`
blocks included (an annotation-only import is still a dependency of the
design). Imports at module level must form no circle; an import inside a
function must not reach a module that (at module level) imports the
importer back, which is how a circle hides; and the library
(`components`) never imports the orchestration (`pipelines`).
"""

from __future__ import annotations

import ast
import functools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("components", "pipelines")
# The harness and the benchmarks join the graph for the circle checks: two
# benchmarks that import each other are as hard to follow as two modules.
PACKAGES = (*PRODUCT, "testkit", "benchmarks")


@functools.cache
def _modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _names(node: ast.Import | ast.ImportFrom, module: str | None = None) -> list[str]:
    """The dotted names an import statement may load; `module` (the importing one) resolves
    a relative import."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".")
        if _modules()[module].name != "__init__.py":
            package = package[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join([*package, base] if base else package)
    # `from package import name` loads the submodule `name` when there is one.
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def _targets(node: ast.Import | ast.ImportFrom, module: str) -> set[str]:
    """The project modules an import statement executes (packages on the way included)."""
    modules = _modules()
    targets = set()
    for name in _names(node, module):
        parts = name.split(".")
        targets |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & modules.keys()
    return targets


def _imports(module: str) -> tuple[set[str], set[str]]:
    """(imported at module level, imported inside a function) by `module`."""
    top: set[str] = set()
    lazy: set[str] = set()
    # A module's own packages are already being imported when it runs.
    parts = module.split(".")
    own = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                (lazy if in_function else top).update(_targets(child, module) - own)
            else:
                nested = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
                visit(child, in_function or nested)

    visit(ast.parse(_modules()[module].read_text()), False)
    return top, lazy


@functools.cache
def _graph() -> dict[str, tuple[set[str], set[str]]]:
    return {module: _imports(module) for module in _modules()}


def _reachable(start: str) -> set[str]:
    """Modules `start` imports at module level, directly or through others."""
    seen: set[str] = set()
    stack = [start]
    while stack:
        for target in _graph()[stack.pop()][0]:
            if target not in seen:
                seen.add(target)
                stack.append(target)
    return seen


def test_the_graph_is_read():
    graph = _graph()
    assert "components.config" in graph["components.training.strategies"][0]
    assert "components.config.accelerators" in graph["components.config.kubeflow"][0]
    # The annotation-only import of a TYPE_CHECKING block counts.
    assert "components.config" in graph["components.kubernetes.placement"][0]


def test_the_graph_holds_the_harness_and_the_benchmarks():
    graph = _graph()
    assert "benchmarks.distillation_common" in graph["benchmarks.distillation_methods"][0]
    assert "testkit.stats" in graph["benchmarks.distillation"][0]


def test_no_import_circles():
    circles = sorted(
        f"{module} -> {target} -> ... -> {module}"
        for module, (top, _) in _graph().items()
        for target in top
        if module in _reachable(target)
    )
    assert not circles, circles


def test_no_function_level_import_runs_back_up():
    back = sorted(
        f"{module} imports {target} inside a function, and {target} imports {module}"
        for module, (_, lazy) in _graph().items()
        for target in lazy
        if module in _reachable(target)
    )
    assert not back, back


def test_the_library_does_not_import_the_pipelines():
    found = sorted(
        f"{module} -> {target}"
        for module, (top, lazy) in _graph().items()
        if module.startswith("components")
        for target in top | lazy
        if target.startswith("pipelines")
    )
    assert not found, found


def test_no_product_module_imports_the_test_helpers():
    """`testkit/` (what tests and benchmarks share) is not in the wheel: a product
    module that imported it would fail once installed."""
    found = sorted(
        f"{module}:{node.lineno}"
        for module, path in _modules().items()
        if module.split(".")[0] in PRODUCT
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Import | ast.ImportFrom)
        and not getattr(node, "level", 0)
        and any(name == "testkit" or name.startswith("testkit.") for name in _names(node))
    )
    assert not found, found


def _tfx_v1_imports(source: str) -> list[int]:
    """Lines of `source` that import `tfx.v1` (or a module under it), in any form and
    at any depth (inside functions too)."""

    def is_v1(name: str) -> bool:
        return name == "tfx.v1" or name.startswith("tfx.v1.")

    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Import | ast.ImportFrom)
        # A relative import is the project's own, never tfx's.
        and not getattr(node, "level", 0)
        and any(is_v1(name) for name in _names(node))
    ]


def test_no_product_module_imports_tfx_v1():
    """`tfx.v1` imports TFX's Google Cloud extensions (google.cloud.aiplatform and
    BigQuery's client): seconds of every process's start that a local run and a
    compile never use. The product imports what it uses from `tfx.components` and
    the other modules `tfx.v1` re-exports. `components.tfx_v1` is the exception
    by design: it mirrors `tfx.v1` for a user who imported it anyway."""
    found = sorted(
        f"{module}:{line}"
        for module, path in _modules().items()
        if module.split(".")[0] in PRODUCT and module != "components.tfx_v1"
        for line in _tfx_v1_imports(path.read_text())
    )
    assert not found, found


def test_the_tfx_v1_check_sees_every_form():
    source = textwrap.dedent(
        """
        from tfx import v1 as tfx
        import tfx.v1
        from tfx.v1 import components
        import tfx.v1.dsl as dsl
        def later():
            from tfx import v1
        from tfx import components as stock
        from tfx.components import Trainer
        import tfx
        """
    )
    assert _tfx_v1_imports(source) == [2, 3, 4, 5, 7]


# The layers of `components/`, lowest first: a module may import its own
# layer and the ones below, never one above (docs/architecture.md). The TFX
# components are the top.
LAYERS = (
    ("components.config", "components.compat"),
    ("components.data", "components.kubernetes"),
    ("components.training",),
    ("components.distillation",),
    (
        "components.trainer",
        "components.transform",
        "components.distiller",
        "components.validation",
        "components.pusher",
        "components.example_gen",
        "components.tfx_v1",
    ),
)


def _layer(module: str) -> int | None:
    for level, packages in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in packages):
            return level
    return None


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in _graph() if m.startswith("components.") and _layer(m) is None)
    assert not unplaced, unplaced


def test_no_import_runs_up_the_layers():
    up = sorted(
        f"{module} (layer {_layer(module)}) -> {target} (layer {_layer(target)})"
        for module, (top, lazy) in _graph().items()
        if _layer(module) is not None
        for target in top | lazy
        if _layer(target) is not None and _layer(target) > _layer(module)
    )
    assert not up, up


def test_the_layer_check_sees_a_climb():
    # A data-layer module importing the training layer is what the check exists to catch.
    assert _layer("components.data.ingestion") < _layer("components.training.fit")
    assert _layer("components.config.payload") == 0
    assert _layer("components.trainer.executor") == len(LAYERS) - 1


def test_one_training_run_stays_in_the_training_and_lower_layers():
    reached = _reachable("components.training.fit")
    assert reached, "components.training.fit imports nothing?"
    assert all(
        _layer(m) is not None and _layer(m) <= _layer("components.training")
        for m in reached
        if m.startswith("components.")
    ), sorted(reached)


# --------------------------------------------------------------------------- #
# The public face and what importing it changes (run in a fresh interpreter:
# what is already imported here would hide a broken path).
# --------------------------------------------------------------------------- #

_FACE = textwrap.dedent(
    """
    import importlib, json, sys
    def import_system():
        return {
            "meta_path": [repr(f) for f in sys.meta_path],
            "path_hooks": [repr(h) for h in sys.path_hooks],
            "path": list(sys.path),
            "keras": sorted(m for m in sys.modules if m.split(".")[0] in ("keras", "tf_keras")),
        }
    out = {"before": import_system()}
    import components
    out["after"] = import_system()
    out["face"] = sorted(components.__all__)
    out["light"] = "tensorflow" not in sys.modules
    out["old"] = {}
    for old in ("components.dropin", "components.strategies", "components.testing"):
        try:
            importlib.import_module(old)
            out["old"][old] = "imported"
        except ImportError as e:
            out["old"][old] = type(e).__name__
    from components import Trainer
    from components.trainer.component import Trainer as long_trainer
    out["same"] = Trainer is long_trainer
    import pipelines.cli, pipelines.local_runner, pipelines.pipeline  # noqa: E401, F401
    out["cloud"] = sorted(
        m for m in sys.modules if m == "tfx.v1" or m.startswith("google.cloud.aiplatform")
    )
    print(json.dumps(out))
    """
)


@pytest.mark.multiprocess
def test_the_public_face_in_a_fresh_interpreter_changes_no_import_machinery():
    done = subprocess.run(
        [sys.executable, "-c", _FACE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    # Importing the library leaves the import system of the process as it was:
    # no finder, no path hook, no path entry, no Keras loaded.
    assert out["after"] == out["before"]
    assert out["after"]["keras"] == []
    assert out["face"] == [
        "DataGate",
        "Distiller",
        "DropInSettings",
        "PipelineConfig",
        "StudentBaseline",
        "Trainer",
        "Transform",
        "backup_and_restore",
    ]
    # `import components` loads no TensorFlow: each public name loads on first use.
    assert out["light"] is True
    # Paths of an unreleased layout are simply gone, with no alias table behind them.
    assert out["old"] == {
        "components.dropin": "ModuleNotFoundError",
        "components.strategies": "ModuleNotFoundError",
        "components.testing": "ModuleNotFoundError",
    }
    assert out["same"] is True
    # `tfx.v1` imports TFX's Google Cloud extensions (google.cloud.aiplatform):
    # seconds of every run's start-up that a local run never uses. The product
    # imports the stock components from `tfx.components` and the rest from
    # their own modules.
    assert out["cloud"] == []
