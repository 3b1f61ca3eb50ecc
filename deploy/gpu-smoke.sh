#!/usr/bin/env bash
# GPU smoke test of the whole stack: `amptrain up` (private Redis, SQLite, one worker, the API)
# in a temporary data directory, then an fp16 and a bf16 job (by default) submitted over HTTP, waited for,
# and reported with the worker's capability report, GET /workers and the Prometheus series.
#
# Needs: a CUDA machine and a virtual environment with amptrain installed (`pip install -e
# ".[dev]"` or the worker image plus `.[api,embedded]`). Takes a minute or two.
#
#   bash deploy/gpu-smoke.sh                       # exit 0 when both jobs succeeded
#   AMPTRAIN_SMOKE_DEVICE=cpu bash deploy/gpu-smoke.sh   # the same plumbing without a GPU
#
# With 2+ visible GPUs it also starts a `--devices-per-job 2` worker and trains a `devices: 2`
# (data-parallel, NCCL) job; with fewer that job is skipped and says so.
#
# If `amptrain up` exits before the API answers (a missing dependency, a port taken), the
# script stops at once with its exit status and the tail of its log instead of waiting out
# the start-up timeout.
#
# Knobs: AMPTRAIN_SMOKE_STEPS (default 300), AMPTRAIN_SMOKE_TIMEOUT seconds per job (240),
# AMPTRAIN_SMOKE_START_TIMEOUT seconds for the API and the worker to come up (180),
# AMPTRAIN_SMOKE_PRECISIONS (default "fp16 bf16"; deploy/gpu-check.sh adds tf32),
# PYTHON (default: python on PATH).
set -euo pipefail

PYTHON=${PYTHON:-python}
DEVICE=${AMPTRAIN_SMOKE_DEVICE:-cuda}
STEPS=${AMPTRAIN_SMOKE_STEPS:-300}
JOB_TIMEOUT=${AMPTRAIN_SMOKE_TIMEOUT:-240}
PRECISIONS=${AMPTRAIN_SMOKE_PRECISIONS:-fp16 bf16}
START_TIMEOUT=${AMPTRAIN_SMOKE_START_TIMEOUT:-180}

DATA_DIR=$(mktemp -d "${TMPDIR:-/tmp}/amp-smoke-XXXXXX")
free_port() { "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
PORT=$(free_port)
METRICS_PORT=$(free_port)
TOKEN=$("$PYTHON" -c 'import secrets; print(secrets.token_urlsafe(24))')

# Only what this script decides; everything else keeps amptrain's defaults.
unset AMPTRAIN_REDIS_URL AMPTRAIN_DATABASE_URL AMPTRAIN_CHECKPOINT_URL
export AMPTRAIN_DATA_DIR=$DATA_DIR
export AMPTRAIN_ADMIN_TOKEN=$TOKEN
export AMPTRAIN_WORKER_METRICS_PORT=$METRICS_PORT
export AMPTRAIN_HEARTBEAT_SECONDS=1

echo "== capability report (python -m amptrain.worker.main.devices)"
"$PYTHON" -m amptrain.worker.main.devices || echo "capability report failed (exit $?): see above"

echo "== amptrain up on 127.0.0.1:$PORT (data in $DATA_DIR)"
"$PYTHON" -m amptrain.cli.main up --host 127.0.0.1 --port "$PORT" --data-dir "$DATA_DIR" >"$DATA_DIR/up.log" 2>&1 &
UP_PID=$!

# shellcheck disable=SC2329  # called by the EXIT trap
stop_stack() {
    if kill -0 "$UP_PID" 2>/dev/null; then
        kill -INT "$UP_PID" 2>/dev/null || true
        for _ in $(seq 1 120); do kill -0 "$UP_PID" 2>/dev/null || break; sleep 0.5; done
        kill -KILL "$UP_PID" 2>/dev/null || true
    fi
    wait "$UP_PID" 2>/dev/null || true
}
trap stop_stack EXIT

# A data-parallel job needs 2 GPUs and a worker taking 2-device jobs (queue gpu-x2).
GPUS=0
if [ "$DEVICE" = cuda ]; then
    GPUS=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
fi
if [ "$GPUS" -ge 2 ]; then
    X2_METRICS_PORT=$(free_port)
    AMPTRAIN_WORKER_METRICS_PORT=$X2_METRICS_PORT "$PYTHON" -m amptrain.cli.main worker --queues gpu \
        --devices-per-job 2 --concurrency 1 --name "smoke-x2@$(hostname)" >"$DATA_DIR/x2.log" 2>&1 &
    X2_PID=$!
    # shellcheck disable=SC2329  # called by the EXIT trap
    stop_all() {
        kill -TERM "$X2_PID" 2>/dev/null || true
        for _ in $(seq 1 120); do kill -0 "$X2_PID" 2>/dev/null || break; sleep 0.5; done
        kill -KILL "$X2_PID" 2>/dev/null || true
        stop_stack
    }
    trap stop_all EXIT
fi

status=0
"$PYTHON" - "$PORT" "$TOKEN" "$DEVICE" "$STEPS" "$JOB_TIMEOUT" "$METRICS_PORT" "$DATA_DIR/up.log" "$PRECISIONS" "$GPUS" "$UP_PID" "$START_TIMEOUT" <<'PY' || status=$?
import json
import os
import sys
import time
import urllib.error
import urllib.request

port, token, device, steps, job_timeout, metrics_port, up_log, precisions, gpus = sys.argv[1:10]
up_pid, start_timeout = int(sys.argv[10]), int(sys.argv[11])
base = f"http://127.0.0.1:{port}"
auth = {"Authorization": f"Bearer {token}"}


def call(method, path, body=None, headers=auth, raw=False, timeout=30):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method, headers=dict(headers))
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        payload = r.read().decode()
    return payload if raw else json.loads(payload)


def up_alive():
    """Whether `amptrain up` still runs (a zombie, exited but not yet reaped, does not)."""
    try:
        with open(f"/proc/{up_pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(up_pid, 0)
        except ProcessLookupError:
            return False
        return True


def up_log_tail():
    return open(up_log, errors="replace").read()[-4000:]


def wait_for(what, predicate, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            value = None
        if value:
            return value
        if not up_alive():
            sys.exit(f"amptrain up exited while waiting for {what}\n--- up.log (tail)\n{up_log_tail()}")
        time.sleep(0.5)
    sys.exit(f"timed out after {timeout}s waiting for {what}\n--- up.log (tail)\n{up_log_tail()}")


wait_for("the API", lambda: call("GET", "/healthz", headers={}), start_timeout)
wait_for("the worker in GET /workers", lambda: call("GET", "/workers")["items"], start_timeout)


def job_spec(precision):
    return {
        "name": f"smoke-{precision}",
        "model": {"name": "mlp", "args": {}},
        "dataset": {"name": "synthetic-classification", "args": {}},
        "precision": precision,
        "device": device,
        "batch_size": 256,
        "max_steps": int(steps),
        "telemetry": {"flush_every_steps": 25, "flush_every_ms": 200},
        "checkpoint": {"every_steps": 100, "keep_last": 1},
    }


failures = []
for precision in precisions.split():
    started = time.monotonic()
    job = call("POST", "/jobs", job_spec(precision))
    done = wait_for(
        f"{precision} job {job['id']}",
        lambda: (j := call("GET", f"/jobs/{job['id']}"))["status"]
        in ("succeeded", "failed", "cancelled")
        and j,
        int(job_timeout),
    )
    # The recorder persists asynchronously: wait for the last point before reading the summary.
    if done["status"] == "succeeded":
        wait_for("every point recorded", lambda: call("GET", f"/jobs/{job['id']}")["step"] == int(steps), 60)
        done = call("GET", f"/jobs/{job['id']}")
    page = call("GET", f"/jobs/{job['id']}/metrics?limit=1000")
    points = page["items"]
    print(f"== {precision}: {done['status']} in {time.monotonic() - started:.1f}s")
    print(json.dumps({
        "id": done["id"],
        "status": done["status"],
        "precision": done["precision"],
        "error": done["error"],
        "step": done["step"],
        "summary": done["summary"],
        "first_point": points[0] if points else None,
        "points_on_first_page": len(points),
    }, indent=2))
    if done["status"] != "succeeded" or done["precision"]["effective"] != precision:
        failures.append(precision)

if int(gpus) >= 2:
    # Data-parallel: 2 ranks under torchrun on the x2 worker's two GPUs, NCCL.
    spec = {**job_spec("bf16"), "name": "smoke-ddp-x2", "devices": 2}
    started = time.monotonic()
    job = call("POST", "/jobs", spec)
    done = wait_for(
        f"devices: 2 job {job['id']}",
        lambda: (j := call("GET", f"/jobs/{job['id']}"))["status"]
        in ("succeeded", "failed", "cancelled")
        and j,
        int(job_timeout),
    )
    began = [e for e in call("GET", f"/jobs/{job['id']}/events")["items"] if e["type"] == "started"]
    print(f"== devices: 2 (queue {job.get('queue')}): {done['status']} in {time.monotonic() - started:.1f}s")
    print(json.dumps({"error": done["error"], "started": began[-1]["data"] if began else None}, indent=2))
    device_text = (done["precision"] or {}).get("reason", "")
    if done["status"] != "succeeded" or "DDP, NCCL" not in device_text:
        failures.append("devices-2")
else:
    print(f"== devices: 2 job skipped: {gpus} GPU(s) visible, 2 needed")

print("== GET /workers")
print(json.dumps(call("GET", "/workers"), indent=2))
print("== GET /metrics (amptrain_* samples)")
for line in call("GET", "/metrics", headers={}, raw=True).splitlines():
    if line.startswith("amptrain_") and "_bucket" not in line and "_created" not in line:
        print(line)
print(f"== worker metrics on :{metrics_port}")
with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
    for line in r.read().decode().splitlines():
        if line.startswith("amptrain_worker"):
            print(line)
if failures:
    sys.exit(f"FAILED: {', '.join(failures)}")
print(f"smoke OK: {', '.join(precisions.split())} trained through the whole stack")
PY

if [ "$status" -ne 0 ]; then
    if ! kill -0 "$UP_PID" 2>/dev/null; then
        up_status=0
        wait "$UP_PID" 2>/dev/null || up_status=$?
        echo "amptrain up exited with status $up_status"
    fi
    echo "== up.log (tail)"
    tail -n 80 "$DATA_DIR/up.log" || true
fi
exit "$status"
