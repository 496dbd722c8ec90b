"""The optional native helpers, built by the package build.

* ``readers/decode/_jpegcrop.c``, the region decoder: compiled against the system libjpeg-turbo
  where a C compiler and ``jpeglib.h`` exist (Debian: ``apt-get install gcc libjpeg62-turbo-dev``);
  without it the readers decode whole JPEGs (``readers.decode.jpegcrop.library()`` is None).
* ``packer/tools/_tarwalk.c``, the tar header walk of ``pack-dataset index``: needs a C compiler
  only; without it the headers are walked in Python (``packer.tools.index_scan.tarwalk_library()``
  is None), with the same result.
* ``readers/formats/_gather.c``, the batch gather of whole-batch reads (stored bytes): needs a C
  compiler only; without it numpy copies the same bytes (``readers.formats.batch.gather_library()``
  is None).

Everything else about the package is in ``pyproject.toml``; this file only declares the extensions.
``pip install .``, ``pip install -e .`` (built in place, beside the modules that load them) and
``pip wheel .`` compile them. Where a compile or a link fails, the build says so in one warning and
goes on without that helper: the install succeeds.

Each extension is a plain C library that its module loads with ctypes by its path (no ``PyInit_``,
no Python headers needed); it is an extension only so that setuptools builds it, names it for the
platform and puts it in the wheel.
"""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, ExecError, PlatformError

NATIVE = "readers.decode._jpegcrop"
TARWALK = "packer.tools._tarwalk"
GATHER = "readers.formats._gather"
#: What each helper needs, and what the package does without it (the warning of a failed build).
WITHOUT = {
    NATIVE: ("the native region decoder", "a C compiler and libjpeg-turbo's jpeglib.h (Debian: apt-get install gcc "
             "libjpeg62-turbo-dev)", "the readers decode whole JPEGs"),
    TARWALK: ("the native tar walk", "a C compiler (Debian: apt-get install gcc)",
              "pack-dataset index walks tar headers in Python"),
    GATHER: ("the native batch gather", "a C compiler (Debian: apt-get install gcc)",
             "whole-batch reads copy with numpy"),
}


class optional_build_ext(build_ext):
    """``build_ext`` that turns a failed compile or link of a native helper into a warning."""

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except (CCompilerError, ExecError, PlatformError) as exc:  # no cc, no jpeglib.h, no -ljpeg
            reason = str(exc) or type(exc).__name__  # e.g. "command 'gcc' failed with exit code 1"
            what, needs, without = WITHOUT[ext.name]
            self.warn(f"{what} {ext.name} was not built ({reason}): it needs {needs}; {without}")


setup(
    # optional: setuptools copies a missing build output into the source tree (editable) without failing
    ext_modules=[Extension(NATIVE, ["readers/decode/_jpegcrop.c"], libraries=["jpeg"], optional=True),
                 Extension(TARWALK, ["packer/tools/_tarwalk.c"], extra_compile_args=["-O2"], optional=True),
                 Extension(GATHER, ["readers/formats/_gather.c"], extra_compile_args=["-O2"], optional=True)],
    cmdclass={"build_ext": optional_build_ext},
)
