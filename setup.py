"""Build hook for the optional native statistics kernel (nbdebug._fastats).

Project metadata lives in pyproject.toml.  The extension is optional: without a C compiler the
install still succeeds and nbdebug falls back to the pure-framework statistics path.
No -march/-ffast-math: wheels must run on any x86-64, and NaN semantics matter; the kernel selects
AVX2/AVX-512 code paths at import time itself.
"""

import sys

from setuptools import Extension, setup

if sys.platform == "win32":
    extra_compile_args = ["/O2"]
else:
    extra_compile_args = ["-O3", "-fno-fast-math", "-Wall"]

setup(
    ext_modules=[
        Extension(
            "nbdebug._fastats",
            ["nbdebug/frameworks/_fastats.c"],
            extra_compile_args=extra_compile_args,
            optional=True,
        )
    ]
)
