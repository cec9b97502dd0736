"""A crash right after a CG checkpoint was saved, for the resume tests (not a test module)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from daskkrr.checkpoint import FitCheckpoint


class SimulatedCrash(Exception):
    """Stands in for a crash right after a checkpoint was saved."""


@contextlib.contextmanager
def crash_after_cg_save(iteration: int) -> Iterator[None]:
    """Within the block, a fit saves its CG checkpoints as usual and raises :class:`SimulatedCrash` right after
    saving the one of ``iteration`` (or a later one)."""
    save_cg = FitCheckpoint.save_cg

    def save_then_crash(self: FitCheckpoint, state) -> None:
        save_cg(self, state)
        if state.iteration >= iteration:
            raise SimulatedCrash(state.iteration)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(FitCheckpoint, "save_cg", save_then_crash)
        yield
