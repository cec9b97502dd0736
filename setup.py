"""Build hook: compile the fused kernel engine into the wheel's numba cache.

Everything else about the build is declared in ``pyproject.toml``. Right after
``pip install``, numba would have to compile the engine (about 18 s for both dtypes)
before the first fit could use it; so the wheel build compiles it here, into the
``__pycache__`` folders of the built package, and writes the marker that
:mod:`daskkrr.kernels.warmup` looks for. numba keys its cache on the sources'
contents, its own version, Python's and the CPU, and the marker records the CPU: on
the machine that built the wheel (``pip install .``, or a wheel built and installed
on one host) the first fit loads compiled code; anywhere else the cache does not
match, and the package falls back to what it does without one (the BLAS engine
while a background process compiles).

Only the engine's modules are imported, with the top-level package stubbed out,
so the build needs numba, numpy, scipy and threadpoolctl (``[build-system]
requires``), not dask. ``DASKKRR_BUILD_COMPILE=0`` skips the step (for a wheel
meant for other machines); a failed compile only prints a warning. An editable
install compiles into the source tree, which it runs from; when that tree's cache
is complete already (the marker is there), the step takes no time.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

#: Seconds the build waits for the compile (about 18 s on a 2-core VM) before it goes on without.
COMPILE_TIMEOUT = 900

# Run in a fresh interpreter: the engine's modules from the built tree, without
# daskkrr/__init__.py (which imports dask, absent from the build environment).
_COMPILE = """
import sys, types
package = types.ModuleType("daskkrr")
package.__path__ = [sys.argv[1]]
sys.modules["daskkrr"] = package
from daskkrr.kernels import warmup
warmup.warm_up()
print(warmup.marker_path())
"""


def compile_engine(package_dir: Path, clean: bool = True) -> bool:
    """Fill ``package_dir``'s ``__pycache__`` folders with the engine's compiled code; True on success.

    ``clean`` first removes numba files and markers left by an earlier build in the same folder.
    """
    if clean:
        for stale in [*package_dir.rglob("__pycache__/*.nb[ic]"), *package_dir.rglob("__pycache__/daskkrr-engine-*")]:
            stale.unlink()
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "DASKKRR_ENGINE")}
    env["DASKKRR_BACKGROUND_COMPILE"] = "0"
    try:
        out = subprocess.run([sys.executable, "-c", _COMPILE, str(package_dir)], env=env, cwd=package_dir.parent,
                             capture_output=True, text=True, timeout=COMPILE_TIMEOUT)
        ok, detail = out.returncode == 0, (out.stdout if out.returncode == 0 else out.stderr)[-2000:].strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        ok, detail = False, str(exc)
    if clean:  # a built package carries no lock file (a source tree's may be held by a compile)
        for lock in package_dir.rglob("__pycache__/daskkrr-engine-*.lock"):
            lock.unlink()
    if ok:
        print(f"daskkrr: fused engine compiled ({detail})")
    else:
        print("daskkrr: WARNING: could not compile the fused engine at build time; the first fit after the "
              f"install will compile it in the background instead:\n{detail}", file=sys.stderr)
    return ok


class BuildPyWithEngine(build_py):
    """``build_py``, then the engine's compile into the built package."""

    def run(self) -> None:
        super().run()
        if os.environ.get("DASKKRR_BUILD_COMPILE", "1").strip().lower() in ("0", "false", "no"):
            return
        if self.editable_mode:  # the package runs from the source tree: its cache goes there
            compile_engine(Path(__file__).resolve().parent / "daskkrr", clean=False)
        else:
            compile_engine(Path(self.build_lib).resolve() / "daskkrr")


if __name__ == "__main__":  # as setuptools runs it (the tests import compile_engine)
    setup(cmdclass={"build_py": BuildPyWithEngine})
