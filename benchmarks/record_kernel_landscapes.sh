#!/usr/bin/env bash
# Both kernel landscapes of benchmarks/record_kernel_landscape.py on the lent GPU, within one device
# call (LIMIT_S seconds in all, default 540): the attention kernel first, then the grouped MoE. A call
# that runs out of time leaves its work files in /tmp (kept while the machine stays warm): send the
# same call again at once and it resumes. Copies the landscapes, logs and the GPU's name into $OUT.
#   bash benchmarks/record_kernel_landscapes.sh
set -uo pipefail
OUT=${OUT:-/tmp/autoopt-out}; mkdir -p "$OUT"
LIMIT_S=${LIMIT_S:-540}; END=$(( $(date +%s) + LIMIT_S ))
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm,clocks.max.mem --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | awk '{print $2}')  # H100, H200
for pair in attention:sparse_mqa_decode moe:moe_grouped; do
  kernel=${pair%%:*}; name=${pair##*:}_${GPU:-GPU}
  file="$OUT/$name.json.gz"; left=$(( END - $(date +%s) - 20 ))
  [ -f "/tmp/autoopt-landscape-$kernel/$name.json.gz" ] && { cp "/tmp/autoopt-landscape-$kernel/$name.json.gz" "$OUT/"; continue; }
  [ "$left" -gt 30 ] || { echo "$kernel: no time left in this call"; continue; }
  python3 benchmarks/record_kernel_landscape.py --kernel "$kernel" --limit-s "$left" \
      --out "/tmp/autoopt-landscape-$kernel/$name.json.gz" >> "/tmp/autoopt-landscape-$kernel.log" 2>&1
  echo "$kernel: exit $?"; grep "^\[landscape\]" "/tmp/autoopt-landscape-$kernel.log" | tail -4
  grep -v "^\[landscape\]" "/tmp/autoopt-landscape-$kernel.log" | tail -3
  cp "/tmp/autoopt-landscape-$kernel.log" "$OUT/$name.log"
  [ -f "/tmp/autoopt-landscape-$kernel/$name.json.gz" ] && cp "/tmp/autoopt-landscape-$kernel/$name.json.gz" "$OUT/"
done
ls -la "$OUT"
