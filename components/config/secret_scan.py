"""Secrets never enter the config.

Config values travel into ML Metadata execution properties, compiled Kubeflow
specs and logs, all readable by anyone with pipeline access; a value that looks
like a credential is rejected when the config is built.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from typing import Any

from components.config.validation import ConfigError, join

_SECRET_PATTERNS = (
    ("a private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
    ("an AWS access key id", re.compile(r"\bAKIA[0-9A-Z]{16}\b")),
    ("a Google API key", re.compile(r"\bAIza[0-9A-Za-z_\-]{35}\b")),
    ("a Google OAuth access token", re.compile(r"\bya29\.[0-9A-Za-z_\-]{20,}")),
    ("a GitHub token", re.compile(r"\b(gh[pousr]_[0-9A-Za-z]{20,}|github_pat_[0-9A-Za-z_]{20,})")),
    ("a GitLab token", re.compile(r"\bglpat-[0-9A-Za-z_\-]{20,}")),
    ("a Slack token", re.compile(r"\bxox[abprs]-[0-9A-Za-z\-]{10,}")),
    ("an API secret key", re.compile(r"\bsk-[0-9A-Za-z]{20,}")),
    (
        "a credential assignment",
        re.compile(
            r"(password|passwd|secret|token|api[_-]?key|access[_-]?key|private[_-]?key)[\"']?\s*[=:]\s*[^\s/]\S*",
            re.I,
        ),
    ),
)


def reject_secret(path: str, text: str) -> None:
    """Raises if `text` looks like a credential.

    Raises:
      ConfigError: naming the field and pointing to Kubernetes secrets.
    """
    for kind, pattern in _SECRET_PATTERNS:
        if pattern.search(text):
            raise ConfigError(
                f"{path}: looks like {kind}; secrets must not be in the config (it is stored in ML Metadata, "
                "compiled Kubeflow specs and logs). Put it in a Kubernetes Secret and read it from the "
                "environment of the pod that needs it"
            )


def reject_secrets(config: Any, path: str = "") -> None:
    """Applies `reject_secret` to every string (and mapping key) of a config."""
    for where, text in _strings(config, path):
        reject_secret(where, text)


def _strings(obj: Any, path: str) -> Iterator[tuple[str, str]]:
    """Yields (field path, string) for every string (and mapping key) in a config."""
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from _strings(getattr(obj, f.name), join(path, f.name))
    elif isinstance(obj, tuple | list):
        for i, v in enumerate(obj):
            yield from _strings(v, f"{path}[{i}]")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield f"{path}.{k}", str(k)
            yield from _strings(v, f"{path}.{k}")
    elif isinstance(obj, str):
        yield path, obj
