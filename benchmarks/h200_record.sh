#!/usr/bin/env bash
# Issue 14's H200 decode table on the lent H200: benchmarks/record_decode_table.py over its whole
# design (168 configurations of flash-slice at C = 1, 16, 64) in ONE process. The recording takes
# longer than one device call (10 minutes a command), so it runs in its own session (setsid: the device
# keeps such a process while the machine is held) and the next calls follow it:
#   bash benchmarks/h200_record.sh start    # start the recording, follow it for WAIT_S (default 565)
#   bash benchmarks/h200_record.sh wait     # follow it for WAIT_S more (again until it has ended)
#   PASS=2 bash benchmarks/h200_record.sh start   # the second pass, in a new process, then `PASS=2 ... wait`
# Then, here: python benchmarks/merge_decode_passes.py PASS1.recording.csv PASS2.recording.csv
#   --side-car PASS1.restart.yaml --out benchmarks/data/h200_flash_decode (the noise between processes).
# Send each next call at once: a machine idle for 30 s is handed back, and the recording with it.
# Every call copies what exists so far into $OUT (the recording, the per-row what-ran lines, the log,
# and once it has ended the replay table and its side-car); copy them to benchmarks/data/.
# LIMIT_S (default 1400) stops the recording from starting rows after that long; the step_compile rows
# come last, so a recording cut there is a whole table once `step_compile == 'off'` is a constraint.
# On a CPU: LIVE=/tmp/rec OUT=/tmp/out DEVICE=cpu PRESET=tiny WAIT_S=30 bash benchmarks/h200_record.sh start
set -uo pipefail
OUT=${OUT:-/tmp/autoopt-out}; LIVE=${LIVE:-/tmp/autoopt-record}; mkdir -p "$OUT" "$LIVE"
WAIT_S=${WAIT_S:-565}; LIMIT_S=${LIMIT_S:-1400}; NAME=h200_flash_decode; PASS=${PASS:-1}
REC=$LIVE/pass$PASS; mkdir -p "$REC"

if [ ! -d "$LIVE/src" ]; then  # the code of the first call: later calls re-send the tree
  mkdir -p "$LIVE/src" && tar --exclude=./.git --exclude=./.whl --exclude=./.venv --exclude=./db -cf - . | tar -C "$LIVE/src" -xf -
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,compute_cap --format=csv > "$LIVE/gpu.txt" 2>&1
fi
export PYTHONPATH=$LIVE/src:$LIVE/src/kernels PYTHONUNBUFFERED=1
cd "$LIVE/src" || exit 1

running() { [ -f "$REC/pid" ] && kill -0 "$(cat "$REC/pid")" 2>/dev/null; }

case "${1:-}" in
  start)
    running && { echo "already recording (pid $(cat "$REC/pid"))"; exit 2; }
    # a CUDA fault ends the process with 3 (its row recorded as failed): the next one resumes after it
    deadline=$(( $(date +%s) + LIMIT_S ))
    setsid timeout $((LIMIT_S + 400)) bash -c 'for i in 1 2 3 4; do
        python3 benchmarks/record_decode_table.py --out "$0/'"$NAME"'" --device "${DEVICE:-cuda}" \
            --preset "${PRESET:-flash-slice}" --limit-s '"$LIMIT_S"' --deadline "$1"; [ $? = 3 ] || break; done' \
        "$REC" "$deadline" > "$REC/record.log" 2>&1 < /dev/null &
    echo $! > "$REC/pid"; echo "recording pass $PASS started (pid $(cat "$REC/pid")) at $(date -u +%T)" ;;
  wait) ;;
  *) echo "usage: $0 start|wait"; exit 2 ;;
esac
DEADLINE=$((SECONDS + WAIT_S))
while running && [ "$SECONDS" -lt "$DEADLINE" ]; do sleep 5; done
running && echo "still recording at $(date -u +%T)" || echo "recording ended at $(date -u +%T)"
grep "^\[record\]" "$REC/record.log" | tail -25
for f in "$REC/$NAME".* "$REC/record.log" "$LIVE/gpu.txt"; do [ -f "$f" ] && cp "$f" "$OUT/"; done
ls -la "$OUT"
