"""Hypothesis strategies for every message the wire carries: valid encodings, mangled ones and noise."""

from __future__ import annotations

import contextlib
import functools

from google.protobuf import message_factory
from google.protobuf.descriptor import FieldDescriptor as F
from hypothesis import strategies as st

_INTS = {
    F.TYPE_INT32: (-(2**31), 2**31 - 1),
    F.TYPE_SINT32: (-(2**31), 2**31 - 1),
    F.TYPE_INT64: (-(2**63), 2**63 - 1),
    F.TYPE_SINT64: (-(2**63), 2**63 - 1),
    F.TYPE_UINT32: (0, 2**32 - 1),
    F.TYPE_UINT64: (0, 2**64 - 1),
    F.TYPE_FIXED32: (0, 2**32 - 1),
    F.TYPE_FIXED64: (0, 2**64 - 1),
}

_EDGE_INTS = st.sampled_from([0, 1, -1, 2, 7, 63, 64, 999, 1000, 4096, 2**31 - 1, -(2**31)])


def _scalar(field) -> st.SearchStrategy:
    if field.type in _INTS:
        low, high = _INTS[field.type]
        edges = _EDGE_INTS.filter(lambda v: low <= v <= high)
        return st.one_of(edges, st.integers(low, high))
    if field.type in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
        return st.one_of(
            st.floats(allow_nan=True, allow_infinity=True, width=32), st.sampled_from([0.0, -0.0])
        )
    if field.type == F.TYPE_BOOL:
        return st.booleans()
    if field.type == F.TYPE_STRING:
        hexes = st.text("0123456789abcdef", min_size=64, max_size=64)  # digests: reach past the first check
        known = st.sampled_from(["boxed", "bfloat16", "float32", "dverl-flat-v1", "", "x" * 300])
        return st.one_of(st.text(max_size=40), hexes, known)
    if field.type == F.TYPE_BYTES:
        return st.binary(max_size=64)
    if field.type == F.TYPE_ENUM:
        return st.integers(-1, len(field.enum_type.values) + 1)
    raise AssertionError(f"no strategy for {field.full_name}")


@functools.cache
def message_strategy(descriptor, depth: int = 0) -> st.SearchStrategy:
    """Any message of `descriptor`'s type, every field possibly set to a hostile value."""
    cls = message_factory.GetMessageClass(descriptor)
    fields = {}
    for field in descriptor.fields:
        if field.type == F.TYPE_MESSAGE:
            if field.message_type.GetOptions().map_entry:
                fields[field.name] = st.dictionaries(
                    st.text(max_size=8), st.floats(allow_nan=True), max_size=3
                )
                continue
            if depth >= 3:
                continue
            value = message_strategy(field.message_type, depth + 1)
        else:
            value = _scalar(field)
        if field.is_repeated:
            value = st.lists(value, max_size=6 if field.type == F.TYPE_MESSAGE else 12)
        fields[field.name] = st.one_of(st.none(), value)

    def build(values: dict) -> object:
        msg = cls()
        for name, value in values.items():
            if value is None:
                continue
            field = descriptor.fields_by_name[name]
            if field.type == F.TYPE_MESSAGE and field.message_type.GetOptions().map_entry:
                getattr(msg, name).update(value)
            elif field.is_repeated:
                target = getattr(msg, name)
                if field.type == F.TYPE_MESSAGE:
                    for item in value:
                        target.add().CopyFrom(item)
                else:
                    target.extend(value)
            elif field.type == F.TYPE_MESSAGE:
                getattr(msg, name).CopyFrom(value)
            else:
                with contextlib.suppress(ValueError):  # an enum value proto3 refuses to hold
                    setattr(msg, name, value)
        return msg

    return st.fixed_dictionaries(fields).map(build)


def wire_bytes(descriptor) -> st.SearchStrategy:
    """Bytes a peer could send: a valid message's encoding, mangled or not, or noise."""
    valid = message_strategy(descriptor).map(lambda msg: msg.SerializeToString())
    mangled = st.tuples(valid, st.binary(max_size=16), st.integers(0, 64)).map(
        lambda t: t[0][: t[2]] + t[1] + t[0][t[2] :]
    )
    return st.one_of(valid, mangled, st.binary(max_size=256))
