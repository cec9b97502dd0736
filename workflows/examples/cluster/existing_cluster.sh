#!/usr/bin/env bash
# daskkrr on a Dask cluster that is already running (started by `dask scheduler` /
# `dask worker`, a cluster manager, or a colleague). Every daskkrr command that
# computes takes --scheduler, or reads $DASK_SCHEDULER_ADDRESS.
#
#   SCHEDULER=tcp://scheduler.example.org:8786 bash workflows/examples/cluster/existing_cluster.sh
#
# Without DATA, it generates a small store to try the cluster with; the outputs go to
# OUT_DIR (default: a new temporary folder, printed at the end). For real data, set DATA
# and OUT_DIR to paths the workers see as well (a shared file system or object store);
# the workers must run the same daskkrr version. Install daskkrr where the scheduler
# runs too, to get the daskkrr page on the scheduler's dashboard
# (http://<scheduler>:8787/daskkrr).
set -euo pipefail
SCHEDULER=${SCHEDULER:-${DASK_SCHEDULER_ADDRESS:-}}
: "${SCHEDULER:?set SCHEDULER=tcp://host:8786 to the address of your Dask scheduler}"
OUT_DIR=${OUT_DIR:-$(mktemp -d)}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

export DASK_SCHEDULER_ADDRESS="$SCHEDULER"        # or pass --scheduler "$SCHEDULER" to each command
if [ -z "${DATA:-}" ]; then
    DATA="$OUT_DIR/train.zarr"
    daskkrr generate "$DATA" --n 20000 --d 8       # written by the workers
fi
OUT="$OUT_DIR/model-$(date +%Y%m%d)"
daskkrr fit --data "$DATA" --out "$OUT" --centers 500 --max-iter 50 --sigma 1.0
daskkrr predict --model "$OUT" --data "$DATA" --out "$OUT-predictions.zarr"
daskkrr run "$HERE/existing_cluster.toml" --set "data.store=$DATA" --runs-dir "$OUT_DIR/runs"
echo "outputs in $OUT_DIR"
