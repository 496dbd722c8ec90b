"""``one_line``: an exception (or warning, or text) as one short line for a user-facing message.

The packer's rejects, the remote stores' errors and the Ray engine's failures all quote the
error underneath them this way: whitespace (newlines too) collapsed, object reprs such as
``<_io.BytesIO object at 0x7f..>`` replaced by ``data`` (they differ from run to run), cut at
``limit`` characters. Nothing here imports anything of ``readers``.
"""

from __future__ import annotations

import re

__all__ = ["one_line"]

_OBJECT_REPR = re.compile(r"<[^<>]* at 0x[0-9a-fA-F]+>")


def one_line(exc: BaseException | Warning | str, limit: int = 240, *, kind: bool = False,
             first: bool = False) -> str:
    """``exc`` as one line of at most ``limit`` characters; ``kind``: prefixed with its type name;
    ``first``: only its first non-blank line (libraries that append a traceback or a usage block
    below the message). An exception without a message (or only blank lines) is its type name."""
    text = str(exc)
    if first:
        text = next((line for line in text.splitlines() if line.strip()), "")
    text = " ".join(_OBJECT_REPR.sub("data", text).split())
    name = type(exc).__name__
    if not text:
        text = name
    elif kind and not isinstance(exc, str):
        text = f"{name}: {text}"
    return text if len(text) <= limit else text[: limit - 3] + "..."
