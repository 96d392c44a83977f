"""Every transformers model family against attn_implementation="ringattn"
(python/tests/transformers_sweep.py): a tiny random model of each, eager against ringattn
(outputs and every gradient), and a representative set in more modes (padding, packing,
generation, decoding over a DynamicCache). Fails if any case is silently different from
eager or crashes; prints the table (pytest -s, or on failure). Skipped where transformers is
not installed (CI's .venv-torch has it). RINGATTN_SWEEP_FAMILIES (a regular expression)
narrows it; RINGATTN_SWEEP_WORKERS sets the processes (default 2).
"""
import io
import os
import time

import pytest

pytest.importorskip("transformers",
                    reason="transformers is not installed (CI's .venv-torch has it)")
import transformers_sweep as sweep  # noqa: E402  (python/tests is on sys.path: conftest.py)


def test_every_model_family_is_exact_or_refused_by_name():
    start = time.time()
    rows = sweep.run_sweep(os.environ.get("RINGATTN_SWEEP_FAMILIES") or None,
                           workers=int(os.environ.get("RINGATTN_SWEEP_WORKERS", "2")))
    out = io.StringIO()
    counts = sweep.report(rows, time.time() - start, out=out)
    print(out.getvalue())
    assert rows, "the sweep found no model family"
    failures = [sweep.format_row(r) for r in rows if r.result in sweep.FAILURES]
    assert not failures, (f"{counts['different']} different, {counts['crash']} crash:\n" +
                          "\n".join(failures) + "\n\n" + out.getvalue())
    for row in rows:
        if row.result == "refused":
            assert row.message.startswith("ringattn:"), row
