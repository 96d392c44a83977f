"""ringattn and torch in one process, imported in either order (issue 54).

ringattn links no NCCL: its NCCL transport opens one on first use, the one already loaded
(torch's) or else the nvidia-nccl wheel's that torch would load, so `import ringattn` before
`import torch` no longer leaves torch with the CUDA toolkit's older libnccl.so.2. Each case runs
in a fresh interpreter. And torch failing to import is reported, not taken for its absence.
"""
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

HAVE_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")

# Prints the distinct libnccl files mapped into this process (one NCCL per process).
NCCL_FILES = textwrap.dedent("""
    def nccl_files():
        with open("/proc/self/maps") as maps:
            return sorted({os.path.realpath(line.split(None, 5)[5].strip()) for line in maps
                           if len(line.split(None, 5)) == 6 and "libnccl" in line})
""")


def run(code, env=None):
    r = subprocess.run([sys.executable, "-c", "import os\n" + NCCL_FILES + textwrap.dedent(code)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r.stdout


def file_of(version):
    """The file in ringattn's "NCCL 2.28.9 (<file>)", or None."""
    if not version.startswith("NCCL 2.") or not version.endswith(")"):
        return None
    return version[version.index(" (") + 2:-1]


@needs_torch
@pytest.mark.parametrize("first", ["ringattn", "torch"])
def test_ringattn_and_torch_import_in_either_order(first):
    second = "torch" if first == "ringattn" else "ringattn"
    out = run(f"""
        import {first}
        import {second}
        import torch.distributed
        if torch.version.cuda:
            print("torch's NCCL:", torch.cuda.nccl.version())
        print("ok")
    """)
    assert out.strip().endswith("ok"), out


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps")
def test_importing_ringattn_loads_no_nccl():
    # torch kept out (ringattn imports it when it is installed, and torch loads its NCCL).
    out = run("""
        import sys
        sys.modules["torch"] = None
        import ringattn
        print(nccl_files())
    """)
    assert out.strip() == "[]", out


@needs_torch
@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps")
@pytest.mark.parametrize("nccl_first", ["torch", "ringattn"])
def test_ringattn_and_torch_share_one_nccl(nccl_first):
    """torch loading NCCL first (ringattn imports torch), or ringattn opening it before torch
    is imported (torch kept out of ringattn's import, then imported)."""
    out = run(f"""
        import json, sys
        if "{nccl_first}" == "ringattn":
            sys.modules["torch"] = None
        import ringattn
        from ringattn import _core, _nccl
        if not _core.has_nccl:
            print(json.dumps({{"skip": "this ringattn build has no NCCL transport"}}))
            raise SystemExit(0)
        ours = _core.nccl_version()
        if "{nccl_first}" == "ringattn":
            del sys.modules["torch"]  # now torch may be imported
        import torch
        import torch.distributed
        if not torch.version.cuda:
            print(json.dumps({{"skip": "torch has no CUDA (no NCCL of its own)"}}))
            raise SystemExit(0)
        theirs = torch.cuda.nccl.version()
        print(json.dumps({{"ours": ours, "theirs": list(theirs), "wheel": _nccl.wheel_nccl(),
                          "mapped": nccl_files()}}))
    """)
    import json
    r = json.loads(out.strip().splitlines()[-1])
    if "skip" in r:
        pytest.skip(r["skip"])
    assert len(r["mapped"]) == 1, f"more than one NCCL in the process: {r}"
    ours = file_of(r["ours"])
    assert ours and os.path.samefile(ours, r["mapped"][0]), r
    assert r["ours"].startswith("NCCL {}.{}.{} ".format(*r["theirs"])), r
    if r["wheel"]:
        # torch's own NCCL, whichever opened it: not the toolkit's.
        assert os.path.samefile(r["mapped"][0], r["wheel"]), r


def fake_torch(tmp_path, body):
    """A `torch` package on PYTHONPATH, before the real one, whose import runs `body`."""
    pkg = tmp_path / "torch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(body)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path)] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


@pytest.mark.parametrize("body", [
    "raise ImportError('libnccl.so.2: undefined symbol: ncclCommResume')",
    "import ringattn_test_missing_dependency_of_torch",  # ModuleNotFoundError, not torch's name
])
def test_a_torch_that_fails_to_import_is_reported_not_swallowed(tmp_path, body):
    out = run("""
        try:
            import ringattn
        except ImportError as e:
            print("raised:", e)
            print("cause:", repr(e.__cause__))
        else:
            print("imported; torch is", ringattn.functional.torch)
    """, env=fake_torch(tmp_path, body))
    assert "raised: ringattn: torch is installed but failed to import" in out, out
    assert "cause: " in out and "cause: None" not in out, out


def test_without_torch_ringattn_runs_numpy_only():
    out = run("""
        import sys
        sys.modules["torch"] = None  # `import torch` raises ModuleNotFoundError(name="torch")
        import numpy as np
        import ringattn
        assert ringattn.functional.torch is None
        q = np.random.default_rng(0).standard_normal((1, 64, 2, 16), dtype=np.float32)
        out = ringattn.attention(q, q, q, attention="dense", causal=True)
        print("numpy only:", out.shape)
    """)
    assert "numpy only: (1, 64, 2, 16)" in out, out
