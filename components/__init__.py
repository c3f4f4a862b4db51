"""tfxkit: a config-driven Transform, a distributed Trainer and a Distiller for TFX pipelines.

What users import lives here: `from components import Trainer, Transform`
(each loaded on first use, so importing a lower layer stays light). The
folders are layers, each importing only those below it (docs/architecture.md,
enforced by tests/test_imports.py): `config`, `compat` < `data`,
`kubernetes` < `training` < `distillation` < the TFX components.

Importing it leaves `tf.keras` as the process has it: the product's own code
imports tf_keras by name (`components.compat.legacy_keras`).
"""

from __future__ import annotations

import importlib.abc
import sys

from components.compat import lazy

# Public name -> the module that defines it.
_PUBLIC = {
    "Trainer": "components.trainer.component",
    "Transform": "components.transform.component",
    "Distiller": "components.distiller.component",
    "DataGate": "components.validation.component",
    "StudentBaseline": "components.trainer.baseline",
    "PipelineConfig": "components.config",
    "DropInSettings": "components.config",
    "backup_and_restore": "components.training.backup",
}
__all__ = sorted(_PUBLIC)

# Modules that moved into the layer folders: importing an old path fails
# naming the new one (`ModuleNotFoundError` is an `ImportError`).
MOVED = {
    "components.accelerators": "components.config.accelerators",
    "components.payload": "components.config.payload",
    "components.legacy_keras": "components.compat.legacy_keras",
    "components.patching": "components.compat.patching",
    "components.beam_signatures": "components.compat.beam_signatures",
    "components.user_code": "components.compat.user_code",
    "components.transform.tfx_compat": "components.compat.tfx_transform",
    "components.fashion_mnist": "components.data.fashion_mnist",
    "components.layout": "components.data.layout",
    "components.stored_input": "components.data.stored_input",
    "components.ingestion": "components.data.ingestion",
    "components.augment": "components.data.augment",
    "components.memory": "components.data.memory",
    "components.transform.writer": "components.data.writer",
    "components.transform.preprocessing": "components.data.preprocessing",
    "components.strategies": "components.training.strategies",
    "components.cluster": "components.training.cluster",
    "components.peers": "components.training.peers",
    "components.backup": "components.training.backup",
    "components.models": "components.training.models",
    "components.export": "components.training.export",
    "components.trainer.inputs": "components.training.inputs",
    "components.trainer.training": "components.training.fit",
    "components.trainer.task": "components.training.task",
    "components.distiller.teachers": "components.distillation.teachers",
    "components.distiller.student": "components.distillation.students",
    "components.kubeflow": "components.kubernetes",
}


class _MovedModules(importlib.abc.MetaPathFinder):
    """Consulted last: only an import that nothing else can satisfy reaches it."""

    def find_spec(self, fullname, path, target=None):
        new = MOVED.get(fullname)
        if new is None:
            return None
        raise ModuleNotFoundError(f"{fullname} moved to {new}: import it from there", name=fullname)


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())


__getattr__, __dir__ = lazy.exports(__name__, globals(), _PUBLIC)
