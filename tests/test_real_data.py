"""California housing (../shared/data/537_houses.tsv.gz): FALKON against exact KRR, and the CLI."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import zarr

import daskkrr
from daskkrr import ExactKernelRidge, FalkonRegressor
from daskkrr.cli import main

from .conftest import shared_file


@pytest.fixture(scope="module")
def houses():
    df = pd.read_csv(shared_file("537_houses.tsv.gz"), sep="\t")
    X = df.drop(columns="target").to_numpy(float)
    y = df["target"].to_numpy(float)
    perm = np.random.default_rng(0).permutation(len(y))  # fixed split
    train, test = perm[:10_000], perm[10_000:15_000]
    return X[train], y[train], X[test], y[test]


def _rmse(a, b):
    return float(np.sqrt(np.mean((a - b) ** 2)))


@pytest.mark.slow
def test_falkon_within_3_percent_of_exact_krr(houses):
    Xtr, ytr, Xte, yte = houses
    params = dict(kernel="gaussian", sigma=1.0, penalty=1e-6)
    exact = ExactKernelRidge(**params).fit(Xtr, ytr)
    falkon = FalkonRegressor(**params, n_centers=2000, max_iter=30, random_state=0).fit(Xtr, ytr)
    rmse_exact = _rmse(exact.predict(Xte), yte)
    rmse_falkon = _rmse(falkon.predict(Xte), yte)
    baseline = _rmse(np.full_like(yte, ytr.mean()), yte)
    assert rmse_exact < 0.6 * baseline  # the kernel model is meaningful
    assert rmse_falkon <= 1.03 * rmse_exact, (rmse_falkon, rmse_exact)


@pytest.mark.slow  # converts and fits the 20 640-row houses table by CLI: 21 s
def test_cli_convert_fit_predict_and_round_trip(tmp_path, capsys):
    source = shared_file("537_houses.tsv.gz")
    store = tmp_path / "houses.zarr"
    assert main(["convert", str(source), str(store), "--target", "target", "--chunk-rows", "5000"]) == 0
    group = zarr.open_group(str(store), mode="r")
    assert group["X"].shape == (20640, 8) and group["y"].shape == (20640,)
    config = tmp_path / "model.toml"
    config.write_text('[model]\nkernel = "gaussian"\nsigma = 1.0\npenalty = 1e-6\nrandom_state = 0\n')
    model_dir = tmp_path / "model"
    rc = main(["fit", "--data", str(store), "--out", str(model_dir), "--config", str(config),
               "--centers", "300", "--max-iter", "10", "--workers", "2"])
    assert rc == 0 and (model_dir / "daskkrr-model.json").is_file()
    preds = tmp_path / "preds.zarr"
    assert main(["predict", "--model", str(model_dir), "--data", str(store), "--out", str(preds),
                 "--workers", "2"]) == 0
    written = zarr.open_group(str(preds), mode="r")["y_pred"][:]
    model = daskkrr.load(model_dir)
    X = group["X"][:]
    np.testing.assert_allclose(written, model.predict(X), rtol=1e-10)
    assert model.kernel_.sigma == 1.0 and model.centers_.shape == (300, 8)
    # save/load round trip predicts identically
    model.save(tmp_path / "again")
    np.testing.assert_array_equal(daskkrr.load(tmp_path / "again").predict(X), model.predict(X))
    # the model is meaningful on the data it came from
    assert 1 - np.mean((written - group["y"][:]) ** 2) / np.var(group["y"][:]) > 0.6
    # an existing output is not overwritten without --overwrite
    capsys.readouterr()
    assert main(["predict", "--model", str(model_dir), "--data", str(store), "--out", str(preds)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("daskkrr: error:") and "overwrite" in err and "\n" not in err
