"""`testkit.results`: committed results name their commit and machine; stale ones show."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from testkit import results

STACK_1_16 = {
    "python": "3.11.7",
    "tfx": "1.16.0",
    "tensorflow": "2.16.2",
    "keras": "3.15.1",
    "tf_keras": "2.16.0",
    "apache_beam": "2.72.0",
}
STACK_1_21 = {
    **STACK_1_16,
    "python": "3.13.5",
    "tfx": "1.21.0",
    "tensorflow": "2.21.0",
    "tf_keras": "2.21.0",
    "apache_beam": "2.77.0",
}


def _git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture
def repo(tmp_path):
    """A throwaway git repository shaped like this one (a benchmark and product code)."""
    root = tmp_path / "repo"
    (root / "benchmarks").mkdir(parents=True)
    (root / "components").mkdir()
    (root / "benchmarks" / "speed.py").write_text("print('fast')\n")
    (root / "components" / "core.py").write_text("X = 1\n")
    _git(root, "init", "-q")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "x", "--allow-empty")
    _git(root, "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "code")
    return root


def _write_proc(proc, *, busy, idle, own, loadavg="0.10 0.20 0.30", pid=None, cpus=2):
    """A hand-written /proc: the machine's counters (`busy` and `idle` ticks over all
    CPUs) and one process, `pid` (default: this one), that used `own` ticks."""
    pid = os.getpid() if pid is None else pid
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / "loadavg").write_text(f"{loadavg} 1/100 {pid}\n")
    per_cpu = "".join(f"cpu{i} 0 0 0 0 0 0 0 0 0 0\n" for i in range(cpus))
    # user nice system idle iowait irq softirq steal guest guest_nice: busy split
    # over user, system and steal; guest (already inside user) must not count twice.
    third = busy // 3
    (proc / "stat").write_text(
        f"cpu  {third} 0 {third} {idle} 0 0 0 {busy - 2 * third} 999 0\n{per_cpu}intr 1 2\n"
    )
    _write_process(proc, pid, ppid=1, utime=own, stime=0)


def _write_process(proc, pid, *, ppid, utime, stime=0, cutime=0, cstime=0):
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    # A command name may hold spaces and parentheses.
    (proc / str(pid) / "stat").write_text(
        f"{pid} (a (b) c) S {ppid} 0 0 0 -1 0 0 0 0 0 {utime} {stime} {cutime} {cstime} 20 0\n"
    )


def test_the_writer_records_commit_date_machine_and_the_headline_last(tmp_path, repo):
    proc = tmp_path / "proc"
    # 2 CPUs for 1,000 ticks each: this process used 400 ticks, others 100 (0.05 core).
    _write_proc(proc, busy=10_000, idle=50_000, own=200)
    started = results.start(str(repo), str(proc))
    _write_proc(proc, busy=10_450, idle=51_550, own=600, loadavg="0.50 0.25 0.31")
    path = results.write(
        "speed",
        [{"a": 1}, {"ratio": 0.5}],
        shared_with=None,
        results_dir=str(tmp_path / "r"),
        cwd=str(repo),
        started=started,
        stack=STACK_1_16,
    )
    record = json.loads(open(path).read())
    assert os.path.basename(path) == "speed.json"
    assert record["commit"] == results.commit(str(repo))["commit"] and record["dirty"] is False
    assert len(record["commit"]) == 40
    assert record["headline"] == {"ratio": 0.5} and record["lines"][0] == {"a": 1}
    assert record["idle"] is True and record["shared_with"] is None
    assert record["load_says_shared"] is False
    load = record["load"]
    assert (load["busy_cpu_share"], load["own_cpu_share"], load["other_cpu_share"]) == (
        0.45,
        0.4,
        0.05,
    )
    assert load["loadavg_start"] == [0.1, 0.2, 0.3] and load["loadavg_end"] == [0.5, 0.25, 0.31]
    assert load["cpus"] == 2 and load["idle_below"] == results.IDLE_OTHER_CPU_SHARE
    assert record["stack"] == STACK_1_16
    assert record["machine"]["cores"] == os.cpu_count()
    assert record["date"].endswith("+00:00")
    assert results.report(str(tmp_path / "r"), str(repo))[1] == '{"ratio": 0.5}'


def test_commit_reads_the_checked_out_commit(repo):
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert results.commit(str(repo)) == {"commit": head, "dirty": False, "dirty_files": []}
    # Another run's results file, not committed yet, is an output: the code is unchanged.
    (repo / "benchmarks" / "results").mkdir()
    (repo / "benchmarks" / "results" / "speed.json").write_text("{}\n")
    assert results.commit(str(repo))["dirty"] is False
    (repo / "components" / "core.py").write_text("X = 2\n")
    (repo / "benchmarks" / "new.py").write_text("N = 1\n")
    assert results.commit(str(repo))["dirty"] is True
    assert results.commit(str(repo))["dirty_files"] == ["benchmarks/new.py", "components/core.py"]


def test_uncommitted_changes_stale_a_result_only_where_it_depends_on_them(repo):
    head = results.commit(str(repo))["commit"]

    def stale(*dirty_files):
        record = {"benchmark": "speed", "commit": head, "dirty": bool(dirty_files)}
        return results.staleness({**record, "dirty_files": list(dirty_files)}, str(repo))

    assert stale() is None
    # Another benchmark's script measures nothing of this one.
    assert stale("benchmarks/other.py") is None
    assert stale("benchmarks/speed.py", "benchmarks/other.py") == (
        "measured on uncommitted changes to 1 file(s) it depends on"
    )
    assert stale("components/core.py") is not None
    # Recorded before the files were named, or git could not say: any change may count.
    for unknown in ({"dirty": True}, {"dirty": None, "dirty_files": None}):
        assert results.staleness({"benchmark": "speed", "commit": head, **unknown}, str(repo)) == (
            f"measured on uncommitted changes to {head[:10]} (or none recorded)"
        )


def test_uncommitted_renames_and_unusual_names_are_recorded_as_they_are(repo):
    _git(repo, "mv", "benchmarks/speed.py", "benchmarks/speed 2.py")
    (repo / "components" / 'quote"d -> é.py').write_text("Q = 1\n")
    assert results.commit(str(repo))["dirty_files"] == [
        "benchmarks/speed 2.py",
        "benchmarks/speed.py",
        'components/quote"d -> é.py',
    ]


def test_paths_a_benchmark_declares_stale_its_results(repo):
    (repo / "benchmarks" / "speed.py").write_text(
        'DEPENDS_ON: tuple[str, ...] = ("benchmarks/modules",)\n'
    )
    (repo / "benchmarks" / "modules").mkdir()
    (repo / "benchmarks" / "modules" / "user.py").write_text("U = 1\n")
    (repo / "benchmarks" / "modules_other.py").write_text("O = 1\n")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "declare")
    head = results.commit(str(repo))["commit"]
    record = {"benchmark": "speed", "commit": head, "dirty": False, "dirty_files": []}
    assert results.staleness(record, str(repo)) is None
    # Uncommitted: only the declared directory counts, not a name that merely starts like it.
    dirty = {**record, "dirty": True, "dirty_files": ["benchmarks/modules_other.py"]}
    assert results.staleness(dirty, str(repo)) is None
    dirty["dirty_files"] = ["benchmarks/modules/user.py"]
    assert results.staleness(dirty, str(repo)).endswith("1 file(s) it depends on")
    (repo / "benchmarks" / "modules" / "user.py").write_text("U = 2\n")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "user")
    assert results.staleness(record, str(repo)).startswith("1 file(s)")


def test_a_result_is_stale_once_its_benchmark_or_the_product_changed(repo):
    head = results.commit(str(repo))["commit"]
    record = {"benchmark": "speed", "commit": head, "dirty": False}
    assert results.staleness(record, str(repo)) is None
    (repo / "components" / "core.py").write_text("X = 2\n")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "change")
    assert results.staleness(record, str(repo)) == (
        f"1 file(s) of the product or the benchmark changed since {head[:10]}"
    )
    unknown = {"benchmark": "speed", "commit": "0" * 40}
    assert results.staleness(unknown, str(repo)) == "commit 0000000000 is not in this history"


def test_a_test_helper_stales_only_the_results_of_benchmarks_that_import_it(repo):
    testing = repo / "testkit"
    testing.mkdir()
    (testing / "timer.py").write_text("from testkit import clock\n")
    (testing / "clock.py").write_text("T = 1\n")
    (testing / "faults.py").write_text("F = 1\n")
    (testing / "results.py").write_text("R = 1\n")
    (repo / "benchmarks" / "common.py").write_text("C = 1\n")
    (repo / "benchmarks" / "speed.py").write_text(
        "from benchmarks import common\nfrom testkit import results, timer\n"
    )
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "helpers")
    record = {"benchmark": "speed", "commit": results.commit(str(repo))["commit"], "dirty": False}

    def after_changing(path: str) -> str | None:
        (repo / path).write_text((repo / path).read_text() + "CHANGED = 1\n")
        _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", path)
        return results.staleness(record, str(repo))

    # A helper it does not import, and the results writer, measure nothing of it.
    assert after_changing("testkit/faults.py") is None
    assert after_changing("testkit/results.py") is None
    # A helper it imports through another, and a benchmark module it imports, do.
    assert after_changing("testkit/clock.py").startswith("1 file(s)")
    assert after_changing("benchmarks/common.py").startswith("2 file(s)")


def test_the_test_helpers_package_init_stales_only_the_results_of_benchmarks_that_import_it(repo):
    testing = repo / "testkit"
    testing.mkdir()
    (testing / "__init__.py").write_text("")
    (testing / "cases.py").write_text("from testkit import disk\n\nCASES = 1\n")
    (testing / "disk.py").write_text("D = 1\n")
    (testing / "other.py").write_text("O = 1\n")
    (repo / "pipelines").mkdir()
    (repo / "pipelines" / "runner.py").write_text("R = 1\n")
    (repo / "benchmarks" / "catalogue.py").write_text("from testkit.cases import CASES\n")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "helpers")
    measured = results.commit(str(repo))["commit"]
    speed, catalogue = (
        {"benchmark": name, "commit": measured, "dirty": False} for name in ("speed", "catalogue")
    )

    def after_changing(path: str) -> tuple[str | None, str | None]:
        (repo / path).write_text((repo / path).read_text() + "CHANGED = 1\n")
        _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", path)
        return results.staleness(speed, str(repo)), results.staleness(catalogue, str(repo))

    # No product run imports them: a helper nobody imports stales nothing.
    assert after_changing("testkit/other.py") == (None, None)
    # The one a benchmark imports stales its results only.
    stale_speed, stale_catalogue = after_changing("testkit/cases.py")
    assert stale_speed is None and stale_catalogue.startswith("1 file(s)")
    # So do the helpers it imports, and the package's __init__.
    assert after_changing("testkit/disk.py")[0] is None
    assert after_changing("testkit/__init__.py")[0] is None
    # pipelines/ is the product: it stales both.
    stale_speed, stale_catalogue = after_changing("pipelines/runner.py")
    assert stale_speed.startswith("1 file(s)") and stale_catalogue.startswith("4 file(s)")


def test_one_benchmark_keeps_a_file_per_stem(tmp_path, repo):
    for example in ("taxi", "penguin"):
        results.write(
            "drop_in",
            [{"example": example}],
            shared_with="a compile",
            results_dir=str(tmp_path / "r"),
            cwd=str(repo),
            stem=f"drop_in_{example}",
            stack=STACK_1_16,
        )
    assert sorted(os.listdir(tmp_path / "r")) == ["drop_in_penguin.json", "drop_in_taxi.json"]
    record = json.loads((tmp_path / "r" / "drop_in_penguin.json").read_text())
    assert record["benchmark"] == "drop_in" and record["idle"] is False
    assert record["shared_with"] == "a compile"


def test_writing_nothing_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"^speed: no result lines to write$"):
        results.write("speed", [], shared_with=None, results_dir=str(tmp_path))


def test_a_change_to_docstrings_comments_or_layout_alone_stales_nothing(repo):
    core = repo / "components" / "core.py"
    core.write_text('"""Core."""\n\n\ndef f(x):\n    """Doubles."""\n    return 2 * x\n')
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "f")
    record = {"benchmark": "speed", "commit": results.commit(str(repo))["commit"], "dirty": False}

    def after(text: str) -> str | None:
        core.write_text(text)
        _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "edit")
        return results.staleness(record, str(repo))

    assert after('"""Core, said better."""\n\n\ndef f(x):  # why\n    return 2 * (x)\n') is None
    assert after('"""Core."""\n\n\ndef f(x):\n    """Doubles."""\n    return 3 * x\n') == (
        f"1 file(s) of the product or the benchmark changed since {record['commit'][:10]}"
    )

    # A string that is not a docstring is code.
    core.write_text('def f(x):\n    x = "a"\n    return x\n')
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "g")
    record["commit"] = results.commit(str(repo))["commit"]
    assert after('def f(x):\n    x = "b"\n    return x\n') is not None


def test_a_shipped_config_stales_only_the_benchmarks_that_name_it(repo):
    configs = repo / "pipelines" / "configs"
    configs.mkdir(parents=True)
    (configs / "taxi.yaml").write_text("name: taxi\n")
    (configs / "schema.json").write_text("{}\n")
    (repo / "benchmarks" / "speed.py").write_text('CONFIG = "taxi"\n')
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "configs")
    record = {"benchmark": "speed", "commit": results.commit(str(repo))["commit"], "dirty": False}

    def after_writing(path: str, text: str) -> str | None:
        (repo / path).write_text(text)
        _git(repo, "add", "-A")
        _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", path)
        return results.staleness(record, str(repo))

    # Another config, new or changed, is not what this benchmark runs.
    assert after_writing("pipelines/configs/digits.yaml", "name: digits\n") is None
    assert after_writing("pipelines/configs/digits.yaml", "name: digits2\n") is None
    # The config it names, and any other file under pipelines/, do count.
    assert after_writing("pipelines/configs/taxi.yaml", "name: taxi2\n").startswith("1 file(s)")
    assert after_writing("pipelines/configs/schema.json", "[]\n").startswith("2 file(s)")


def test_a_config_whose_comments_or_layout_alone_changed_stales_nothing(repo):
    configs = repo / "pipelines" / "configs"
    configs.mkdir(parents=True)
    (configs / "taxi.yaml").write_text("name: taxi\ntrain: {steps: 10}\n")
    (repo / "benchmarks" / "speed.py").write_text('CONFIG = "taxi"\n')
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "configs")
    record = {"benchmark": "speed", "commit": results.commit(str(repo))["commit"], "dirty": False}

    def after(text: str) -> str | None:
        (configs / "taxi.yaml").write_text(text)
        _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "edit")
        return results.staleness(record, str(repo))

    assert after("# Measured: see the results.\nname: taxi\ntrain:\n  steps: 10  # why\n") is None
    assert after("name: taxi\ntrain: {steps: 20}\n").startswith("1 file(s)")
    # A key of another type is other data; a file that no longer parses is a change.
    assert after("name: taxi\ntrain: {steps: 20}\n1: a\n").startswith("1 file(s)")
    record["commit"] = results.commit(str(repo))["commit"]
    assert after("name: taxi\ntrain: {steps: 20}\n'1': a\n").startswith("1 file(s)")
    assert after("name: [taxi\n").startswith("1 file(s)")


def test_a_yaml_file_other_than_a_shipped_config_counts_by_its_text(repo):
    (repo / "components" / "settings.yaml").write_text("a: 1\n")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "settings")
    record = {"benchmark": "speed", "commit": results.commit(str(repo))["commit"], "dirty": False}
    (repo / "components" / "settings.yaml").write_text("# why\na: 1\n")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "comment")
    assert results.staleness(record, str(repo)).startswith("1 file(s)")


def _commit_all(repo, message: str = "edit") -> str:
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message)
    return results.commit(str(repo))["commit"]


def _declare(repo, *changes: tuple[str, str]) -> str:
    """Commits `benchmarks/neutral_changes.json` declaring each `(commit, path)`."""
    entries = [{"commit": c, "paths": [p], "why": "wording only"} for c, p in changes]
    (repo / results.NEUTRAL_FILE).write_text(json.dumps({"changes": entries}))
    return _commit_all(repo, "declare")


def test_a_change_declared_neutral_stales_nothing_and_is_reported_beside_the_result(repo):
    core, other = repo / "components" / "core.py", repo / "components" / "other.py"
    measured = results.commit(str(repo))["commit"]
    record = {
        "benchmark": "speed",
        "commit": measured,
        "dirty": False,
        "dirty_files": [],
        "date": "d",
        "machine": {"cores": 2, "cpu": "c"},
        "idle": True,
        "headline": {"ratio": 0.5},
    }
    (repo / "r").mkdir()
    (repo / "r" / "speed.json").write_text(json.dumps(record))
    core.write_text('X = 1\nMESSAGE = "no lead to recover"\n')
    other.write_text("Y = 2\n")
    both = _commit_all(repo)
    stale = f"{{}} file(s) of the product or the benchmark changed since {measured[:10]}"
    assert results.staleness(record, str(repo)) == stale.format(2)
    # Declared for one of the two paths it changed, the other still counts.
    _declare(repo, (both, "components/core.py"))
    assert results.assess(record, str(repo)) == (
        stale.format(1),
        [f"components/core.py at {both[:10]}: wording only"],
    )
    _declare(repo, (both, "components/core.py"), (both, "components/other.py"))
    assert results.staleness(record, str(repo)) is None
    assert results.report(str(repo / "r"), str(repo))[:2] == [
        "== speed (speed.json): commit " + measured[:10] + ", d, 2 cores c, idle",
        "   declared not to touch its figures (benchmarks/neutral_changes.json): "
        f"components/core.py at {both[:10]}: wording only",
    ]
    # An uncommitted declaration spares nothing: the committed one is read.
    (repo / results.NEUTRAL_FILE).write_text(json.dumps({"changes": []}))
    assert results.staleness(record, str(repo)) is None
    _git(repo, "checkout", "-q", "--", results.NEUTRAL_FILE)
    # A later change to the same path that nobody declared stales it again.
    core.write_text('X = 2\nMESSAGE = "no lead to recover"\n')
    _commit_all(repo)
    assert results.staleness(record, str(repo)) == stale.format(1)


def test_a_declaration_spares_nothing_across_a_rename_a_merge_or_another_line(repo):
    core = repo / "components" / "core.py"
    before = results.commit(str(repo))["commit"]

    # A merge that takes the other line's file undoes the measured change: the
    # merge itself changed the path and must be declared.
    core.write_text("X = 5\n")
    measured = _commit_all(repo)
    record = {"benchmark": "speed", "commit": measured, "dirty": False, "dirty_files": []}
    _git(repo, "checkout", "-q", "-b", "side", before)
    core.write_text('X = 1\nMESSAGE = "a"\n')
    wording = _commit_all(repo)
    _git(repo, "checkout", "-q", "-")
    _git(
        repo,
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@t",
        "merge",
        "-q",
        "-s",
        "ours",
        "--no-commit",
        "side",
    )
    _git(repo, "checkout", "side", "--", "components/core.py")
    _commit_all(repo, "merge side, its core.py")
    _declare(repo, (wording, "components/core.py"))
    assert results.staleness(record, str(repo)) is not None

    # A result measured on another line: HEAD lacks its change, whatever is declared.
    _git(repo, "checkout", "-q", "-b", "lone", before)
    core.write_text("X = 7\n")
    lone = _commit_all(repo)
    _git(repo, "checkout", "-q", "-b", "declared", before)
    core.write_text('X = 1\nMESSAGE = "c"\n')
    reworded = _commit_all(repo)
    _declare(repo, (reworded, "components/core.py"))
    assert results.staleness({**record, "commit": before}, str(repo)) is None
    assert results.staleness({**record, "commit": lone}, str(repo)) is not None

    # A rename (git sees one: most lines stay) after an undeclared edit of the
    # old path: that edit still counts.
    _git(repo, "checkout", "-q", "-b", "renames", measured)
    body = "".join(f"V{i} = {i}\n" for i in range(20))
    core.write_text(body + "X = 5\n")
    renaming_from = _commit_all(repo)
    core.write_text(body + "X = 99\n")
    _commit_all(repo)
    _git(repo, "mv", "components/core.py", "components/core2.py")
    renamed = _commit_all(repo)
    _declare(repo, (renamed, "components/core2.py"), (renamed, "components/core.py"))
    from_there = {**record, "commit": renaming_from}
    assert results.staleness(from_there, str(repo)) is not None


def test_a_malformed_declaration_is_refused_naming_the_file_and_the_form(repo):
    _declare(repo, ("abc123", "components/core.py"))
    core = repo / "components" / "core.py"
    record = {"benchmark": "speed", "commit": results.commit(str(repo))["commit"], "dirty": False}
    core.write_text("X = 3\n")
    _commit_all(repo)
    with pytest.raises(
        ValueError, match=r"neutral_changes\.json: changes\[0\]\.commit: expected a full"
    ):
        results.staleness(record, str(repo))


def _sample(busy: int, total: int, own: int, pid: int = 7) -> results.LoadSample:
    return results.LoadSample((0.0, 0.0, 0.0), busy, total, 2, pid, own, 0.0)


def test_idle_only_without_a_flag_and_with_others_below_the_threshold():
    # 2 CPUs over 1,000 ticks each; the benchmark's tree used 800 of them (0.8 core).
    start = _sample(busy=5_000, total=20_000, own=0)
    quiet = results.measure_load(start, _sample(busy=5_850, total=22_000, own=800))
    busy = results.measure_load(start, _sample(busy=5_900, total=22_000, own=800))
    assert (quiet["own_cpu_share"], quiet["other_cpu_share"]) == (0.8, 0.05)
    assert busy["other_cpu_share"] == results.IDLE_OTHER_CPU_SHARE
    assert results.verdict(None, quiet) == {"idle": True, "load_says_shared": False}
    # At the threshold: the load says the cores were shared, whatever the flags say.
    assert results.verdict(None, busy) == {"idle": False, "load_says_shared": True}
    assert results.verdict("a test run", quiet) == {"idle": False, "load_says_shared": False}
    assert results.verdict("a test run", busy) == {"idle": False, "load_says_shared": True}
    # Process and machine counters tick apart: others never come out below nothing.
    ahead = results.measure_load(start, _sample(busy=5_790, total=22_000, own=800))
    assert ahead["other_cpu_share"] == 0.0


def test_without_proc_the_load_is_unmeasured_and_never_idle(tmp_path, repo):
    started = results.start(str(repo), str(tmp_path / "no-proc"))
    assert started.load is None and started.commit == results.commit(str(repo))
    path = results.write(
        "speed",
        [{"ratio": 0.5}],
        shared_with=None,
        results_dir=str(tmp_path / "r"),
        cwd=str(repo),
        started=started,
        stack=STACK_1_16,
    )
    record = json.loads(open(path).read())
    assert record["load"] == "unmeasured (no /proc)" == results.NO_PROC
    assert record["idle"] is False and record["load_says_shared"] is None
    assert results.report(str(tmp_path / "r"), str(repo))[0].endswith(
        "not idle: load unmeasured (no /proc)"
    )
    assert results.measure_load(_sample(1, 2, 0, pid=1), _sample(1, 4, 0, pid=2)).startswith(
        "unmeasured (started in process 1"
    )


def test_a_load_measured_busy_labels_a_flagless_run_shared(tmp_path, repo):
    proc = tmp_path / "proc"
    _write_proc(proc, busy=10_000, idle=50_000, own=0)
    started = results.start(str(repo), str(proc))
    # Over 1,000 ticks per CPU, others used 1,300 (1.3 cores): the faults run's case.
    _write_proc(proc, busy=11_500, idle=50_500, own=200, loadavg="2.28 1.90 1.20")
    results.write(
        "speed",
        [{"ratio": 0.5}],
        shared_with=None,
        results_dir=str(tmp_path / "r"),
        cwd=str(repo),
        started=started,
        stack=STACK_1_16,
    )
    record = json.loads((tmp_path / "r" / "speed.json").read_text())
    assert record["idle"] is False and record["load_says_shared"] is True
    assert record["load"]["other_cpu_share"] == 1.3 and record["load"]["loadavg_end"][0] == 2.28
    assert results.report(str(tmp_path / "r"), str(repo))[0].endswith(
        "shared: others used 1.3 of a core on average"
    )


def test_the_process_tree_counts_live_descendants_and_their_reaped_children(tmp_path):
    proc = tmp_path / "proc"
    _write_proc(proc, busy=100, idle=100, own=5, pid=100)
    _write_process(proc, 101, ppid=100, utime=10, stime=20, cutime=40, cstime=80)
    _write_process(proc, 102, ppid=101, utime=160)
    _write_process(proc, 200, ppid=1, utime=10_000)  # not of the tree
    (proc / "self").mkdir()  # not a process directory
    sample = results.sample_load(str(proc), pid=100)
    assert sample.own == 5 + 10 + 20 + 40 + 80 + 160
    assert (sample.busy, sample.total, sample.cpus) == (99 + 1, 200, 2)
    assert results.sample_load(str(proc), pid=300) is None
    assert set(results.process_tree_stats(str(proc), 100)) == {100, 101, 102}


# The busy child's CPU seconds: enough to stand out of the counters' ticks.
SPIN_CPU_SECONDS = 1.0
SPIN = (
    "import time\n"
    f"while time.process_time() < {SPIN_CPU_SECONDS}:\n"
    "    pass\n"
    "print(time.process_time())\n"
)


def _spin() -> float:
    """Runs a child that spins one core until it has used `SPIN_CPU_SECONDS`; its CPU
    seconds (it has been reaped when this returns)."""
    done = subprocess.run(
        [sys.executable, "-c", SPIN], capture_output=True, text=True, check=True, timeout=120
    )
    return float(done.stdout)


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs /proc")
def test_a_busy_child_shows_in_the_machine_total_and_in_its_tree():
    # Lower bounds only: on a shared machine others add to every count, never take away.
    hz = os.sysconf("SC_CLK_TCK")
    start = results.sample_load()
    cpu = _spin()
    end = results.sample_load()
    own = end.own - start.own
    # 0.8: the kernel's tick counts and the child's own clock part by a few ticks.
    assert own >= 0.8 * cpu * hz
    assert end.busy - start.busy >= 0.8 * cpu * hz
    assert results.measure_load(start, end)["own_cpu_share"] > 0


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs /proc")
def test_a_busy_process_outside_the_tree_shows_as_others_load():
    hz = os.sysconf("SC_CLK_TCK")
    # The tree sampled is a sleeping process; the spinning one is not in it.
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        start = results.sample_load(pid=sleeper.pid)
        cpu = _spin()
        end = results.sample_load(pid=sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait(timeout=60)
    assert (end.busy - start.busy) - (end.own - start.own) >= 0.8 * cpu * hz
    load = results.measure_load(start, end)
    # A second of CPU over the run: at least a tenth of a core unless the run took
    # ten seconds, and then whatever slowed the child counts as others' too.
    assert results.verdict(None, load) == {"idle": False, "load_says_shared": True}


def test_commit_start_is_recorded_and_a_commit_that_changed_is_flagged(tmp_path, repo):
    # Taken at import, from this repository: HEAD then, an ancestor of HEAD now (a commit
    # made while the tests run moves HEAD on).
    recorded = results.STARTED.commit["commit"]
    is_ancestor = ["git", "merge-base", "--is-ancestor", recorded, results.commit()["commit"]]
    assert subprocess.run(is_ancestor, cwd=results.REPO_ROOT).returncode == 0
    started = results.start(str(repo))
    at_start = results.commit(str(repo))
    assert started.commit == at_start and started.commit["dirty"] is False
    (repo / "components" / "core.py").write_text("X = 2\n")
    path = results.write(
        "speed",
        [{"ratio": 0.5}],
        shared_with="a test",
        results_dir=str(tmp_path / "r"),
        cwd=str(repo),
        started=started,
        stack=STACK_1_16,
    )
    record = json.loads(open(path).read())
    assert record["commit_start"] == at_start
    assert record["dirty_files"] == ["components/core.py"] and record["commit_changed"] is True
    assert record["date_start"] <= record["date"]
    assert results.report(str(tmp_path / "r"), str(repo))[1] == (
        f"   commit changed while it ran: started on {at_start['commit'][:10]}"
    )
    results.write(
        "speed",
        [{"ratio": 0.5}],
        shared_with="a test",
        results_dir=str(tmp_path / "r"),
        cwd=str(repo),
        started=results.start(str(repo)),
        stack=STACK_1_16,
    )
    assert json.loads(open(path).read())["commit_changed"] is False


def test_the_report_names_a_file_written_before_commit_start(tmp_path, repo):
    (tmp_path / "r").mkdir()
    record = {
        "benchmark": "speed",
        "commit": results.commit(str(repo))["commit"],
        "dirty": False,
        "dirty_files": [],
        "date": "d",
        "machine": {"cores": 2, "cpu": "c"},
        "idle": True,
        "shared_with": None,
        "headline": {"ratio": 0.5},
    }
    (tmp_path / "r" / "speed.json").write_text(json.dumps(record))
    assert results.report(str(tmp_path / "r"), str(repo))[:2] == [
        f"== speed (speed.json): commit {record['commit'][:10]}, d, 2 cores c, idle",
        "   no commit_start: written before provenance was recorded "
        "(no measured load either: its idle is the --shared-with flag's word)",
    ]


def test_a_result_on_another_stack_keeps_the_1_16_file_and_both_are_reported(tmp_path, repo):
    paths = [
        results.write(
            "speed",
            [{"ratio": ratio}],
            shared_with="a test",
            results_dir=str(tmp_path / "r"),
            cwd=str(repo),
            stack=stack,
        )
        for ratio, stack in ((0.5, STACK_1_16), (0.7, STACK_1_21))
    ]
    assert [os.path.basename(p) for p in paths] == ["speed.json", "speed.tfx1.21.json"]
    assert json.loads(open(paths[1]).read())["stack"] == STACK_1_21
    report = results.report(str(tmp_path / "r"), str(repo))
    headers = [line for line in report if line.startswith("==")]
    # Each maps to benchmarks/speed.py through its recorded `benchmark`: neither is stale.
    assert [h.split(":")[0] for h in headers] == [
        "== speed (speed.json)",
        "== speed (speed.tfx1.21.json)",
    ]
    assert "tfx 1.16.0" in headers[0] and "tfx 1.21.0" in headers[1]
    assert not any("STALE" in h for h in headers)
    assert '{"ratio": 0.7}' in report and '{"ratio": 0.5}' in report
    assert results.stack_suffix({"tfx": "1.16.1"}) == ""
    assert results.stack_suffix({"tfx": "1.22.0rc1"}) == ".tfx1.22"
    assert results.stack_suffix({"tfx": None}) == ".no-tfx"
    installed = results.installed_stack()
    assert set(installed) == {"python", *results.STACK_DISTRIBUTIONS}
    assert results.results_path("x", "d") == f"d/x{results.stack_suffix(installed)}.json"


def test_provenance_names_commit_date_machine_and_stack(repo):
    saved = results.provenance(str(repo))
    assert saved["commit"] == results.commit(str(repo))["commit"] and saved["dirty"] is False
    assert saved["date"].endswith("+00:00") and saved["machine"]["cores"] == os.cpu_count()
    assert saved["stack"] == results.installed_stack()
    # What the process started on, beside the commit at the save.
    assert saved["commit_start"] == results.STARTED.commit
