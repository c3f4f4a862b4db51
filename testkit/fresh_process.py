"""Benchmark runs in fresh processes: the child prints one `RESULT` line, the parent reads it.

A child's other output (TensorFlow's logs, TFX's module wheel builds) stays in
the child, so the parent's stdout holds only its JSON lines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREFIX = "RESULT "


def print_result(result: dict) -> None:
    """What a child prints last: its result, for `run` to read."""
    print(PREFIX + json.dumps(result), flush=True)


def run(args: list[str], what: str) -> dict:
    """Runs `python *args` from the repository root; returns the result it printed.

    Raises:
      SystemExit: naming `what` (after the child's last stderr) when the child
        fails or prints no result.
    """
    env = {**os.environ, "PYTHONPATH": REPO_ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, cwd=REPO_ROOT
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith(PREFIX)]
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stderr[-5000:])
        raise SystemExit(f"{what} failed (exit {done.returncode})")
    return json.loads(lines[-1][len(PREFIX) :])
