"""What ``bench/load.py`` prints: the sampler of the API's and Redis's CPU and memory and
of the jobs' steps in SQL, and the report lines (recorder lag, GET latencies, RSS, CPU,
watchers)."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import psutil


class Sampler:
    """RSS of the API process; CPU of the service's processes (each with its children): the
    API, Redis and, when it runs apart, the recorder; plus the jobs' steps in SQL."""

    def __init__(self, services: dict[str, int], db_url: str, job_ids: list[str]) -> None:
        import sqlalchemy as sa

        from amptrain.store.db import make_engine

        self.services = {name: psutil.Process(pid) for name, pid in services.items()}
        self.api = self.services["API"]
        self.engine = make_engine(db_url)
        self.job_ids = job_ids
        self.query = sa.text("SELECT id, step FROM jobs WHERE status = 'running'")
        self.rss: list[tuple[float, float]] = []
        self.t0 = time.monotonic()
        self.cpu_mark = (self.t0, self._service_cpu())
        self.bench = psutil.Process()
        self.bench_mark = (self.t0, 0.0)
        self.bench_cpu()

    def _procs(self, p: psutil.Process) -> list[psutil.Process]:
        return [p, *p.children(recursive=True)]

    def _cpu(self, p: psutil.Process) -> float:
        return sum(sum(q.cpu_times()[:2]) for q in self._procs(p))

    def _service_cpu(self) -> dict[str, float]:
        return {name: self._cpu(p) for name, p in self.services.items()}

    def sample_rss(self) -> float:
        mib = sum(q.memory_info().rss for q in self._procs(self.api)) / 2**20
        self.rss.append((time.monotonic() - self.t0, mib))
        return mib

    def cpu(self) -> dict[str, float]:
        """Cores busy per service process since the previous call."""
        now, cpu = time.monotonic(), self._service_cpu()
        t, before = self.cpu_mark
        self.cpu_mark = (now, cpu)
        return {name: (cpu[name] - before[name]) / (now - t) for name in cpu}

    def bench_cpu(self) -> float:
        """Cores busy in this benchmark's own processes (producers and clients)."""
        now, cpu = time.monotonic(), self._cpu(self.bench) - sum(self._service_cpu().values())
        t, c = self.bench_mark
        self.bench_mark = (now, cpu)
        return (cpu - c) / (now - t)

    def sql_steps(self) -> dict[str, int]:
        with self.engine.connect() as conn:
            return {row.id: row.step for row in conn.execute(self.query)}

    def rss_summary(self, last_s: float) -> str:
        t = np.array([x for x, _ in self.rss])
        m = np.array([y for _, y in self.rss])
        tail = t >= t[-1] - last_s
        slope = float(np.polyfit(t[tail] / 60, m[tail], 1)[0]) if tail.sum() > 2 else float("nan")
        return (
            f"API RSS MiB start {m[0]:.0f} min {m.min():.0f} max {m.max():.0f} end {m[-1]:.0f}; "
            f"slope over the last {last_s / 60:.1f} min {slope:+.2f} MiB/min"
        )


def lag_line(published: Any, job_ids: list[str], sql: dict[str, int], rate: float) -> str:
    lags = np.array([max(0, published[i] - sql.get(j, 0)) for i, j in enumerate(job_ids)])
    pub = sum(published[:])
    rec = sum(sql.get(j, 0) for j in job_ids)
    return (
        f"recorder lag steps: max {lags.max()} p50 {np.percentile(lags, 50):.0f} "
        f"(= {lags.max() / rate:.1f} s / {np.percentile(lags, 50) / rate:.1f} s at {rate:.0f}/s); "
        f"published {pub} recorded {rec}"
    )


def get_line(probe: dict[str, Any] | None, poll: dict[str, Any] | None) -> str:
    parts = []
    if probe:
        for route, name in (("list", "GET /jobs?limit=20"), ("get", "GET /jobs/{id}")):
            s = probe[route]
            parts.append(
                f"{name} p50 {s['p50']:.1f} p95 {s['p95']:.1f} p99 {s['p99']:.1f} ms (n={s['n']})"
            )
    if poll:
        parts.append(
            f"pollers (timed in their own busy client) GET /jobs/{{id}} p50 {poll['p50']:.1f} p95 {poll['p95']:.1f} "
            f"p99 {poll['p99']:.1f} ms (n={poll['n']})"
        )
    return "; ".join(parts)


def report(
    label: str,
    args: Any,
    sampler: Sampler,
    published: Any,
    job_ids: list[str],
    latest: dict[str, Any],
    lag: bool = True,
) -> None:
    load1, load5, _ = os.getloadavg()
    service_cpu = sampler.cpu()
    lines = [f"[{label}] load average {load1:.1f} (5 min {load5:.1f})"]
    if lag:
        lines.append(lag_line(published, job_ids, sampler.sql_steps(), args.rate))
    probe = latest.get("probe", (None, {}))
    poll = latest.get("poll", (None, {}))
    lines.append(
        get_line(probe[0], poll[0])
        + f"; errors probe {probe[1].get('errors', 0)} pollers {poll[1].get('errors', 0)}"
    )
    lines.append(sampler.rss_summary(last_s=min(240.0, args.minutes * 60 * 0.8)))
    lines.append(
        "CPU cores busy: "
        + " ".join(f"{name} {cores:.2f}" for name, cores in service_cpu.items())
        + f" bench producers+clients {sampler.bench_cpu():.2f}"
    )
    if "watch" in latest:
        w, st = latest["watch"]
        lines.append(
            f"watchers: p50 {w['p50']:.0f} p95 {w['p95']:.0f} p99 {w['p99']:.0f} ms "
            f"(n={w['n']}); lost {st['lost']} repeated {st['repeated']} reconnects {st['drops']}"
        )
    print("\n  ".join(lines), flush=True)
