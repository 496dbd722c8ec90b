"""``names.jsonl``: each sample's source path, one JSON string a line, in sample order.

The packer writes it beside the index (:data:`readers.contract.spec.NAMES_FILE`); readers never load
it unless asked (:meth:`readers.contract.spec.Index.names`, ``pack-dataset verify``): it is a
dataset's only per-sample text. :func:`parse_names` is its one strict parse.
"""

from __future__ import annotations

import json
from typing import Iterable, Iterator

from readers.contract.messages import one_line
from readers.contract.safeio import DatasetFormatError

__all__ = ["parse_names"]


def parse_names(where: str, lines: Iterable[bytes], n: int, grown: bool = False) -> Iterator[str]:
    """``names.jsonl``'s lines as names: one JSON string a line, ``n`` lines; anything else is a
    one-line :class:`DatasetFormatError` naming ``where:LINE`` (``where``: the file, as shown).
    ``grown``: an append has started since this index (``readers.contract.generations``): the lines
    past the first ``n`` are its samples'."""
    count = 0
    for count, line in enumerate(lines, 1):
        if count > n and grown:
            return
        if count > n:
            raise DatasetFormatError(f"{where}:{count}: more lines than the {n:,} samples of the index; "
                                     "the names file is damaged")
        try:
            name = json.loads(line)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, deep nesting
            raise DatasetFormatError(f"{where}:{count}: not a JSON string ({one_line(exc, first=True)}); "
                                     "the names file is damaged") from None
        if not isinstance(name, str):
            raise DatasetFormatError(f"{where}:{count}: not a JSON string (a JSON {type(name).__name__}); "
                                     "the names file is damaged")
        yield name
    if count != n:
        raise DatasetFormatError(f"{where}: {count:,} lines for the {n:,} samples of the index; "
                                 "the names file is damaged")
