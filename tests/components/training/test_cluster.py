"""The training cluster: `TF_CONFIG` parsing and the cluster a TrainJob
replica derives from its JobSet environment (pure rules, every cluster shape).
"""

from __future__ import annotations

import json

import pytest

from components.config import ConfigError
from components.training import cluster
from components.training.cluster import StrategyError, parse_tf_config
from tests.conftest import closed_address

WORKERS = ["localhost:2001", "localhost:2002"]
PS_CLUSTER = {"chief": ["localhost:2000"], "worker": WORKERS, "ps": ["localhost:2003"]}


def tf_config(cluster, task_type, index=0):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


# --------------------------------------------------------------------------- #
# TF_CONFIG parsing
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("text", [None, "", "  ", "{}"])
def test_no_tf_config_means_no_cluster(text):
    assert parse_tf_config(text) is None


def test_worker_zero_is_chief_without_a_chief_task():
    workers = {"worker": WORKERS}
    first, second = (
        parse_tf_config(tf_config(workers, "worker", 0)),
        parse_tf_config(tf_config(workers, "worker", 1)),
    )
    assert first.is_chief and not second.is_chief
    assert first.num_workers == 2 and not first.has_ps


def test_chief_task_is_chief_and_worker_zero_is_not():
    cluster = {"chief": ["localhost:2000"], "worker": WORKERS}
    assert parse_tf_config(tf_config(cluster, "chief")).is_chief
    worker0 = parse_tf_config(tf_config(cluster, "worker", 0))
    assert not worker0.is_chief
    assert worker0.num_workers == 3


def test_evaluator_is_never_chief_and_leaves_the_training_cluster():
    cluster = {"worker": WORKERS, "evaluator": ["localhost:2009"]}
    evaluator = parse_tf_config(tf_config(cluster, "evaluator"))
    assert not evaluator.is_chief
    assert "evaluator" not in evaluator.training_cluster
    # TensorFlow's convention: the evaluator may be absent from the cluster.
    assert parse_tf_config(tf_config({"worker": WORKERS}, "evaluator")).task_type == "evaluator"


def test_parameter_server_cluster_parses():
    parsed = parse_tf_config(tf_config(PS_CLUSTER, "ps"))
    assert parsed.has_ps and parsed.num_ps == 1 and not parsed.is_chief
    assert parsed.cluster_spec().as_dict()["worker"] == WORKERS


@pytest.mark.parametrize(
    "text, field, hint",
    [
        ("{not json", "TF_CONFIG:", "not valid JSON"),
        ("[1, 2]", "TF_CONFIG:", "expected a JSON object"),
        (tf_config({"worker": WORKERS}, "worker", 2), "TF_CONFIG.task.index:", "out of range"),
        (tf_config({"worker": WORKERS}, "worker", -1), "TF_CONFIG.task.index:", ">= 0"),
        (
            tf_config({"worker": WORKERS}, "master"),
            "TF_CONFIG.task.type:",
            "unknown task type 'master'",
        ),
        (tf_config({"worker": WORKERS}, "chief"), "TF_CONFIG.task.type:", "has no tasks"),
        (
            tf_config({"worker": WORKERS, "ps": ["localhost:2003"]}, "worker"),
            "TF_CONFIG.cluster.chief:",
            "needs a 'chief' task",
        ),
        (
            tf_config({"chief": ["localhost:1"], "ps": ["localhost:2003"]}, "chief"),
            "TF_CONFIG.cluster.worker:",
            "at least one 'worker'",
        ),
        (
            tf_config({"worker": ["localhost"]}, "worker"),
            "TF_CONFIG.cluster.worker[0]:",
            "'host:port'",
        ),
        (tf_config({"trainer": WORKERS}, "worker"), "TF_CONFIG.cluster.trainer:", "unknown job"),
        (tf_config({"worker": []}, "worker"), "TF_CONFIG.cluster.worker:", "non-empty list"),
        (tf_config({"chief": WORKERS}, "chief"), "TF_CONFIG.cluster.chief:", "at most one chief"),
        (json.dumps({"cluster": {"worker": WORKERS}}), "TF_CONFIG.task:", "'type' and 'index'"),
        (
            json.dumps({"cluster": {"worker": WORKERS}, "task": {"type": "worker"}, "extra": 1}),
            "TF_CONFIG.extra:",
            "unknown key",
        ),
    ],
)
def test_malformed_tf_config_is_rejected_precisely(text, field, hint):
    with pytest.raises(StrategyError) as err:
        parse_tf_config(text)
    assert str(err.value).startswith(field), err.value
    assert hint in str(err.value)


def test_strategy_errors_are_config_errors():
    assert issubclass(StrategyError, ConfigError)


# --------------------------------------------------------------------------- #
# TF_CONFIG derived from a TrainJob's JobSet environment
# --------------------------------------------------------------------------- #


def jobset_env(job, index, replicas, name="taxi-trainer-ab12", **extra):
    """What a pod of a tfxkit runtime sees: downward-API variables and the step's shape."""
    from components.kubernetes import env

    return {
        env.JOBSET_NAME: name,
        env.REPLICATED_JOB: job,
        env.JOB_INDEX: "0",
        env.COMPLETION_INDEX: str(index),
        env.REPLICAS: replicas,
        env.TF_PORT: "2222",
        **extra,
    }


def _host(job, i, name="taxi-trainer-ab12"):
    return f"{name}-{job}-0-{i}.{name}:2222"


@pytest.mark.parametrize("index", [0, 1, 2])
def test_multi_worker_tf_config_from_jobset_env(index):
    derived = cluster.tf_config_from_jobset(jobset_env("node", index, "node=3"))
    assert derived == {
        "cluster": {"worker": [_host("node", i) for i in range(3)]},
        "task": {"type": "worker", "index": index},
    }
    # Worker 0 is the chief (there is no chief job).
    assert parse_tf_config(json.dumps(derived)).is_chief == (index == 0)


@pytest.mark.parametrize(
    "job, index, task",
    [("chief", 0, "chief"), ("node", 1, "worker"), ("ps", 0, "ps"), ("ps", 1, "ps")],
)
def test_parameter_server_tf_config_from_jobset_env(job, index, task):
    derived = cluster.tf_config_from_jobset(jobset_env(job, index, "chief=1,node=2,ps=2"))
    assert derived == {
        "cluster": {
            "chief": [_host("chief", 0)],
            "worker": [_host("node", 0), _host("node", 1)],
            "ps": [_host("ps", 0), _host("ps", 1)],
        },
        "task": {"type": task, "index": index},
    }
    parsed = parse_tf_config(json.dumps(derived))
    assert parsed.has_ps and parsed.is_chief == (task == "chief")


def test_existing_tf_config_wins_and_no_jobset_env_means_no_cluster():
    given = tf_config({"worker": WORKERS}, "worker", 1)
    environ = {"TF_CONFIG": given, **jobset_env("node", 0, "node=3")}
    parsed = cluster.read_tf_config(environ)
    assert parsed.cluster == {"worker": tuple(WORKERS)} and parsed.task_id == 1
    assert cluster.tf_config_from_jobset({"HOSTNAME": "pod-1"}) is None
    assert cluster.read_tf_config({}) is None


def test_derived_tf_config_is_read_and_logged(caplog):
    import logging

    # On absl's logger itself: a SavedModel export elsewhere in the process
    # leaves that logger at WARNING (TensorFlow restores absl's verbosity flag).
    with caplog.at_level(logging.INFO, logger="absl"):
        parsed = cluster.read_tf_config(jobset_env("node", 1, "node=2"))
    assert parsed.task_type == "worker" and parsed.task_id == 1 and parsed.num_workers == 2
    assert "TF_CONFIG derived from the JobSet environment" in caplog.text
    assert _host("node", 1) in caplog.text


def test_host_aliases_map_derived_addresses():
    from components.kubernetes import env

    aliases = {_host("node", 0): "localhost:4001", _host("node", 1): "localhost:4002"}
    derived = cluster.tf_config_from_jobset(
        jobset_env("node", 1, "node=2", **{env.HOST_ALIASES: json.dumps(aliases)})
    )
    assert derived["cluster"] == {"worker": ["localhost:4001", "localhost:4002"]}


def _without(environ, name):
    return {k: v for k, v in environ.items() if k != name}


@pytest.mark.parametrize(
    "environ, field, hint",
    [
        (
            _without(jobset_env("node", 0, "node=2"), "TFXKIT_COMPLETION_INDEX"),
            "TFXKIT_COMPLETION_INDEX",
            "not set, but this pod has TFXKIT_JOBSET_NAME.*batch.kubernetes.io/job-completion-index",
        ),
        (
            _without(jobset_env("node", 0, "node=2"), "TFXKIT_REPLICAS"),
            "TFXKIT_REPLICAS",
            "not set.*the Trainer step",
        ),
        (jobset_env("node", 2, "node=2"), "TFXKIT_COMPLETION_INDEX", r"in \[0, 2\)"),
        (jobset_env("node", 0, "node=two"), "TFXKIT_REPLICAS", "'chief=1,node=2,ps=1'"),
        (jobset_env("ps", 0, "chief=1,ps=1"), "TFXKIT_REPLICAS", "no 'node'"),
        (jobset_env("evaluator", 0, "node=2"), "TFXKIT_REPLICATED_JOB", "'evaluator' is not among"),
        (
            {**jobset_env("node", 0, "node=2"), "TFXKIT_JOB_INDEX": "1"},
            "TFXKIT_JOB_INDEX",
            "one Job per replicated job",
        ),
        (
            jobset_env("ps", 0, "chief=1,node=2,ps=2", TFXKIT_RUNTIME_PODS="1"),
            "TFXKIT_RUNTIME_PODS",
            r"runs 1 'ps' pod\(s\) but the step expects 2 \(strategy.parameter_servers\); regenerate",
        ),
    ],
    ids=[
        "no_completion_index",
        "no_shape",
        "index_out_of_range",
        "bad_shape",
        "no_workers",
        "unknown_job",
        "second_job",
        "runtime_disagrees",
    ],
)
def test_inconsistent_jobset_env_refuses_to_start_naming_the_variable(environ, field, hint):
    with pytest.raises(StrategyError, match=rf"^{field}: .*{hint}"):
        cluster.read_tf_config(environ)


# --------------------------------------------------------------------------- #
# Lost peers
# --------------------------------------------------------------------------- #


def test_mentioned_tasks_are_the_other_tasks_tensorflow_names_in_order():
    config = parse_tf_config(tf_config(PS_CLUSTER, "chief"))
    text = (
        "Failed copying input tensor from /job:chief/replica:0/task:0/device:CPU:0 to "
        "/job:ps/replica:0/task:0/device:CPU:0 ... /job:worker/replica:0/task:1 ... "
        "/job:ps/replica:0/task:0 ... /job:worker/replica:0/task:7"
    )
    # Itself, repeats and tasks the cluster does not have are left out.
    assert cluster.mentioned_tasks(text, config) == [("ps", 0), ("worker", 1)]


def test_lost_peers_are_the_named_tasks_that_do_not_answer(listening):
    workers = {"worker": [closed_address(), listening, closed_address()]}
    config = parse_tf_config(tf_config(workers, "worker", 2))
    named = "from /job:worker/replica:0/task:0 and /job:worker/replica:0/task:1"
    # Both named, only worker 0 is gone.
    assert cluster.lost_peers(config, named) == [("worker", 0)]
    # Nothing named: every other task is probed.
    assert cluster.lost_peers(config, "Deadline Exceeded") == [("worker", 0)]
    assert cluster.task_label(config, ("worker", 0)) == f"worker:0 ({workers['worker'][0]})"


def test_lost_peers_keeps_the_named_tasks_when_all_answer(listening):
    config = parse_tf_config(tf_config({"worker": [listening, closed_address()]}, "worker", 1))
    assert cluster.lost_peers(config, "at /job:worker/replica:0/task:0") == [("worker", 0)]
    assert cluster.lost_peers(config, "no task named") == []


def test_first_line_is_the_cause_of_a_graph_execution_error():
    import tensorflow as tf

    text = (
        "Graph execution error:\n\nDetected at node CollectiveReduceV2 defined at (most recent call last):\n"
        '  File "train.py", line 1, in <module>\n\n'
        "Collective ops is aborted by: Task /job:worker/replica:0/task:1 heartbeat timeout.\n"
        "The error could be from a previous operation. Restart your program to reset.\n"
        "\t [[{{node CollectiveReduceV2}}]] [Op:__inference_train_function_1]"
    )
    assert cluster.first_line(tf.errors.UnavailableError(None, None, text)) == (
        "UnavailableError: Collective ops is aborted by: Task /job:worker/replica:0/task:1 "
        "heartbeat timeout."
    )
    assert cluster.first_line(ValueError("x" * 400), limit=10) == "ValueError: xxxxxxx..."
