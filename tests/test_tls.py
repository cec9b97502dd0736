"""A tls:// scheduler: the command line's --tls-ca-file/--tls-cert/--tls-key and the workflow's
[cluster] tls_* keys connect to a real TLS LocalCluster on 127.0.0.1; bad settings are refused
before any work."""

from __future__ import annotations

import json

import numpy as np
import pytest

from daskkrr import FalkonRegressor
from daskkrr.cli import main
from daskkrr.data import write_zarr

pytest.importorskip("cryptography", reason="Security.temporary() makes its certificates with cryptography")


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory):
    """A TLS LocalCluster (one in-process worker) and its certificates as PEM files."""
    from distributed import LocalCluster
    from distributed.security import Security

    security = Security.temporary()  # a self-signed authority that also signs the certificates
    folder = tmp_path_factory.mktemp("tls")
    files = {}
    for name, text in (("ca.pem", security.tls_ca_file), ("cert.pem", security.tls_client_cert),
                       ("key.pem", security.tls_client_key)):
        (folder / name).write_text(text)
        files[name] = str(folder / name)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, host="127.0.0.1", protocol="tls://",
                      security=security, dashboard_address=None) as cluster:
        assert cluster.scheduler_address.startswith("tls://127.0.0.1:")
        yield cluster, files


@pytest.fixture(scope="module")
def store_and_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tlsdata")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 3))
    y = np.sin(X[:, 0]) + 0.1 * X[:, 1]
    write_zarr(X, y, folder / "S", chunk_rows=100)
    FalkonRegressor(n_centers=20, random_state=0).fit(X, y).save(folder / "M")
    return folder


def test_cli_scores_on_a_tls_scheduler(tls_cluster, store_and_model, capsys):
    cluster, files = tls_cluster
    before = cluster.scheduler.transition_counter
    code = main(["score", "--model", str(store_and_model / "M"), "--data", str(store_and_model / "S"),
                 "--scheduler", cluster.scheduler_address, "--tls-ca-file", files["ca.pem"],
                 "--tls-cert", files["cert.pem"], "--tls-key", files["key.pem"]])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["n"] == 400
    assert cluster.scheduler.transition_counter > before, "the work did not run on the TLS cluster"


@pytest.mark.parametrize("flags, says", [
    ([], "speaks TLS: give --tls-ca-file"),
    (["--tls-ca-file", "{ca}"], "--tls-cert missing"),
    (["--tls-ca-file", "{ca}", "--tls-cert", "{folder}/absent.pem"], "--tls-cert {folder}/absent.pem: no such"),
])
def test_bad_tls_settings_are_refused_before_any_work(flags, says, tls_cluster, store_and_model, capsys,
                                                      monkeypatch):
    import daskkrr.models.loading

    cluster, files = tls_cluster
    monkeypatch.setattr(daskkrr.models.loading, "load_model", lambda *a: pytest.fail("the model was read"))
    fill = {"ca": files["ca.pem"], "folder": str(store_and_model)}
    argv = ["score", "--model", "M", "--data", "S", "--scheduler", cluster.scheduler_address,
            *(flag.format(**fill) for flag in flags)]
    assert main(argv) == 2
    assert says.format(**fill) in capsys.readouterr().err


def test_tls_flags_need_a_tls_scheduler(tls_cluster, capsys):
    _, files = tls_cluster
    assert main(["score", "--model", "M", "--data", "S", "--scheduler", "tcp://127.0.0.1:1",
                 "--tls-ca-file", files["ca.pem"], "--tls-cert", files["cert.pem"]]) == 2
    assert "apply to a tls:// scheduler; the scheduler is tcp://127.0.0.1:1" in capsys.readouterr().err


def test_workflow_cluster_table_connects_with_tls(tls_cluster, store_and_model, tmp_path):
    from daskkrr.workflow import run_workflow

    cluster, files = tls_cluster
    for name, path in files.items():  # relative to the workflow file
        (tmp_path / name).write_text(open(path).read())
    (tmp_path / "wf.toml").write_text(
        f'[data]\nstore = "{store_and_model / "S"}"\n[model]\nn_centers = 20\n'
        f'[cluster]\nscheduler = "{cluster.scheduler_address}"\n'
        'tls_ca_file = "ca.pem"\ntls_cert = "cert.pem"\ntls_key = "key.pem"\n')
    before = cluster.scheduler.transition_counter
    result = run_workflow(tmp_path / "wf.toml")
    assert result.status == "succeeded"
    assert cluster.scheduler.transition_counter > before, "the run did not use the TLS cluster"
