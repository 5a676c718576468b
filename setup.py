"""Build hooks: the optional native statistics kernel (nbdebug.frameworks._fastats), the prebuilt lab extension.

Project metadata lives in pyproject.toml.  The extension is optional: without a C compiler the
install still succeeds and nbdebug falls back to the pure-framework statistics path.
No -march/-ffast-math: wheels must run on any x86-64, and NaN semantics matter; the kernel selects
AVX2/AVX-512 code paths at import time itself.

The JupyterLab extension (``make labextension`` builds it with node into nbdebug/labextension) is shipped
as data files under share/jupyter/labextensions/nbdebug, every built file, so that installing the wheel
needs no node. Built without it (a fresh clone), the package installs but JupyterLab gets no extension:
a warning says so.
"""

import sys
from pathlib import Path

from setuptools import Extension, setup

if sys.platform == "win32":
    extra_compile_args = ["/O2"]
else:
    extra_compile_args = ["-O3", "-fno-fast-math", "-Wall"]

LABEXT = Path("nbdebug/labextension")
LABEXT_DEST = "share/jupyter/labextensions/nbdebug"


def labextension_data_files() -> list[tuple[str, list[str]]]:
    if not (LABEXT / "package.json").is_file():
        print("warning: nbdebug's JupyterLab extension is not built (run `make labextension`, which needs node): "
              "this build does not carry it", file=sys.stderr)
        return []
    by_dir: dict[str, list[str]] = {LABEXT_DEST: ["install.json"]}
    for path in sorted(p for p in LABEXT.rglob("*") if p.is_file()):
        rel = path.parent.relative_to(LABEXT).as_posix()
        by_dir.setdefault(LABEXT_DEST if rel == "." else f"{LABEXT_DEST}/{rel}", []).append(path.as_posix())
    return sorted(by_dir.items())


setup(
    data_files=labextension_data_files(),
    ext_modules=[
        Extension(
            "nbdebug.frameworks._fastats",
            ["nbdebug/frameworks/_fastats.c"],
            depends=["nbdebug/frameworks/_recorder.c"],  # included by _fastats.c
            extra_compile_args=extra_compile_args,
            optional=True,
        )
    ]
)
