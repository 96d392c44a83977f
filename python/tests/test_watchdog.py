"""A failing rank must not hang the others: under mpiexec -n 2 with a fault injected on
rank 1, both ranks raise RuntimeError (rank 0's from the watchdog, naming Comm's timeout)
and the job ends soon after the timeout."""
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest

import ringattn._core

MPIEXEC = shutil.which("mpiexec")


@pytest.mark.skipif(not MPIEXEC or not ringattn._core.has_mpi, reason="needs mpiexec")
def test_injected_failure_raises_runtime_error_on_every_rank():
    env = dict(os.environ, RINGATTN_FAULT_INJECT="rank=1,step=1", OMP_NUM_THREADS="1",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    script = pathlib.Path(__file__).with_name("watchdog_job.py")
    start = time.monotonic()
    run = subprocess.run([MPIEXEC, "-n", "2", "--oversubscribe", sys.executable, str(script),
                          "2"], env=env, capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - start
    text = run.stdout + run.stderr
    assert "rank 1: RuntimeError" in text and "fault injected at ring step 1" in text, text
    assert "rank 0: RuntimeError" in text, text
    assert "did not complete within 2 s (timeout)" in text, text
    assert "NO ERROR" not in text
    # After a failure the job is ended (MPI_Abort) rather than finalised: a nonzero exit.
    assert run.returncode != 0
    assert elapsed < 60, f"the job took {elapsed:.0f} s"
