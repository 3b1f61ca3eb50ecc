"""Data-parallel scaling: throughput at 1 and N devices, and the scaling efficiency.

Each run is the product's own path for one rank: ``python -m amptrain.cli.train`` (one
process) and the same under ``torch.distributed.run --standalone --nproc-per-node N
--max-restarts 0`` (what the worker starts for a ``devices: N`` job). Weak scaling: every
device gets the same micro-batch, so N devices train an N-times larger global batch. The
throughput is the median ``samples_per_second`` (global samples per second, from rank 0's
records) over the steps after the warm-up.

    efficiency = throughput(N) / (N x throughput(1))

Goal on GPUs: >= 90% at 2 devices for ResNet-50 (224x224, bf16, batch 128 per GPU).
On a CPU (gloo) the same script runs a small MLP to check itself (``--quick``); CPU
efficiency says little (one core per rank, gloo over loopback, and a busy machine).

    python bench/ddp_scaling.py                      # CUDA: ResNet-50 at 1 and all GPUs
    python bench/ddp_scaling.py --quick              # CPU smoke: MLP, 1 and 2 ranks, gloo
    python bench/ddp_scaling.py --devices 4 --steps 60 --json out.json
    sudo python bench/ddp_scaling.py --netns --nodes 1,2,3   # CPU: 1-3 hosts, 1 rank each

``--netns`` runs the multi-node path on one machine: each node a network namespace with
its own address (tests/support/netns.py), launched as a ``nodes: N`` job's workers do
(``torch.distributed.run`` with a c10d rendezvous on the first node), one CPU rank per node
on the ``--quick`` MLP; efficiency is relative to the 1-node run. A smoke figure: the
nodes share this machine's cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.support.netns import Network

ROOT = Path(__file__).resolve().parents[1]


def spec(device: str, devices: int, per_device: int, steps: int, quick: bool) -> dict[str, Any]:
    if quick:
        model = {"name": "mlp", "args": {"width": 256}}
        data = {"name": "synthetic-classification", "args": {"features": 256}}
        precision = "fp32"
    else:
        model = {"name": "resnet50", "args": {}}
        data = {"name": "synthetic-images", "args": {"height": 224, "width": 224}}
        precision = "bf16"
    return {
        "name": f"ddp-scaling-x{devices}",
        "model": model,
        "dataset": data,
        "device": device,
        "precision": precision,
        "devices": devices,
        "batch_size": per_device * devices,
        "max_steps": steps,
        "telemetry": {"flush_every_steps": 10},  # each data-parallel flush is an all-gather
        "collective_timeout_s": 600,
    }


def run(job: dict[str, Any], work: Path, warmup: int) -> dict[str, Any]:
    """Train ``job`` (torchrun when devices > 1); throughput from rank 0's records. On a CPU
    one device is one core: torchrun gives each rank 1 OpenMP thread, so the 1-rank run
    gets 1 too (else it would use every core and the efficiency would compare cores)."""
    env = os.environ.copy()
    if job["device"] == "cpu":
        env.setdefault("OMP_NUM_THREADS", "1")
    path, out = work / f"spec-{job['devices']}.json", work / f"records-{job['devices']}.jsonl"
    path.write_text(json.dumps(job))
    entry = ["-m", "amptrain.cli.train", str(path), "--out", str(out), "--no-resume"]
    if job["devices"] > 1:
        launcher = ["-m", "torch.distributed.run", "--standalone", "--nnodes", "1"]
        launcher += ["--nproc-per-node", str(job["devices"]), "--max-restarts", "0"]
        entry = [*launcher, *entry]
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, *entry], cwd=ROOT, capture_output=True, text=True, env=env
    )
    wall = time.monotonic() - started
    if done.returncode:
        sys.exit(f"devices {job['devices']} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return summary(job, out, warmup, wall)


def summary(job: dict[str, Any], out: Path, warmup: int, wall: float) -> dict[str, Any]:
    """Throughput and step time from rank 0's records in ``out``."""
    records = [json.loads(line) for line in out.read_text().splitlines()]
    metrics = [r for r in records if r["kind"] == "metric" and r["step"] > warmup]
    device = next(
        (r["data"]["device"] for r in records if r.get("type") == "precision"), job["device"]
    )
    rates = [m["samples_per_second"] for m in metrics if m.get("samples_per_second")]
    return {
        "devices": job["devices"],
        "device": device,
        "global_batch": job["batch_size"],
        "timed_steps": len(rates),
        "samples_per_second": statistics.median(rates) if rates else 0.0,
        "step_time_ms": statistics.median(m["step_time_ms"] for m in metrics) if metrics else 0,
        "wall_s_with_launch": round(wall, 1),
    }


def run_netns(
    net: Network, job: dict[str, Any], nodes: int, work: Path, warmup: int
) -> dict[str, Any]:
    """Train ``job`` on ``nodes`` netns hosts, one CPU rank each: on every host the launch a
    ``nodes: N`` job runs (torch.distributed.run, c10d rendezvous on host 0's address,
    ``--local-addr`` its own). Rank 0 (host 0: ranks follow the sorted addresses) writes
    the records; the others' ``--out`` stay empty."""
    hosts = net.hosts[:nodes]
    path = work / f"spec-n{nodes}.json"
    path.write_text(json.dumps(job))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one core per rank, as in run()
    agents, logs = [], []
    started = time.monotonic()
    for i, host in enumerate(hosts):
        launcher = ["-m", "torch.distributed.run", "--nnodes", str(nodes), "--nproc-per-node", "1"]
        launcher += [
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"{hosts[0].addr}:{29400 + nodes}",
        ]
        launcher += ["--rdzv-id", f"bench-{net.tag}-{nodes}", "--max-restarts", "0"]
        # c10d reads join_timeout (not timeout); is_host so no agent has to guess.
        launcher += ["--rdzv-conf", f"join_timeout=120,is_host={str(i == 0).lower()}"]
        launcher += ["--local-addr", host.addr]
        out = work / f"records-n{nodes}-h{i}.jsonl"
        train = ["-m", "amptrain.cli.train", str(path), "--out", str(out), "--no-resume"]
        logs.append(work / f"n{nodes}-h{i}.log")
        with logs[-1].open("w") as log:
            argv = [sys.executable, *launcher, *train]
            agents.append(host.popen(argv, env=env, cwd=ROOT, stdout=log, stderr=log))
    for host, agent, log_path in zip(hosts, agents, logs, strict=True):
        if agent.wait(timeout=900):
            sys.exit(
                f"{nodes} nodes: {host} failed ({agent.returncode}):\n{log_path.read_text()[-3000:]}"
            )
    wall = time.monotonic() - started
    return summary(job, work / f"records-n{nodes}-h0.jsonl", warmup, wall)


def netns_main(nodes: list[int], per_device: int, steps: int, warmup: int) -> dict[str, Any]:
    """The same CPU work (the ``--quick`` MLP) on 1, 2, ... netns hosts; prints the table."""
    if os.geteuid() != 0:
        sys.exit("--netns makes network namespaces and must run as root (sudo)")
    sys.path.insert(0, str(ROOT))  # tests/ holds the netns helper (as other benches do)
    from tests.support.netns import netns_unavailable, networks

    if reason := netns_unavailable():
        sys.exit(f"--netns makes network namespaces and must run as root: {reason}")
    runs = []
    with networks() as make, tempfile.TemporaryDirectory() as tmp:
        net = make(max(nodes))
        for n in nodes:
            runs.append(
                run_netns(net, spec("cpu", n, per_device, steps, True), n, Path(tmp), warmup)
            )
    base = next((r["samples_per_second"] for r in runs if r["devices"] == 1), None)
    print(
        f"{'nodes':>6} {'world':<22} {'samples/s':>12} {'step ms':>9} {'wall s':>7} "
        f"{'efficiency':>11}"
    )
    for r in runs:
        eff = r["samples_per_second"] / (r["devices"] * base) if base else None
        r["efficiency"] = eff
        shown = f"{eff:.1%}" if eff is not None else "n/a"
        print(
            f"{r['devices']:>6} {r['device'][:22]:<22} {r['samples_per_second']:>12,.1f} "
            f"{r['step_time_ms']:>9.1f} {r['wall_s_with_launch']:>7} {shown:>11}"
        )
    print(
        f"netns smoke figure: each node is one CPU rank (gloo over veth + bridge), all nodes "
        f"share this machine's {os.cpu_count()} cores (and other work): past "
        f"{os.cpu_count()} ranks the efficiency must fall; it proves the multi-node path "
        "works, not how real hosts scale. Efficiency = samples/s(N) / (N x samples/s(1))."
    )
    return {"runs": runs, "netns": True}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="CPU smoke: small MLP, 2 ranks")
    parser.add_argument("--devices", type=int, default=None, help="N (default: GPUs, or 2)")
    parser.add_argument("--per-device-batch", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=None, help="steps left out of the median")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--netns", action="store_true", help="CPU ranks on netns hosts, one each (needs root)"
    )
    parser.add_argument("--nodes", default="1,2,3", help="with --netns: host counts to run")
    args = parser.parse_args()
    if args.netns:
        report = netns_main(
            [int(n) for n in args.nodes.split(",")],
            args.per_device_batch or 64,
            args.steps or 40,
            args.warmup if args.warmup is not None else 10,
        )
        if args.json:
            args.json.write_text(json.dumps(report, indent=2))
        return

    import torch  # only to count GPUs

    cuda = torch.cuda.is_available() and not args.quick
    device = "cuda" if cuda else "cpu"
    n = args.devices or (torch.cuda.device_count() if cuda else 2)
    if n < 2:
        sys.exit("data-parallel scaling needs 2 or more devices")
    quick = args.quick or not cuda
    per_device = args.per_device_batch or (64 if quick else 128)
    steps = args.steps or (40 if quick else 60)
    warmup = args.warmup if args.warmup is not None else (10 if quick else 15)

    with tempfile.TemporaryDirectory() as tmp:
        one = run(spec(device, 1, per_device, steps, quick), Path(tmp), warmup)
        many = run(spec(device, n, per_device, steps, quick), Path(tmp), warmup)
    efficiency = many["samples_per_second"] / (n * one["samples_per_second"])
    print(f"{'devices':>8} {'device':<40} {'samples/s':>12} {'step ms':>9} {'wall s':>7}")
    for r in (one, many):
        print(
            f"{r['devices']:>8} {r['device'][:40]:<40} {r['samples_per_second']:>12,.1f} "
            f"{r['step_time_ms']:>9.1f} {r['wall_s_with_launch']:>7}"
        )
    goal = (
        "" if quick else f" (goal at 2 devices: >= 90%: {'met' if efficiency >= 0.9 else 'MISSED'})"
    )
    print(f"scaling efficiency at {n} devices: {efficiency:.1%}{goal}")
    if args.json:
        report = {"runs": [one, many], "efficiency": efficiency, "quick": quick}
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
