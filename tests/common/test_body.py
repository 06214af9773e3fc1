"""tidal.common.body: the JSON value count that bounds a parse before it starts."""

from __future__ import annotations

import json
import pickle

import pytest

from tidal.common.body import BodyError, check_json_values, json_values, parse_json


@pytest.mark.parametrize(
    ("text", "values"),
    [
        (b"1", 1),
        (b"[]", 2),  # an empty list or object counts two
        (b"[1,2,3]", 4),
        (b"[[],[],[]]", 7),
        (b'{"a": [1, 2], "b": {}}', 6),  # the object, two members, two numbers; {} twice
        (b'["a,b,[c", "{\\",d"]', 3),  # what is inside strings does not count
    ],
)
def test_json_values_counts_values_and_nothing_inside_strings(text: bytes, values: int) -> None:
    json.loads(text)  # each case is valid JSON
    assert json_values(text) == values, (text, json_values(text))


def test_a_text_over_the_limit_is_a_413_naming_the_limit_before_it_is_parsed() -> None:
    bomb = b"[" + b",".join([b"[]"] * 1000) + b"]"
    with pytest.raises(BodyError) as caught:
        parse_json(bomb, "the request header", max_values=2000)
    assert caught.value.status == 413, caught.value.message
    assert "2001 JSON values" in caught.value.message, caught.value.message
    assert "maxJsonValues (2000)" in caught.value.message, caught.value.message
    assert parse_json(bomb, "the request header", max_values=2001) == [[]] * 1000


def test_commas_inside_strings_do_not_refuse_a_text_within_the_limit() -> None:
    text = json.dumps(["," * 5000, "[{" * 100]).encode()
    check_json_values(text, "the body", 3)  # the list and its two strings


def test_a_body_error_survives_a_trip_through_a_worker_process() -> None:
    error = pickle.loads(pickle.dumps(BodyError(413, "too many values")))
    assert (error.status, error.message) == (413, "too many values"), vars(error)
