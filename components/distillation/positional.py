"""Which transformed feature each input of a Keras 3 teacher reads.

`tf.saved_model.save` of a Keras 3 model (what TFX's examples do under Keras 3) keeps
the model's call only as `_default_save_signature`: positional inputs `inputs_0`,
`inputs_1`, ... without the names of the Keras inputs (a model built on a dict of
inputs keeps them as the dict's keys). The names survive in the
teacher's `serving_default`, which calls the same model on the dict its
`TransformFeaturesLayer` returns. `input_names` reads them from the two graphs: the
ops of the model that read input `i` in the default signature read, in the serving
signature, output `k` of the transform call, whose outputs are the transformed
features in sorted order (TensorFlow flattens a dict by sorted key). No TFX types.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import tensorflow as tf

# Ops an input passes through unchanged in meaning before the model's first op reads it.
_PASS_THROUGH = {"Identity", "IdentityN", "Cast", "Reshape", "Squeeze", "ExpandDims"}
_CALLS = {"StatefulPartitionedCall", "PartitionedCall"}


def positional_call(loaded):
    """The Keras 3 model's own call of a restored SavedModel, or None.

    Returns:
      The concrete function of `_default_save_signature`, whose single
      argument is the list (or single tensor) of the model's inputs.
    """
    saved = getattr(loaded, "_default_save_signature", None)
    if saved is None:
        return None
    concretes = getattr(saved, "concrete_functions", None) or [saved]
    return concretes[0]


def input_names(
    call, serving, transformed_features: Sequence[str], export_dir: str
) -> tuple[str, ...]:
    """The transformed feature each positional input of `call` reads, in call order.

    Args:
      call: `positional_call(loaded)` of the teacher.
      serving: Its `serving_default` concrete function.
      transformed_features: The Transform output's feature names.
      export_dir: The teacher's directory (named in errors).

    Raises:
      ValueError: when the graphs do not say, naming the teacher and the fix.
    """
    structure = call.structured_input_signature[0][0]
    if isinstance(structure, Mapping) and set(structure) <= set(transformed_features):
        # A model built on a dict of inputs keeps their names as the dict's keys.
        return tuple(sorted(structure))
    specs = tf.nest.flatten(structure)
    placeholders = [t.op.name for t in call.inputs[: len(specs)]]
    readers = _readers(call.graph.as_graph_def(), placeholders)
    found = _read_in_serving(serving.graph.as_graph_def(), readers, sorted(transformed_features))
    names = []
    for i, spec in enumerate(specs):
        candidates = found.get(i, set())
        if len(candidates) != 1:
            names.append(_by_spec(spec, i, specs, transformed_features, export_dir, candidates))
        else:
            names.append(next(iter(candidates)))
    if len(set(names)) != len(names):
        raise ValueError(_unreadable(export_dir, f"its inputs would read {names}"))
    return tuple(names)


def _readers(graph_def, placeholders: Sequence[str]) -> dict[tuple[str, int], int]:
    """(op name, input slot) of the model's first ops -> the positional input they read."""
    consumers: dict[str, list[tuple[str, int, str]]] = {}
    for node in graph_def.node:
        for slot, ref in enumerate(node.input):
            if not ref.startswith("^"):
                consumers.setdefault(ref.split(":")[0], []).append((node.name, slot, node.op))
    readers = {}
    for position, name in enumerate(placeholders):
        frontier = [name]
        while frontier:
            for reader, slot, op in consumers.get(frontier.pop(), []):
                if op in _PASS_THROUGH:
                    frontier.append(reader)
                else:
                    readers[reader, slot] = position
    return readers


def _read_in_serving(
    graph_def, readers: dict[tuple[str, int], int], features: Sequence[str]
) -> dict[int, set[str]]:
    """Positional input -> the transformed features its readers read in the serving graph."""
    found: dict[int, set[str]] = {}
    bodies = [list(graph_def.node)] + [list(f.node_def) for f in graph_def.library.function]
    outputs = {f.signature.name: len(f.signature.output_arg) for f in graph_def.library.function}
    for nodes in bodies:
        by_name = {n.name: n for n in nodes}
        for node in nodes:
            for slot, ref in enumerate(node.input):
                position = readers.get((node.name, slot))
                if position is None:
                    continue
                feature = _transform_output(ref, by_name, outputs, features)
                if feature is not None:
                    found.setdefault(position, set()).add(feature)
    return found


def _transform_output(ref: str, by_name, outputs: dict[str, int], features: Sequence[str]):
    """The transformed feature `ref` is, traced back through pass-through ops to the output of a
    call with one output per transformed feature (the `TransformFeaturesLayer`), or None."""
    for _ in range(32):
        parts = ref.lstrip("^").split(":")
        node = by_name.get(parts[0])
        if node is None:
            return None
        if node.op in _PASS_THROUGH:
            ref = node.input[0]
            continue
        if node.op in _CALLS and outputs.get(node.attr["f"].func.name) == len(features):
            # In a function body a call's output is "<op>:output:<k>".
            index = int(parts[-1]) if len(parts) > 1 else 0
            return features[index]
        return None
    return None


def _by_spec(spec, position, specs, transformed_features, export_dir, candidates) -> str:
    """The one transformed feature named like, or alone in taking, input `position`'s spec."""
    if spec.name in transformed_features:
        return spec.name
    if not candidates and len(specs) == 1:
        return _only_input(export_dir, transformed_features)
    raise ValueError(
        _unreadable(
            export_dir,
            f"its input {position} ({spec.name}: {spec.shape} {spec.dtype.name}) reads "
            + (f"one of {sorted(candidates)}" if candidates else "no transformed feature seen"),
        )
    )


def _only_input(export_dir: str, transformed_features: Sequence[str]) -> str:
    raise ValueError(
        _unreadable(
            export_dir,
            "its one input is not read from the transform its serving_default applies "
            f"(transformed features {sorted(transformed_features)})",
        )
    )


def _unreadable(export_dir: str, why: str) -> str:
    return (
        f"distillation: teacher model {export_dir!r} was saved from Keras 3 with tf.saved_model.save, "
        f"which keeps its inputs by position only, and {why}; call the model on the dict of "
        "transformed features inside serving_default (as TFX's examples do), or save it with "
        "TF_USE_LEGACY_KERAS=1 so its call keeps the input names"
    )
