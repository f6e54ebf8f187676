"""Canonical JSON and action keys."""

from __future__ import annotations

import hashlib
import math

import pytest

from trtbuild.keys import action_key, canonical_json

FIELDS = {"stage": "checkpoint", "stage_version": 1, "inputs": {"source": "ab" * 32},
          "params": {"quant": "fp8", "tp": 2}, "toolchain": {"modelopt": "0.47.0"}, "platform": {"device": "cpu"}}


def test_canonical_json_is_sorted_compact_utf8():
    assert canonical_json({"b": 1, "a": [1, 2.5, None, True], "é": "ü"}) == '{"a":[1,2.5,null,true],"b":1,"é":"ü"}'.encode()
    assert canonical_json({"x": (1, 2)}) == b'{"x":[1,2]}'


def test_integers_stay_integers_and_integral_floats_become_integers():
    assert canonical_json({"n": 3, "f": 3.0, "g": 0.5}) == b'{"f":3,"g":0.5,"n":3}'


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_no_nan_or_infinity(bad):
    with pytest.raises(ValueError, match="cannot be part of a key"):
        canonical_json({"x": bad})


def test_only_json_types():
    with pytest.raises(TypeError, match="set cannot be part of a key"):
        canonical_json({"x": {1, 2}})
    with pytest.raises(TypeError, match="is not a string"):
        canonical_json({1: "x"})


def test_action_key_is_sha256_of_the_canonical_fields():
    assert action_key(FIELDS) == hashlib.sha256(canonical_json(FIELDS)).hexdigest()
    reordered = dict(reversed(list(FIELDS.items())))
    assert action_key(reordered) == action_key(FIELDS)


@pytest.mark.parametrize("field, value", [
    ("stage_version", 2), ("inputs", {"source": "cd" * 32}), ("params", {"quant": "fp8", "tp": 4}),
    ("toolchain", {"modelopt": "0.48.0"}), ("platform", {"device": "cuda"}),
])
def test_every_field_changes_the_key(field, value):
    assert action_key({**FIELDS, field: value}) != action_key(FIELDS)


def test_a_key_has_exactly_the_six_fields():
    with pytest.raises(ValueError, match="exactly the fields"):
        action_key({**FIELDS, "extra": 1})
    with pytest.raises(ValueError):
        action_key({k: v for k, v in FIELDS.items() if k != "platform"})
