"""Packing options, grouped in one frozen dataclass shared by the API and the CLI.

:class:`PackOptions` says what to write; :class:`RemoteOptions` says how to reach object storage
(an ``s3://`` output or source), for ``pack(..., remote=RemoteOptions(...))``.

Each field that ``pack-dataset`` exposes carries its command-line spelling
and help text as field metadata (:class:`Flag`); ``packer.cli`` builds its
parser from them, so a new option is one field here. Defaults live only in
the field definitions (image-rule defaults come from ``packer.prepare.images``).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

from packer.prepare.images import DEFAULT_MAX_PIXELS, DEFAULT_QUALITY, ImageOptions
from readers.contract.spec import DEFAULT_ORDER, FORMATS, ORDER_KINDS
from readers.contract.units import format_size
from readers.contract.units import parse_size as _parse_size

if TYPE_CHECKING:
    from readers.remote import RetryPolicy

__all__ = ["PackOptions", "RemoteOptions", "OptionError", "ENGINES", "Flag", "GROUPS", "cli_fields",
           "DEFAULT_SHARD_SIZE", "parse_size", "format_size", "parse_positive"]

#: who prepares the images: this machine's process pool, or a Ray cluster (``packer.engines``)
ENGINES = ("local", "ray")
DEFAULT_SHARD_SIZE = 256 * 1024 * 1024  # 256 MiB: large sequential reads, ~2.5k ImageNet images


def parse_size(text: str | int) -> int:
    """Parse ``"256MB"``, ``"1GiB"``, ``"500k"`` or a plain byte count (binary units: :mod:`readers.contract.units`)."""
    return _parse_size(text)


def parse_positive_size(text: str | int) -> int:
    """:func:`parse_size`, at least 1 byte."""
    return _parse_size(text, minimum=1)


def parse_positive(text: str) -> int:
    """A whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise ValueError(f"must be >= 1, got {value}")
    return value


#: --workers may ask for at most this many processes per usable CPU (more only thrash and take memory).
WORKERS_PER_CPU = 4


def _max_workers() -> int:
    from readers.contract.env import available_cpus

    return max(8, WORKERS_PER_CPU * available_cpus())


def _parse_splits(text: str) -> str:
    from packer.sources.source import parse_splits

    return parse_splits(text)


@dataclass(frozen=True)
class Flag:
    """How a :class:`PackOptions` field appears on the command line.

    ``help`` may say ``{default}``: it is filled in with the field's default,
    spelled by ``show``.
    """

    flags: tuple[str, ...]
    help: str
    parse: Callable[[str], Any] | None = None  # raises ValueError with a one-line reason
    action: str | None = None  # "store_true" / "store_false" for on/off switches
    choices: tuple[str, ...] | None = None
    required: bool = False
    exclusive_group: str | None = None  # flags sharing a group name cannot be given together
    show: Callable[[Any], str] = str
    metavar: str | None = None
    commands: tuple[str, ...] = ("pack",)  # the pack-dataset subcommands that take this flag
    group: str = ""  # the section of --help it is listed in: a key of GROUPS

    def help_for(self, default: Any) -> str:
        return self.help.format(default=self.show(default))


class OptionError(ValueError):
    """A :class:`PackOptions` value refused, in words for whoever gave it.

    ``template`` names the options it is about as ``{0}``, ``{1}``, ...: each is a field name
    (``"max_side"``) or a setting (``("engine", "ray")``); ``values`` fill the other placeholders.
    ``str(exc)`` spells them as Python does (``max_side``, ``engine='ray'``); :meth:`cli_message` as
    ``pack-dataset`` does (``--max-side``, ``--engine ray``), which is what the CLI prints.
    """

    def __init__(self, template: str, *options: str | tuple[str, Any], **values: Any) -> None:
        self.template, self.options, self.values = template, options, values
        super().__init__(self._render(cli=False))

    def cli_message(self) -> str:
        """The message with each option as it is typed on the command line."""
        return self._render(cli=True)

    def _render(self, cli: bool) -> str:
        return self.template.format(*(_spell(o, cli) for o in self.options), **self.values)


def _spell(option: str | tuple[str, Any], cli: bool) -> str:
    name, value = (option, None) if isinstance(option, str) else option
    if not cli:
        return name if isinstance(option, str) else f"{name}={value!r}"
    flag = next(f for f in _FIELDS[name].metadata["cli"].flags if f.startswith("--"))
    return flag if isinstance(option, str) or _FIELDS[name].metadata["cli"].action else f"{flag} {value}"


def _flag(*flags: str, **kwargs: Any) -> dict[str, Flag]:
    return {"cli": Flag(flags, **kwargs)}


_BOTH = ("pack", "convert")  # flags that ``pack-dataset convert`` takes too

#: the sections of ``pack-dataset pack --help`` / ``convert --help``, in order: key -> (title, description)
GROUPS: dict[str, tuple[str, str | None]] = {
    "source": ("source", None),
    "output": ("output and format", None),
    "images": ("images", "what is checked and changed in each image on the way in"),
    "fields": ("fields", "manifest sources: which column is the image, the types of the others"),
    "resume": ("existing output and resume", None),
    "remote": ("remote output", "for -o s3://bucket/prefix"),
    "engine": ("engine", "where the work runs (never changes the output)"),
}


@dataclass(frozen=True)
class PackOptions:
    """Everything that decides what ``pack`` writes. Recorded in each index."""

    format: str = field(default="wds", metadata=_flag(
        "-f", "--format", group="output", help=f"output format: {', '.join(FORMATS[:-1])} or {FORMATS[-1]}",
        choices=FORMATS, metavar="FORMAT", required=True, commands=_BOTH))
    # None: the CPUs this process may use (cgroup-aware)
    workers: int | None = field(default=None, metadata=_flag(
        "-w", "--workers", group="engine", parse=parse_positive, metavar="N",
        help="worker processes (default: usable CPUs, cgroup-aware)", commands=_BOTH))
    shard_size: int = field(default=DEFAULT_SHARD_SIZE, metadata=_flag(
        "--shard-size", group="output", parse=parse_positive_size, show=format_size, metavar="SIZE",
        help="wds: start a new shard once a shard reaches this size (default {default})", commands=_BOTH))
    shard_count: int | None = field(default=None, metadata=_flag(
        "--shard-count", group="output", parse=parse_positive, metavar="N",
        help="wds: ...or once it holds this many samples", commands=_BOTH))
    # downscale so the longer side <= this, re-encode at quality
    max_side: int | None = field(default=None, metadata=_flag(
        "--max-side", group="images", parse=parse_positive, metavar="N",
        help="downscale so the longer side is at most N pixels"))
    quality: int = field(default=DEFAULT_QUALITY, metadata=_flag(
        "--quality", group="images", parse=int, metavar="Q",
        help="JPEG quality for re-encoded images (default {default})"))
    resize: int | None = field(default=None, metadata=_flag(
        "--resize", group="images", parse=parse_positive, metavar="N",
        help="mmap: shorter side to N, then center crop NxN (one N x N x 3 array)", commands=_BOTH))
    validate: bool = field(default=True, metadata=_flag(
        "--no-validate", group="images", action="store_false",
        help="do not decode images at pack time (for data you already trust)"))
    strict: bool = field(default=False, metadata=_flag(
        "--strict", group="images", action="store_true", help="stop at the first image that cannot be packed"))
    max_pixels: int = field(default=DEFAULT_MAX_PIXELS, metadata=_flag(
        "--max-pixels", group="images", parse=parse_positive, metavar="N",
        help="reject images with more pixels than this (decompression bombs)"))
    follow_symlinks: bool = field(default=False, metadata=_flag(
        "--follow-symlinks", group="source", action="store_true", help="follow symlinks that point outside SRC"))
    overwrite: bool = field(default=False, metadata=_flag(
        "--overwrite", group="resume", action="store_true", exclusive_group="existing",
        help="replace an existing output", commands=_BOTH))
    resume: bool = field(default=False, metadata=_flag(
        "--resume", group="resume", action="store_true", exclusive_group="existing",
        help="finish an interrupted pack with the same options", commands=_BOTH))
    # add the samples to the dataset already in the output as its next generation (packer.appending);
    # the CLI's --append OUT sets it
    append: bool = False
    # lmdb/hdf5/mmap: durable commit every this many bytes. Each checkpoint costs about six fsyncs
    # (data, the three side files, the journal and its folder): at 64 MB that was a quarter of an
    # hdf5 pack's time here; 256 MB keeps at most ~1 s of packing to redo after a crash.
    checkpoint_bytes: int = field(default=256 * 1024 * 1024, metadata=_flag(
        "--checkpoint-bytes", group="resume", parse=parse_positive_size, show=format_size, metavar="SIZE",
        help="lmdb/hdf5/mmap, and wds with --engine ray: make progress durable (resumable) every this many "
             "bytes (default {default})", commands=_BOTH))
    # which sub-folders of the source are splits; decides the output layout, not a dataset's content
    splits: str = field(default="auto", metadata=_flag(
        "--splits", group="source", parse=_parse_splits, metavar="WHICH",
        help="auto: sub-folders named train, val, test, ... (each a class tree) are packed as splits "
             "(default); none: one dataset; or sub-folder names separated by commas"))

    # manifest and COCO sources (packer.importers.rowsource); recorded only when set
    image_column: str = field(default="image", metadata=_flag(
        "--image-column", group="fields", metavar="NAME",
        help="manifest (.csv/.jsonl/.parquet): the column holding the image path, URL or bytes (default {default})"))
    fields: str | None = field(default=None, metadata=_flag(
        "--fields", group="fields", metavar="NAME:TYPE,...",
        help="manifest: state column types instead of inferring them, e.g. caption:text,boxes:float32[*,4] "
             "(types: image text json bytes int float int8..uint64 float16..float64 DTYPE[N,...] DTYPE[*,...])"))
    images: str | None = field(default=None, metadata=_flag(
        "--images", group="source", metavar="DIR",
        help="COCO instances .json source: the folder of its images (default: COCO's layout, "
             "annotations/instances_val2017.json beside val2017/)"))

    # None: the format's default (spec.DEFAULT_ORDER); resolved by order_kind()
    order: str | None = field(default=None, metadata=_flag(
        "--order", group="output", choices=ORDER_KINDS, metavar="ORDER",
        help="sample order written: shuffled (seeded permutation; default for wds, which is read shard by "
        "shard) or source (sorted by class then path, as ImageFolder; default for lmdb/hdf5/mmap)"))
    shuffle_seed: int = field(default=0, metadata=_flag(
        "--shuffle-seed", group="output", parse=int, metavar="N", help="seed of --order shuffled (default {default})"))
    # Where the work runs. Never changes the output, so not recorded (see recorded()).
    engine: str = field(default="local", metadata=_flag(
        "--engine", group="engine", choices=ENGINES, metavar="ENGINE",
        help="where images are prepared: local (a process pool on this machine, the default) or ray (tasks on a "
             "Ray cluster; pip install 'dataset-packer[ray]', see docs/distributed.md)"))
    ray_address: str | None = field(default=None, metadata=_flag(
        "--ray-address", group="engine", metavar="ADDRESS",
        help="ray: the cluster's address, 'auto' or HOST:PORT (default: $RAY_ADDRESS, else the cluster "
             "'ray start' runs on this machine, else a private one-machine Ray with --workers CPUs)"))
    ray_chunk: int = field(default=64, metadata=_flag(
        "--ray-chunk", group="engine", parse=parse_positive, metavar="N",
        help="ray: images per task (at most 64 MB of source each; default {default})"))

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise OptionError("unknown {0} {value!r}; choose one of {known}", "format", value=self.format,
                              known=", ".join(FORMATS))
        for name in ("workers", "shard_count", "max_side", "resize"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise OptionError("{0} must be >= 1, got {value}", name, value=value)
        if self.workers is not None and self.workers > _max_workers():
            raise OptionError("{0} is more than this machine can use: at most {most} ({per} per usable CPU, 8 at "
                              "least)", ("workers", self.workers), most=_max_workers(), per=WORKERS_PER_CPU)
        for name in ("shard_size", "checkpoint_bytes"):
            if getattr(self, name) < 1:
                raise OptionError("{0} must be >= 1 byte, got {value}", name, value=getattr(self, name))
        if not 1 <= self.quality <= 100:
            raise OptionError("{0} must be in 1..100, got {value}", "quality", value=self.quality)
        if self.resize is not None and self.format != "mmap":
            raise OptionError("{0} applies to the mmap format only; use {1} for the others", "resize", "max_side")
        if self.order is not None and self.order not in ORDER_KINDS:
            raise OptionError("unknown {0} {value!r}; choose one of {known}", "order", value=self.order,
                              known=", ".join(ORDER_KINDS))
        if self.shuffle_seed < 0:
            raise OptionError("{0} must be >= 0, got {value}", "shuffle_seed", value=self.shuffle_seed)
        if self.engine not in ENGINES:
            raise OptionError("unknown {0} {value!r}; choose one of {known}", "engine", value=self.engine,
                              known=", ".join(ENGINES))
        if self.ray_address is not None and self.engine != "ray":
            raise OptionError("{0} applies to the ray engine only ({1})", "ray_address", ("engine", "ray"))
        if self.ray_chunk < 1:
            raise OptionError("{0} must be >= 1, got {value}", "ray_chunk", value=self.ray_chunk)
        if self.overwrite and self.resume:
            raise OptionError("choose either {0} (start again) or {1} (continue), not both", "overwrite", "resume")
        if _parse_splits(self.splits) != self.splits:
            raise OptionError("{0} must be auto, none or comma-separated names without spaces, got {value!r}",
                              "splits", value=self.splits)

    def recorded(self) -> dict[str, Any]:
        """The options that shape the output (stored in the index, compared on resume)."""
        d = asdict(self)
        for volatile in ("workers", "overwrite", "resume", "append", "strict", "splits", "engine", "ray_address",
                         "ray_chunk"):
            d.pop(volatile)
        for name, default in (("image_column", "image"), ("fields", None), ("images", None)):
            if d[name] == default:  # recorded only when given: indexes of image folders stay as they were
                d.pop(name)
        d["order"] = self.order_kind()
        return d

    def order_kind(self) -> str:
        """The sample order to write: ``order``, or the format's default (``spec.DEFAULT_ORDER``)."""
        return self.order or DEFAULT_ORDER[self.format]

    def image_options(self, *, want_pixels: bool) -> ImageOptions:
        """The per-image rules these options ask for (``want_pixels``: the writer stores pixels)."""
        return ImageOptions(validate=self.validate, max_side=self.max_side, quality=self.quality,
                            resize=self.resize, want_pixels=want_pixels, max_pixels=self.max_pixels)


_FIELDS = {f.name: f for f in dataclasses.fields(PackOptions)}


def cli_fields(command: str = "pack") -> Iterator[tuple[dataclasses.Field, Flag]]:
    """The :class:`PackOptions` fields that ``pack-dataset COMMAND`` exposes, in declaration order."""
    for f in dataclasses.fields(PackOptions):
        if "cli" in f.metadata and command in f.metadata["cli"].commands:
            yield f, f.metadata["cli"]


#: ``upload_progress(split)`` may return a callback called with each upload's bytes as they go.
UploadProgressFactory = Callable[[str], "Callable[[int], None] | None"]


@dataclass(frozen=True)
class RemoteOptions:
    """How ``pack`` reaches object storage: ``pack(src, out, options, remote=RemoteOptions(...))``.

    * ``storage_options`` -- s3fs's settings (``endpoint_url``, ``key``, ``secret``, ...; the
      ``AWS_*`` environment fills in what they leave out: docs/remote.md);
    * ``retry`` -- a :class:`readers.remote.RetryPolicy` for every request (None: its defaults);
    * ``stage_dir`` -- the local staging folder of an ``s3://`` output (None:
      ``$DATASET_PACKER_STAGE`` or ``~/.cache/dataset-packer/stage/<url>-<hash>``);
    * ``upload_progress(split)`` -- may return a callback ``(bytes)`` called as uploads go.

    All four apply to an ``s3://`` output; ``storage_options`` and ``retry`` to an ``s3://`` source
    too. A field set where it cannot apply is a TypeError naming it (:meth:`unused`).
    """

    storage_options: Mapping[str, Any] | None = None
    retry: RetryPolicy | None = None
    stage_dir: str | os.PathLike[str] | None = None
    upload_progress: UploadProgressFactory | None = None

    def unused(self, *, remote_source: bool, remote_output: bool) -> list[str]:
        """The fields set (not None) that a pack with this source and output would not use."""
        used = {f.name for f in dataclasses.fields(self)} if remote_output else (
            {"storage_options", "retry"} if remote_source else set())
        return [f.name for f in dataclasses.fields(self) if getattr(self, f.name) is not None and f.name not in used]
