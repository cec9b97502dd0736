"""``python -m workflows.benchmarks``: see :mod:`workflows.benchmarks.runner`."""

import sys

from .runner import main

sys.exit(main())
