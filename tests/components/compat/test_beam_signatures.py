"""Beam's signature reads, memoised for a block: same answers, Beam's function restored after."""

from __future__ import annotations

import functools
import inspect
import threading

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import userstate
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec

from components.compat import beam_signatures


def _plain(a, b=2, *args, c, **kwargs):
    return a


class _Fn(beam.DoFn):
    def process(self, element, scale=3):
        yield element * scale


class _Counting(beam.DoFn):
    """A stateful DoFn: its state spec is a default argument of `process`."""

    COUNT = ReadModifyWriteStateSpec("count", beam.coders.VarIntCoder())

    def process(self, element, count=beam.DoFn.StateParam(COUNT)):  # noqa: B008 - Beam's idiom
        seen = (count.read() or 0) + 1
        count.write(seen)
        yield element[0], seen


class _Callable:
    def __call__(self, x, y=0):
        return x


def _callables():
    fn = _Fn()
    return {
        "function": _plain,
        "bound method": fn.process,
        "function of the class": _Fn.process,
        "lambda": lambda x, y=1: x,
        "partial": functools.partial(_plain, 1),
        "builtin method descriptor": str.strip,
        "callable object": _Callable(),
    }


def test_every_kind_of_callable_gets_beams_own_signature():
    expected = {name: beam_signatures.BEAM_GET_SIGNATURE(f) for name, f in _callables().items()}
    with beam_signatures.cached_signatures() as installed:
        assert installed
        for _ in range(2):  # the second read comes from the memo
            got = {
                name: beam_signatures.decorators.get_signature(f)
                for name, f in _callables().items()
            }
            assert got == expected
    assert expected["bound method"].parameters.keys() == {"element", "scale"}
    assert list(expected["function of the class"].parameters) == ["self", "element", "scale"]


def test_a_function_is_read_once_per_kind_and_every_module_is_patched_and_restored(monkeypatch):
    calls = []
    read = inspect.signature

    def counting(func, *args, **kwargs):
        calls.append(func)
        return read(func, *args, **kwargs)

    # Beam's get_signature reads through inspect.signature: count those reads.
    monkeypatch.setattr(inspect, "signature", counting)
    fn, other = _Fn(), _Fn()
    with beam_signatures.cached_signatures():
        for module in beam_signatures.MODULES:
            assert module.get_signature is beam_signatures._cached_get_signature
        for _ in range(3):
            beam_signatures.core.get_signature(fn.process)
            beam_signatures.util.get_signature(other.process)  # bound to another object: same memo
            beam_signatures.ptransform.get_signature(_Fn.process)
    # One read of the bound form, one of the function itself.
    assert len(calls) == 2
    for module in beam_signatures.MODULES:
        assert module.get_signature is beam_signatures.BEAM_GET_SIGNATURE


def test_nested_and_concurrent_blocks_restore_beam_only_when_the_last_one_exits():
    original = beam_signatures.decorators.get_signature
    entered, release = threading.Event(), threading.Event()

    def other_block():
        with beam_signatures.cached_signatures():
            entered.set()
            release.wait(timeout=30)

    thread = threading.Thread(target=other_block)
    with beam_signatures.cached_signatures():
        thread.start()
        assert entered.wait(timeout=30)
        with beam_signatures.cached_signatures():
            pass
        assert beam_signatures.core.get_signature is beam_signatures._cached_get_signature
    # The other thread's block is still open: the patch stays.
    assert beam_signatures.core.get_signature is beam_signatures._cached_get_signature
    release.set()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert beam_signatures.core.get_signature is original


def test_on_another_beam_it_changes_nothing(monkeypatch):
    monkeypatch.setattr(beam_signatures, "BEAM_VERSION", "2.99.0")
    with beam_signatures.cached_signatures() as installed:
        assert not installed
        assert beam_signatures.core.get_signature is beam_signatures.BEAM_GET_SIGNATURE


def test_a_stateful_pipeline_runs_and_keeps_its_state_specs_under_the_memo():
    with beam_signatures.cached_signatures():
        assert userstate.is_stateful_dofn(_Counting())
        assert not userstate.is_stateful_dofn(_Fn())
        with beam.Pipeline() as p:
            counted = (
                p
                | beam.Create([("a", 1), ("a", 2), ("b", 3)])
                | beam.ParDo(_Counting())
                | beam.combiners.Count.PerElement()
            )
            assert_that(counted, equal_to([(("a", 1), 1), (("a", 2), 1), (("b", 1), 1)]))
            scaled = p | "Numbers" >> beam.Create([1, 2]) | beam.ParDo(_Fn())
            assert_that(scaled, equal_to([3, 6]), label="Scaled")


def test_a_bad_dofn_is_still_refused():
    class Duplicate(beam.DoFn):
        COUNT = ReadModifyWriteStateSpec("count", beam.coders.VarIntCoder())

        def process(self, element, a=beam.DoFn.StateParam(COUNT), b=beam.DoFn.StateParam(COUNT)):  # noqa: B008
            yield element

    with beam_signatures.cached_signatures():
        with pytest.raises(ValueError, match="duplicate"):
            userstate.validate_stateful_dofn(Duplicate())
