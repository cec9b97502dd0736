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
from daskkrr.dashboard.svg import line_chart
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


def test_one_point_dictionary_chart_has_a_scale_from_zero():
    # a one-block SQUEAK pass records one [rows seen, size] point; its axes spanned that point alone
    svg = line_chart([[20000, 500]], title="t", xlabel="rows seen", ylabel="size", from_zero=True)
    labels = re.findall(r'font-size="11">([^<]+)</text>', svg)
    assert "0" in labels and "20,000" in labels and "500" in labels  # both axes run from 0 to the point
    cx, cy = (float(v) for v in re.search(r'<circle cx="([\d.]+)" cy="([\d.]+)"', svg).groups())
    assert 62 < cx <= 460 - 14 and 28 <= cy < 260 - 42  # inside the plot, away from the origin


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
