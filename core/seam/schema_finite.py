"""Does a JSON schema admit any finite JSON at all?

A schema can be well formed and still have no instance a reply could ever finish: an object
that requires a property of its own type (`{"type": "object", "properties": {"a": {"$ref":
"#"}}, "required": ["a"]}`), an array that needs an item of its own type, two definitions that
require each other. Constrained decoding then writes `{"a":{"a":{...` until the grammar engine
runs out of depth, mid-reply: a streamed client had its 200 and got an error event. `finite`
finds those before anything is queued, so the request is refused with a 400 like any schema
that admits nothing.

Which subschemas have a finite instance is a least fixed point over the `$ref` edges (as a
grammar's productive symbols are found): every referenced subschema starts as "none", and
passes over them turn on those that have one, until nothing changes. It refuses only what
surely has none; where it cannot tell (remote references, `not`, conditionals, formats, a
schema nested deeper than Python recurses) it says finite and leaves the rest to llguidance.
Pure Python, no state: any thread (the preparation pool, a route).
"""

from __future__ import annotations

from typing import Any

_SIMPLE = {"string", "number", "integer", "boolean", "null"}


def finite(schema: Any) -> bool:
    """False only if no finite JSON value satisfies `schema` (its local `$ref`s resolved
    against it)."""
    try:
        return _Search(schema).run()
    except RecursionError:
        return True  # too deep to follow here: llguidance decides


class _Search:
    def __init__(self, root: Any):
        self.root = root
        self.targets: dict[int, Any] = {}  # referenced subschemas, by identity
        self.known: dict[int, bool] = {}  # what the last pass found of each (absent: none yet)

    def run(self) -> bool:
        while True:
            before = dict(self.known)
            for key, node in list(self.targets.items()):
                self.known[key] = self.value(node)
            root = self.value(self.root)
            if self.known == before and len(self.known) == len(self.targets):
                return root

    def value(self, s: Any) -> bool:
        if s is False:
            return False
        if not isinstance(s, dict):
            return True
        if "enum" in s and not s["enum"]:
            return False
        if "const" in s or "enum" in s:
            return True
        ok = self.typed(s)
        if "$ref" in s:
            ok = ok and self.ref(s["$ref"])
        ok = ok and all(self.value(x) for x in _list(s.get("allOf")))
        for key in ("anyOf", "oneOf"):
            if key in s:
                ok = ok and any(self.value(x) for x in _list(s[key]))
        return ok

    def ref(self, pointer: Any) -> bool:
        target = _resolve(self.root, pointer)
        if target is None:
            return True  # remote, or not found: not ours to judge
        key = id(target)
        self.targets.setdefault(key, target)
        return self.known.get(key, False)

    def typed(self, s: dict[str, Any]) -> bool:
        types = s.get("type")
        if types is None:
            return True  # any type may be given, and a string or a number is finite
        return any(self.of_type(t, s) for t in _list(types))

    def of_type(self, t: Any, s: dict[str, Any]) -> bool:
        if t in _SIMPLE:
            return True
        if t == "object":
            props = s.get("properties") if isinstance(s.get("properties"), dict) else {}
            extra = s.get("additionalProperties", True)
            required = [r for r in _list(s.get("required")) if isinstance(r, str)]
            return all(self.value(props.get(r, extra)) for r in required)
        if t == "array":
            return self.array(s)
        return True

    def array(self, s: dict[str, Any]) -> bool:
        least = s.get("minItems", 0)
        least = least if isinstance(least, int) else 0
        prefix, items = _list(s.get("prefixItems")), s.get("items", True)
        needed = [prefix[i] if i < len(prefix) else items for i in range(min(least, len(prefix) + 1))]
        if "contains" in s and s.get("minContains", 1) != 0:
            needed.append(s["contains"])
        return all(self.value(x) for x in needed)


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else [] if v is None else [v]


def _resolve(root: Any, pointer: Any) -> Any:
    """The subschema a local JSON pointer (`#`, `#/$defs/a`) names in `root`; None if it is
    not a local pointer or names nothing."""
    if not isinstance(pointer, str) or not pointer.startswith("#"):
        return None
    node = root
    for part in [p for p in pointer[1:].split("/") if p][:64]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node
