#!/usr/bin/env bash
# The hc_head mHC GEMM before and after 3bce87b, on the GPU, in one process, both orders: the live
# study's best (trial 26 of h200_live_10m_run8_resumed) as it was built (head: fp32 torch.mm) and as
# the same parameters build now (head: bf16, view operand), beside the hand-tuned final row.
#   bash benchmarks/h200_head_gemm.sh      (on the device, with .whl carried; results in $OUT)
# benchmarks/data/h200_trial26_head_follows.yaml is trial 26's export with the global mHC knobs set as
# 3bce87b's params_to_config sets them (every layer's values unchanged). Not run yet: no GPU came in
# the session that wrote it (2026-12-07).
# HAND=0 leaves the hand-tuned row out (it compiles for about two minutes): the pair alone.
set -uo pipefail
OUT=${OUT:-/tmp/head-gemm}; mkdir -p "$OUT"
[ -n "${NO_WHEELS:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/kernels PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,compute_cap --format=csv > "$OUT/gpu.txt"
timeout "${DECODE_S:-500}" python3 benchmarks/h200_decode.py --no-compile --samples 10 --passes 2 \
    --only "$([ "${HAND:-1}" = 0 ] || echo "hand-tuned + glue=triton + step_compile + stacked proj + cuda_graphs")" \
    --best benchmarks/results/h200_live_10m_run8_resumed/config2_trial26.yaml \
    --best benchmarks/data/h200_trial26_head_follows.yaml --out "$OUT/h200_decode.json" > "$OUT/decode.log" 2>&1
echo "exit $?"; tail -25 "$OUT/decode.log"
