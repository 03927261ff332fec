#!/usr/bin/env bash
# What the lead runs on the lent H200 (device tool); each call < 10 minutes, stages composable:
#   bash benchmarks/h200_session.sh tests compile tuned     # GPU tests, torch.compile row, tuned rows
#   bash benchmarks/h200_session.sh search                  # autoopt run (resumable study) + export
#   bash benchmarks/h200_session.sh table                   # the side-by-side table incl. the best
# Stages:
#   tests    GPU-marked pytest of the Triton kernels and every GPU variant of the decode step
#   compile  torch.compile(max-autotune) of the starting point (C from COMPILE_C, default 16)
#   tuned    the hand-tuned rows (ROWS: comma-separated labels of h200_decode.py), with the traces
#   search   autoopt run --budget $BUDGET on dsv4_flash_decode, resuming the study in $DB if given
#   table    h200_decode.py over ONLY_FAST plus the exported best (config.yaml from `search`)
#   twins    the copy_cast pairs: bf16 mHC + view + cached hc_fn vs start (eager), and the tuned step
#            with bf16 vs fp32 mHC (glue=triton + CUDA graphs)
# torch.compile(max-autotune) of the start needs more than 310 s at C=16 on the H200: give it a call
# of its own (COMPILE_S=590 COMPILE_WARM_S=380 bash benchmarks/h200_session.sh compile). Timing starts
# once Dynamo stops compiling (the expert loop recompiles per step up to its limit) or after COMPILE_WARM_S.
# Needs: optuna/sqlalchemy/alembic/colorlog/Mako wheels in .whl/ (the H200 image has no registry access).
set -uo pipefail
OUT=${OUT:-/tmp/autoopt-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/kernels PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
ONLY_FAST="start,mhc_gemm=bf16 (cast_from_fp32),mhc_gemm=bf16 + view_bf16_residual,attention=mma,indexer_kernel=triton_fused (bf16),mhc_kernel=triton_splitk (bf16 view),mhc_fuse_post_pre=on,moe_experts=triton_grouped,cuda_graphs=on (+ moe grouped),hand-tuned: all Triton (eager),hand-tuned: all Triton + cuda_graphs"
DB=${DB:-sqlite:///$OUT/h200.sqlite}
for stage in "$@"; do
  echo "=== stage $stage ($(date -u +%T))"
  case "$stage" in
  tests)
    timeout ${TEST_S:-200} python3 -m pytest -q -m "${TEST_MARK:-gpu}" -p no:cacheprovider ${TEST_FILES:-tests/test_dsv4_triton_variants.py \
        tests/test_triton_kernels.py} 2>&1 | tee "$OUT/gpu_tests.log" | tail -15
    ;;
  compile)
    timeout ${COMPILE_S:-240} python3 benchmarks/h200_decode.py --only "" --concurrency ${COMPILE_C:-16} \
        --compile-warmup-s ${COMPILE_WARM_S:-180} --samples 10 --out "$OUT/h200_decode_compile.json" 2>&1 | tee "$OUT/compile.log" | tail -8
    ;;
  tuned)
    timeout ${TUNED_S:-150} python3 benchmarks/h200_decode.py --no-compile --samples 10 --traces "$OUT" \
        --only "${ROWS:-start,hand-tuned + glue=triton + step_compile + stacked proj + cuda_graphs}" \
        --out "$OUT/h200_decode_tuned.json" 2>&1 | tee "$OUT/tuned.log" | tail -8
    ;;
  search)
    timeout ${RUN_S:-540} python3 -m autoopt.cli run --space dsv4_flash_decode --budget ${BUDGET:-8m} \
        --db "$DB" --study flash-h200 --plain 2>&1 | tee "$OUT/run.log" | tail -25
    python3 -m autoopt.cli best --db "$DB" --study flash-h200 --export "$OUT/config.yaml" 2>&1 | tail -15
    ;;
  table)
    best=(); [ -f "${BEST:-$OUT/config.yaml}" ] && best=(--best "${BEST:-$OUT/config.yaml}")
    timeout ${DECODE_S:-400} python3 benchmarks/h200_decode.py --no-compile --only "${ONLY-$ONLY_FAST}" "${best[@]}" \
        --samples 10 --out "$OUT/h200_decode.json" 2>&1 | tee "$OUT/decode.log" | tail -30
    ;;
  twins)
    timeout ${TWINS_S:-240} python3 benchmarks/h200_decode.py --no-compile --samples 10 \
        --only "start,mhc bf16 + view + hc_fn cached,hand-tuned + glue=triton + cuda_graphs,hand-tuned + glue=triton + cuda_graphs + mhc_gemm=fp32" \
        --out "$OUT/h200_decode_twins.json" 2>&1 | tee "$OUT/twins.log" | tail -10
    ;;
  *) echo "unknown stage $stage (tests, compile, tuned, search, table, twins)"; exit 2 ;;
  esac
done
ls -la "$OUT"
