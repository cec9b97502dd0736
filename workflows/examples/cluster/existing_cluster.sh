#!/usr/bin/env bash
# daskkrr on a Dask cluster that is already running (started by `dask scheduler` /
# `dask worker`, a cluster manager, or a colleague). Every daskkrr command that
# computes takes --scheduler, or reads $DASK_SCHEDULER_ADDRESS.
#
#   SCHEDULER=tcp://scheduler.example.org:8786 bash workflows/examples/cluster/existing_cluster.sh
#
# The workers must see the same paths as this machine (a shared file system or
# object store), and run the same daskkrr version. Install daskkrr where the
# scheduler runs too, to get the daskkrr page on the scheduler's dashboard
# (http://<scheduler>:8787/daskkrr).
set -euo pipefail
: "${SCHEDULER:?set SCHEDULER=tcp://host:8786 to the address of your Dask scheduler}"
DATA=${DATA:-/shared/daskkrr/train.zarr}
OUT=${OUT:-/shared/daskkrr/models/model-$(date +%Y%m%d)}

export DASK_SCHEDULER_ADDRESS="$SCHEDULER"        # or pass --scheduler "$SCHEDULER" to each command
daskkrr fit --data "$DATA" --out "$OUT" --centers 2000 --max-iter 20 --sigma 1.0
daskkrr predict --model "$OUT" --data "$DATA" --out "$OUT-predictions.zarr"
daskkrr run workflows/examples/cluster/existing_cluster.toml
