#!/usr/bin/env bash
# What the lead ran on the lent H200 (device tool), in two calls of < 10 minutes each:
#   bash benchmarks/h200_session.sh search   # autoopt run on flash-slice, export the best, the decode table
#   bash benchmarks/h200_session.sh extra    # GPU tests, torch.compile(max-autotune) of the starting point
# Needs: optuna/sqlalchemy/alembic/colorlog/Mako wheels in .whl/ (the H200 image has no registry access).
set -uo pipefail
OUT=${OUT:-/tmp/autoopt-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/kernels PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
ONLY_FAST="start,mhc_gemm=bf16 (cast_from_fp32),mhc_gemm=bf16 + view_bf16_residual,attention=mma,indexer_kernel=triton_fused (bf16),mhc_kernel=triton_splitk (bf16 view),moe_experts=triton_grouped,cuda_graphs=on (+ moe grouped),hand-tuned: all Triton (eager),hand-tuned: all Triton + cuda_graphs"
case "${1:-search}" in
all)  # one call of < 10 minutes when device time is short: search, export, the table with compile
  timeout ${RUN_S:-150} python3 -m autoopt.cli run --space dsv4_flash_decode --budget ${BUDGET:-2m} \
      --db "sqlite:///$OUT/h200.sqlite" --study flash-h200 --plain > "$OUT/run.log" 2>&1; tail -15 "$OUT/run.log"
  timeout 40 python3 -m autoopt.cli best --db "sqlite:///$OUT/h200.sqlite" --study flash-h200 --export "$OUT/config.yaml" 2>&1 | tail -8
  best=(); [ -f "$OUT/config.yaml" ] && best=(--best "$OUT/config.yaml")
  timeout ${DECODE_S:-300} python3 benchmarks/h200_decode.py --only "$ONLY_FAST" "${best[@]}" --traces "$OUT" \
      --out "$OUT/h200_decode.json" > "$OUT/decode.log" 2>&1; tail -22 "$OUT/decode.log"
  ;;
search)
  timeout ${RUN_S:-230} python3 -m autoopt.cli run --space dsv4_flash_decode --budget ${BUDGET:-3m} \
      --db "sqlite:///$OUT/h200.sqlite" --study flash-h200 --plain 2>&1 | tee "$OUT/run.log" | tail -25
  python3 -m autoopt.cli best --db "sqlite:///$OUT/h200.sqlite" --study flash-h200 --export "$OUT/config.yaml" 2>&1 | tail -15
  best=(); [ -f "$OUT/config.yaml" ] && best=(--best "$OUT/config.yaml")
  timeout ${DECODE_S:-270} python3 benchmarks/h200_decode.py --no-compile "${best[@]}" --traces "$OUT" \
      --out "$OUT/h200_decode.json" 2>&1 | tee "$OUT/decode.log" | tail -30
  ;;
extra)
  timeout ${TEST_S:-200} python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_dsv4_triton_variants.py \
      tests/test_dsv4_variants.py tests/test_triton_kernels.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -15
  timeout ${COMPILE_S:-240} python3 benchmarks/h200_decode.py --only "start" ${BEST:+--best $BEST} \
      --out "$OUT/h200_decode_compile.json" 2>&1 | tee "$OUT/compile.log" | tail -12
  ;;
esac
ls -la "$OUT"
