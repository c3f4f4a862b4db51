"""Bad inputs against a pipeline that already pushed a model (see reliability_cases):
the catalogue's cases that are refused, fail or are killed (those that proceed
are in test_reliability_proceeds.py), and what the pushed model serves."""

from __future__ import annotations

import os

import pytest
import tensorflow as tf

from pipelines import local_runner
from testkit import full_disk as full_disk_module
from testkit.full_disk import FullDiskUnavailable, full_disk
from testkit.reliability_cases import (
    Case,
    CaseUnavailable,
    read_taxi_rows,
    run_case,
    serving_versions,
    taxi_serving_example,
)
from tests.pipelines.reliability_support import assert_behaves_as_documented, case_params


@pytest.mark.e2e
@pytest.mark.parametrize("case", case_params(proceeds=False))
def test_bad_input_behaves_as_documented(case, reliability_baseline, tmp_path):
    assert_behaves_as_documented(case, reliability_baseline, tmp_path)


@pytest.mark.e2e
def test_serving_input_types_follow_the_configured_kinds(reliability_baseline):
    # trip_seconds is `kind: float` but every value in the CSV is a whole
    # number, which CSV type inference alone reads as int64.
    baseline_dir, config = reliability_baseline
    _, rows = read_taxi_rows(1)
    assert rows[0]["trip_seconds"].isdigit()
    versions = serving_versions(local_runner.paths_for(config, baseline_dir).serving_dir)
    model_dir = os.path.join(
        local_runner.paths_for(config, baseline_dir).serving_dir, max(versions)
    )
    serve = tf.saved_model.load(model_dir).signatures["serving_default"]
    example = taxi_serving_example(config)
    assert example.features.feature["trip_seconds"].float_list.value
    # No excluded column (tips, trip_start_timestamp) is part of the serving contract either.
    probabilities = serve(examples=tf.constant([example.SerializeToString()]))["probabilities"]
    assert probabilities.shape == (1, config.data.label.num_classes)


def test_full_disk_refuses_writes_past_its_margin_and_leaves_nothing_mounted(tmp_path):
    directory = tmp_path / "root"
    directory.mkdir()
    (directory / "kept.txt").write_text("before")
    work = tmp_path / "work"
    work.mkdir()
    try:
        with full_disk(str(directory), 64, str(work)) as size_kib:
            assert (directory / "kept.txt").read_text() == "before"
            with pytest.raises(OSError, match="No space left on device"):
                with open(directory / "big", "wb") as f:
                    f.write(b"x" * (size_kib + 64) * 1024)
    except FullDiskUnavailable as e:
        pytest.skip(str(e))
    # Back on the host's disk, with what the writer left; nothing mounted here.
    assert directory.is_dir() and not directory.is_symlink()
    assert (directory / "kept.txt").read_text() == "before"
    assert 0 < (directory / "big").stat().st_size < (size_kib + 64) * 1024
    with open("/proc/self/mounts") as f:
        assert str(work) not in f.read()
    assert os.listdir(work) == []


@pytest.mark.parametrize(
    "command, fstype, reason",
    [
        (["/nonexistent/unshare"], "tmpfs", r"cannot start '/nonexistent/unshare'"),
        # Mounting refused (as without user namespaces): an unknown file system type.
        (
            None,
            "tfxkit-no-such-fs",
            r"`unshare[^`]*` then `mount -t tfxkit-no-such-fs` \(a private mount namespace\) "
            r"failed \(exit \d+\): .+",
        ),
    ],
    ids=["no_unshare", "mount_refused"],
)
def test_full_disk_unavailable_names_what_failed_and_changes_nothing(
    tmp_path, monkeypatch, command, fstype, reason
):
    if command is not None:
        monkeypatch.setattr(full_disk_module, "namespace_command", lambda: command)
    monkeypatch.setattr(full_disk_module, "FSTYPE", fstype)
    directory = tmp_path / "root"
    directory.mkdir()
    (directory / "kept.txt").write_text("before")
    with pytest.raises(FullDiskUnavailable, match=reason):
        with full_disk(str(directory), 64, str(tmp_path)):
            pytest.fail("the body ran without a file system")
    assert (directory / "kept.txt").read_text() == "before"


def test_a_case_this_host_cannot_set_up_is_reported_skipped(tmp_path, taxi_config):
    def cannot(config, out):
        raise CaseUnavailable("needs a size-limited file system: mount refused")

    baseline_dir = tmp_path / "baseline"
    baseline_dir.mkdir()
    case = Case("x", "x", "fails", "x", "x", lambda work, base: base, execute=cannot)
    result = run_case(case, str(baseline_dir), str(tmp_path / "work"), taxi_config)
    assert result.skipped == "needs a size-limited file system: mount refused"
    assert not result.as_documented
    assert (result.wrongly_pushed, result.lost_models) == (0, 0)
