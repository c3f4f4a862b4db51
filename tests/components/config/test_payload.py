"""`components.config.payload`: what a component hands its executor, and what the executor reads back."""

from __future__ import annotations

import dataclasses
import json

import pytest
from tfx.components.trainer.fn_args_utils import FnArgs
from tfx.utils import proto_utils

from components.config import ConfigError, payload
from components.config.dropin import DropInSettings
from components.distiller import executor as distiller_executor
from components.trainer import executor as trainer_executor
from components.trainer import fn_args as fn_args_lib
from components.transform import executor as transform_executor
from components.validation import executor as validation_executor


def test_the_config_and_settings_round_trip_beside_the_users_entries(taxi_config):
    settings = DropInSettings(checkpoint_every_steps=7)
    encoded = payload.encode({"epochs": 2}, config=taxi_config, settings=settings)
    for carried in (encoded, json.dumps(encoded)):  # the dict of FnArgs, the executor's JSON
        decoded = payload.decode(carried)
        assert decoded.config == taxi_config
        assert decoded.settings == settings
        assert decoded.teacher_dirs == ()
        assert dict(decoded.user) == {"epochs": 2}


def test_only_what_is_given_is_written(taxi_config):
    assert set(payload.encode(config=taxi_config)) == {payload.CONFIG_KEY}
    assert set(payload.encode({"a": 1}, settings=DropInSettings())) == {"a", payload.DROPIN_KEY}


@pytest.mark.parametrize("stock", [None, "", "null", "{}", '{"other": 1}', {"other": 1}])
def test_a_stock_custom_config_carries_nothing_of_tfxkit(stock):
    decoded = payload.decode(stock)
    assert (decoded.config, decoded.settings, decoded.teacher_dirs) == (None, None, ())
    assert dict(decoded.user) == ({"other": 1} if stock and "other" in stock else {})


def test_the_users_entries_are_read_only(taxi_config):
    decoded = payload.decode(payload.encode({"a": 1}, config=taxi_config))
    with pytest.raises(TypeError):
        decoded.user["a"] = 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        decoded.config = None


@pytest.mark.parametrize(
    "custom_config, match",
    [
        ([1], r"^custom_config: expected a dict, got list"),
        ("{}", r"^custom_config: expected a dict, got str"),
        ({payload.CONFIG_KEY: "x"}, r"^custom_config: keys \['tfxkit_config'\] are reserved"),
        (
            {payload.TEACHER_DIRS_KEY: [], payload.DROPIN_KEY: "x", "mine": 1},
            r"^custom_config: keys \['tfxkit_dropin', 'tfxkit_teacher_model_dirs'\] are reserved",
        ),
    ],
)
def test_encode_names_a_custom_config_it_cannot_carry(custom_config, match):
    with pytest.raises(ConfigError, match=match):
        payload.encode(custom_config, settings=DropInSettings())


@pytest.mark.parametrize(
    "custom_config, match",
    [
        ("{not json", r"^custom_config: expected a JSON object .* not JSON"),
        ("[1, 2]", r"^custom_config: expected a JSON object \(a mapping\), got list"),
        (42, r"^custom_config: expected a JSON object \(a mapping\), got int"),
        (
            {payload.CONFIG_KEY: {"name": "x"}},
            r"^custom_config\['tfxkit_config'\]: expected the JSON text of a PipelineConfig, got dict",
        ),
        (
            {payload.CONFIG_KEY: "{oops"},
            r"^custom_config\['tfxkit_config'\]: expected the JSON text of a PipelineConfig, got text "
            "that is not JSON",
        ),
        (
            {payload.DROPIN_KEY: json.dumps({"checkpoint_every_steps": 0})},
            r"^custom_config\['tfxkit_dropin'\]: not a valid DropInSettings: "
            r"config\.checkpoint_every_steps: expected an integer >= 1",
        ),
        (
            {payload.TEACHER_DIRS_KEY: "/one/dir"},
            r"^custom_config\['tfxkit_teacher_model_dirs'\]: expected a list of model directories",
        ),
    ],
)
def test_decode_names_the_key_it_cannot_read(custom_config, match):
    with pytest.raises(ConfigError, match=match):
        payload.decode(custom_config)


def test_an_invalid_config_is_named_by_key_and_field(taxi_config):
    data = json.loads(taxi_config.to_json())
    data["train"]["learning_rate"] = -1
    with pytest.raises(
        ConfigError, match=r"^custom_config\['tfxkit_config'\]: not a valid PipelineConfig: train\."
    ):
        payload.decode({payload.CONFIG_KEY: json.dumps(data)})


def test_teacher_dirs_travel_in_the_execution_properties(taxi_config):
    exec_properties = {
        "custom_config": json.dumps(payload.encode({"mine": 1}, config=taxi_config)),
        "run_fn": "x.y",
    }
    with_teachers = payload.with_distiller_inputs(exec_properties, ["/t0", "/t1"])
    assert with_teachers["run_fn"] == "x.y"
    decoded = payload.decode_exec_properties(with_teachers)
    assert decoded.teacher_dirs == ("/t0", "/t1")
    assert decoded.config == taxi_config and dict(decoded.user) == {"mine": 1}
    assert not decoded.student_module


def test_a_student_module_moves_from_the_execution_properties_into_the_payload(taxi_config):
    """So the Trainer executor (and every job replica) resolves run_fn as the dotted path it is."""
    exec_properties = {
        "custom_config": json.dumps(payload.encode(None, config=taxi_config)),
        "run_fn": "components.distiller.run_fn.run_fn",
        "module_file": "/m/student.py",
        "module_path": "student@/w/student.whl",
    }
    moved = payload.with_distiller_inputs(
        exec_properties,
        ["/t0"],
        {"module_file": "/m/student.py", "module_path": "student@/w/student.whl"},
    )
    assert "module_file" not in moved and "module_path" not in moved
    assert moved["run_fn"] == "components.distiller.run_fn.run_fn"
    decoded = payload.decode_exec_properties(moved)
    assert dict(decoded.student_module) == {
        "module_file": "/m/student.py",
        "module_path": "student@/w/student.whl",
    }


def test_an_undecodable_student_module_is_named_by_key():
    with pytest.raises(
        ConfigError, match=r"custom_config\['tfxkit_student_module'\]: expected a mapping"
    ):
        payload.decode({payload.STUDENT_MODULE_KEY: {"run_fn": "x"}})


def test_a_run_fn_gets_the_executors_payload_without_parsing_again(taxi_config):
    encoded = payload.encode({"mine": 1}, config=taxi_config)
    decoded = payload.decode(encoded)
    # custom_config stays what TFX gives a run_fn; the decoded payload rides beside it.
    fn_args = fn_args_lib.with_payload(FnArgs(custom_config=dict(encoded)), decoded)
    assert payload.of(fn_args) is decoded
    assert fn_args.custom_config == encoded
    # A run_fn called directly (no executor) decodes custom_config itself.
    assert payload.of(FnArgs(custom_config=encoded)) == decoded


def test_example_rules_round_trip_through_the_proto():
    rules = {"exclude": ["tips"], "kinds": {"fare": "float"}}
    proto = payload.encode_example_rules(rules)
    exec_properties = {"custom_config": proto_utils.proto_to_json(proto)}
    assert payload.decode_example_rules(exec_properties) == rules
    assert payload.decode_example_rules({}) == {}
    with pytest.raises(ConfigError, match=r"^custom_config: expected the JSON of an ExampleGen"):
        payload.decode_example_rules({"custom_config": "{not json"})


@pytest.mark.parametrize(
    "executor",
    [
        trainer_executor.Executor,
        distiller_executor.Executor,
        transform_executor.Executor,
        validation_executor.Executor,
    ],
)
def test_every_executor_refuses_an_undecodable_payload_before_reading_inputs(executor, tmp_path):
    context = executor.Context(tmp_dir=str(tmp_path))
    # No inputs or outputs at all: anything read before the payload would fail differently.
    with pytest.raises(ConfigError, match=r"^custom_config\['tfxkit_config'\]: expected the JSON"):
        executor(context).Do({}, {}, {"custom_config": json.dumps({payload.CONFIG_KEY: 3})})
