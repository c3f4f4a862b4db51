"""The output directory of a local run: checked, locked, and its full log kept.

Nothing here imports TensorFlow: the console script checks `--output`, takes
the lock and starts the log before the heavy imports, so that TensorFlow's
start-up lines land in the log file rather than on the console.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator

LOG_NAME = "tfxkit.log"
SUMMARY_NAME = "summary.json"
# `stage` of a run refused before any component ran.
CONFIG_CHECK_STAGE = "config check (before any component ran)"
INPUT_CHECK_STAGE = "input check (before any component ran)"
SERVICE_START_STAGE = "tf.data service start (before any component ran)"


class OutputDirError(ValueError):
    """`--output` cannot be used as a run's output directory."""


class ConcurrentRunError(RuntimeError):
    """Another run holds the output directory (pipeline root + ML Metadata)."""


def check_output_dir(path: str) -> str:
    """Creates `path` if needed and proves it is a directory this process can write.

    Args:
      path: The `--output` directory.

    Returns:
      The absolute path.

    Raises:
      OutputDirError: naming the path, what is wrong and the fix.
    """
    path = os.path.abspath(path)
    fix = "pass --output a directory you can write to (it is created if missing)"
    _refuse_the_source_tree(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise OutputDirError(f"--output: {path!r} is a file, not a directory; {fix}")
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise OutputDirError(
            f"--output: cannot create {path!r}: {existing!r} is a file, not a directory; {fix}"
        )
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".tfxkit-write-check-{uuid.uuid4().hex}")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        reason = {
            errno.EACCES: "permission denied",
            errno.EPERM: "permission denied",
            errno.EROFS: "read-only file system",
            errno.ENOSPC: "no space left on device",
            errno.EDQUOT: "disk quota exceeded",
        }.get(e.errno, e.strerror or type(e).__name__)
        where = e.filename if isinstance(e.filename, str) else path
        raise OutputDirError(
            f"--output: cannot write to {path!r} ({reason}: {where!r}); {fix}"
        ) from None
    return path


# The checkout this package runs from, when it runs from one (an editable install).
SOURCE_TREE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _refuse_the_source_tree(path: str, source_tree: str = SOURCE_TREE) -> None:
    """Refuses an output inside the product's git work tree that git does not ignore.

    A run writes ML Metadata, models and TFX artifacts: inside the sources
    they would show up in `git status` and could be committed. `runs/` (the
    default) is ignored and stays allowed; so is any path where git cannot say.

    Raises:
      OutputDirError: naming `--output`, the work tree and the fix.
    """
    if not os.path.exists(os.path.join(source_tree, ".git")):  # a directory, or a worktree's file
        return
    if os.path.commonpath([path, source_tree]) != source_tree:
        return
    try:
        ignored = subprocess.run(
            ["git", "-C", source_tree, "check-ignore", "-q", "--no-index", path],
            capture_output=True,
            timeout=30,
        ).returncode
    except (OSError, subprocess.TimeoutExpired):
        return
    if ignored == 1:  # 0: ignored; 128: git cannot say
        raise OutputDirError(
            f"--output: {path!r} is inside the tfxkit source tree {source_tree!r} and not "
            "ignored by git: the run's ML Metadata, models and artifacts would land among the "
            "sources; use the default runs/ or a directory outside the source tree"
        )


# How a full disk reads once Beam, TensorFlow or Python have wrapped it.
_NO_SPACE = re.compile(r"No space left on device|\bENOSPC\b|\[Errno 28\]")
_NO_SPACE_PATH = (
    re.compile(r"(/[^\s;'\"]+); No space left on device"),  # TensorFlow file systems
    re.compile(r"No space left on device: '([^']+)'"),  # Python's OSError
)


def _human_bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    size = n / 1024
    for unit in ("KiB", "MiB"):
        if size < 1024:
            return f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def _free_bytes(path: str) -> int | None:
    existing = path
    while existing and not os.path.exists(existing):
        parent = os.path.dirname(existing)
        if parent == existing:
            return None
        existing = parent
    try:
        stat = os.statvfs(existing)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def disk_full_error(error: BaseException, node: str | None, node_dir: str) -> str | None:
    """The message for a run that failed because a file system was full, else None.

    Args:
      error: What the orchestrator raised (causes are followed).
      node: The component that failed (None when no component is known to have).
      node_dir: Where that component writes its outputs, named when the error
        carries no path.

    Returns:
      One line naming the component, the full disk, the path and the fix.
    """
    texts: list[str] = []
    path = None
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        texts.append(str(current))
        if isinstance(current, OSError) and current.errno == errno.ENOSPC:
            texts.append("No space left on device")
            if path is None and isinstance(current.filename, str):
                path = current.filename
        current = current.__cause__ or current.__context__
    text = "\n".join(texts)
    if not _NO_SPACE.search(text):
        return None
    for pattern in _NO_SPACE_PATH:
        match = path is None and pattern.search(text)
        if match:
            path = match.group(1)
    who = node or "the run"
    where = f" writing {path!r}" if path else f" (its outputs go under {node_dir!r})"
    free = _free_bytes(path or node_dir)
    room = f"; {_human_bytes(free)} free on that file system now" if free is not None else ""
    return (
        f"{who} ran out of disk space (No space left on device){where}{room}. "
        "Free space on that file system, or pass --output a directory on a file system "
        "with room, and run again"
    )


_HELD: set[str] = set()


@contextlib.contextmanager
def exclusive_run(output_dir: str) -> Iterator[None]:
    """Holds an exclusive lock on `output_dir` for the duration of a run.

    Two orchestrators writing one SQLite ML Metadata store and one pipeline
    root at once can interleave executions and fail with "database is
    locked" half-way; the second run is refused up front instead. The lock is
    an `flock`, so the kernel releases it when a killed run's process dies.
    Re-entrant within a process: the console script takes it before its
    imports, and `local_runner.run` takes it again.

    Raises:
      ConcurrentRunError: naming the process that holds the lock.
    """
    output_dir = os.path.abspath(output_dir)
    if output_dir in _HELD:
        yield
        return
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, ".tfxkit.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise ConcurrentRunError(
                f"another tfxkit run (pid {holder}) is using {output_dir}; "
                "wait for it to finish or pass a different --output"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        _HELD.add(output_dir)
        try:
            yield
        finally:
            _HELD.discard(output_dir)
    finally:
        os.close(fd)


class RunLog:
    """Where a run's output goes.

    Attributes:
      path: The log file.
      file: A text stream appending to it (for log records).
      out: The console's standard output (progress, summary).
      err: The console's standard error (warnings that matter, errors).
    """

    def __init__(self, path: str, file: io.TextIOBase, out: io.TextIOBase, err: io.TextIOBase):
        self.path, self.file, self.out, self.err = path, file, out, err


_ACTIVE: list[RunLog] = []


def _console(fd: int) -> io.TextIOBase:
    return io.TextIOWrapper(
        os.fdopen(os.dup(fd), "wb", buffering=0), encoding="utf-8", line_buffering=True
    )


@contextlib.contextmanager
def log_to_file(output_dir: str) -> Iterator[RunLog]:
    """Sends everything the process writes to file descriptors 1 and 2 into
    `<output_dir>/tfxkit.log` (library start-up lines, TensorFlow's C++ log,
    Python warnings, Keras progress) and yields the console streams, which
    the run uses for progress, warnings that matter and the summary.

    Re-entrant: an inner call yields the outer call's `RunLog`. File
    descriptors are restored on exit.
    """
    if _ACTIVE:
        yield _ACTIVE[-1]
        return
    path = os.path.join(os.path.abspath(output_dir), LOG_NAME)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    out, err = _console(1), _console(2)
    run_log = RunLog(path, _console(log_fd), out, err)
    try:
        for fd in (1, 2):
            os.dup2(log_fd, fd)
        _ACTIVE.append(run_log)
        yield run_log
    finally:
        if run_log in _ACTIVE:
            _ACTIVE.remove(run_log)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
        os.close(log_fd)
        for stream in (run_log.file, out, err):
            with contextlib.suppress(Exception):
                stream.flush()
                stream.close()


def refused_summary(stage: str, error: str) -> dict:
    """The `summary.json` of a run refused before any component ran."""
    return {
        "status": "failed",
        "stage": stage,
        "error": error,
        "components": {},
        "metrics": {},
        "blessed": None,
        "pushed_model": None,
    }


def write_refusal(output_dir: str, summary: dict) -> None:
    """Writes `summary` as `<output_dir>/summary.json` (a local directory; no TensorFlow)."""
    path = os.path.join(output_dir, SUMMARY_NAME)
    with open(path + ".tmp", "w") as f:
        f.write(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    os.replace(path + ".tmp", path)


def record_refusal(output: str, stage: str, error: str) -> str | None:
    """Records a run refused before it got its output directory (an invalid config).

    Every run writes its own `summary.json`, so a refused run must not leave
    the previous run's `succeeded` and pushed model standing for it. Writes
    `tfxkit.log` (this run's: the error) and `summary.json` into `output` when
    it can be used; writes nothing when it cannot be or another run holds it
    (that run's record is its own).

    Args:
      output: The `--output` directory (created if missing).
      stage: What refused the run (`CONFIG_CHECK_STAGE`).
      error: The error, as the summary's `error`.

    Returns:
      The `summary.json` path written, or None.
    """
    try:
        output_dir = check_output_dir(output)
        with exclusive_run(output_dir):
            log = os.path.join(output_dir, LOG_NAME)
            with open(log, "w") as f:
                f.write(f"tfxkit: run refused at the {stage}: {error}\n")
            write_refusal(output_dir, {**refused_summary(stage, error), "log": log})
    except (OutputDirError, ConcurrentRunError, OSError):
        return None
    return os.path.join(output_dir, SUMMARY_NAME)
