"""HTML of the daskkrr dashboard page: pure functions from fit records to markup."""

from __future__ import annotations

import html
import logging
import time
from typing import Any
from urllib.parse import quote

from daskkrr.dashboard.plugin import updated_at
from daskkrr.dashboard.svg import line_chart, progress_bar
from daskkrr.progress.bar import STATUS_COLORS, solver_measure, status_label
from daskkrr.progress.state import FitProgress

logger = logging.getLogger("daskkrr.dashboard")

REFRESH_MS = 1000


def choose_fit(fits: dict[str, dict[str, Any]], wanted: str | None = None) -> str | None:
    """``wanted`` if published, else the running fit updated last, else the fit updated last."""
    if wanted and wanted in fits:
        return wanted
    if not fits:
        return None

    def key(fid: str) -> tuple[bool, float]:
        rec = fits[fid] if isinstance(fits[fid], dict) else {}
        return (rec.get("status") == "running", updated_at(rec))

    return max(fits, key=key)


#: What a malformed record raises while it is read or drawn (wrong types, missing or odd values).
_MALFORMED = (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError)


def _published(fits: dict[Any, Any]) -> dict[str, dict[str, Any]]:
    """The records that look like fit records: a dict under a text id, with its ``fit_id`` a string."""
    return {fid: rec for fid, rec in fits.items()
            if isinstance(fid, str) and isinstance(rec, dict) and isinstance(rec.get("fit_id"), str)}


def _row(name: str, value: Any, ident: str) -> str:
    return f'<tr><th>{html.escape(name)}</th><td id="daskkrr-{ident}">{html.escape(str(value))}</td></tr>'


def _dictionary_text(p: FitProgress) -> str:
    if p.dictionary_size is None:
        return "-"
    if p.dictionary and p.n_centers is not None and p.n_centers != p.dictionary_size:
        return f"{p.dictionary_size} ({p.n_centers} centers kept)"
    return str(p.dictionary_size)


def _status_of(record: dict[str, Any]) -> str:
    """The status of a published fit record, as the page shows it."""
    status = str(record.get("status", ""))
    return "done (not converged)" if status == "done" and record.get("converged") is False else status


def render_fragment(fits: dict[str, dict[str, Any]], counts: dict[str, dict[str, int]], wanted: str | None) -> str:
    """The live part of the page (refreshed by the page's script).

    Any client of the scheduler can publish a record, so a malformed one (not a
    dict, no ``fit_id``, fields of the wrong type) is skipped and logged, never
    allowed to break the page for everyone.
    """
    fits = _published(fits)
    while fits:
        fit_id = choose_fit(fits, wanted)
        if fit_id is None:
            break
        try:
            return _render_fit(fits, counts, fit_id)
        except _MALFORMED as exc:
            logger.warning("daskkrr dashboard: skipping the malformed fit record %r (%s: %s)",
                           fit_id, type(exc).__name__, exc)
            fits = {fid: rec for fid, rec in fits.items() if fid != fit_id}
    return (
        '<div id="daskkrr-fit" data-status="none"><p id="daskkrr-empty">No daskkrr fit has run on this '
        "cluster yet. Fit a model with a client connected to this scheduler, e.g. "
        "<code>daskkrr fit --scheduler ADDRESS ...</code> or "
        "<code>FalkonRegressor().fit(...)</code> with <code>Client(ADDRESS)</code> active.</p></div>"
    )


def _render_fit(fits: dict[str, dict[str, Any]], counts: dict[str, dict[str, int]], fit_id: str) -> str:
    """The fragment showing ``fit_id``; one of :data:`_MALFORMED` when its record is not a fit record."""
    p = FitProgress.from_dict(fits[fit_id])
    p.apply_counts(counts.get(fit_id, {}))
    status = status_label(p)  # an unconverged fit is "done (not converged)", not green
    badge = STATUS_COLORS.get(status, "#777")
    cg_text = "-" if not p.cg else (
        f"{p.cg_iteration}" + (f" / {p.max_iter}" if p.max_iter else "")
        + f"  ({solver_measure(p)[1].split()[-1]} {p.residual:.3e})"
    )
    live = f"{min(p.blocks_in_pass, p.n_blocks)} / {p.n_blocks}" if p.pass_task else "-"
    rows = [
        _row("phase", p.phase, "phase"),
        _row("rows streamed", f"{p.rows_streamed:,}", "rows"),
        _row("blocks read", f"{p.blocks_read:,}", "blocks"),
        _row("current pass", live, "pass"),
        _row("passes done", p.passes, "passes"),
        _row("dictionary size", _dictionary_text(p), "dictionary"),
        _row(f"{p.solver} iteration", cg_text, "cg-iteration"),
        _row("data", f"{p.n_rows:,} rows x {p.n_features} features, {p.n_blocks} blocks", "data"),
        _row("elapsed", f"{p.elapsed:.1f} s", "elapsed"),
    ]
    if p.error:
        rows.append(_row("error", p.error, "error"))
    cg_chart = line_chart(
        p.cg, title=f"{p.solver} {solver_measure(p)[1]} by iteration", xlabel="iteration",
        ylabel=f"{solver_measure(p)[1]} (log10)", logy=True, element_id="daskkrr-cg-chart",
        empty_text="the solver has not started",
    )
    if p.dictionary:
        dict_chart = line_chart(
            p.dictionary, title="SQUEAK dictionary size", xlabel="rows seen", ylabel="dictionary size",
            element_id="daskkrr-dictionary-chart", color="#d62728", from_zero=True,
        )
    else:
        note = (f"{p.sampler or 'this'} sampler: {p.n_centers} centers, no dictionary growth"
                if p.n_centers is not None else "centers not chosen yet")
        dict_chart = line_chart(
            [], title="SQUEAK dictionary size", xlabel="rows seen", ylabel="dictionary size",
            element_id="daskkrr-dictionary-chart", empty_text=note,
        )
    others = "".join(
        f'<li><a href="?fit={quote(fid)}">{html.escape(fid)}</a> '
        f'{html.escape(str((fits[fid] or {}).get("estimator", "")))}'
        f' - {html.escape(_status_of(fits[fid] or {}))}</li>'
        for fid in sorted(fits, key=lambda k: updated_at(fits[k]), reverse=True)[:10]
    )
    return (
        f'<div id="daskkrr-fit" data-fit="{html.escape(fit_id)}" data-status="{html.escape(p.status)}">'
        f'<h2>{html.escape(p.estimator)} <span class="badge" id="daskkrr-status" style="background:{badge}">'
        f"{html.escape(status)}</span> <small>{html.escape(fit_id)}</small></h2>"
        f'<div class="bar">{progress_bar(p.fraction, element_id="daskkrr-progress")}</div>'
        f'<div class="cols"><table class="figures">{"".join(rows)}</table>'
        f'<div class="charts">{cg_chart}{dict_chart}</div></div>'
        f"<h3>Recent fits</h3><ul>{others}</ul>"
        f'<p class="updated">updated {time.strftime("%H:%M:%S")}</p></div>'
    )


_STYLE = """
body { font-family: Helvetica, Arial, sans-serif; margin: 16px; color: #222; }
h1 { font-size: 20px; margin: 0 0 8px 0; } h2 { font-size: 17px; } h3 { font-size: 14px; }
.badge { color: white; border-radius: 4px; padding: 1px 8px; font-size: 13px; }
.cols { display: flex; flex-wrap: wrap; gap: 18px; align-items: flex-start; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
table.figures th { text-align: left; padding: 3px 12px 3px 0; font-weight: normal; color: #555; }
table.figures td { font-family: monospace; padding: 3px 0; }
.updated { color: #888; font-size: 12px; } a { color: #36c; }
"""


def render_page(fragment: str, fit: str | None, prefix: str = "/") -> str:
    """The whole page; its script refreshes the fragment every second."""
    query = f"?fit={quote(fit)}" if fit else ""
    fragment_url = html.escape(f"{prefix.rstrip('/')}/daskkrr/fragment{query}")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>daskkrr - fit progress</title>
<style>{_STYLE}</style></head>
<body><h1>daskkrr: current fit</h1>
<p><a href="{html.escape(prefix.rstrip('/'))}/status">Dask dashboard</a> |
<a href="{html.escape(prefix.rstrip('/'))}/daskkrr/state.json">state.json</a></p>
<div id="daskkrr-live">{fragment}</div>
<script>
(function () {{
  var live = document.getElementById("daskkrr-live");
  function refresh() {{
    fetch("{fragment_url}", {{cache: "no-store"}})
      .then(function (r) {{ return r.ok ? r.text() : null; }})
      .then(function (t) {{ if (t !== null) {{ live.innerHTML = t; }} }})
      .catch(function () {{}})
      .finally(function () {{ setTimeout(refresh, {REFRESH_MS}); }});
  }}
  setTimeout(refresh, {REFRESH_MS});
}})();
</script></body></html>"""
