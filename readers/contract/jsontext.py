"""Strict JSON text: what a manifest's JSONL line or CSV ``json``/array cell, and a COCO json, may be.

``json.loads`` with two refusals: an object that gives one key twice (``json.loads`` would keep the
last value, silently) and a value nested more than :data:`MAX_JSON_DEPTH` levels (checked on the
parsed value by :func:`json_too_deep`); each problem said in a few words (:func:`json_problem`), and
where in the text it is (:func:`json_locate`).

Used by the field types' text form (``readers.contract.fields``: ``FieldType.from_text`` of a CSV
cell, ``JsonType.check_nesting``) and by the importers (``packer.importers.manifest``,
``packer.importers.coco``); it imports only :mod:`readers.contract.messages`.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from readers.contract.messages import one_line

__all__ = ["MAX_JSON_DEPTH", "JSON_ERRORS", "json_loads", "json_problem", "json_too_deep", "json_locate",
           "short_repr"]

#: A JSON value (a JSONL row, a CSV ``json`` cell, a COCO json's parts) may nest this deep: far
#: below Python's recursion limit, so that what is packed encodes and reads back in any process.
MAX_JSON_DEPTH = 200


def short_repr(value: Any, limit: int = 40) -> str:
    """``repr(value)``, cut to ``limit`` characters (``...`` at the end): how an error message quotes a value."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _DuplicateKey(ValueError):
    """A JSON object that gives one key twice (``json.loads`` would keep the last value, silently)."""


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        raise _DuplicateKey(next(k for k, _ in pairs if k in seen or seen.add(k)))  # type: ignore[func-returns-value]
    return obj


#: ``json.loads`` of a str, but an object that gives a key twice raises _DuplicateKey
_DECODER = json.JSONDecoder(object_pairs_hook=_object)
#: what it raises for a text it does not turn into a value: JSONDecodeError and _DuplicateKey are
#: ValueErrors, so is an integer past Python's int-str limit; RecursionError for deep nesting
JSON_ERRORS = (RecursionError, ValueError)
_WS = re.compile(r"[ \t\n\r]*")


def json_loads(text: str) -> Any:
    """``json.loads(text)``, but an object that gives a key twice is a ValueError (:data:`JSON_ERRORS`)."""
    return _DECODER.decode(text)


def json_problem(exc: BaseException) -> str:
    """Why a JSON text is not read (an exception of :data:`JSON_ERRORS`), in a few words."""
    if isinstance(exc, RecursionError):
        return f"JSON nested more than {MAX_JSON_DEPTH} levels deep"
    if isinstance(exc, _DuplicateKey):
        return f"the key {short_repr(exc.args[0])} is given twice in one JSON object"
    if isinstance(exc, json.JSONDecodeError):
        return f"malformed JSON ({exc.msg} at column {exc.colno})"
    if "integer string conversion" in str(exc):
        return f"an integer of more than {sys.get_int_max_str_digits():,} digits"
    return f"JSON not read ({one_line(exc)})"


def json_too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the lists and dicts of ``value`` nest more than ``limit`` levels deep (no recursion)."""
    level, depth = ([value] if isinstance(value, (list, dict)) else []), 0
    while level:
        depth += 1
        if depth > limit:
            return True
        level = [x for c in level for x in (c.values() if isinstance(c, dict) else c) if isinstance(x, (list, dict))]
    return False


class _Found(Exception):
    """json_locate's answer: the path to the value that fails, and its error."""


def json_locate(text: str, levels: int = 1, parsed: dict[str, Any] | None = None
                ) -> tuple[list[str | int], BaseException] | None:
    """Where the JSON ``text`` fails to parse: the keys (of objects) and indices (of arrays) down to
    the value whose parse fails, at most ``levels`` deep, and the error; None when it parses.
    ``parsed`` (``levels=1``): gets the members of the outer object that did parse.

    For the failure path only: the outer ``levels`` are walked here and each value under them is
    parsed on its own (``raw_decode``), so that a value nested past the recursion limit, an integer
    past the int-str limit or a repeated key is named by where it is, not only by the file or line."""
    try:
        end = _skip(text, _WS.match(text).end(), levels, [], parsed)  # type: ignore[union-attr]
    except _Found as found:
        return found.args[0], found.args[1]
    if _WS.match(text, end).end() != len(text):  # type: ignore[union-attr]
        return [], json.JSONDecodeError("Extra data", text, end)
    return None


def _skip(text: str, i: int, levels: int, path: list[str | int], parsed: dict[str, Any] | None = None) -> int:
    """The end of the JSON value at ``text[i]``; raises _Found where it fails."""
    opener = text[i:i + 1]
    if not levels or opener not in ("{", "["):
        try:
            value, end = _DECODER.raw_decode(text, i)
        except JSON_ERRORS as exc:
            raise _Found(path, exc) from None
        if parsed is not None and len(path) == 1:
            parsed[str(path[0])] = value
        return end
    close, seen, n = ("}" if opener == "{" else "]"), set(), 0
    i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
    if text.startswith(close, i):
        return i + 1
    while True:
        where: str | int = n
        if opener == "{":
            try:
                if not text.startswith('"', i):
                    raise json.JSONDecodeError("Expecting property name enclosed in double quotes", text, i)
                where, i = json.decoder.scanstring(text, i + 1)  # type: ignore[attr-defined]
                i = _WS.match(text, i).end()  # type: ignore[union-attr]
                if not text.startswith(":", i):
                    raise json.JSONDecodeError("Expecting ':' delimiter", text, i)
            except ValueError as exc:
                raise _Found(path, exc) from None
            if where in seen:
                raise _Found(path + [where], _DuplicateKey(where))
            seen.add(where)
            i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
        i = _WS.match(text, _skip(text, i, levels - 1, path + [where], parsed)).end()  # type: ignore[union-attr]
        n += 1
        if text.startswith(close, i):
            return i + 1
        if not text.startswith(",", i):
            raise _Found(path, json.JSONDecodeError("Expecting ',' delimiter", text, i))
        i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]

