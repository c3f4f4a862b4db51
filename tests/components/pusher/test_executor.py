"""The Pusher executor pushes only a model every given blessing blesses (temp-dir artifacts)."""

from __future__ import annotations

import os

import pytest
from tfx.proto import pusher_pb2
from tfx.types import standard_artifacts, standard_component_specs
from tfx.utils import proto_utils

from components.pusher import executor
from components.pusher.executor import SERVED_BLESSING_KEY, Executor


def _blessing(tmp_path, name, blessed):
    artifact = standard_artifacts.ModelBlessing()
    artifact.uri = str(tmp_path / name)
    os.makedirs(artifact.uri)
    artifact.set_int_custom_property("blessed", int(blessed))
    return artifact


def _push(tmp_path, blessed, served_blessed):
    """Runs the executor on a stand-in model; returns (PushedModel artifact, serving dir)."""
    model = standard_artifacts.Model()
    model.uri = str(tmp_path / "model")
    os.makedirs(os.path.join(model.uri, "Format-Serving", "variables"))
    with open(os.path.join(model.uri, "Format-Serving", "saved_model.pb"), "w") as f:
        f.write("stand-in")
    pushed = standard_artifacts.PushedModel()
    pushed.uri = str(tmp_path / "pushed")
    os.makedirs(pushed.uri)
    serving = str(tmp_path / "serving")
    inputs = {
        standard_component_specs.MODEL_KEY: [model],
        standard_component_specs.MODEL_BLESSING_KEY: [_blessing(tmp_path, "blessing", blessed)],
    }
    if served_blessed is not None:
        inputs[SERVED_BLESSING_KEY] = [_blessing(tmp_path, "served", served_blessed)]
    destination = pusher_pb2.PushDestination(
        filesystem=pusher_pb2.PushDestination.Filesystem(base_directory=serving)
    )
    Executor().Do(
        inputs,
        {standard_component_specs.PUSHED_MODEL_KEY: [pushed]},
        {standard_component_specs.PUSH_DESTINATION_KEY: proto_utils.proto_to_json(destination)},
    )
    return pushed, serving


def _pushed(artifact):
    return artifact.get_int_custom_property("pushed") == 1


@pytest.mark.parametrize(
    "blessed, served_blessed, refused_by",
    [
        (True, False, "the served-model gate (served_blessing)"),
        (False, True, "the Evaluator (model_blessing)"),
    ],
)
def test_a_gate_that_did_not_bless_stops_the_push_and_is_named(
    tmp_path, monkeypatch, blessed, served_blessed, refused_by
):
    # Recorded at the executor's absl call: other tests reconfigure absl's
    # handlers (the run's console), which pytest's log capture depends on.
    logged = []
    monkeypatch.setattr(executor.logging, "info", lambda msg, *args: logged.append(str(msg) % args))
    pushed, serving = _push(tmp_path, blessed, served_blessed)
    assert not _pushed(pushed)
    assert not os.path.exists(serving)
    assert any(
        m.startswith(f"Pusher: not pushed: {refused_by} did not bless the model") for m in logged
    ), logged


@pytest.mark.parametrize("served_blessed", [True, None], ids=["both-blessed", "no-served-gate"])
def test_a_model_every_given_gate_blessed_is_pushed(tmp_path, served_blessed):
    pushed, serving = _push(tmp_path, True, served_blessed)
    assert _pushed(pushed)
    (version,) = os.listdir(serving)
    assert os.path.isfile(os.path.join(serving, version, "saved_model.pb"))
