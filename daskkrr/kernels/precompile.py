"""``python -m daskkrr.kernels.precompile``: compile the fused engine into numba's cache.

Run it where an image is built or before a benchmark; ``engine="auto"`` runs it
itself in the background (``--background``) the first time it finds no cache (see
:mod:`daskkrr.kernels.warmup`). A module of its own, which the package never
imports, so that ``-m`` runs it without a second copy of :mod:`~daskkrr.kernels.warmup`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from daskkrr.kernels import warmup
from daskkrr.utils.optional import numba_installed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m daskkrr.kernels.precompile",
                                 description="Compile daskkrr's fused kernel engine into numba's cache.")
    ap.add_argument("--background", action="store_true",
                    help="run at low priority and exit at once if another process is compiling")
    ap.add_argument("--after-idle", type=int, default=None, metavar="PID",
                    help="first wait (up to 2 minutes) until process PID is idle")
    args = ap.parse_args(argv)
    if not numba_installed():
        print("numba is not installed: nothing to compile (the BLAS engine is used)")
        return 0
    if args.background:
        with contextlib.suppress(OSError):
            os.nice(19)
    if args.after_idle is not None:
        warmup.wait_until_idle(args.after_idle)
    done = warmup.warm_up(wait=not args.background)
    if not args.background:
        print(f"fused engine compiled; marker {warmup.marker_path()}" if done else "another process is compiling")
    return 0


if __name__ == "__main__":
    sys.exit(main())
