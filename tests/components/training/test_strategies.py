"""Strategy factory (the cluster itself is `tests/components/training/test_cluster.py`).

Pure rules (`resolve_kind`, `check_batch_sizes`) are tested
directly for every cluster shape. Strategies that fit this test process (its
visible devices, no cluster) are really created here, with expectations
derived from the GPUs this host actually has; mirrored / central-storage
over logical CPUs need a fresh process and are created in
`tests/components/training/test_fit.py`'s subprocess, multi-worker and
parameter-server clusters in its multi-process tests.
"""

from __future__ import annotations

import dataclasses
import types
import typing

import pytest
import tensorflow as tf

from components.config import ConfigError, StrategyConfig, StrategyKind, from_dict
from components.training import cluster, strategies
from components.training.cluster import StrategyError, parse_tf_config
from components.training.strategies import resolve_kind
from tests.components.training.test_cluster import PS_CLUSTER, WORKERS, tf_config
from tests.conftest import closed_address

# What this host has decides what the factory may pick and refuse.
VISIBLE_GPUS = len(tf.config.list_physical_devices("GPU"))


# --------------------------------------------------------------------------- #
# Resolving the kind (auto and explicit)
# --------------------------------------------------------------------------- #


def strategy_config(**fields):
    """A `StrategyConfig`, or for a kind none accepts a stand-in with its attributes.

    The factory's own check of the kind (for callers that bypass the config)
    can only be reached with the stand-in: a `StrategyConfig` rejects the kind.
    """
    if fields.get("kind", "auto") in typing.get_args(StrategyKind):
        return StrategyConfig(**fields)
    return types.SimpleNamespace(**{**dataclasses.asdict(StrategyConfig()), **fields})


def resolve(tf_config_text=None, gpus=0, tpu=False, **config):
    return resolve_kind(
        strategy_config(**config), parse_tf_config(tf_config_text), gpus, tpu_available=tpu
    )


@pytest.mark.parametrize(
    "tf_config_text, gpus, tpu, extra, kind, role",
    [
        (None, 0, True, {}, "tpu", "trainer"),
        (None, 0, False, {}, "one_device", "trainer"),
        (None, 1, False, {}, "one_device", "trainer"),
        (None, 4, False, {}, "mirrored", "trainer"),
        (None, 0, False, {"num_cpu_devices": 2}, "mirrored", "trainer"),
        (tf_config({"worker": WORKERS[:1]}, "worker"), 0, False, {}, "one_device", "trainer"),
        (
            tf_config({"worker": WORKERS}, "worker", 1),
            0,
            False,
            {},
            "multi_worker_mirrored",
            "trainer",
        ),
        (
            tf_config({"chief": ["localhost:2000"], "worker": WORKERS[:1]}, "chief"),
            0,
            False,
            {},
            "multi_worker_mirrored",
            "trainer",
        ),
        (tf_config(PS_CLUSTER, "chief"), 0, False, {}, "parameter_server", "trainer"),
        (tf_config(PS_CLUSTER, "worker", 1), 0, False, {}, "parameter_server", "server"),
        (tf_config(PS_CLUSTER, "ps"), 0, False, {}, "parameter_server", "server"),
        (tf_config({"worker": WORKERS}, "evaluator"), 0, False, {}, "one_device", "evaluator"),
    ],
)
def test_auto_picks_the_strategy_for_each_cluster_shape(
    tf_config_text, gpus, tpu, extra, kind, role
):
    resolution = resolve(tf_config_text, gpus, tpu, kind="auto", **extra)
    assert (resolution.kind, resolution.role) == (kind, role)
    expected_reason = (
        "this task is the TF_CONFIG evaluator" if role == "evaluator" else "strategy.kind is 'auto'"
    )
    assert resolution.reason.startswith(expected_reason)


def test_explicit_kind_is_kept_and_explained():
    resolution = resolve(None, 0, False, kind="mirrored", num_cpu_devices=2)
    assert resolution.kind == "mirrored"
    assert resolution.reason == "strategy.kind is 'mirrored'"


@pytest.mark.parametrize(
    "tf_config_text, config, field, hint",
    [
        (None, {"kind": "parameter_server"}, "strategy.kind:", "needs a cluster"),
        (
            tf_config({"worker": WORKERS}, "worker"),
            {"kind": "mirrored"},
            "strategy.kind:",
            "trains on one machine",
        ),
        (
            tf_config(PS_CLUSTER, "chief"),
            {"kind": "multi_worker_mirrored", "workers": 2},
            "strategy.kind:",
            "takes no parameter servers",
        ),
        (
            tf_config({"worker": WORKERS}, "worker"),
            {"kind": "multi_worker_mirrored", "workers": 3},
            "strategy.workers:",
            "set strategy.workers: 2",
        ),
        (
            tf_config(PS_CLUSTER, "chief"),
            {"kind": "parameter_server", "workers": 2, "parameter_servers": 2},
            "strategy.parameter_servers:",
            "set strategy.parameter_servers: 1",
        ),
    ],
)
def test_contradictory_kind_and_cluster_are_rejected(tf_config_text, config, field, hint):
    with pytest.raises(StrategyError) as err:
        resolve(tf_config_text, 0, False, **config)
    assert str(err.value).startswith(field), err.value
    assert hint in str(err.value)


def test_batch_sizes_must_split_over_replicas():
    strategies.check_batch_sizes(64, 32, 4, "mirrored")
    strategies.check_batch_sizes(33, 7, 1, "one_device")
    with pytest.raises(
        StrategyError,
        match=r"^ingestion\.batch_size: 30 does not split evenly over the 4 replicas .*multiple of 4 \(e\.g\. 32\)",
    ):
        strategies.check_batch_sizes(30, 32, 4, "mirrored")
    with pytest.raises(StrategyError, match=r"^ingestion\.eval_batch_size: 9 "):
        strategies.check_batch_sizes(32, 9, 2, "multi_worker_mirrored")


def test_communication_options_come_from_config():
    options = strategies.communication_options(
        StrategyConfig(communication="ring", all_reduce_pack_bytes=1 << 20)
    )
    assert options.implementation == tf.distribute.experimental.CommunicationImplementation.RING
    assert options.bytes_per_pack == 1 << 20
    assert options.timeout_seconds is None
    timed = strategies.communication_options(
        StrategyConfig(kind="multi_worker_mirrored", workers=2, collective_timeout_seconds=600)
    )
    assert timed.timeout_seconds == 600


@pytest.mark.parametrize(
    "fields, match",
    [
        (
            {"collective_timeout_seconds": 30},
            r"^strategy\.collective_timeout_seconds: expected 0 \(no timeout\) or at least 120 "
            r"seconds, got 30; ",
        ),
        (
            {"collective_timeout_seconds": -1},
            r"^strategy\.collective_timeout_seconds: expected 0 \(no timeout\) or at least 120 "
            r"seconds, got -1; ",
        ),
        (
            {"kind": "parameter_server", "parameter_servers": 1, "collective_timeout_seconds": 600},
            r"^strategy\.collective_timeout_seconds: only 'multi_worker_mirrored' runs collectives "
            r"with a timeout, got kind 'parameter_server'; set it to 0$",
        ),
    ],
)
def test_bad_collective_timeouts_are_refused_naming_the_field(fields, match):
    with pytest.raises(ConfigError, match=match):
        StrategyConfig(**{"kind": "multi_worker_mirrored", "workers": 2, **fields})


def test_formation_is_bounded_by_the_collective_timeout():
    # This process configured no coordination service, whose registration
    # timeout would come first (see `formation_bound`).
    timed = StrategyConfig(kind="multi_worker_mirrored", workers=2, collective_timeout_seconds=150)
    assert strategies.formation_bound(timed) == (150.0, "strategy.collective_timeout_seconds")
    assert (
        strategies.formation_bound(dataclasses.replace(timed, collective_timeout_seconds=0)) is None
    )


def test_a_cluster_that_fails_to_form_is_reraised_naming_the_missing_task():
    leader = closed_address()
    config = parse_tf_config(tf_config({"worker": [leader, closed_address()]}, "worker", 1))
    registration = (
        "Deadline Exceeded\nAdditional GRPC error information from remote target "
        "/job:worker/replica:0/task:0 while calling /tensorflow.CoordinationService/RegisterTask:"
    )
    with pytest.raises(cluster.PeerLost) as raised:
        with strategies.cluster_formation(config, None, "multi_worker_mirrored"):
            raise tf.errors.DeadlineExceededError(None, None, registration)
    assert str(raised.value).startswith(
        f"Strategy: worker:0 ({leader}) did not join the multi_worker_mirrored cluster of worker:1 "
        "(DeadlineExceededError: Deadline Exceeded); every task of the cluster must be running"
    )
    assert isinstance(raised.value.__cause__, tf.errors.DeadlineExceededError)


# --------------------------------------------------------------------------- #
# Creating strategies in this process (its visible devices, no cluster)
# --------------------------------------------------------------------------- #


def test_one_device_strategy_on_the_first_local_device():
    device = "/gpu:0" if VISIBLE_GPUS else "/cpu:0"
    choice = strategies.create_strategy(StrategyConfig(kind="one_device"), environ={})
    assert isinstance(choice.strategy, tf.distribute.OneDeviceStrategy)
    assert choice.num_replicas == 1 and choice.is_chief and choice.devices == (device,)
    assert choice.describe().startswith(f"Strategy: one_device (1 replica(s) on {device})")
    # What `ingestion.service.codes: auto` asks: a GPU replica, or a CPU one.
    assert choice.accelerated == bool(VISIBLE_GPUS)


def test_auto_without_cluster_picks_from_the_local_devices():
    choice = strategies.create_strategy(StrategyConfig(kind="auto"), environ={})
    assert choice.role == "trainer"
    if VISIBLE_GPUS > 1:
        assert choice.kind == "mirrored"
        assert f"{VISIBLE_GPUS} GPUs are available" in choice.reason
    else:
        assert choice.kind == "one_device"
        assert "no TPU, no multi-worker TF_CONFIG" in choice.reason


def test_the_same_setup_reuses_the_process_strategy():
    first = strategies.create_strategy(
        StrategyConfig(kind="one_device", steps_per_execution=1), environ={}
    )
    second = strategies.create_strategy(
        StrategyConfig(kind="one_device", steps_per_execution=4), environ={}
    )
    assert first.strategy is second.strategy


def test_evaluator_task_trains_nothing():
    environ = {"TF_CONFIG": tf_config({"worker": WORKERS}, "evaluator")}
    choice = strategies.create_strategy(StrategyConfig(kind="auto"), environ=environ)
    assert choice.role == "evaluator" and not choice.is_chief


def test_parameter_server_workers_and_ps_get_no_strategy():
    environ = {"TF_CONFIG": tf_config(PS_CLUSTER, "worker", 1)}
    choice = strategies.create_strategy(
        StrategyConfig(kind="parameter_server", workers=2, parameter_servers=1), environ=environ
    )
    assert choice.role == "server" and choice.strategy is None and not choice.is_chief


def test_unknown_kind_is_refused_when_the_config_is_built():
    with pytest.raises(ConfigError, match=r"^strategy\.kind: expected one of"):
        StrategyConfig(kind="gpu_cluster")
    with pytest.raises(ConfigError, match=r"^strategy\.kind: expected one of"):
        from_dict(
            {
                "data": {"builtin": "taxi", "features": [{"name": "fare", "kind": "float"}]},
                "strategy": {"kind": "gpu_cluster"},
            }
        )


def test_tpu_requested_without_a_tpu_fails_with_the_fix():
    with pytest.raises(StrategyError) as err:
        strategies.create_strategy(StrategyConfig(kind="tpu"), environ={})
    message = str(err.value)
    assert message.startswith("strategy.kind: 'tpu' requested but no TPU was found")
    assert "set strategy.tpu" in message


def test_more_gpus_than_visible_fails_with_the_fix():
    requested = VISIBLE_GPUS + 2
    with pytest.raises(
        StrategyError,
        match=rf"^strategy\.num_gpus: {requested} GPU\(s\) requested but {VISIBLE_GPUS} visible; "
        rf"lower strategy\.num_gpus to at most {VISIBLE_GPUS}",
    ):
        strategies.create_strategy(StrategyConfig(kind="mirrored", num_gpus=requested), environ={})


@pytest.mark.skipif(VISIBLE_GPUS > 0, reason="needs a host without GPUs: with GPUs 'nccl' is valid")
def test_nccl_without_gpus_fails():
    with pytest.raises(StrategyError, match=r"^strategy\.communication: 'nccl' needs GPUs"):
        strategies.create_strategy(StrategyConfig(kind="auto", communication="nccl"), environ={})


@pytest.mark.skipif(
    VISIBLE_GPUS > 0, reason="needs a host without GPUs: with GPUs the replicas are the GPUs"
)
def test_logical_cpus_after_tensorflow_started_fail_with_the_fix():
    tf.constant(1.0)  # this process's runtime is initialised with one CPU device
    with pytest.raises(
        StrategyError,
        match=r"^strategy\.num_cpu_devices: asked for 3 logical CPU devices, but TensorFlow already initialised with 1",
    ):
        strategies.create_strategy(StrategyConfig(kind="mirrored", num_cpu_devices=3), environ={})


def test_malformed_tf_config_from_the_environment_fails_before_any_strategy():
    with pytest.raises(StrategyError, match=r"^TF_CONFIG: is not valid JSON"):
        strategies.create_strategy(
            StrategyConfig(kind="auto"), environ={"TF_CONFIG": "{cluster: x"}
        )


@pytest.mark.parametrize(
    "strategy, field",
    [
        (
            {"kind": "one_device", "num_gpus": 2},
            "strategy.num_gpus: kind 'one_device' uses one device",
        ),
        ({"kind": "tpu", "communication": "nccl"}, "strategy.communication: 'nccl' is for GPUs"),
        (
            {"kind": "multi_worker_mirrored", "workers": 2, "num_gpus": 1},
            "strategy.num_gpus: kind 'multi_worker_mirrored' uses every accelerator its task sees",
        ),
        (
            {"kind": "parameter_server", "workers": 2, "parameter_servers": 1, "num_gpus": 2},
            "strategy.num_gpus: kind 'parameter_server' uses every accelerator its task sees",
        ),
        ({"kind": "tpu", "num_gpus": 1}, "strategy.num_gpus: kind 'tpu' uses every accelerator"),
        ({"steps_per_execution": 0}, "strategy.steps_per_execution: expected an integer >= 1"),
    ],
)
def test_strategy_section_is_validated_when_the_config_loads(strategy, field):
    data = {
        "data": {"builtin": "taxi", "features": [{"name": "fare", "kind": "float"}]},
        "strategy": strategy,
    }
    with pytest.raises(ConfigError) as err:
        from_dict(data)
    assert str(err.value).startswith(field), err.value


def test_accumulation_steps_below_one_are_rejected_when_the_config_loads():
    data = {
        "data": {"builtin": "taxi", "features": [{"name": "fare", "kind": "float"}]},
        "train": {"grad_accum_steps": 0},
    }
    with pytest.raises(ConfigError, match=r"^train\.grad_accum_steps: expected an integer >= 1"):
        from_dict(data)


def test_num_gpus_is_refused_when_auto_resolves_to_a_whole_task_strategy():
    # Pure resolution with the GPU count given, so it holds on any host.
    with pytest.raises(StrategyError) as err:
        resolve(
            tf_config({"worker": WORKERS}, "worker"), 2, False, kind="auto", num_gpus=1, workers=2
        )
    assert str(err.value).startswith(
        "strategy.num_gpus: strategy.kind is 'auto' and TF_CONFIG lists 2 workers, but kind "
        "'multi_worker_mirrored' uses every accelerator its task sees, so num_gpus 1 would be ignored"
    )
    assert resolve(None, 2, False, kind="auto", num_gpus=1).kind == "mirrored"
