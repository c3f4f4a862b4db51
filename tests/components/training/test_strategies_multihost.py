"""The multi-task strategies across separate network hosts: each task of a multi-worker
mirrored and a parameter-server cluster on a network namespace of its own
(`testkit.netns`), its `TF_CONFIG` naming the hosts' addresses, forked by the
launcher of `testkit.local_cluster` into its namespace.

- multi-worker mirrored, two workers on two hosts: both finish, and their weights
  equal those of the same job with both workers on loopback (the same batches in the
  same order and the same all-reduce: bitwise, within `ATOL`);
- parameter server: the coordinator, the ps and two workers on four hosts: the
  coordinator runs every step and exports.

Needs root and iproute2's `ip`; skips naming which is missing elsewhere.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from testkit import fault_cases, local_cluster, netns, penguins
from tests.components.training.test_faults import ATOL
from tests.conftest import data_file

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.skipif(bool(netns.unavailable()), reason=netns.unavailable() or "available"),
]

# Bound on one training task of these jobs (about 20 s each on 2 idle cores).
TASK_BOUND_S = 300
PORT = 23456


def _job(config, inputs: dict, cluster: dict, task_type: str, index: int, namespace: str) -> dict:
    return {
        "env": {"TF_CONFIG": local_cluster.tf_config(cluster, task_type, index)},
        "config": config.to_json(),
        "inputs": inputs,
        "netns": namespace,
    }


def _finish(tasks) -> None:
    for task in tasks:
        code = task.wait(TASK_BOUND_S)
        assert code == 0, f"{task.name} exited with {code}:\n{task.tail()}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    data_file(os.path.basename(penguins.PENGUINS_CSV))
    root = str(tmp_path_factory.mktemp("multihost"))
    hosts = ["worker0", "worker1", "chief", "ps0"]
    with (
        netns.Network(hosts) as network,
        local_cluster.Launcher(os.path.join(root, "tasks")) as launcher,
    ):
        data = launcher.penguins(os.path.join(root, "data"))
        out = {}
        with launcher.scope():
            config = fault_cases.mwms_config()
            for name, placed in (("mwms_hosts", True), ("mwms_loopback", False)):
                inputs = penguins.inputs_for(data, root, name, config)
                if placed:
                    cluster = {"worker": [f"{network.address[h]}:{PORT}" for h in hosts[:2]]}
                    spaces = [network.namespace[h] for h in hosts[:2]]
                else:
                    cluster, spaces = local_cluster.free_cluster(2), ["", ""]
                tasks = [
                    launcher.start(
                        f"{name}.worker{i}", _job(config, inputs, cluster, "worker", i, spaces[i])
                    )
                    for i in range(2)
                ]
                _finish(tasks)
                out[name] = (tasks, inputs)
        with launcher.scope():
            config = fault_cases.ps_config(fault_cases.PS_STEPS_DEFAULT)
            inputs = penguins.inputs_for(data, root, "ps_hosts", config)
            placement = {"worker": hosts[:2], "chief": ["chief"], "ps": ["ps0"]}
            cluster = {
                kind: [f"{network.address[h]}:{PORT}" for h in on] for kind, on in placement.items()
            }
            servers = [
                launcher.start(
                    f"ps_hosts.{kind}{i}",
                    _job(config, inputs, cluster, kind, i, network.namespace[h]),
                )
                for kind in ("ps", "worker")
                for i, h in enumerate(placement[kind])
            ]
            chief = launcher.start(
                "ps_hosts.chief0",
                _job(config, inputs, cluster, "chief", 0, network.namespace["chief"]),
            )
            _finish([chief])
            out["ps_hosts"] = ([chief, *servers], inputs)
            # Where the servers run, asked of the kernel while they still serve.
            out["ps_spaces"] = {t.name: netns.identify(t.pid) for t in servers if t.poll() is None}
        yield network, out


def test_multihost_mwms_workers_on_two_hosts_equal_the_loopback_run(runs):
    _, out = runs
    (placed, inputs), (loopback, _) = out["mwms_hosts"], out["mwms_loopback"]
    assert [t.result()["steps_run"] for t in placed] == [fault_cases.MWMS_STEPS] * 2
    assert os.path.isdir(inputs["serving_model_dir"])
    across = [dict(np.load(t.path("weights.npz"))) for t in placed]
    reference = dict(np.load(loopback[0].path("weights.npz")))
    assert sorted(across[0]) == sorted(reference)
    for weights in across:
        for name, value in reference.items():
            np.testing.assert_allclose(weights[name], value, rtol=0, atol=ATOL, err_msg=name)


def test_multihost_ps_coordinator_ps_and_workers_on_four_hosts_train_and_export(runs):
    network, out = runs
    (chief, *servers), inputs = out["ps_hosts"]
    result = chief.result()
    assert "error" not in result, result
    assert result["iterations"] == fault_cases.PS_STEPS_DEFAULT
    assert os.path.isdir(inputs["serving_model_dir"])
    # Each server ran in its host's namespace.
    assert out["ps_spaces"] == {
        "ps_hosts.ps0": network.namespace["ps0"],
        "ps_hosts.worker0": network.namespace["worker0"],
        "ps_hosts.worker1": network.namespace["worker1"],
    }
