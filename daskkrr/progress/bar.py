"""A progress bar for fits, in terminals and in Jupyter, without extra dependencies.

Three ways of drawing, chosen automatically:

- Jupyter (an IPython kernel): one cell output with an HTML ``<progress>`` bar,
  updated in place through a display handle;
- a terminal (the stream is a TTY): one line redrawn with ``\\r``;
- anything else (logs, CI, pipes): a line per phase change and per CG iteration,
  at most one CG line per ``min_line_interval`` seconds, so logs stay short.
"""

from __future__ import annotations

import html
import sys
import time
from typing import IO, Any

from daskkrr.progress.state import FitProgress


def in_notebook() -> bool:
    """Whether this runs inside a Jupyter (IPython kernel) session.

    Returns
    -------
    bool
        True in a Jupyter kernel, False in a terminal IPython or plain Python.
    """
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:
        return False
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


#: Colours of the fit's status: green only for a fit that finished and converged.
STATUS_COLORS = {"running": "#36c", "done": "#2a7", "done (not converged)": "#d80", "failed": "#c33"}


def status_label(p: FitProgress) -> str:
    """The fit's status in words; a finished fit whose solver stopped above ``tol`` says so."""
    if p.status == "done" and p.converged is False:
        return "done (not converged)"
    return p.status


def solver_measure(p: FitProgress) -> tuple[str, str]:
    """Short and long names of what the solver's steps report: CG's residual, Lloyd's center shift."""
    return ("shift", "center shift") if p.solver == "Lloyd" else ("res", "relative residual")


def describe(p: FitProgress) -> str:
    """The figures of the bar as one line of text (without the bar itself).

    Parameters
    ----------
    p : FitProgress
        The fit's progress record.

    Returns
    -------
    str
        Rows, blocks, pass, dictionary, solver step and seconds, separated by ``|``.
    """
    parts = [f"{p.rows_streamed:,} rows", f"{p.blocks_read} blocks"]
    if p.pass_task and p.n_blocks:
        parts.append(f"pass {p.passes + 1}: {min(p.blocks_in_pass, p.n_blocks)}/{p.n_blocks}")
    size = p.dictionary_size
    if size is not None:
        thinned = p.dictionary and p.n_centers is not None and p.n_centers != size
        parts.append(f"dict {size}" + (f" ({p.n_centers} centers)" if thinned else ""))
    if p.cg:
        limit = f"/{p.max_iter}" if p.max_iter else ""
        parts.append(f"{p.solver} {p.cg_iteration}{limit} {solver_measure(p)[0]} {p.residual:.2e}")
    parts.append(f"{p.elapsed:.1f}s")
    return " | ".join(parts)


class ProgressBar:
    """Draws a :class:`FitProgress`; use it as a sink (``bar(progress, event)``).

    Parameters
    ----------
    stream : file object, optional
        Where to write in text modes (default ``sys.stderr``).
    mode : {"auto", "notebook", "tty", "lines"}
        How to draw; "auto" picks notebook, tty or lines as described above.
    width : int
        Characters of the text bar.
    min_interval : float
        Seconds between redraws of the live bar (terminal and notebook).
    min_line_interval : float
        Seconds between two CG lines in "lines" mode.
    heartbeat : float
        In "lines" mode, during a long pass, a line every ``heartbeat`` seconds.
    """

    def __init__(
        self,
        stream: IO[str] | None = None,
        *,
        mode: str = "auto",
        width: int = 24,
        min_interval: float = 0.2,
        min_line_interval: float = 1.0,
        heartbeat: float = 10.0,
    ):
        if mode not in ("auto", "notebook", "tty", "lines"):
            raise ValueError(f"mode must be 'auto', 'notebook', 'tty' or 'lines'; got {mode!r}")
        self.stream = stream
        self.mode = mode
        self.width = int(width)
        self.min_interval = float(min_interval)
        self.min_line_interval = float(min_line_interval)
        self.heartbeat = float(heartbeat)
        self._handle: Any = None
        self._last_draw = 0.0
        self._last_line = 0.0
        self._started = False
        self._tty_len = 0

    # ------------------------------------------------------------------ helpers
    def _out(self) -> IO[str]:
        return self.stream if self.stream is not None else sys.stderr

    def _mode(self) -> str:
        if self.mode != "auto":
            return self.mode
        if self.stream is None and in_notebook():
            return "notebook"
        isatty = getattr(self._out(), "isatty", None)
        return "tty" if isatty is not None and isatty() else "lines"

    def text_bar(self, p: FitProgress) -> str:
        frac = p.fraction
        if frac is None:
            return " " * (self.width + 7)
        filled = int(round(frac * self.width))
        return f"[{'#' * filled}{'.' * (self.width - filled)}] {frac * 100:3.0f}%"

    def line(self, p: FitProgress) -> str:
        """One line of text: phase, bar and figures."""
        label = p.phase if p.status == "running" else status_label(p)
        text = f"{label:<14} {self.text_bar(p)} | {describe(p)}"
        if p.status == "failed" and p.error:
            text += f" | {p.error}"
        return text

    def html(self, p: FitProgress) -> str:
        """The notebook rendering: a ``<progress>`` element and the figures."""
        frac = p.fraction if p.fraction is not None else 0.0
        status = status_label(p)
        color = STATUS_COLORS.get(status, "#36c")
        label = html.escape(p.phase if p.status == "running" else status)
        error = f"<div style='color:#c33'>{html.escape(p.error)}</div>" if p.error else ""
        return (
            f"<div class='daskkrr-progress' style='font-family:monospace'>"
            f"<b>{html.escape(p.estimator)}</b> <span style='color:{color}'>{label}</span> "
            f"<progress value='{frac:.4f}' max='1' style='width:40%'></progress> {frac * 100:.0f}%"
            f"<div>{html.escape(describe(p))}</div>{error}</div>"
        )

    # --------------------------------------------------------------------- sink
    def __call__(self, p: FitProgress, event: str) -> None:
        if event == "begin":  # a new fit (one bar may serve several): start a fresh drawing
            self._started, self._handle, self._tty_len = True, None, 0
        if not self._started:
            return  # nothing to show before the data are open (e.g. a missing store)
        final = event in ("done", "failed")
        now = time.monotonic()
        mode = self._mode()
        if mode == "lines":
            if event == "blocks" and now - self._last_line >= self.heartbeat:
                pass  # a long pass: say how far it got
            elif event in ("begin", "blocks", "pass") or (event == "dictionary" and not p.dictionary):
                return
            elif event == "cg" and now - self._last_line < self.min_line_interval:
                return
            self._last_line = now
            print(self.line(p), file=self._out(), flush=True)
            return
        if not final and event != "phase" and now - self._last_draw < self.min_interval:
            return
        self._last_draw = now
        if mode == "notebook":
            self._draw_notebook(p)
        else:
            self._draw_tty(p, final)

    def _draw_tty(self, p: FitProgress, final: bool) -> None:
        text = self.line(p)
        pad = " " * max(0, self._tty_len - len(text))
        self._tty_len = len(text)
        out = self._out()
        out.write("\r" + text + pad + ("\n" if final else ""))
        out.flush()

    def _draw_notebook(self, p: FitProgress) -> None:
        from IPython.display import HTML, display

        content = HTML(self.html(p))
        if self._handle is None:
            self._handle = display(content, display_id=True)
        else:
            self._handle.update(content)
