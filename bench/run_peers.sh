#!/usr/bin/env bash
# ringattn against PyTorch's CPU attention, in one run on this machine: SDPA (dense, causal;
# forward, backward) and compiled FlexAttention (block-sparse local band) beside
# `ringattn run --device cpu` on the same shapes and thread count, with the same run's SGEMM
# rate. Without PyTorch it runs ringattn's rows and says how to get it (PyTorch is optional:
# never needed by the build or the tests).
# Saves bench/results/peers-<date>-<commit>.txt (table) and .jsonl (rows).
# Usage: [TORCH_PYTHON=/path/to/venv/bin/python] [BUILD=build] [THREADS=n] bench/run_peers.sh [peers.py options]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
for exe in "$build/ringattn" "$build/bench/cpu_bench"; do
  [ -x "$exe" ] || { echo "run_peers.sh: $exe missing; build first (scripts/build.sh)" >&2; exit 2; }
done
# torch >= 2.0 (scaled_dot_product_attention); Debian bookworm's python3-torch is 1.13
has_torch() { "$1" -c 'import torch; torch.nn.functional.scaled_dot_product_attention' >/dev/null 2>&1; }
py=""
for cand in "${TORCH_PYTHON:-}" "${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/python}" python3 \
            "$root/../torch-venv/bin/python" "$HOME/torch-venv/bin/python"; do
  [ -n "$cand" ] && command -v "$cand" >/dev/null 2>&1 && has_torch "$cand" && { py=$cand; break; }
done
if [ -n "${TORCH_PYTHON:-}" ] && [ "$py" != "$TORCH_PYTHON" ]; then
  echo "run_peers.sh: TORCH_PYTHON=$TORCH_PYTHON cannot import torch" >&2
fi
torch_args=()
[ -z "$py" ] && { py=python3; torch_args=(--no-torch); echo "run_peers.sh: no Python with torch found; ringattn rows only" >&2; }
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
prefix="$root/bench/results/peers-$(date -u +%Y%m%d-%H%M)-$commit"
threads=${THREADS:-$(nproc)}
OMP_NUM_THREADS=$threads "$py" "$root/bench/peers.py" --ringattn "$build/ringattn" \
  --cpu-bench "$build/bench/cpu_bench" --prefix "$prefix" --commit "$commit" \
  --threads "$threads" "${torch_args[@]}" "$@"
if [ ${#torch_args[@]} -gt 0 ]; then
  cat <<'MSG'
To add PyTorch's rows: python3 -m venv ~/torch-venv && ~/torch-venv/bin/pip install torch
then TORCH_PYTHON=~/torch-venv/bin/python bench/run_peers.sh (see bench/README.md).
MSG
fi
