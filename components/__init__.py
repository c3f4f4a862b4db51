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

__getattr__, __dir__ = lazy.exports(__name__, globals(), _PUBLIC)
