"""``pack_map``: map a function over inputs in parallel and write what it returns as a dataset.

    from packer import pack_map

    def render(record):                      # one input -> a sample, a list/generator of them, or None
        return {"image": draw(record), "label": record["cls"], "caption": record["text"]}

    result = pack_map(render, records, "out", format="wds", workers=2)

``fn(input)`` runs in the pack's own pool (:class:`packer.prepare.pool.WorkerPool`: forked workers,
results in input order, a bounded window), so ``fn`` may be a closure or a lambda (the workers are
forked with it, it is never pickled); the inputs and the samples it returns cross processes and must
be picklable. ``workers=0`` runs ``fn`` in the caller. The samples go, in input order, into one
:class:`packer.writer.Writer` (its validation, rejects, CRCs, index), so the output's bytes do not
depend on the worker count. A failure of ``fn`` on an input (or of the generator it returned) is,
with ``on_error="reject"``, one line of :attr:`MapResult.rejects` naming the input's position and
repr, also logged, and one line of the dataset's ``rejects.jsonl`` (:meth:`Writer.reject`: the
input's position and repr as its ``path``, the error as its ``reason``), a position of the Writer's
sequence as a written sample is, so ``resume=True`` skips it too; with ``on_error="raise"`` it
stops the job with :class:`MapError` (the Writer is aborted: nothing opens as complete). A bad
*sample* is the Writer's to reject or raise (``rejects.jsonl``), by the same ``on_error``.

``engine="ray"`` (or ``options.engine``) runs ``fn`` as Ray tasks instead, on the cluster
``options.ray_address`` names (``packer.engines.ray``'s session: ``RaySession.map_ordered``, chunks
of ``options.ray_chunk`` inputs, results taken in input order), and the same one Writer writes what
they return: the same bytes as the local engine's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Sequence
from typing import Any, Callable, Iterable, Iterator, Mapping

from packer.engines import ray_session
from packer.errors import PackError, UsageError
from packer.options import PackOptions, RemoteOptions
from packer.pipeline import SplitResult
from packer.prepare.pool import WorkerPool
from packer.progress import bar as progress_bar
from packer.writer import ON_ERROR, Writer
from readers.contract.fields import FieldType
from readers.contract.messages import one_line

__all__ = ["pack_map", "MapResult", "MapError"]

log = logging.getLogger(__name__)

_REPR = 60  # characters of an input's repr in a reject line


class MapError(PackError):
    """``fn`` failed on one input (``on_error="raise"``): one line naming the input and the error."""


@dataclasses.dataclass(frozen=True)
class MapResult:
    """What :func:`pack_map` did: the Writer's :class:`SplitResult`, the inputs taken, the samples
    given to the Writer, and one line per input on which ``fn`` failed."""

    result: SplitResult | None
    inputs: int
    samples: int
    rejects: tuple[str, ...]


def _describe(pos: int, item: Any) -> str:
    text = repr(item)
    return f"input {pos} ({text[:_REPR] + '...' if len(text) > _REPR else text})"


class _Apply:
    """``fn`` over one ``(position, input)``: ``(True, samples)`` or ``(False, the failure's line)``.
    A generator is drained here (in the worker), so its failures are the input's too."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __call__(self, job: tuple[int, Any]) -> tuple[bool, Any]:  # (False, (input's name, one-line reason))
        pos, item = job
        try:
            got = self.fn(item)
            if got is None:
                return True, []
            if isinstance(got, Mapping):
                return True, [got]
            if isinstance(got, (str, bytes)) or not isinstance(got, Iterable):
                raise TypeError(f"fn returned a {type(got).__name__}; expected a sample dict, "
                                f"a list or generator of them, or None")
            samples = list(got)
            bad = next((s for s in samples if not isinstance(s, Mapping)), None)
            if bad is not None:
                raise TypeError(f"fn gave a {type(bad).__name__} among its samples; expected sample dicts")
            return True, samples
        except Exception as exc:  # one input's failure: a reject line or MapError, by policy
            return False, (_describe(pos, item), one_line(exc, kind=True))


def _bar(progress: bool | Callable[[int], None], total: int | None) -> tuple[Callable[[int], None] | None, Any]:
    """``progress``: True -> a bar over the inputs (:func:`packer.progress.bar`, as a pack's), a callable
    -> itself, else None."""
    if callable(progress):
        return progress, None
    shown = progress_bar(total, "input", "pack_map", quiet=not progress)
    return (shown.update if shown is not None else None), shown


def pack_map(fn: Callable[[Any], Any], inputs: Iterable[Any], out: str | os.PathLike, format: str | None = None, *,
             workers: int = 0, on_error: str = "reject", fields: Mapping[str, FieldType | str] | str | None = None,
             classes: Sequence[str] | None = None, options: PackOptions | None = None, overwrite: bool = False,
             resume: bool = False, append: bool = False, split: str = "data", remote: RemoteOptions | None = None,
             engine: str | None = None, progress: bool | Callable[[int], None] = False) -> MapResult:
    """Write the samples ``fn`` makes of each input into ``out`` (see the module docstring).

    ``workers``: 0 runs ``fn`` here, N >= 1 in N forked processes; the output is the same bytes.
    ``format``, ``fields``, ``classes``, ``options``, ``overwrite``, ``resume``, ``append``, ``split`` and
    ``remote`` (an ``s3://``, ``gs://`` or ``az://`` ``out``) are the :class:`~packer.writer.Writer`'s (``append=True``: the samples become the next generation of
    the dataset in ``out``); ``resume=True`` continues an interrupted ``pack_map`` of the
    same ``fn`` and inputs: ``fn`` runs again over every input and the samples and rejects the Writer
    already holds (:attr:`Writer.count`) are skipped, so the result is what an uninterrupted job writes.
    ``engine``: ``"local"`` (``workers``) or ``"ray"`` (default: ``options.engine``; see the module
    docstring). ``progress``: True for a bar over the inputs, or a callback
    called with the number of inputs just done."""
    if on_error not in ON_ERROR:
        raise UsageError(f"on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise UsageError(f"workers must be an integer >= 0, got {workers!r}")
    options = options or PackOptions()
    engine = engine or options.engine
    if engine not in ("local", "ray"):
        raise UsageError(f"engine must be 'local' or 'ray', got {engine!r}")
    # checks ray_address / ray_chunk as a pack does; a Ray started here (no address) gets ``workers`` CPUs
    asked = dataclasses.replace(options, engine=engine, workers=options.workers or workers or None)
    options = dataclasses.replace(asked, engine="local", ray_address=None)  # the Writer writes here
    total = len(inputs) if isinstance(inputs, Sequence) else None
    apply = _Apply(fn)
    jobs = enumerate(inputs)
    tick, shown = _bar(progress, total)
    rejects: list[str] = []
    taken = samples = 0
    try:
        with Writer(out, format, fields=fields, classes=classes, options=options, on_error=on_error,
                    overwrite=overwrite, resume=resume, append=append, split=split, remote=remote) as writer, \
                contextlib.ExitStack() as stack:
            skip = writer.count  # resume: samples of the sequence the Writer holds already
            pool = WorkerPool(apply, workers, describe=lambda n: f"input {n}") if workers and engine == "local" \
                else None
            try:
                done: Iterator[tuple[bool, Any]]
                if engine == "ray":  # connected after the Writer has checked and locked its output
                    session = stack.enter_context(ray_session(asked))
                    done = stack.enter_context(contextlib.closing(session.map_ordered(
                        apply, jobs, asked.ray_chunk, lambda a, b: f"{_describe(*a)} .. input {b[0]}")))
                else:
                    done = pool.map(jobs) if pool is not None else map(apply, jobs)
                for ok, value in done:
                    taken += 1
                    if not ok:
                        name, reason = value
                        line = f"{name}: {reason}"
                        if on_error == "raise":
                            raise MapError(line)
                        log.warning("pack_map: %s", line)
                        rejects.append(line)
                        if skip:  # resume: this input's reject is in the sequence the Writer holds
                            skip -= 1
                        else:
                            writer.reject(name, reason)
                    else:
                        for sample in value[skip:]:
                            writer.write(sample)
                        skip = max(0, skip - len(value))
                        samples += len(value)
                    if tick is not None:
                        tick(1)
                if skip:  # raised in the with block: the Writer is aborted, its output left as it was
                    raise PackError(f"{out}: resume=True, but it holds {writer.count} samples and rejects and fn "
                                    f"made only {samples} samples and {len(rejects)} rejects of these inputs; "
                                    "resume with the same fn and inputs")
            finally:
                if pool is not None:
                    pool.close()
        return MapResult(writer.result, taken, samples, tuple(rejects))
    finally:
        if shown is not None:
            shown.close()
