"""examples/train_tiny.py under mpiexec -n 2 must follow the single-process loss curve."""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import ringattn._core

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "train_tiny.py"
MPIEXEC = shutil.which("mpiexec")


def test_train_tiny_loss_curve_is_the_same_on_two_ranks(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    curve = tmp_path / "single.json"
    single = subprocess.run([sys.executable, str(EXAMPLE), "--losses-out", str(curve)],
                            env=env, capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stdout + single.stderr
    if not MPIEXEC or not ringattn._core.has_mpi:
        pytest.skip("needs mpiexec")
    ring = subprocess.run([MPIEXEC, "-n", "2", "--oversubscribe", sys.executable, str(EXAMPLE),
                           "--mpi", "--compare", str(curve)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert ring.returncode == 0, ring.stdout + ring.stderr
    assert "-> OK" in ring.stdout
