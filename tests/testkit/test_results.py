"""`testkit.results`: committed results name their commit and machine; stale ones show."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from testkit import results


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


def test_the_writer_records_commit_date_machine_and_the_headline_last(tmp_path, repo):
    path = results.write(
        "speed",
        [{"a": 1}, {"ratio": 0.5}],
        shared_with=None,
        results_dir=str(tmp_path / "r"),
        cwd=str(repo),
    )
    record = json.loads(open(path).read())
    assert os.path.basename(path) == "speed.json"
    assert record["commit"] == results.commit(str(repo))["commit"] and record["dirty"] is False
    assert len(record["commit"]) == 40
    assert record["headline"] == {"ratio": 0.5} and record["lines"][0] == {"a": 1}
    assert record["idle"] is True and record["shared_with"] is None
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
