"""The memory a training process can get, read from the kernel's files as Linux lays them
out (here under a temporary root): MemAvailable, capped by cgroup v2 and v1 limits."""

from __future__ import annotations

from pathlib import Path

from amptrain.contract import host_memory

GiB = 2**30
MiB = 2**20


def machine(root: Path, *, total_gib: int, available_gib: int, cgroup: str) -> Path:
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/meminfo").write_text(
        f"MemTotal:       {total_gib * GiB // 1024} kB\n"
        f"MemFree:        1024 kB\n"
        f"MemAvailable:   {available_gib * GiB // 1024} kB\n"
    )
    (root / "proc/self/cgroup").write_text(cgroup)
    return root


def files(d: Path, **values: str) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for name, text in values.items():
        (d / name.replace("_", ".", 1)).write_text(text)


def test_without_a_cgroup_limit_it_is_the_kernels_estimate(tmp_path: Path) -> None:
    root = machine(tmp_path, total_gib=24, available_gib=20, cgroup="0::/\n")
    files(root / "sys/fs/cgroup", memory_current="123\n")  # the root: no memory.max
    assert host_memory.available(root) == 20 * GiB
    assert host_memory.total(root) == 24 * GiB


def test_a_v2_limit_anywhere_above_the_process_caps_both(tmp_path: Path) -> None:
    root = machine(tmp_path, total_gib=64, available_gib=60, cgroup="0::/box/job\n")
    base = root / "sys/fs/cgroup"
    files(base / "box", memory_max=f"{8 * GiB}\n", memory_current=f"{3 * GiB}\n")
    files(
        base / "box/job",
        memory_max="max\n",
        memory_current=f"{2 * GiB}\n",
        memory_stat=f"anon 1\ninactive_file {GiB}\n",
    )
    # The parent's 8 GiB limit holds 3 GiB in use: 5 GiB left, whatever the machine has.
    assert host_memory.available(root) == 5 * GiB
    assert host_memory.total(root) == 8 * GiB


def test_v1_counts_reclaimable_page_cache_as_free(tmp_path: Path) -> None:
    root = machine(tmp_path, total_gib=24, available_gib=20, cgroup="4:memory:/api/x\n1:cpu:/\n")
    files(
        root / "sys/fs/cgroup/memory/api/x",
        memory_limit_in_bytes=f"{4 * GiB}\n",
        memory_usage_in_bytes=f"{3 * GiB}\n",
        memory_stat=f"cache {2 * GiB}\ntotal_inactive_file {2 * GiB}\n",
    )
    files(root / "sys/fs/cgroup/memory", memory_limit_in_bytes="9223372036854771712\n")
    assert host_memory.available(root) == 3 * GiB  # 4 GiB limit, 1 GiB really used
    assert host_memory.total(root) == 4 * GiB


def test_a_container_sees_its_cgroup_at_the_mount_root(tmp_path: Path) -> None:
    root = machine(tmp_path, total_gib=24, available_gib=20, cgroup="0::/kubepods/pod1/c\n")
    files(root / "sys/fs/cgroup", memory_max=f"{512 * MiB}\n", memory_current=f"{100 * MiB}\n")
    assert host_memory.available(root) == 412 * MiB


def test_unknown_where_there_is_no_proc(tmp_path: Path) -> None:
    assert host_memory.available(tmp_path) is None and host_memory.total(tmp_path) is None


def test_this_machine_is_read() -> None:
    free, size = host_memory.available(), host_memory.total()
    assert free is not None and size is not None and 0 < free <= size
