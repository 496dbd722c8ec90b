"""The optional native region decoder, ``readers/decode/_jpegcrop.c``, built by the package build.

Everything else about the package is in ``pyproject.toml``; this file only declares the extension.
``pip install .``, ``pip install -e .`` (built in place, beside ``readers/decode/jpegcrop.py``) and
``pip wheel .`` compile it against the system libjpeg-turbo where a C compiler and ``jpeglib.h``
exist (Debian: ``apt-get install gcc libjpeg62-turbo-dev``). Where the compile or the link fails,
the build says so in one warning and goes on without it: the install succeeds, and the readers
decode whole JPEGs (``readers.decode.jpegcrop.library()`` is None).

The extension is a plain C library that ``readers.decode.jpegcrop`` loads with ctypes by its path (no
``PyInit__jpegcrop``, no Python headers needed); it is an extension only so that setuptools builds
it, names it for the platform and puts it in the wheel.
"""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, ExecError, PlatformError

NATIVE = "readers.decode._jpegcrop"


class optional_build_ext(build_ext):
    """``build_ext`` that turns a failed compile or link of the native decoder into a warning."""

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except (CCompilerError, ExecError, PlatformError) as exc:  # no cc, no jpeglib.h, no -ljpeg
            reason = str(exc) or type(exc).__name__  # e.g. "command 'gcc' failed with exit code 1"
            self.warn(f"the native region decoder {ext.name} was not built ({reason}): it needs a C compiler "
                      "and libjpeg-turbo's jpeglib.h (Debian: apt-get install gcc libjpeg62-turbo-dev); "
                      "the readers decode whole JPEGs")


setup(
    # optional: setuptools copies a missing build output into the source tree (editable) without failing
    ext_modules=[Extension(NATIVE, ["readers/decode/_jpegcrop.c"], libraries=["jpeg"], optional=True)],
    cmdclass={"build_ext": optional_build_ext},
)
