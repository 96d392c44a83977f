#!/usr/bin/env bash
# Installs the Debian packages ringattn builds and tests with, when any is missing.
# Safe to run repeatedly: with everything present it only checks and returns.
set -euo pipefail
packages=(
  cmake ninja-build g++ make
  libboost-program-options-dev libgtest-dev nlohmann-json3-dev libopenblas-openmp-dev
  # The pthreads OpenBLAS too: many machines have it (and Debian then selects it); the tests
  # check that ringattn's speed and threading do not depend on it.
  libopenblas0-pthread
  # The emulated GPU (build-emu): Boost.Context fibers; pip fetches CUTLASS headers for the
  # fragment-layout check.
  libboost-context-dev python3-pip
  libopenmpi-dev openmpi-bin
  slurm-wlm munge
  # The Python package (pip install . into a venv that sees these) and its tests.
  python3-dev python3-venv python3-numpy python3-torch python3-pytest
  # The multihost and fault tests: network namespaces, links and qdiscs (ip, tc), packet
  # loss where the kernel has no netem (nft), ps for finding ranks.
  iproute2 nftables procps
  # Sanitizer and fuzzing builds (scripts/sanitize_and_fuzz.sh): clang, its sanitizer and
  # libFuzzer runtimes, and LLVM's OpenMP (with Archer, which lets TSan see OpenMP).
  clang libclang-rt-dev libomp-dev
)
# libxsmm (generated small-GEMM kernels for the CPU kernels' tile products) is packaged for
# amd64 only; elsewhere the tile products run on OpenBLAS.
if [ "$(dpkg --print-architecture 2>/dev/null)" = amd64 ]; then
  packages+=(libxsmm-dev)
fi
missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "ringattn: installing missing packages: ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then sudo="sudo"; else
    echo "ringattn: need root (or sudo) to install: ${missing[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
