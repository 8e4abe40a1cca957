#!/usr/bin/env bash
# Reproduction rows on a lent GPU machine: several `python -m reproduce`
# jobs at once, stopped at a deadline, their finished runs packed for home.
#
# With no arguments: the committed queue (results/queue.json,
# docs/reproduction.md "The queue"), the same command for every call of a
# session:
#
#   bash benchmarks/gpu_reproduce.sh
#
# 1. CIFAR-10: parts of reproduce.datapack found in .datapack/ (the
#    call's `carry`) are moved to $STAGE (default /tmp/fkjax_datapack, kept
#    while the machine stays warm); until all parts are there the call ends
#    saying how many are staged. Then they are unpacked, checked, into
#    /tmp/fkjax_data (FKJAX_DATA_DIR, unless set and already holding it).
# 2. `python -m reproduce.lease prepare`: the committed state of the
#    next runs is unpacked into their workdirs, and JOBS (2) jobs take the
#    next units round-robin (with the queue's order: one the paper scale's
#    run, the other the gpu scale's rows).
# 3. At DEADLINE the jobs are stopped and
#    `python -m reproduce.lease pack` writes to $OUT the results and
#    weights of every finished run home lacks (reproduce.ledger: those of
#    this call, and of an earlier call here killed before its pack) and the
#    last checkpoint of every run not finished (lease.tar.part-NN,
#    lease.json; within the tool's 8 files of 16 MiB). At home, for each
#    call in turn: python -m reproduce unpack <folder>.
#    This pack is the call's only output: a call that the device tool
#    kills before the pack brings back nothing itself (the next call on
#    this still-warm machine brings back its finished runs; a fresh
#    machine resumes from the committed carry). So DEADLINE is LIMIT less
#    MARGIN (90 s: up to 7 s to stop the jobs, then the pack, which took
#    25 s on 2 busy CPU cores with the most a lease brings back, 60 MB of
#    En5ResNet20 states: `python -m benchmarks.bench_carry --lease=8`),
#    counted from the script's start; a DEADLINE that leaves less than
#    MARGIN is refused. LIMIT (600) must be the call's timeout_s, or the device
#    time left where that is less: `LIMIT=420 bash ...` with timeout_s=420.
#
# With arguments (jobs named by hand):
#   FKJAX_DATA_DIR=/data DEADLINE=480 bash benchmarks/gpu_reproduce.sh \
#     "table1 --rows=a,b --seeds=1 --sweep" \
#     "fig45 --rows=c,d --seeds=1 --sweep; table2 --rows=c --seeds=1"
#
# Each argument is one job: `;`-separated argument lists of
# `python -m reproduce ... --scale=$SCALE` (default cpu), run in turn;
# VARIANT=long adds `--variant=long` to each (results and workdirs under
# cpu-long: give the variant here, not in a job, so that they are packed).
# The jobs run side by side on the one GPU: a ResNet20-sized net cannot fill
# it, and one job's compilation overlaps another's steps. Jobs must not
# share a run (the listing's "(= table/row)"), or two would train it.
#
# Every 20 s, and once more at the end, $OUT/runs.tgz is rewritten with the
# runs finished or updated in this call (their archives under
# results/<scale>/runs, reproduce.archive; not those the checkout
# brought unchanged) and the jobs' logs, so a call stopped at its limit
# still brings back every run finished by then. At the deadline the jobs
# are stopped and $OUT/workdirs.tgz gets the workdirs of the runs not
# finished (checkpoints included), so that a later lease resumes them: runs
# longer than one lease (the paper scale's) finish over several. A file
# larger than PART_BYTES (15 MiB: the device tool brings back files of 16
# MiB at most) is cut into numbered parts, workdirs.tgz.part-00, -01, ...
# At home, in the repository root:
#   cat runs.tgz* | tar xz && cat workdirs.tgz* | tar xz
#   python -m reproduce all --scale=$SCALE [--variant=$VARIANT] \
#     --report-only
# and the next lease carries the workdirs back (the device tool's `carry`:
# workdirs/reproduce/<scale>[-<variant>]).
#
# ml-collections and tensorboardX, which such machines may lack, are
# installed from ./.whl if it holds wheels (e.g. `pip download --no-deps
# --only-binary=:all: -d .whl ml-collections==1.1.0 tensorboardX==2.6.5`).
# benchmarks/results/h200_2026-11-27_reproduce/ has what one such run gave.
set -u
OUT=${OUT:-/tmp/fkjax_gpu_reproduce}
SCALE=${SCALE:-cpu}
VARIANT=${VARIANT:-}
# where the runner puts this scale's results and workdirs
RESULTS_NAME=$SCALE${VARIANT:+-$VARIANT}
QUEUE_MODE=$(( $# == 0 ))
# the device tool's timeout_s for this call (docs/reproduction.md)
LIMIT=${LIMIT:-600}
# what queue mode keeps after DEADLINE to stop the jobs and pack
MARGIN=${MARGIN:-90}
DEADLINE=${DEADLINE:-$(( QUEUE_MODE ? LIMIT - MARGIN : 480 ))}
JOBS=${JOBS:-2}
STAGE=${STAGE:-/tmp/fkjax_datapack}
PY=${PY:-python3}
ROOT=${ROOT:-workdirs/reproduce}   # the runner's --root (its default)
LOGS=${LOGS:-/tmp/fkjax_reproduce_logs}
PART_BYTES=${PART_BYTES:-15728640}
mkdir -p "$OUT" "$LOGS"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# N processes on one GPU: none may take most of its memory up front.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
# Rows of one architecture share their evaluation programs: compile once.
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/fkjax_jax_cache}
start=$SECONDS
log() { echo "=== +$((SECONDS - start))s $*"; }
if (( QUEUE_MODE )); then
  if (( LIMIT - DEADLINE < MARGIN )); then
    echo "error: DEADLINE=$DEADLINE leaves $((LIMIT - DEADLINE)) s of the" \
      "call's LIMIT=$LIMIT s (its timeout_s) to stop the jobs and pack the" \
      "lease; MARGIN=$MARGIN s is needed: lower DEADLINE or raise LIMIT" >&2
    exit 2
  fi
  log "deadline ${DEADLINE}s: $((LIMIT - DEADLINE)) s before the call's" \
    "limit of ${LIMIT}s (timeout_s) to stop the jobs and pack"
fi
if (( QUEUE_MODE )) && [ ! -f "${FKJAX_DATA_DIR:-/nonexistent}/cifar-10-batches-bin/test_batch.bin" ]; then
  # CIFAR-10 comes in parts over consecutive calls (docs/reproduction.md).
  mkdir -p "$STAGE"
  if ls .datapack/* > /dev/null 2>&1; then cp .datapack/* "$STAGE"/; fi
  export FKJAX_DATA_DIR=${DATA_DEST:-/tmp/fkjax_data}
  if [ ! -f "$FKJAX_DATA_DIR/cifar-10-batches-bin/test_batch.bin" ]; then
    if ! $PY -m reproduce.datapack unpack "$STAGE" "$FKJAX_DATA_DIR" 2>&1; then
      log "CIFAR-10 not complete yet: call again (within the warm window) carrying the next part"
      exit 0
    fi
  fi
fi
: "${FKJAX_DATA_DIR:?set FKJAX_DATA_DIR to the folder holding cifar-10-batches-bin}"

if ls .whl/*.whl > /dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/fkjax_site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/fkjax_site"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
  2>/dev/null || echo "no nvidia-smi"

# A call the device tool kills at its limit leaves its jobs running (each
# leads its own session, which the tool does not end): the next call here
# stops them first, else they would hold the workdirs its own jobs resume.
JOBS_FILE=$ROOT/lease_jobs.pids
# TERM, then KILL what is left after 5 s (every process of each job's group)
stop_jobs() {
  local p alive
  for p in "$@"; do kill -TERM -- "-$p" 2>/dev/null; done
  for _ in $(seq 10); do
    alive=0
    for p in "$@"; do kill -0 -- "-$p" 2>/dev/null && alive=1; done
    (( alive )) || return 0
    sleep 0.5
  done
  for p in "$@"; do kill -KILL -- "-$p" 2>/dev/null; done
}
if [ -f "$JOBS_FILE" ]; then
  left=()
  # those still running a job (not a process that took a pid freed since)
  while read -r p; do
    [ "$p" != $$ ] && grep -qasF -- "-m reproduce" "/proc/$p/cmdline" \
      && left+=("$p")
  done < "$JOBS_FILE"
  if (( ${#left[@]} )); then
    log "stopping the jobs an earlier call left running: ${left[*]}"
    stop_jobs "${left[@]}"
  fi
  rm -f "$JOBS_FILE"
fi

# With jobs named by hand: the runs finished (or updated: an extra
# evaluation added) since the call began, their records newer than this
# mark. (The queue's pack brings back every run home lacks instead,
# reproduce.ledger: also those of a call killed before its pack.)
STARTED=$(mktemp)
new_runs() {
  find "results/$RESULTS_NAME/runs" -mindepth 3 -maxdepth 3 \
    -name reproduce_run.json -newer "$STARTED" -printf '%h\n' 2>/dev/null
}

# Those runs, and the logs.
pack() {
  local new
  mapfile -t new < <(new_runs)
  tar czf "$OUT/runs.tgz.tmp" "${new[@]}" -C "$(dirname "$LOGS")" \
    "$(basename "$LOGS")" 2>/dev/null && mv "$OUT/runs.tgz.tmp" "$OUT/runs.tgz"
}

# Cuts $1 into parts of PART_BYTES when it is larger.
cut_up() {
  (( $(stat -c %s "$1") > PART_BYTES )) || return 0
  split -b "$PART_BYTES" -d -a 2 "$1" "$1.part-" && rm "$1"
  log "$(basename "$1") cut into $(ls "$1".part-* | wc -l) parts"
}

# The workdirs of runs without a record (reproduce.archive.RUN_RECORD):
# stopped mid-way; their checkpoints let a later lease resume them.
pack_unfinished() {
  local dirs=()
  for d in "$ROOT/$RESULTS_NAME"/*/*/; do
    [ -d "$d" ] && [ ! -f "$d/reproduce_run.json" ] && dirs+=("${d%/}")
  done
  (( ${#dirs[@]} )) || return 0
  tar czf "$OUT/workdirs.tgz" "${dirs[@]}"
  log "unfinished runs packed: ${dirs[*]} ($(du -k "$OUT/workdirs.tgz" | cut -f1) KiB)"
  cut_up "$OUT/workdirs.tgz"
}

if (( QUEUE_MODE )); then
  # the scale is in each job's commands
  EXTRA=""
  jobs_text=$($PY -m reproduce.lease prepare --jobs="$JOBS" --root="$ROOT") \
    || { log "the queue could not be read (above)"; exit 1; }
  job_list=()
  if [ -n "$jobs_text" ]; then
    mapfile -t job_list <<< "$jobs_text"
  else
    # still packs: an earlier call here may have left finished runs unsent
    log "the queue has no run left"
  fi
else
  EXTRA="--scale=$SCALE${VARIANT:+ --variant=$VARIANT}"
  job_list=("$@")
fi

pids=()
for i in $(seq 1 ${#job_list[@]}); do
  job=${job_list[$((i - 1))]}
  # setsid: each job leads its own process group, so the deadline can stop
  # it with every process it started.
  setsid bash -c '
    IFS=";" read -ra cmds <<< "$1"
    for c in "${cmds[@]}"; do
      echo "=== $(date +%T) python -m reproduce $c $2"
      '"$PY"' -m reproduce $c $2
      echo "=== $(date +%T) rc=$?"
    done' job "$job" "$EXTRA" \
    > "$LOGS/job$i.log" 2>&1 &
  pids+=($!)
  log "job $i (pid $!): $job"
done
if (( ${#pids[@]} )); then
  mkdir -p "$ROOT" && printf '%s\n' "${pids[@]}" > "$JOBS_FILE"
fi

running() { for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
last_pack=$SECONDS
# STOP_FILE: once it exists the jobs stop as at the deadline (the tests).
while running && (( SECONDS - start < DEADLINE )) && [ ! -e "${STOP_FILE:-/nonexistent}" ]; do
  sleep 2
  # (queue mode packs once, at the end: its DEADLINE leaves the time)
  if (( ! QUEUE_MODE && SECONDS - last_pack >= 20 )); then
    pack
    last_pack=$SECONDS
    log "$(new_runs | wc -l) runs finished"
  fi
done
if running; then
  log "deadline: stopping the jobs"
  stop_jobs "${pids[@]}"
fi
rm -f "$JOBS_FILE"
if (( QUEUE_MODE )); then
  log "packing the lease"
  $PY -m reproduce.lease pack --out="$OUT" --root="$ROOT" --logs="$LOGS"
  log "packed: $((LIMIT - SECONDS + start)) s of the call's limit to spare"
else
  pack
  cut_up "$OUT/runs.tgz"
  pack_unfinished
fi
for i in $(seq 1 ${#job_list[@]}); do log "job $i:"; grep -E "^=== |done|Error|error" "$LOGS/job$i.log" | tail -8; done
log end
