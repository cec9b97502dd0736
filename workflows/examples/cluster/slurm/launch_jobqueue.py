"""Run a daskkrr workflow on SLURM through dask-jobqueue (``pip install dask-jobqueue``).

Run it on a login node (the scheduler lives in this process; workers are SLURM jobs)::

    DASK_CONFIG=workflows/examples/cluster/slurm python workflows/examples/cluster/slurm/launch_jobqueue.py \
        workflows/examples/nightly_retrain.toml --jobs 4

``jobqueue.yaml`` beside this file holds the SLURM settings (partition, account,
cores, memory, walltime). The daskkrr page is at ``<dashboard>/daskkrr`` while it runs.
"""

from __future__ import annotations

import argparse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workflow")
    parser.add_argument("--jobs", type=int, default=4, help="SLURM jobs to start (each runs several workers)")
    parser.add_argument("--runs-dir", default=None)
    args = parser.parse_args()

    from dask_jobqueue import SLURMCluster
    from distributed import Client

    from daskkrr.dashboard import install
    from daskkrr.workflow import run_workflow

    with SLURMCluster() as cluster, Client(cluster) as client:
        cluster.scale(jobs=args.jobs)
        print("Dask dashboard:", client.dashboard_link, "| daskkrr page:", install(client))
        client.wait_for_workers(1, timeout=1800)  # the queue may take a while
        result = run_workflow(args.workflow, client=client, runs_dir=args.runs_dir, progress=True)
        print(f"run {result.run_id}: {result.status}; {result.run_dir}")


if __name__ == "__main__":
    main()
