"""Which JSON schemas admit a finite instance (core/seam/schema_finite.py): those that do not
are refused before a reply starts; every one that does must still be let through."""

from __future__ import annotations

import pytest

from radixchat.core.seam.schema_finite import finite

SELF = {"$ref": "#"}


@pytest.mark.parametrize(
    "schema",
    [
        SELF,
        {"anyOf": [SELF]},
        {"type": "object", "properties": {"a": SELF}, "required": ["a"]},
        {"type": "object", "required": ["a"], "additionalProperties": SELF},
        {"type": "array", "items": SELF, "minItems": 2},
        {"type": "array", "prefixItems": [{"type": "string"}, SELF], "minItems": 2},
        {"type": "array", "contains": SELF},
        {"enum": []},
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"allOf": [{"type": "object"}, {"$ref": "#/$defs/a"}]}}, **SELF},
    ],
)
def test_a_schema_whose_every_instance_holds_another_has_none(schema):
    assert not finite(schema)


@pytest.mark.parametrize(
    "schema",
    [
        {},
        True,
        {"type": "object", "properties": {"a": SELF}},  # `a` may be left out
        {"type": "object", "properties": {"next": {"anyOf": [SELF, {"type": "null"}]}}, "required": ["next"]},
        {"type": ["object", "null"], "properties": {"a": SELF}, "required": ["a"]},
        {"type": "array", "items": SELF},  # [] ends it
        {"type": "array", "items": SELF, "contains": SELF, "minContains": 0},
        {"properties": {"a": SELF}, "required": ["a"]},  # no type: a string is an instance
        # a tree: a node's children may be none
        {
            "$defs": {
                "node": {
                    "type": "object",
                    "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                    "required": ["kids"],
                }
            },
            "$ref": "#/$defs/node",
        },
        # each definition needs the other, and one of them can end
        {
            "$defs": {
                "a": {"anyOf": [{"$ref": "#/$defs/b"}, {"type": "string"}]},
                "b": {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"]},
            },
            "$ref": "#/$defs/b",
        },
        {"$ref": "https://example.com/elsewhere"},  # not this check's to judge
        {"$ref": "#/$defs/missing"},
        {"type": "object", "required": [["odd"]], "properties": {}},
    ],
)
def test_a_schema_with_a_finite_instance_is_let_through(schema):
    assert finite(schema)


def test_a_schema_nested_past_pythons_recursion_is_left_to_the_grammar_engine():
    deep: dict = {"type": "string"}
    for _ in range(5000):
        deep = {"anyOf": [deep]}
    assert finite(deep)
