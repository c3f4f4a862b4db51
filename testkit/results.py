"""Committed benchmark results: each file names the commit, date and machine it came from.

`write` saves a benchmark's JSON lines to `benchmarks/results/<name>.json`
(`<name>.tfx1.21.json` on the current stack) with the commit the process
started on (`STARTED`, taken at this module's first import), the stack, and the
load measured since: `idle` only when no one said the cores were shared and
other processes used under `IDLE_OTHER_CPU_SHARE` of a core;
`python -m testkit.results` (`make bench-report`) prints every
committed headline without running anything, marking a file stale when the
product, its benchmark or a test helper it imports changed since the commit
it records, unless `NEUTRAL_FILE` declares that change does not touch any
figure (and the report then prints the declaration).
"""

from __future__ import annotations

import ast
import dataclasses
import datetime
import functools
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(REPO_ROOT, "benchmarks", "results")
# What a result depends on besides its own script: the product's code.
# What every figure depends on: the product and the locked dependencies it runs on.
PRODUCT_PATHS = ("components", "pipelines", "requirements.lock")


def _git(*args: str, cwd: str = REPO_ROOT) -> subprocess.CompletedProcess:
    # -z output names files unquoted: any byte a file name holds must survive decoding.
    return subprocess.run(
        ["git", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        errors="surrogateescape",
        timeout=60,
    )


def commit(cwd: str = REPO_ROOT) -> dict:
    """The checked-out commit and whether the product's or the benchmarks' code in the work
    tree differs from it: `dirty`, and `dirty_files` naming what differs (results files not
    yet committed are outputs, not code)."""
    head = _git("rev-parse", "HEAD", cwd=cwd)
    files = uncommitted(
        *PRODUCT_PATHS, "benchmarks", TESTING_DIR, ":(exclude)benchmarks/results", cwd=cwd
    )
    return {
        "commit": head.stdout.strip() if head.returncode == 0 else None,
        "dirty": None if files is None else bool(files),
        "dirty_files": files,
    }


def uncommitted(*pathspec: str, cwd: str = REPO_ROOT) -> list[str] | None:
    """The files under `pathspec` that differ from HEAD in the work tree, untracked ones
    included; None where git cannot say."""
    status = _git(
        "status", "--porcelain=v1", "-z", "--untracked-files=all", "--", *pathspec, cwd=cwd
    )
    return _status_paths(status.stdout) if status.returncode == 0 else None


def _status_paths(porcelain_z: str) -> list[str]:
    """Every path `git status --porcelain=v1 -z` names, a rename's or copy's source too
    (NUL-separated entries are never quoted)."""
    entries = iter(porcelain_z.split("\0"))
    paths = set()
    for entry in entries:
        if not entry:
            continue
        paths.add(entry[3:])
        if "R" in entry[:2] or "C" in entry[:2]:
            paths.add(next(entries, ""))
    return sorted(p for p in paths if p)


def machine() -> dict:
    """Cores, CPU model, memory and versions of the machine a benchmark ran on."""
    model, memory_gib = platform.processor() or None, None
    try:
        with open("/proc/cpuinfo") as f:
            model = next(
                (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                model,
            )
        with open("/proc/meminfo") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("MemTotal"))
        memory_gib = round(kib / 2**20, 1)
    except (OSError, StopIteration, ValueError):
        pass
    return {
        "cores": os.cpu_count(),
        "cpu": model,
        "memory_gib": memory_gib,
        "python": platform.python_version(),
        "system": platform.platform(),
    }


# What other processes may use, in cores on average over a run (1.0 = one core
# busy throughout), for the run still to count as having had the machine to
# itself. A quiet machine's daemons and shells use a few hundredths of a core;
# another benchmark, a test suite or a compile uses half a core or more. A tenth
# of a core (5% of this project's 2-core machines) sits between the two.
IDLE_OTHER_CPU_SHARE = 0.10
NO_PROC = "unmeasured (no /proc)"
STACK_DISTRIBUTIONS = {
    "tfx": "tfx",
    "tensorflow": "tensorflow",
    "keras": "keras",
    "tf_keras": "tf-keras",
    "apache_beam": "apache-beam",
}
# The stack whose results keep the plain `<stem>.json`: every figure committed
# before the current stack existed was measured on it.
PLAIN_STEM_TFX = "1.16"


@dataclasses.dataclass(frozen=True)
class LoadSample:
    """One reading of the machine's CPU counters and a process tree's, in clock ticks.

    Attributes:
      loadavg: The 1, 5 and 15 minute load averages.
      busy: Ticks all CPUs spent busy since boot (user, nice, system, irq, softirq and
        steal: time the hypervisor gave to another machine counts as taken by others).
      total: Ticks all CPUs spent in any state since boot (busy, idle, iowait).
      cpus: The CPUs `stat` lists.
      pid: The process at the root of the tree `own` counts.
      own: Ticks the process and its descendants used: the live ones' own and their
        reaped children's (a reaped child's time moves to its parent's count).
      monotonic: `time.monotonic()` at the reading.
    """

    loadavg: tuple[float, ...]
    busy: int
    total: int
    cpus: int
    pid: int
    own: int
    monotonic: float


def sample_load(proc: str = "/proc", pid: int | None = None) -> LoadSample | None:
    """Reads `proc`'s `loadavg`, `stat` and the `stat` of `pid`'s process tree (default:
    this process); None where they cannot be read (no /proc)."""
    pid = os.getpid() if pid is None else pid
    try:
        with open(os.path.join(proc, "loadavg")) as f:
            loadavg = tuple(float(x) for x in f.read().split()[:3])
        busy = total = cpus = 0
        with open(os.path.join(proc, "stat")) as f:
            for line in f:
                label, *ticks = line.split()
                if label == "cpu":
                    # Guest time is already inside user and nice: left out.
                    user, nice, system, idle, iowait, irq, softirq, steal = (
                        [int(t) for t in ticks[:8]] + [0] * 8
                    )[:8]
                    busy = user + nice + system + irq + softirq + steal
                    total = busy + idle + iowait
                elif label.startswith("cpu"):
                    cpus += 1
        own = _tree_ticks(proc, pid)
    except (OSError, ValueError):
        return None
    if not cpus or not total:
        return None
    return LoadSample(loadavg, busy, total, cpus, pid, own, time.monotonic())


def process_tree_stats(proc: str, pid: int) -> dict[int, list[str]]:
    """`pid` and its live descendants -> the fields of their `<proc>/<pid>/stat` after the
    command name (`[0]` the state, `[1]` the parent, `[11:15]` CPU ticks, `[21]` resident
    pages).

    Raises:
      OSError: when `pid` is not running.
    """
    parents, stats = {}, {}
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(proc, entry, "stat")) as f:
                text = f.read()
        except OSError:
            continue  # exited since the listing
        # The command name, in parentheses, may hold spaces and parentheses itself.
        fields = text[text.rindex(")") + 2 :].split()
        parents[int(entry)] = int(fields[1])
        stats[int(entry)] = fields
    if pid not in stats:
        raise OSError(f"{proc}/{pid}/stat: no such process")
    children: dict[int, list[int]] = {}
    for child, parent in parents.items():
        children.setdefault(parent, []).append(child)
    tree, todo = {}, [pid]
    while todo:
        process = todo.pop()
        tree[process] = stats[process]
        todo += children.get(process, [])
    return tree


def _tree_ticks(proc: str, pid: int) -> int:
    """CPU ticks of `pid` and its live descendants, each with its reaped children's
    (`utime + stime + cutime + cstime` of `<proc>/<pid>/stat`)."""
    return sum(
        sum(int(v) for v in fields[11:15]) for fields in process_tree_stats(proc, pid).values()
    )


def measure_load(start: LoadSample | None, end: LoadSample | None) -> dict | str:
    """What the machine did between two samples: load averages at each, and the mean
    CPU use of everything, of the sampled process tree and of every other process, in
    cores (1.0 = one core busy throughout); a sentence saying why not where it cannot
    say."""
    if start is None or end is None:
        return NO_PROC
    if start.pid != end.pid:
        return f"unmeasured (started in process {start.pid}, written by {end.pid})"
    per_core = (end.total - start.total) / end.cpus
    if per_core <= 0:
        return "unmeasured (no time elapsed)"
    busy = (end.busy - start.busy) / per_core
    own = (end.own - start.own) / per_core
    return {
        "seconds": round(end.monotonic - start.monotonic, 1),
        "cpus": end.cpus,
        "loadavg_start": list(start.loadavg),
        "loadavg_end": list(end.loadavg),
        "busy_cpu_share": round(busy, 3),
        "own_cpu_share": round(own, 3),
        # Process and machine counts tick apart: a few ticks either way.
        "other_cpu_share": round(max(0.0, busy - own), 3),
        "idle_below": IDLE_OTHER_CPU_SHARE,
    }


def verdict(shared_with: str | None, load: dict | str) -> dict:
    """`idle`: no one said the cores were shared and the measured load agrees (never
    without a measurement); `load_says_shared`: other processes used at least
    `IDLE_OTHER_CPU_SHARE` of a core on average (None when unmeasured)."""
    if not isinstance(load, dict):
        return {"idle": False, "load_says_shared": None}
    shared = load["other_cpu_share"] >= IDLE_OTHER_CPU_SHARE
    return {"idle": shared_with is None and not shared, "load_says_shared": shared}


def installed_stack() -> dict:
    """The versions of Python and of the libraries a figure depends on (None: not
    installed)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for key, distribution in STACK_DISTRIBUTIONS.items():
        try:
            versions[key] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            versions[key] = None
    return versions


def stack_suffix(stack: dict) -> str:
    """What a results file's stem gets for the stack it was measured on: nothing on TFX
    1.16, `.tfx<major>.<minor>` on any other (`.tfx1.21`), `.no-tfx` without TFX."""
    tfx = stack.get("tfx")
    if not tfx:
        return ".no-tfx"
    version = ".".join(tfx.split(".")[:2])
    return "" if version == PLAIN_STEM_TFX else f".tfx{version}"


def results_path(stem: str, results_dir: str = RESULTS_DIR, stack: dict | None = None) -> str:
    """The file a result of `stem` measured on `stack` (default: this process's) goes to."""
    suffix = stack_suffix(installed_stack() if stack is None else stack)
    return os.path.join(results_dir, f"{stem}{suffix}.json")


@dataclasses.dataclass(frozen=True)
class Started:
    """What a benchmark process started on.

    Attributes:
      commit: `commit()` at the start.
      date: UTC, ISO 8601.
      load: The first load sample (None without /proc).
      proc: The /proc the samples read.
    """

    commit: dict
    date: str
    load: LoadSample | None
    proc: str = "/proc"


def start(cwd: str = REPO_ROOT, proc: str = "/proc") -> Started:
    """Records the commit, the date and a load sample now (see `STARTED`)."""
    return Started(commit(cwd), _now(), sample_load(proc), proc)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def provenance(cwd: str = REPO_ROOT) -> dict:
    """Where a saved trial, pair or stage came from: the commit (and dirty state), the
    date, the machine and the stack, now, and `commit_start`, what this process started
    on (`STARTED`): a commit made while a trial trained would otherwise name code that
    did not train it. For files a benchmark saves besides its results file (resumable
    trials)."""
    return {
        **commit(cwd),
        "commit_start": STARTED.commit,
        "date": _now(),
        "machine": machine(),
        "stack": installed_stack(),
    }


def write(
    name: str,
    lines: Sequence[dict],
    *,
    shared_with: str | None,
    results_dir: str = RESULTS_DIR,
    argv: Sequence[str] = (),
    cwd: str = REPO_ROOT,
    stem: str | None = None,
    started: Started | None = None,
    stack: dict | None = None,
) -> str:
    """Writes a benchmark's JSON lines, headline last, with where they came from.

    Args:
      name: The benchmark (its script is `benchmarks/<name>.py`).
      lines: Everything it printed, in order; the last is the headline.
      shared_with: What else ran on the cores meanwhile, or None when the
        machine was otherwise idle (timings need an idle machine). The file says
        `idle` only when this is None and the measured load agrees (`verdict`).
      argv: The command line it ran with.
      cwd: The repository whose commit is recorded.
      stem: The file's name without `.json` when one benchmark keeps several
        results (one per example); default: `name`. Measured on a stack other
        than TFX 1.16, the name gets `stack_suffix` (`drop_in_taxi.tfx1.21.json`).
      started: What the process started on; default `STARTED`, taken when this
        module was first imported. The load is measured from its sample to now.
      stack: The versions the figures were measured with; default: the installed ones.

    Returns:
      The file written.

    Raises:
      ValueError: with no lines.
    """
    if not lines:
        raise ValueError(f"{name}: no result lines to write")
    started = STARTED if started is None else started
    stack = installed_stack() if stack is None else stack
    load = measure_load(started.load, sample_load(started.proc))
    at_write = commit(cwd)
    record = {
        "benchmark": name,
        **at_write,
        "commit_start": started.commit,
        "commit_changed": started.commit != at_write,
        "date_start": started.date,
        "date": _now(),
        "machine": machine(),
        "stack": stack,
        "load": load,
        **verdict(shared_with, load),
        "shared_with": shared_with,
        "argv": list(argv),
        "lines": list(lines),
        "headline": lines[-1],
    }
    os.makedirs(results_dir, exist_ok=True)
    path = results_path(stem or name, results_dir, stack)
    with open(path + ".tmp", "w") as f:
        f.write(json.dumps(record, indent=1, sort_keys=True) + "\n")
    os.replace(path + ".tmp", path)
    return path


# The helpers benchmarks and tests share. A change there stales only the results
# of benchmarks that import it (directly or through another helper); this
# module records results and measures nothing, so it stales none.
TESTING_DIR = "testkit"
# Every directory of such helpers: the product's runs never import them.
TESTING_DIRS = (TESTING_DIR,)
CONFIGS_DIR = "pipelines/configs"
RECORDING_ONLY = frozenset({f"{TESTING_DIR}/results.py"})
# Commits declared not to touch any benchmark's figures, each for the paths it
# names, with why (a message's wording, say): `{"changes": [{"commit": full sha,
# "paths": [...], "why": "..."}]}`. A result crosses such a change without
# going stale, and `report` prints the declaration under it, when every commit
# to that path since the result's own (merges included; under a rename, the old
# path's too) is declared for it and the result's commit is an ancestor of HEAD.
# Read as committed at HEAD.
NEUTRAL_FILE = "benchmarks/neutral_changes.json"
# The commit, date and load a benchmark started on, taken when this module is first
# imported: every benchmark imports it before measuring anything, so no benchmark
# can forget to record its start. `write` measures the load from here.
STARTED = start()


@functools.cache
def _tree(path: str) -> ast.Module | None:
    """A Python file's syntax tree, parsed once per `staleness` call (None when unreadable)."""
    try:
        with open(path) as f:
            return ast.parse(f.read())
    except (OSError, SyntaxError):
        return None


def _imports_under(path: str, package: str) -> set[str]:
    """The modules of `package` (dotted) a Python file imports, by name within it."""
    tree = _tree(path)
    if tree is None:
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == package:
                names.update(alias.name for alias in node.names)
            elif node.module.startswith(package + "."):
                names.add(node.module[len(package) + 1 :])
        elif isinstance(node, ast.Import):
            names.update(
                alias.name[len(package) + 1 :]
                for alias in node.names
                if alias.name.startswith(package + ".")
            )
    return names


def _declared_paths(path: str) -> set[str]:
    """The paths a Python file declares it reads (`DEPENDS_ON = ("dir", ...)` at module
    level): module files loaded by path, data it trains on; none when it declares none."""
    tree = _tree(path)
    if tree is None:
        return set()
    for node in tree.body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        if any(isinstance(t, ast.Name) and t.id == "DEPENDS_ON" for t in targets) and isinstance(
            node.value, (ast.Tuple, ast.List)
        ):
            return {
                e.value.rstrip("/")
                for e in node.value.elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            }
    return set()


def _string_constants(path: str) -> set[str]:
    """Every string literal in a Python file (a shipped config is loaded by its name)."""
    tree = _tree(path)
    if tree is None:
        return set()
    return {
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def _dependencies(script: str, cwd: str) -> tuple[set[str], set[str], set[str]]:
    """What a benchmark script depends on in this repository beyond the product,
    transitively: `(benchmark modules it imports, test helpers it imports less the
    recording ones, paths these files declare in DEPENDS_ON and the shipped configs
    they name)`."""
    scripts, helpers, declared, todo = set(), set(), set(), [script]
    while todo:
        path = todo.pop()
        declared |= _declared_paths(path)
        declared |= {
            f"{CONFIGS_DIR}/{name}.yaml"
            for name in _string_constants(path)
            if name.isidentifier()
            and os.path.exists(os.path.join(cwd, CONFIGS_DIR, f"{name}.yaml"))
        }
        for name in _imports_under(path, "benchmarks"):
            found = os.path.join("benchmarks", *name.split(".")) + ".py"
            if found not in scripts:
                scripts.add(found)
                todo.append(os.path.join(cwd, found))
        for testing in TESTING_DIRS:
            for name in _imports_under(path, testing.replace("/", ".")):
                found = os.path.join(testing, *name.split(".")) + ".py"
                if found not in helpers and found not in RECORDING_ONLY:
                    helpers.add(found)
                    todo.append(os.path.join(cwd, found))
    # Runs on every import of a helper of its directory.
    helpers |= {
        os.path.join(testing, "__init__.py")
        for testing in TESTING_DIRS
        if any(h.startswith(testing + "/") for h in helpers)
    }
    return scripts, helpers, declared


def _measuring(
    files: Sequence[str], script: str, scripts: set[str], helpers: set[str], declared: set[str]
) -> list[str]:
    """Those of `files` a benchmark's figures depend on: its script, the benchmark modules
    and test helpers it imports, the paths they declare, and the product."""
    return [
        f
        for f in files
        if f in helpers
        or any(f == d or f.startswith(d + "/") for d in declared)
        or (
            not any(f.startswith(testing + "/") for testing in TESTING_DIRS)
            and not _a_shipped_config(f)
            and (f == script or f in scripts or f.split("/", 1)[0] in PRODUCT_PATHS)
        )
    ]


def _a_shipped_config(path: str) -> bool:
    """A shipped YAML config: it counts only for benchmarks that name it (`_dependencies`)."""
    return os.path.dirname(path) == CONFIGS_DIR and path.endswith(".yaml")


def _code_of(source: str) -> str | None:
    """A Python module's syntax tree without its docstrings (comments are not in it);
    None when it does not parse."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def _data_of(source: str) -> str | None:
    """A YAML file's data (comments and layout are not in it; keys keep their types);
    None when it does not parse."""
    import yaml

    try:
        return yaml.safe_dump(yaml.safe_load(source), sort_keys=True)
    except (yaml.YAMLError, TypeError):
        return None


def _same_code(path: str, recorded: str, cwd: str) -> bool:
    """Whether a Python file changed only in docstrings, comments or layout since
    `recorded` (what it runs is the same), or a YAML file (a shipped config) only in
    comments or layout (the same data); False for any other file."""
    if path.endswith(".py"):
        parse = _code_of
    elif _a_shipped_config(path):
        parse = _data_of
    else:
        return False
    before, after = (_git("show", f"{rev}:{path}", cwd=cwd) for rev in (recorded, "HEAD"))
    if before.returncode != 0 or after.returncode != 0:
        return False
    code = parse(before.stdout)
    return code is not None and code == parse(after.stdout)


def _neutral_changes(cwd: str) -> dict[str, dict[str, str]]:
    """`NEUTRAL_FILE` as committed at HEAD (an uncommitted edit spares nothing), as
    path -> {full commit: why}; empty where there is none.

    Raises:
      ValueError: naming the file, the entry and the fix, when it is not of
        `NEUTRAL_FILE`'s form.
    """
    shown = _git("show", f"HEAD:{NEUTRAL_FILE}", cwd=cwd)
    if shown.returncode != 0:
        return {}
    declared: dict[str, dict[str, str]] = {}
    try:
        entries = json.loads(shown.stdout)["changes"]
        for i, entry in enumerate(entries):
            sha, paths, why = entry["commit"], entry["paths"], entry["why"]
            if not (
                isinstance(sha, str) and len(sha) == 40 and set(sha) <= set("0123456789abcdef")
            ):
                raise ValueError(f"changes[{i}].commit: expected a full 40-hex sha, got {sha!r}")
            for path in paths:
                declared.setdefault(path, {})[sha] = why
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(
            f'{NEUTRAL_FILE}: {e}; expected {{"changes": [{{"commit": full sha, '
            '"paths": [...], "why": "..."}]}'
        ) from e
    return declared


def _declared_neutral(path: str, recorded: str, cwd: str, declared: dict) -> list[str] | None:
    """When every commit that changed `path` since `recorded` (merges included) is
    declared in `NEUTRAL_FILE` for that path, one line per commit saying so;
    otherwise None. `recorded` must be an ancestor of HEAD."""
    if path not in declared:
        return None
    log = _git("log", "--full-history", "--format=%H", f"{recorded}..HEAD", "--", path, cwd=cwd)
    commits = log.stdout.split()
    if log.returncode != 0 or not commits or any(c not in declared[path] for c in commits):
        return None
    return [f"{path} at {c[:10]}: {declared[path][c]}" for c in commits]


def staleness(record: dict, cwd: str = REPO_ROOT) -> str | None:
    """Why a result no longer describes HEAD, or None when it still does."""
    return assess(record, cwd)[0]


def assess(record: dict, cwd: str = REPO_ROOT) -> tuple[str | None, list[str]]:
    """`(staleness, declared)`: why a result no longer describes HEAD (None when it
    still does), and the changes since its commit that count for it but that
    `NEUTRAL_FILE` declares do not touch what it measures, one line each."""
    _tree.cache_clear()  # files change between calls; within one, each is read once
    recorded = record.get("commit")
    if not recorded:
        return "no commit recorded", []
    if _git("cat-file", "-e", f"{recorded}^{{commit}}", cwd=cwd).returncode != 0:
        return f"commit {recorded[:10]} is not in this history", []
    script = os.path.join("benchmarks", f"{record['benchmark']}.py")
    scripts, helpers, declared = _dependencies(os.path.join(cwd, script), cwd)
    changed = _git(
        "diff",
        "-z",
        "--name-only",
        # A rename lists both paths: the old one's history counts too.
        "--no-renames",
        recorded,
        "HEAD",
        "--",
        script,
        *scripts,
        *helpers,
        *declared,
        *PRODUCT_PATHS,
        cwd=cwd,
    )
    files = [
        f
        for f in _measuring(changed.stdout.split("\0"), script, scripts, helpers, declared)
        if not _same_code(f, recorded, cwd)
    ]
    # Only a result measured on HEAD's own history can cross a declared change:
    # on another line, `recorded..HEAD` would miss what HEAD lacks of it.
    ancestor = _git("merge-base", "--is-ancestor", recorded, "HEAD", cwd=cwd).returncode == 0
    neutral = _neutral_changes(cwd) if ancestor else {}
    crossed: list[str] = []
    for f in list(files):
        lines = _declared_neutral(f, recorded, cwd, neutral)
        if lines is not None:
            files.remove(f)
            crossed += lines
    if files:
        stale = (
            f"{len(files)} file(s) of the product or the benchmark changed since {recorded[:10]}"
        )
        return stale, crossed
    dirty_files = record.get("dirty_files")
    if dirty_files is None and record.get("dirty") is not False:
        # Recorded before results named the uncommitted files, or git could not say:
        # any of them may count.
        return f"measured on uncommitted changes to {recorded[:10]} (or none recorded)", crossed
    dirty = _measuring(dirty_files or [], script, scripts, helpers, declared)
    if dirty:
        return f"measured on uncommitted changes to {len(dirty)} file(s) it depends on", crossed
    return None, crossed


def report(results_dir: str = RESULTS_DIR, cwd: str = REPO_ROOT) -> list[str]:
    """One block per committed result: where it came from, whether it is stale, its headline."""
    if not os.path.isdir(results_dir):
        return [f"no results in {os.path.relpath(results_dir, cwd)}"]
    out = []
    for entry in sorted(os.listdir(results_dir)):
        if not entry.endswith(".json"):
            continue
        with open(os.path.join(results_dir, entry)) as f:
            record = json.load(f)
        stale, crossed = assess(record, cwd)
        where = record["machine"]
        tfx = (record.get("stack") or {}).get("tfx")
        out.append(
            f"== {record['benchmark']} ({entry}): commit {str(record.get('commit'))[:10]}, "
            f"{record['date']}, {where.get('cores')} cores {where.get('cpu')}, "
            + (f"tfx {tfx}, " if tfx else "")
            + _occupancy(record)
            + (f"; STALE: {stale}" if stale else "")
        )
        out += [f"   declared not to touch its figures ({NEUTRAL_FILE}): {c}" for c in crossed]
        out += _provenance_notes(record)
        out.append(json.dumps(record["headline"], sort_keys=True))
    return out or [f"no results in {os.path.relpath(results_dir, cwd)}"]


def _occupancy(record: dict) -> str:
    """Whether the run had the machine to itself, as its file records it."""
    load, shared_with = record.get("load"), record.get("shared_with")
    if record.get("idle"):
        if isinstance(load, dict):
            return f"idle (others used {load['other_cpu_share']} of a core)"
        return "idle"  # written before the load was measured: the flag's word alone
    said = f"shared with {shared_with}" if shared_with else ""
    if isinstance(load, dict) and record.get("load_says_shared"):
        measured = f"others used {load['other_cpu_share']} of a core on average"
        return f"{said}; {measured}" if said else f"shared: {measured}"
    if isinstance(load, str) and not said:
        return f"not idle: load {load}"
    return said or "shared"


def _provenance_notes(record: dict) -> list[str]:
    """A line for a file written before commit_start was recorded, or one whose commit
    changed while its benchmark ran."""
    if "commit_start" not in record:
        return [
            "   no commit_start: written before provenance was recorded "
            "(no measured load either: its idle is the --shared-with flag's word)"
        ]
    if record.get("commit_changed"):
        began = record["commit_start"]
        return [
            f"   commit changed while it ran: started on {str(began.get('commit'))[:10]}"
            + (" with uncommitted changes" if began.get("dirty") else "")
        ]
    return []


def main(argv: Sequence[str] | None = None) -> int:
    del argv
    print("\n".join(report()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
