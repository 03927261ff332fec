#!/usr/bin/env bash
# Issue 11's last check on the lent H200: `autoopt bench-serve` against a second load generator (AIPerf
# 0.13) on output tok/s at C = 1 and 4, against the server benchmarks/h200_serve.sh tuned: transformers
# serve of a random-weight Llama-3.2-1B-sized model (benchmarks/h200_serve_model.py) on the GPU with the
# flags that run found best (benchmarks/results/h200_serve/best.yaml). On this 2-core VM the same
# comparison scatters by +-25 % from run to run (README, "bench-serve"); the H200 host has 16 cores, so
# the server gets 6 of its own and the generators the other 10.
#   run(command="bash benchmarks/h200_agreement.sh", carry=[".whl"], timeout_s=...)
# .whl/ holds autoopt's and the serving packages' cp312 wheels (see h200_serve.sh); .whl/aiperf/ AIPerf
# 0.13.0 and what the image lacks of its requirements, at the versions a working local install had
# (`pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64`).
# AIPerf gets its own site folder (its pydantic 2.14 beside autoopt's pydantic 2.11), through a wrapper.
# Writes $OUT/bench_serve_agreement_h200.json and the log. Environment: AGREE_REPEATS (4),
# AGREE_REQUESTS (32), AGREE_SERVER_CPUS (0-5), AGREE_GENERATOR_CPUS (6-15), AGREE_TIMEOUT_S (540).
set -uo pipefail
OUT=${OUT:-/tmp/autoopt-out}; mkdir -p "$OUT"
WORK=${AGREE_WORK:-/tmp/autoopt-agree}; mkdir -p "$WORK"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "error: installing .whl/ failed"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/aiperf-site \
  .whl/aiperf/*.whl || { echo "error: installing .whl/aiperf/ failed"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cat > "$WORK/aiperf" <<'EOF'
#!/bin/sh
PYTHONPATH=/tmp/aiperf-site:/tmp/site exec python3 -c 'import sys; from aiperf.cli import app; sys.argv[0] = "aiperf"; sys.exit(app())' "$@"
EOF
chmod +x "$WORK/aiperf"
"$WORK/aiperf" --version 2>&1 | tail -1
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader | tee "$OUT/gpu.txt"
[ -f "$WORK/model/config.json" ] || python3 benchmarks/h200_serve_model.py "$WORK/model" --size llama-1b --device cuda 2>&1 | tail -2
# the flags of benchmarks/results/h200_serve/best.yaml (its --host/--port/--log-level left to this script)
timeout "${AGREE_TIMEOUT_S:-540}" python3 benchmarks/bench_serve_agreement.py --aiperf "$WORK/aiperf" --model "$WORK/model" \
  --server-arg=--device --server-arg=cuda --server-arg=--continuous-batching --server-arg=--cb-use-cuda-graph \
  --server-arg=--cb-max-batch-tokens --server-arg=1024 --server-arg=--dtype --server-arg=float16 \
  --server-arg=--attn-implementation --server-arg=sdpa \
  --concurrency 1,4 --repeats "${AGREE_REPEATS:-4}" --requests "${AGREE_REQUESTS:-32}" --prompt-tokens 128 \
  --output-tokens 32 --server-cpus "${AGREE_SERVER_CPUS:-0-5}" --generator-cpus "${AGREE_GENERATOR_CPUS:-6-15}" \
  --out "$OUT/bench_serve_agreement_h200.json" 2>&1 | tee "$OUT/agreement.log" | grep -v "^Writing\|it/s\]" | tail -30
