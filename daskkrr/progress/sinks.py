"""Progress as log records on the ``daskkrr.progress`` logger, all at INFO.

A failed fit is logged at INFO too: the exception itself reaches the caller, and the
command line prints it as its one error line.
"""

from __future__ import annotations

import logging

from daskkrr.progress.state import FitProgress

logger = logging.getLogger("daskkrr.progress")


class LogSink:
    """Logs phase changes, finished passes, the dictionary, each CG iteration and the end.

    Live block counts are not logged (they change too often for a log).
    """

    def __call__(self, p: FitProgress, event: str) -> None:
        if not logger.isEnabledFor(logging.INFO):
            return
        if event == "begin":
            logger.info("fit %s: %s on %d rows x %d features in %d blocks", p.fit_id, p.estimator,
                        p.n_rows, p.n_features, p.n_blocks)
        elif event == "phase":
            logger.info("fit %s: phase %s", p.fit_id, p.phase)
        elif event == "pass":
            logger.info("fit %s: pass %d done (%d blocks, %d rows read so far)", p.fit_id, p.passes,
                        p.blocks_read, p.rows_streamed)
        elif event == "dictionary":
            if p.dictionary:
                logger.info("fit %s: dictionary of %s after %d rows; %s centers", p.fit_id,
                            p.dictionary[-1][1], p.dictionary[-1][0], p.n_centers)
            else:
                logger.info("fit %s: %s centers", p.fit_id, p.n_centers)
        elif event == "cg":
            logger.info("fit %s: CG iteration %d%s: relative residual %.3e", p.fit_id, p.cg_iteration,
                        f"/{p.max_iter}" if p.max_iter else "", p.residual)
        elif event == "done":
            logger.info("fit %s: done in %.2fs (%d passes, %d rows read)", p.fit_id, p.elapsed, p.passes,
                        p.rows_streamed)
        elif event == "failed":
            logger.info("fit %s failed in phase %s: %s", p.fit_id, p.phase, p.error)
