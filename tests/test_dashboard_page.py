"""The daskkrr page on the Dask dashboard: rendering, routes, and a live fit seen in headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import urllib.request
from pathlib import Path

import dask.array as da
import numpy as np
import pytest

from daskkrr import FalkonRegressor
from daskkrr.dashboard import dashboard_url, install
from daskkrr.dashboard.render import choose_fit, render_fragment
from daskkrr.dashboard.svg import MARGIN, line_chart
from daskkrr.progress import FitProgress, report
from daskkrr.sampling import SAMPLERS

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _browser(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    exe = _chromium()
    if exe is None:
        pytest.skip("headless Chromium is not installed and could not be installed "
                    "(.ci/run tries `apt-get install -y chromium`)")
    profile = tmp_path / f"chromium-profile-{len(list(tmp_path.glob('chromium-profile-*')))}"
    return subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=90)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read().decode()


def test_fragment_renders_figures_and_chooses_the_running_fit():
    running = FitProgress(fit_id="b", estimator="FalkonRegressor", phase="cg", n_rows=1000, n_blocks=4,
                          passes=3, pass_task="gram_matvec_task", task_base={"gram_matvec_task": 4},
                          cg=[[1, 0.5], [2, 0.05], [3, 0.004]], dictionary=[[250, 30], [500, 41]], n_centers=40,
                          max_iter=10, expected_passes=13, updated=1.0).to_dict()
    done = {**running, "fit_id": "a", "status": "done", "updated": 2.0}
    fits = {"a": done, "b": running}
    assert choose_fit(fits) == "b" and choose_fit(fits, "a") == "a" and choose_fit({}) is None
    html = render_fragment(fits, {"b": {"gram_matvec_task": 6}}, None)
    assert 'data-status="running"' in html and 'id="daskkrr-phase">cg<' in html
    assert 'id="daskkrr-pass">2 / 4<' in html  # live part of the pass from the scheduler's counts
    assert 'id="daskkrr-dictionary">41 (40 centers kept)<' in html and "3 / 10" in html
    for chart in ("daskkrr-cg-chart", "daskkrr-dictionary-chart"):
        part = html.split(f'id="{chart}"', 1)[1].split("</svg>", 1)[0]
        assert "<polyline" in part
    assert "No daskkrr fit" in render_fragment({}, {}, None)


def test_log_chart_handles_empty_and_non_positive_values():
    svg = line_chart([[0, 1.0], [1, 0.0], [2, float("nan")], [3, 1e-6]], title="t", xlabel="x", ylabel="y",
                     logy=True)
    assert svg.count("<circle") == 2 and "1e-6" in svg
    assert "waiting" in line_chart([], title="t", xlabel="x", ylabel="y", empty_text="waiting")


def _chart_geometry(svg: str) -> tuple[dict[float, float], tuple[float, float, float, float]]:
    """The y-axis ticks (pixel row -> value) and the plot frame (left, top, width, height) of a chart."""
    frame = re.search(r'<rect x="(\d+)" y="(\d+)" width="(\d+)" height="(\d+)" fill="#fafafa"', svg)
    left, top, width, height = (float(v) for v in frame.groups())
    ticks = {float(y): float(label.replace(",", "")) for y, label in re.findall(
        rf'<line x1="{int(left)}" y1="([\d.]+)" x2="[\d.]+" y2="[\d.]+" stroke="#e3e3e3"/>'
        r'<text [^>]*font-size="11">([^<]+)</text>', svg)}
    return ticks, (left, top, width, height)


@pytest.mark.parametrize("points", [[[20000, 500]], [[20000, 500], [40000, 500]], [[64, 3], [20000, 700]]])
def test_dictionary_chart_frames_its_points_with_a_margin(points):
    # A one-block SQUEAK pass recorded one [rows seen, size] point: its axes spanned that point alone,
    # then (from 0) ended at it, so its dot sat on the frame, cut in half.
    svg = line_chart(points, title="t", xlabel="rows seen", ylabel="size", from_zero=True)
    ticks, (left, top, width, height) = _chart_geometry(svg)
    values = sorted(ticks.values())
    top_size = max(p[1] for p in points)
    assert len(values) >= 3 and values[0] == 0  # a real scale from 0 ...
    assert values[-1] >= top_size * (1 + MARGIN)  # ... whose top tick is above the largest point
    radius = 2.5
    for cx, cy in re.findall(r'<circle cx="([\d.]+)" cy="([\d.]+)"', svg):
        # every dot inside the frame, whole on the far sides (the near ones are the origin, 0 rows)
        assert left <= float(cx) < left + width - radius
        assert top + radius < float(cy) <= top + height
    # the ticks are placed where their values are: the point's pixel row matches its size
    (y_px, y_val), (y0_px, y0_val) = sorted(ticks.items())[0], sorted(ticks.items())[-1]
    cy_last = float(re.findall(r'<circle cx="[\d.]+" cy="([\d.]+)"', svg)[-1])
    expected = y0_px + (points[-1][1] - y0_val) / (y_val - y0_val) * (y_px - y0_px)
    assert cy_last == pytest.approx(expected, abs=0.2)  # 0.2 px: the SVG's one-decimal rounding


@pytest.fixture(scope="module")
def inproc_cluster():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0", memory_limit="2GiB") as cluster, Client(cluster) as client:
        yield client


@pytest.mark.slow  # starts Chromium and a cluster: 9 s
def test_page_shows_a_live_fit_in_headless_chromium(inproc_cluster, tmp_path):
    client = inproc_cluster
    url = install(client)
    assert url == dashboard_url(client) and url.endswith("/daskkrr")
    assert "No daskkrr fit" in _get(url) or "daskkrr-fit" in _get(url)
    assert _get(client.dashboard_link)  # the Dask dashboard itself is served (bokeh installed)

    rng = np.random.default_rng(0)
    X = rng.normal(size=(4000, 3))
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1]
    Xd, yd = da.from_array(X, chunks=(500, 3)), da.from_array(y, chunks=500)
    sampler = "squeak" if "squeak" in SAMPLERS else "uniform"

    paused, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold(progress: FitProgress, event: str) -> None:
        if event == "cg" and progress.cg_iteration == 3:
            paused.set()
            release.wait(120)  # the fit waits here while the browser looks at the page

    def fit() -> None:
        try:
            with report(bar=False, callback=hold):
                FalkonRegressor(n_centers=60, max_iter=6, sampler=sampler, random_state=0,
                                strategy="recompute").fit(Xd, yd)  # a pass over the data per CG step
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
            paused.set()

    thread = threading.Thread(target=fit, daemon=True)
    thread.start()
    try:
        assert paused.wait(120), "the fit did not reach CG iteration 3"
        assert not errors, errors
        state = json.loads(_get(url + "/state.json"))
        (record,) = [r for r in state["fits"].values() if r["status"] == "running"]
        assert record["phase"] == "cg" and record["cg_iteration"] == 3 and record["rows_streamed"] >= 5 * 4000

        dom = _browser(tmp_path, "--dump-dom", url)
        assert dom.returncode == 0, dom.stderr[-2000:]
        html = dom.stdout
        assert 'data-status="running"' in html and 'id="daskkrr-phase">cg<' in html
        assert 'id="daskkrr-cg-iteration">3 / 6' in html
        rows = int(html.split('id="daskkrr-rows">', 1)[1].split("<", 1)[0].replace(",", ""))
        assert rows >= 5 * 4000
        cg_chart = html.split('id="daskkrr-cg-chart"', 1)[1].split("</svg>", 1)[0]
        assert cg_chart.count("<circle") == 3  # iterations 1..3
        dict_chart = html.split('id="daskkrr-dictionary-chart"', 1)[1].split("</svg>", 1)[0]
        if sampler == "squeak":
            assert "<polyline" in dict_chart and record["dictionary"]
        else:
            assert "no dictionary growth" in dict_chart

        shot = tmp_path / "daskkrr-dashboard.png"
        proc = _browser(tmp_path, f"--screenshot={shot}", "--window-size=1280,900", url)
        assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
        data = shot.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        assert (width, height) == (1280, 900)
    finally:
        release.set()
        thread.join(120)
    assert not errors, errors
    fragment = _get(url + "/fragment")
    assert 'data-status="done"' in fragment and 'id="daskkrr-phase">done<' in fragment
