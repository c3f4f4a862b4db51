"""The import path earlier READMEs showed for the drop-in helpers; import them from `components`."""

from components.config.dropin import DropInSettings
from components.training.backup import backup_and_restore

__all__ = ["DropInSettings", "backup_and_restore"]
