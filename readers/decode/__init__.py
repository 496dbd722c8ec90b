"""The decode stack: stored image bytes to RGB ``uint8`` pixels, and the transforms fused with it.

* :mod:`~readers.decode.decoders` -- whole and scaled decodes, the pluggable decoders;
* :mod:`~readers.decode.jpegcrop` -- the optional native region decoder (``_jpegcrop.c``, built by
  the package build), used only where it equals the full decode;
* :mod:`~readers.decode.geometry` -- resize-then-center-crop geometry, shared with ``packer``;
* :mod:`~readers.decode.crop` -- one crop decoded and resized: the decode scale and region it needs,
  and the resize (torch or Pillow);
* :mod:`~readers.decode.transforms`, :mod:`~readers.decode.compose` -- train/eval transforms that
  choose the crops and decode only the pixels they keep, and composing them without losing that.

Imports only :mod:`readers.contract`.
"""
