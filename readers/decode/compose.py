"""Composing transforms without losing the fused decode.

A fused transform (``accepts_bytes = True``: ``imagenet_train_transform()``,
``imagenet_eval_transform()``) decodes the stored bytes itself at reduced
size. Readers hand the bytes to a transform only when it wants them:
:func:`accepts_bytes` says whether it does, also through a ``Compose`` (ours
or torchvision's v1/v2, which call their steps in order) whose first step is
fused. Anywhere else a fused transform gets a decoded image and the speed-up
is gone; :func:`warn_if_fused_lost` says so, once per process.
"""

from __future__ import annotations

__all__ = ["Compose", "accepts_bytes", "steps", "warn_if_fused_lost"]


class Compose:
    """Apply ``transforms`` in order, like torchvision's ``Compose``, keeping the fused decode.

    When the first step is a fused transform (``accepts_bytes``), so is the
    Compose: readers hand it the stored bytes, the first step decodes at
    reduced size and crops, and the later steps get its uint8 CHW tensor.
    """

    def __init__(self, transforms) -> None:
        self.transforms = list(transforms)

    @property
    def accepts_bytes(self) -> bool:
        return bool(self.transforms) and accepts_bytes(self.transforms[0])

    def __call__(self, image):
        for step in self.transforms:
            image = step(image)
        return image

    def __repr__(self) -> str:
        return "Compose([" + ", ".join(repr(t) for t in self.transforms) + "])"


def steps(transform) -> list | None:
    """The steps of a sequential Compose (ours, torchvision's v1 or v2), or None."""
    inner = getattr(transform, "transforms", None)
    if type(transform).__name__ == "Compose" and isinstance(inner, (list, tuple)):
        return list(inner)
    return None


def accepts_bytes(transform) -> bool:
    """True when ``transform`` wants the stored bytes: it says so (``accepts_bytes``), or it is a
    Compose (ours or torchvision's) whose first step does. Other wrappers (``RandomApply``, a
    lambda) may not call the step first, so they get decoded images."""
    if transform is None:
        return False
    if getattr(transform, "accepts_bytes", False) is True:
        return True
    parts = steps(transform)
    if not parts:
        return False
    return accepts_bytes(parts[0])


def _fused_within(transform, depth: int = 0) -> list:
    """Fused transforms reachable inside ``transform`` through ``.transforms`` / ``.transform``."""
    if depth > 8 or transform is None:
        return []
    found = [transform] if getattr(transform, "accepts_bytes", False) is True and depth else []
    inner = getattr(transform, "transforms", None)
    inner = list(inner) if isinstance(inner, (list, tuple)) else []
    single = getattr(transform, "transform", None)
    if single is not None and not isinstance(single, (list, tuple)):
        inner.append(single)
    for step in inner:
        found += _fused_within(step, depth + 1)
    return found


_warned_lost = False


def warn_if_fused_lost(transform) -> bool:
    """Warn once per process when ``transform`` wraps a fused transform where it will receive
    decoded images (not first in a Compose, inside RandomApply, ...): the fused decode is lost.
    Returns True when it found such a case."""
    global _warned_lost
    if transform is None or accepts_bytes(transform):
        return False
    lost = _fused_within(transform)
    if not lost:
        return False
    if not _warned_lost:
        _warned_lost = True
        import warnings

        warnings.warn(
            f"{type(lost[0]).__name__} is wrapped in {type(transform).__name__} where it receives decoded "
            "images, so its fused reduced-size decode is lost (the issue measured 1.8x slower); make it the "
            "first step of a Compose (readers.decode.transforms.Compose or torchvision's)", UserWarning, stacklevel=4)
    return True
