#!/usr/bin/env bash
# shellcheck disable=SC2329  # the detail functions and setup_env are called through run_step
# Everything issue 10 leaves to a GPU, as ONE command that finishes within 8 minutes.
#
# On a machine with one CUDA GPU, Python 3.12 with its own CUDA build of torch, and no network,
# from the repository root (a checkout, or a copy of the working tree):
#
#   bash deploy/gpu-check.sh
#
#   1 environment  a virtual environment that sees the machine's torch (--system-site-packages,
#                  so pip never replaces it) and gets amptrain's other dependencies offline from
#                  the wheelhouse beside this script (deploy/wheelhouse, or AMPTRAIN_WHEELHOUSE):
#                  pip install --no-index --find-links. torch is never installed; the code under
#                  test is this checkout (PYTHONPATH), whatever amptrain wheel the wheelhouse has.
#   2 sync check   host waits counted with PyTorch's GPU trace hooks, which also see
#                  Event.synchronize() (torch.cuda.set_sync_debug_mode does not): none in the
#                  training thread over 12 steps between flushes, fp16/bf16/tf32/fp32, host-built
#                  and GPU-built data, plus the control that the counter sees an event wait.
#   3 pytest gpu   every other test marked gpu.
#   4 amp speedup  bench/amp_speedup.py: ResNet-50 224px batch 256, fp32/tf32/fp16/bf16, bare
#                  loop vs the engine's Trainer (goals: fp16/bf16 >= 2x tf32, >= 45% less peak
#                  memory, engine/bare >= 0.97).
#   5 data path    bench/data_path.py: images/s old vs new; data wait < 2% of the step.
#   6 telemetry    bench/telemetry_overhead.py --device cuda: engine + Redis vs bare, <= 1.01.
#   7 smoke        deploy/gpu-smoke.sh: amptrain up, an fp16, a bf16 and a tf32 job over HTTP.
#
# Then one summary table. Logs and JSON results stay in $RESULTS (default
# /tmp/amptrain-gpu-check/results). Each step runs under the time left of the budget
# (AMPTRAIN_GPU_CHECK_BUDGET, 480 s); a step that would start with less than 20 s left is
# skipped. A benchmark that runs but misses a goal is MISSED. Exit status 0 when every step
# passed.
#
# The wheelhouse, built once on any Linux x86_64 machine with network (torch left out):
#
#   bash deploy/gpu-check.sh --build-wheelhouse [DIR]      # default deploy/wheelhouse
#
# which writes DIR/requirements.txt (the dependencies of amptrain's engine, api, worker and
# embedded extras plus pytest, without torch, read from pyproject.toml) and runs:
#
#   pip wheel --no-deps --wheel-dir DIR .
#   pip download --dest DIR --only-binary=:all: --implementation cp --python-version 3.12 \
#       --abi cp312 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#       --platform manylinux2014_x86_64 -r DIR/requirements.txt
#
# Copy DIR next to this script on the GPU machine (or set AMPTRAIN_WHEELHOUSE to it).
#
# Without a GPU, `bash deploy/gpu-check.sh --dry-run` runs what a CPU can: the environment step
# (when a wheelhouse is there; else it uses $PYTHON as it is), CPU-sized benchmarks and the smoke
# on the CPU; every step that needs CUDA reports SKIP.
#
# Knobs: PYTHON (python3), AMPTRAIN_GPU_CHECK_BUDGET (480), WORK (/tmp/amptrain-gpu-check),
# RESULTS ($WORK/results), AMPTRAIN_WHEELHOUSE (deploy/wheelhouse), WHEEL_PYTHON (3.12: the
# Python version --build-wheelhouse downloads for; 3.11 lets a dry run install them here).
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
PYTHON=${PYTHON:-python3}
BUDGET=${AMPTRAIN_GPU_CHECK_BUDGET:-480}
WORK=${WORK:-/tmp/amptrain-gpu-check}
RESULTS=${RESULTS:-$WORK/results}
WHEELHOUSE=${AMPTRAIN_WHEELHOUSE:-$HERE/wheelhouse}
WHEEL_PYTHON=${WHEEL_PYTHON:-3.12}  # the GPU machine's Python, for --build-wheelhouse
DRY=0

requirements() {
    # amptrain's runtime and test dependencies, torch excluded, one per line.
    "$PYTHON" - "$ROOT/pyproject.toml" <<'PY'
import re
import sys
import tomllib

with open(sys.argv[1], "rb") as f:
    project = tomllib.load(f)["project"]
extras = project["optional-dependencies"]
reqs = list(project["dependencies"])
for extra in ("engine", "api", "worker", "embedded"):
    reqs += extras[extra]
reqs += [r for r in extras["dev"] if re.match(r"pytest\b|pytest-timeout\b", r)]
print("\n".join(sorted({r for r in reqs if not re.match(r"(torch|amptrain)\b", r)})))
PY
}

build_wheelhouse() {
    local dir=${1:-$HERE/wheelhouse}
    mkdir -p "$dir"
    requirements >"$dir/requirements.txt" || return 1
    "$PYTHON" -m pip wheel --no-deps --wheel-dir "$dir" "$ROOT" || return 1
    "$PYTHON" -m pip download --dest "$dir" --only-binary=:all: --implementation cp \
        --python-version "$WHEEL_PYTHON" --abi "cp${WHEEL_PYTHON/./}" --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -r "$dir/requirements.txt" || return 1
    echo "wheelhouse ready: $dir ($(find "$dir" -name '*.whl' | wc -l) wheels, $(du -sh "$dir" | cut -f1))"
}

case "${1:-}" in
    --build-wheelhouse) build_wheelhouse "${2:-}"; exit $? ;;
    --dry-run) DRY=1 ;;
    "") ;;
    *) echo "usage: bash deploy/gpu-check.sh [--dry-run | --build-wheelhouse [DIR]]" >&2; exit 2 ;;
esac

mkdir -p "$RESULTS"
export PYTHON WORK WHEELHOUSE
START=$(date +%s)
ROWS=()      # "step|status|seconds|detail"
FAILED=0

left() { echo $((BUDGET - ($(date +%s) - START))); }

# run_step NAME LIMIT DETAIL_CMD -- COMMAND...: runs COMMAND under min(LIMIT, time left),
# logging to $RESULTS/NAME.log; DETAIL_CMD (a function name or ":") prints the summary detail.
run_step() {
    local name=$1 limit=$2 detail=$3
    shift 4
    local remaining status rc seconds t0 info
    remaining=$(left)
    if [ "$remaining" -lt 20 ]; then
        ROWS+=("$name|SKIP|0|no time left in the ${BUDGET}s budget")
        return
    fi
    [ "$limit" -gt "$remaining" ] && limit=$remaining
    echo "== $name (up to ${limit}s): $*"
    t0=$(date +%s)
    if declare -F "$1" >/dev/null; then  # a function of this script: timeout needs a process
        timeout --kill-after=10 "$limit" bash -c "$(declare -f "$1"); $*" >"$RESULTS/$name.log" 2>&1
    else
        timeout --kill-after=10 "$limit" "$@" >"$RESULTS/$name.log" 2>&1
    fi
    rc=$?
    seconds=$(($(date +%s) - t0))
    tail -n 25 "$RESULTS/$name.log"
    case $rc in
        0) status=PASS ;;
        124 | 137) status=TIMEOUT ;;
        *) status=FAIL ;;
    esac
    info=$("$detail" "$name" 2>/dev/null | tr '\n|' ' /' | cut -c1-150)
    # A benchmark that ran but missed a goal says so (expected on a CPU: --dry-run).
    if [ "$status" = PASS ] && [[ $info == *"NOT MET"* ]]; then
        status=MISSED
        [ "$DRY" = 1 ] || FAILED=1
    fi
    [ "$status" = PASS ] || [ "$status" = MISSED ] || FAILED=1
    ROWS+=("$name|$status|$seconds|$info")
}

skip_step() { ROWS+=("$1|SKIP|0|$2"); }

# -- details for the summary ---------------------------------------------------------------------

pytest_counts() { grep -Eo '[0-9]+ (passed|failed|skipped|error|errors|deselected)' "$RESULTS/$1.log" | tr '\n' ' '; }
last_goals() { grep -E '^goal ' "$RESULTS/$1.log" | sed 's/^goal //' | tr '\n' ';'; }
smoke_detail() { grep -E '^smoke OK|^FAILED|^== (fp16|bf16|tf32):' "$RESULTS/$1.log" | tr '\n' ';'; }
env_detail() { grep -E '^torch ' "$RESULTS/$1.log" | tail -n 1; }

# -- 1 environment --------------------------------------------------------------------------------

setup_env() {
    local venv=$WORK/venv
    rm -rf "$venv"
    "$PYTHON" -m venv --system-site-packages "$venv" || return 1
    "$venv/bin/python" -m pip install --no-index --find-links "$WHEELHOUSE" \
        -r "$WHEELHOUSE/requirements.txt" || return 1
    "$venv/bin/python" - <<'PY'
import torch
cuda = torch.cuda.is_available()
name = torch.cuda.get_device_name() if cuda else "no CUDA device"
print(f"torch {torch.__version__} cuda {torch.version.cuda} on {name}")
PY
}

if [ -f "$WHEELHOUSE/requirements.txt" ]; then
    run_step environment 180 env_detail -- setup_env
    PY=$WORK/venv/bin/python
else
    PY=$PYTHON
    if [ "$DRY" = 1 ]; then
        skip_step environment "no wheelhouse at $WHEELHOUSE: using $PYTHON as it is"
    else
        ROWS+=("environment|FAIL|0|no wheelhouse at $WHEELHOUSE (see --build-wheelhouse)")
        FAILED=1
    fi
fi
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
cd "$ROOT" || exit 1

HAS_CUDA=$("$PY" -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo 0)
if [ "$HAS_CUDA" != 1 ] && [ "$DRY" != 1 ]; then
    echo "no CUDA device visible to $PY (torch.cuda.is_available() is False); use --dry-run without a GPU" >&2
    ROWS+=("cuda|FAIL|0|torch.cuda.is_available() is False")
    FAILED=1
fi

SYNC_TESTS="between_flushes or host_wait_counter"
PYTEST=("$PY" -m pytest -p no:cacheprovider -q -m gpu)

# -- 2..7 -----------------------------------------------------------------------------------------

if [ "$HAS_CUDA" = 1 ]; then
    run_step sync-check 120 pytest_counts -- "${PYTEST[@]}" tests/engine/test_gpu.py -k "$SYNC_TESTS"
    run_step pytest-gpu 150 pytest_counts -- "${PYTEST[@]}" -k "not ($SYNC_TESTS)" tests
    run_step amp-speedup 150 last_goals -- "$PY" bench/amp_speedup.py --device cuda --steps 20 --warmup 8 \
        --json "$RESULTS/amp_speedup.json"
    run_step data-path 90 last_goals -- "$PY" bench/data_path.py --device cuda --json "$RESULTS/data_path.json"
    run_step telemetry 90 last_goals -- "$PY" bench/telemetry_overhead.py --device cuda --steps 150 --pairs 3 \
        --json "$RESULTS/telemetry_overhead.json"
    run_step smoke 150 smoke_detail -- env PYTHON="$PY" AMPTRAIN_SMOKE_STEPS=150 AMPTRAIN_SMOKE_TIMEOUT=90 \
        AMPTRAIN_SMOKE_PRECISIONS="fp16 bf16 tf32" bash deploy/gpu-smoke.sh
elif [ "$DRY" = 1 ]; then
    skip_step sync-check "needs CUDA"
    # The GPU tests must skip cleanly without CUDA: run them, expect only skips.
    run_step pytest-gpu 120 pytest_counts -- "${PYTEST[@]}" tests/engine tests/components
    run_step amp-speedup 240 last_goals -- "$PY" bench/amp_speedup.py --device cpu --steps 1 --warmup 1 --precisions tf32,bf16 \
        --batch 4 --size 32 --json "$RESULTS/amp_speedup.json"
    run_step data-path 240 last_goals -- "$PY" bench/data_path.py --device cpu --batches 1 --old-images 8 \
        --steps 2 --json "$RESULTS/data_path.json"
    run_step telemetry 240 last_goals -- "$PY" bench/telemetry_overhead.py --device cpu --steps 60 --pairs 1 \
        --json "$RESULTS/telemetry_overhead.json"
    run_step smoke 300 smoke_detail -- env PYTHON="$PY" AMPTRAIN_SMOKE_DEVICE=cpu AMPTRAIN_SMOKE_STEPS=20 \
        AMPTRAIN_SMOKE_TIMEOUT=120 bash deploy/gpu-smoke.sh
fi

# -- summary --------------------------------------------------------------------------------------

echo
echo "== amptrain GPU check summary ($( [ "$DRY" = 1 ] && echo "dry run, " )$(($(date +%s) - START))s of ${BUDGET}s; results in $RESULTS)"
printf '%-12s %-8s %6s  %s\n' step status secs detail
for row in "${ROWS[@]}"; do
    IFS='|' read -r name status seconds detail <<<"$row"
    printf '%-12s %-8s %6s  %s\n' "$name" "$status" "$seconds" "$detail"
done
exit "$FAILED"
