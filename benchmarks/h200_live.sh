#!/usr/bin/env bash
# Issue 14's live check on the lent H200: `autoopt run --budget 10m` from an empty database, then the
# same study resumed for 10 more minutes, then the best re-measured by h200_decode.py in ONE process
# beside the hand-tuned final row. A 10-minute run does not fit one device call (10 minutes a command,
# installs and start-up included), so the run is started in its own session (setsid: the device keeps
# such a process while the machine is held) and the next calls wait for it:
#   bash benchmarks/h200_live.sh start     # run 1 in the background, follow it for WAIT_S (default 560)
#   bash benchmarks/h200_live.sh wait      # until run 1 ends; export; then start run 2 (the resume)
#   bash benchmarks/h200_live.sh wait      # until run 2 ends; export
#   bash benchmarks/h200_live.sh table     # h200_decode.py: hand-tuned final row + both runs' exported bests
# Send each next call at once: a machine idle for 30 s is handed back, and the run in flight with it
# (a session lost run 1 that way while editing between calls; another lost its final confirmation and
# export, benchmarks/results/h100_live_10m). A call that returns with the run still going leaves the
# best so far in its archive (configN.so_far.yaml) beside the study.
#   bash benchmarks/h200_live.sh finish    # until the run in flight ends; export; no resume
# A study recorded earlier (its h200.sqlite and config1.yaml) is resumed on a fresh machine by
#   RESUME_FROM=benchmarks/results/h200_live_10m_run8 bash benchmarks/h200_live.sh wait
# (refused unless nvidia-smi names RESUME_GPU, default H200: a study's trials must share a card).
# `table` first follows the run in flight to its end (and exports it), so `start` then `table` is the
# from-empty check without its resume in two calls (a machine handed back between calls takes the
# study with it).
# The table measures each row twice in one process, in both orders (h200_decode.py --passes 2, PASSES=1: once; a
# row measured later in a process reads slower), and reports each mix over the hand-tuned row's.
# Every stage copies what exists so far into $OUT as one live.tgz (the device returns at most 8 files).
# The code that runs is the tree of the first call, copied to $LIVE/src: later calls re-send the
# working tree, and a run in flight must not have its modules replaced under it.
# SPACE (default dsv4_flash_decode) and NO_WHEELS=1 (skip the wheel install) let it be tried on a CPU:
#   NO_WHEELS=1 SPACE=dsv4_tiny_cpu BUDGET=25s WAIT_S=60 LIVE=/tmp/live OUT=/tmp/out bash benchmarks/h200_live.sh start
set -uo pipefail
OUT=${OUT:-/tmp/autoopt-out}; LIVE=${LIVE:-/tmp/autoopt-live}; mkdir -p "$OUT" "$LIVE"
BUDGET=${BUDGET:-10m}; WAIT_S=${WAIT_S:-560}; STUDY=flash-h200
HAND_TUNED="hand-tuned + glue=triton + step_compile + stacked proj + cuda_graphs"

setup() {
  if [ ! -d "$LIVE/src" ]; then
    [ -n "${NO_WHEELS:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$LIVE/site" .whl/*.whl || exit 1
    mkdir -p "$LIVE/src" && tar --exclude=./.git --exclude=./.whl --exclude=./.venv --exclude=./db -cf - . | tar -C "$LIVE/src" -xf -
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,compute_cap --format=csv > "$LIVE/gpu.txt"
    if [ -n "${RESUME_FROM:-}" ]; then  # a committed study's run 1: the next `wait` resumes it here
      grep -q "${RESUME_GPU:-H200}" "$LIVE/gpu.txt" || { echo "RESUME_FROM: $(tail -1 "$LIVE/gpu.txt") is not the study's ${RESUME_GPU:-H200}"; exit 2; }
      cp "$RESUME_FROM/h200.sqlite" "$RESUME_FROM/config1.yaml" "$LIVE/" && echo done1 > "$LIVE/finished" || exit 1
    fi
  fi
  export PYTHONPATH=$LIVE/site:$LIVE/src:$LIVE/src/kernels PYTHONUNBUFFERED=1
  cd "$LIVE/src" || exit 1
}

launch() {  # $1: run number; run 2 resumes the study of run 1
  local resume=(); [ "$1" = 2 ] && resume=(--resume)
  echo "$1" > "$LIVE/current"
  setsid timeout 1500 python3 -m autoopt.cli run --space "${SPACE:-dsv4_flash_decode}" --budget "$BUDGET" --db "sqlite:///$LIVE/h200.sqlite" \
      --study "$STUDY" --plain "${resume[@]}" > "$LIVE/run$1.log" 2>&1 < /dev/null &
  echo $! > "$LIVE/pid"; echo "run $1 started (pid $(cat "$LIVE/pid"), budget $BUDGET) at $(date -u +%T)"
}

running() { [ -f "$LIVE/pid" ] && kill -0 "$(cat "$LIVE/pid")" 2>/dev/null; }

DEADLINE=$((SECONDS + WAIT_S))
follow() {  # until the run ends or this call's WAIT_S has passed; then its export, once
  [ -f "$LIVE/pid" ] || return 0  # no run in flight: the last one was exported when it ended
  while running && [ "$SECONDS" -lt "$DEADLINE" ]; do sleep 5; done
  if running; then  # the best so far travels in this call's archive: the machine may not be here for the next
    echo "run $(cat "$LIVE/current") still running at $(date -u +%T)"
    python3 -m autoopt.cli best --db "sqlite:///$LIVE/h200.sqlite" --study "$STUDY" \
        --export "$LIVE/config$(cat "$LIVE/current").so_far.yaml" > "$LIVE/best_so_far.txt" 2>&1 \
      && echo "best so far exported: config$(cat "$LIVE/current").so_far.yaml" || echo "no best to export yet: $(tail -1 "$LIVE/best_so_far.txt")"
    return 1
  fi
  local n; n=$(cat "$LIVE/current"); echo "run $n ended at $(date -u +%T)"; rm -f "$LIVE/pid"
  python3 -m autoopt.cli best --db "sqlite:///$LIVE/h200.sqlite" --study "$STUDY" --export "$LIVE/config$n.yaml" > "$LIVE/best$n.txt" 2>&1
  python3 -m autoopt.cli history --db "sqlite:///$LIVE/h200.sqlite" --study "$STUDY" > "$LIVE/history$n.txt" 2>&1
  echo "done$n" >> "$LIVE/finished"
}

collect() {
  tail -4 "$LIVE"/run*.log 2>/dev/null
  tar -C "$LIVE" --exclude=src --exclude=site --exclude=cache -czf "$OUT/live.tgz" . && ls -la "$OUT"
}

setup
case "${1:-}" in
  start) launch 1; follow ;;
  wait)
    follow && { grep -q done2 "$LIVE/finished" 2>/dev/null || launch 2; }
    grep -q done2 "$LIVE/finished" 2>/dev/null || follow ;;
  finish)  # until the run in flight ends, then its export; no resume
    follow || exit 1 ;;
  table)
    follow || { collect; exit 1; }
    bests=(); for f in "$LIVE"/config2.yaml "$LIVE"/config1.yaml; do [ -f "$f" ] && bests+=(--best "$f"); done
    # a fresh machine (the last one went back between calls) has no study: say so, not just a lone row
    [ ${#bests[@]} -gt 0 ] || echo "warning: no exported best in $LIVE (no study on this machine): only the hand-tuned row is measured; export one from the last archive and pass it to h200_decode.py --best"
    timeout ${DECODE_S:-420} python3 benchmarks/h200_decode.py --no-compile --samples 10 --passes ${PASSES:-2} \
        --only "$HAND_TUNED" "${bests[@]}" --out "$LIVE/h200_decode.json" \
        > "$LIVE/decode.log" 2>&1; tail -12 "$LIVE/decode.log" ;;
  *) echo "usage: $0 start|wait|finish|table"; exit 2 ;;
esac
collect
