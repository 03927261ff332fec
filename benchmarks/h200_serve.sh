#!/usr/bin/env bash
# `transformers serve` tuned by autoopt on the lent H200, in ONE device call of at most 9 minutes:
#   run(command="bash benchmarks/h200_serve.sh", carry=[".whl"], timeout_s=560)
#
# 1. builds a random-weight model of a real architecture on the GPU's disk (benchmarks/h200_serve_model.py:
#    Llama-3.2-1B-sized by default, a tokenizer trained here; nothing downloaded);
# 2. `autoopt run` on a server space for it (written to $OUT/space.yaml: continuous batching, CUDA
#    graphs, batch tokens, dtype, attention as restart flags; frequency_penalty per request) with
#    --budget $SERVE_BUDGET (8m), under a wall deadline so the call ends in time (a run stopped by it
#    keeps every finished trial);
# 3. the report: the baseline (the defaults) and the best (its confirmation) at C = 1, 16, 64 from the
#    run's own measurements (output tok/s with CI, TTFT, TPOT: the server target's load generator),
#    `best --export` (the winning command line), history, written under $OUT:
#    db.sqlite, server_runs/ (each start's log, each trial's bench.json), run.log, report.json, best.yaml.
#
# The H200 image has transformers 5.17.0 (Python 3.12, torch 2.11) but not its serving extras. From
# transformers 5.17.0's METADATA (Provides-Extra: serving -> openai>=1.98.0, pydantic>=2, uvicorn, fastapi,
# starlette, rich, torch>=2.5, accelerate>=1.1.0) and the packages they need, the image lacks, so .whl/
# must carry (cp312 manylinux wheels, --no-deps, one version each):
#   fastapi 0.115.14, starlette 0.46.2, uvicorn 0.35.0, pydantic 2.11.9, pydantic-core 2.33.2,
#   annotated-types 0.7.0, typing-inspection 0.4.1, openai 1.109.1, distro 1.9.0, jiter 0.10.0, sniffio 1.3.1
# (the image has rich, accelerate, anyio, httpx, h11, click, typer, tqdm, typing-extensions), and for
# autoopt itself: optuna 4.5.0, sqlalchemy 2.0.43, greenlet 3.2.4, alembic 1.16.5, mako 1.3.10, colorlog 6.9.0.
#
# Knobs (environment): SERVE_MODEL (llama-1b | qwen2-0.5b | llama-mini | tiny), SERVE_DEVICE (cuda | cpu),
# SERVE_BUDGET (8m), SERVE_MIN_GAIN (the agent's stop rule, `run --min-gain`: 0 = tune the whole budget;
# unset: the run's default), SERVE_DEADLINE_S (wall seconds for the whole script, 530), SERVE_CONCURRENCY
# ("1, 16, 64"), SERVE_OUTPUT_TOKENS (32), SERVE_PROMPT_TOKENS (128), SERVE_REQUESTS (16: per C, at least C), SERVE_REPEATS (2).
# SERVE_NO_WHEELS=1 skips installing .whl/ (where the packages are installed). On this 2-core CPU: SERVE_NO_WHEELS=1 SERVE_MODEL=tiny SERVE_DEVICE=cpu SERVE_BUDGET=90s SERVE_CONCURRENCY="1, 4"
#   SERVE_REQUESTS=4 SERVE_OUTPUT_TOKENS=8 SERVE_PROMPT_TOKENS=16 OUT=/tmp/serve-out bash benchmarks/h200_serve.sh
# (134 s there, 3 trials; SERVE_MODEL=llama-mini takes the llama-1b path: its 128256-token vocabulary).
# On the H200 expect the defaults (no continuous batching: requests served one at a time) to take about
# 2-3 minutes of the budget at C=64, a continuous-batching trial well under a minute.
set -uo pipefail
START_S=$(date +%s)
OUT=${OUT:-/tmp/autoopt-serve-out}; mkdir -p "$OUT"
MODEL_SIZE=${SERVE_MODEL:-llama-1b}
DEVICE=${SERVE_DEVICE:-cuda}
BUDGET=${SERVE_BUDGET:-8m}
DEADLINE_S=${SERVE_DEADLINE_S:-530}
CONC=${SERVE_CONCURRENCY:-1, 16, 64}
if [ -z "${SERVE_NO_WHEELS:-}" ] && [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "error: installing .whl/ failed"; exit 1; }
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
WORK=${SERVE_WORK:-/tmp/autoopt-serve}; mkdir -p "$WORK/home/hub"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv | tee "$OUT/gpu.txt"
python3 -c "import transformers, fastapi, uvicorn, openai, optuna; print('transformers', transformers.__version__)" \
  || { echo "error: transformers serve's packages are missing (see this script's header)"; exit 1; }

echo "=== model $MODEL_SIZE on $DEVICE ($(date -u +%T))"
[ -f "$WORK/model/config.json" ] || python3 benchmarks/h200_serve_model.py "$WORK/model" --size "$MODEL_SIZE" \
  --device "$DEVICE" 2>&1 | tail -3 | tee "$OUT/model.log"
cp "$WORK/model/autoopt_model.json" "$OUT/" 2>/dev/null

if [ "$DEVICE" = cuda ]; then DTYPES="bfloat16, float16"; CB_GRAPH="false, true"; else DTYPES="float32, bfloat16"; CB_GRAPH="false"; fi
cat > "$OUT/space.yaml" <<EOF
# transformers serve of a random-weight $MODEL_SIZE on $DEVICE (benchmarks/h200_serve.sh wrote this)
name: serve_${MODEL_SIZE//[-.]/_}_${DEVICE}
description: transformers serve, $MODEL_SIZE random weights, output tok/s weighted over C=$CONC
target: server
device: $DEVICE
concurrency: [$CONC]
objective: {weights: {$(python3 -c "c=[int(x) for x in '$CONC'.split(',')]; print(', '.join(f'{x}: {1/len(c):.4f}' for x in c[:-1]) + f', {c[-1]}: {1-sum(round(1/len(c),4) for _ in c[:-1]):.4f}')")}}
measurement: {time_limit_s: 400}
priors:
  apply_cost_s: {none: 0, restart: 40}
server:
  command: [python3, -m, transformers.cli.transformers, serve, "{model}", --host, "{host}", --port, "{port}",
            --device, "$DEVICE", --log-level, info]
  model: "$WORK/model"
  port: auto
  env: {HF_HOME: "$WORK/home", HF_HUB_CACHE: "$WORK/home/hub", HF_HUB_OFFLINE: "1", TRANSFORMERS_OFFLINE: "1",
        TOKENIZERS_PARALLELISM: "false"}
  ready_timeout_s: 180
  stop_grace_s: 10
  workload: {api: completions, prompt_tokens: ${SERVE_PROMPT_TOKENS:-128}, output_tokens: ${SERVE_OUTPUT_TOKENS:-32},
             requests: ${SERVE_REQUESTS:-16}, repeats: ${SERVE_REPEATS:-2}, request_timeout_s: 200}
  objective_metric: output_throughput
  knobs:
    frequency_penalty: {request: frequency_penalty}
knobs:
  continuous_batching: {values: [false, true], prior: {speedup: {true: 4.0}}}
  cb_use_cuda_graph: {values: [$CB_GRAPH]}
  cb_max_batch_tokens: {values: [256, 1024, 4096]}
  dtype: {values: [$DTYPES]}
  attn_implementation: {values: [sdpa, eager]}
  frequency_penalty: {values: [0.0, 0.5], restart_class: none}
constraints:
  - "continuous_batching or cb_max_batch_tokens == 256"
  - "continuous_batching or not cb_use_cuda_graph"
EOF
python3 -m autoopt.cli spaces "$OUT/space.yaml" || exit 2

LEFT_S=$(( DEADLINE_S - ($(date +%s) - START_S) - 20 ))
echo "=== autoopt run --budget $BUDGET (wall limit ${LEFT_S}s, $(date -u +%T))"
timeout --signal=TERM --kill-after=15 "$LEFT_S" python3 -m autoopt.cli run --space "$OUT/space.yaml" --budget "$BUDGET" \
  --db "$OUT/db.sqlite" --study serve --plain ${SERVE_MIN_GAIN:+--min-gain "$SERVE_MIN_GAIN"} 2>&1 | tee "$OUT/run.log" | tail -40
echo "=== report ($(date -u +%T))"
python3 -m autoopt.cli history --db "$OUT/db.sqlite" --study serve --wide > "$OUT/history.txt" 2>&1
python3 -m autoopt.cli best --db "$OUT/db.sqlite" --study serve --export "$OUT/best.yaml" --force 2>&1 | tail -20
python3 benchmarks/h200_serve_report.py "$OUT/db.sqlite" serve "$OUT/report.json"
ls -la "$OUT"
echo "done in $(( $(date +%s) - START_S )) s"
