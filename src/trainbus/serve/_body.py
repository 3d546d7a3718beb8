"""Parsing a job's JSON body strictly: every bad body becomes a message, never a 500.

``json.loads`` alone lets through what the rest of the service cannot handle: deep
nesting (a ``RecursionError`` while parsing, or later while echoing the parameters),
``NaN``/``Infinity`` (not JSON; ``allow_nan=False`` responses fail on them) and lone
surrogates (strings that cannot be encoded as UTF-8 in the response).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["MAX_DEPTH", "parse_params"]

#: How deeply a job's parameters may nest (objects and arrays).
MAX_DEPTH = 32


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (use a number or null)")


def _depth(text: str) -> int:
    """The deepest nesting of ``[``/``{`` outside strings, scanning the text once."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def parse_params(body: bytes) -> dict[str, Any] | str:
    """A job's parameters from a request body, or a message saying what is wrong.

    An empty body means ``{}``. The body must be UTF-8 JSON, an object, nested at most
    :data:`MAX_DEPTH` deep, without ``NaN``/``Infinity`` and without lone surrogates.

    Example:
        >>> parse_params(b'{"epochs": 2}')
        {'epochs': 2}
        >>> parse_params(b"[1]")
        'the body must be a JSON object of parameters, e.g. {"epochs": 2}; got a list'
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"the body is not UTF-8 ({exc.reason} at byte {exc.start}); send UTF-8 JSON"
    if not text.strip():
        return {}
    if text.count("[") + text.count("{") > MAX_DEPTH and _depth(text) > MAX_DEPTH:
        return (
            f"the body is nested more than {MAX_DEPTH} levels deep; send a flat JSON object "
            'of parameters, e.g. {"epochs": 2}'
        )
    try:
        params = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        detail = str(exc)
        detail = detail if len(detail) <= 120 else detail[:117] + "..."
        return f'the body is not JSON ({detail}); send an object, e.g. {{"epochs": 2}}'
    if not isinstance(params, dict):
        return (
            'the body must be a JSON object of parameters, e.g. {"epochs": 2}; '
            f"got {'null' if params is None else type(params).__name__}"
        )
    try:
        json.dumps(params, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return (
            "the body holds a lone surrogate (an unpaired \\ud800-\\udfff escape); "
            "fix the string"
        )
    return params
