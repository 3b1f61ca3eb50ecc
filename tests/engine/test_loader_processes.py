"""Loader processes (a torch DataLoader over whole micro-batch keys): the same batches bitwise
as threads and as ``batch()`` across restarts and halvings, exact resume, a worker's error
reaching the loop as itself, skipped files and class names as events, no orphans after
SIGKILL, and a bounded ``loader_workers``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError
from sklearn.datasets import load_sample_images
from torchvision.io import decode_jpeg, encode_jpeg
from torchvision.transforms.v2 import functional as TF

from amptrain.components.base import DataInfo
from amptrain.contract.errors import InvalidSpecError, PreemptedError
from amptrain.contract.records import (
    DATA_EVENT,
    DATA_SKIPPED_EVENT,
    MAX_CLASS_NAME_CHARS,
    MAX_CLASS_NAMES_SHOWN,
)
from amptrain.contract.spec import parse_spec
from amptrain.engine import Components, RunContext, Trainer
from amptrain.engine.data import Feeder
from amptrain.engine.data_events import data_details, shown
from amptrain.engine.loader import Built, ProcessFeeder, default_loader_workers, feeder_for
from tests.support.sinks import ListSink

CPU = torch.device("cpu")
SIDE = 16
BAD = 5  # every BAD-th position "skips" a file (recorded as a dataset with on_corrupt skip does)


def jpeg_crops(count: int = 12) -> list[torch.Tensor]:
    """Real photographs (scikit-learn's two sample JPEGs) cut into SIDE px crops, as JPEG bytes."""
    crops = []
    for i in range(count):
        photo = load_sample_images().images[i % 2]
        top, left = 37 * i % (photo.shape[0] - SIDE), 53 * i % (photo.shape[1] - SIDE)
        crop = np.ascontiguousarray(photo[top : top + SIDE, left : left + SIDE])
        crops.append(encode_jpeg(torch.from_numpy(crop).permute(2, 0, 1), quality=90))
    return crops


class JpegCrops:
    """Sample p: crop ``p % n`` decoded by torchvision, flipped on odd epochs, normalised; a
    pure function of p (CPU work only). Picklable: it holds bytes tensors only."""

    decode_in_processes = True
    class_names = ("china", "flower\nfield")

    def __init__(self, crops: list[torch.Tensor], fail_at: int | None = None) -> None:
        self.crops = crops
        self.info = DataInfo("classification", (3, SIDE, SIDE), 2)
        self.fail_at = fail_at
        self._skipped: list[str] = []

    def batch(self, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = [], []
        for p in range(start, start + size):
            if p == self.fail_at:
                raise InvalidSpecError(f"dataset.args.path: 'train/china/{p}.jpg' is not a JPEG")
            if p % BAD == 0:
                self._skipped.append(f"train/flower/bad-{p}.jpg")
            image = decode_jpeg(self.crops[p % len(self.crops)])
            if (p // len(self.crops)) % 2:
                image = TF.horizontal_flip(image)
            image = TF.to_dtype(image, torch.float32, scale=True)
            images.append(TF.normalize(image, [0.5] * 3, [0.25] * 3))
            labels.append(p % len(self.crops) % 2)
        return torch.stack(images), torch.tensor(labels)

    def take_skipped(self) -> list[str]:
        taken, self._skipped = self._skipped, []
        return taken


@pytest.fixture(scope="module")
def crops() -> list[torch.Tensor]:
    return jpeg_crops()


def test_processes_deliver_the_batches_threads_and_batch_give(crops: list[torch.Tensor]) -> None:
    data = JpegCrops(crops)
    # Rank 1 of 2 at batch 16: micro-batches of 4 at 8, 12, then 24, 28, ... (its share).
    keys = [(8, 4), (12, 4), (24, 4), (60, 4), (60, 2), (62, 2), (72, 2), (4, 8)]
    feeders = [
        ProcessFeeder(data, CPU, workers=2, end=200, share=(1, 2, 16)),
        Feeder(data, CPU, depth=2, end=200, share=(1, 2, 16)),
    ]
    try:
        for position, size in keys:
            expected = data.batch(position, size)
            for feeder in feeders:
                got = feeder.get(position, size)
                assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
        procs = feeders[0]
        # Predicted ahead but for the restarts: a resume (60), a halving (60, 2), a new start.
        assert procs.misses == 4 and procs.workers == 2
        assert procs.built == len(keys)
    finally:
        for feeder in feeders:
            feeder.close()


def test_torch_pins_a_built_batch_for_the_copy_to_the_device() -> None:
    # torch's pin-memory thread passes objects it does not know through unpinned.
    from torch.utils.data._utils.pin_memory import pin_memory

    built = Built((0, 2), (torch.zeros(2, 3), torch.zeros(2, dtype=torch.long)), ["a.jpg"])
    if not torch.cuda.is_available():
        pytest.skip("pinning needs CUDA")  # the CPU path never pins
    pinned = pin_memory(built)
    assert isinstance(pinned, Built) and pinned.key == (0, 2) and pinned.skipped == ["a.jpg"]
    assert pinned.batch is not None and all(t.is_pinned() for t in pinned.batch)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_loader_batches_arrive_on_the_device(crops: list[torch.Tensor]) -> None:
    data, cuda = JpegCrops(crops), torch.device("cuda")
    feeder = ProcessFeeder(data, cuda, workers=2, channels_last=True, end=64)
    try:
        for position in (0, 8, 16, 40):
            x, y = feeder.get(position, 8)
            assert x.is_cuda and x.is_contiguous(memory_format=torch.channels_last)
            expected = data.batch(position, 8)
            assert torch.equal(x.cpu(), expected[0]) and torch.equal(y.cpu(), expected[1])
    finally:
        feeder.close()


def test_a_loader_processes_error_reaches_the_loop_as_itself(crops: list[torch.Tensor]) -> None:
    feeder = ProcessFeeder(JpegCrops(crops, fail_at=9), CPU, workers=2, end=100)
    try:
        feeder.get(0, 4)
        with pytest.raises(InvalidSpecError) as info:
            feeder.get(8, 4)
        assert type(info.value) is InvalidSpecError
        assert str(info.value) == "dataset.args.path: 'train/china/9.jpg' is not a JPEG"
        assert info.value.to_dict()["message"] == str(info.value)
        assert "loader process" in info.value.__notes__[0]
        # Another position still works: the processes outlive a dataset's error.
        assert torch.equal(feeder.get(40, 2)[0], JpegCrops(crops).batch(40, 2)[0])
    finally:
        feeder.close()


def test_loader_workers_default_to_the_free_cores_and_only_for_decoding_datasets() -> None:
    cores = len(os.sched_getaffinity(0))
    assert default_loader_workers(1) == max(0, min(8, cores - 1))
    assert default_loader_workers(cores) == 0  # no core left beside the training threads
    auto = jpeg_spec(loader_workers=None)
    share = (0, 1, auto.batch_size)
    heavy = feeder_for(auto, JpegCrops([]), CPU, share, False, 0, None)
    assert isinstance(heavy, ProcessFeeder) == (default_loader_workers(1) > 0)
    light = feeder_for(auto, object(), CPU, share, False, 0, None)  # synthetic: threads
    assert type(light) is Feeder
    asked = feeder_for(jpeg_spec(loader_workers=3), object(), CPU, share, False, 0, None)
    assert isinstance(asked, ProcessFeeder) and asked.workers == 3
    none = feeder_for(jpeg_spec(loader_workers=0), JpegCrops([]), CPU, share, False, 0, None)
    assert type(none) is Feeder
    for feeder in (heavy, light, asked, none):
        feeder.close()  # nothing was forked: processes start with the first batch


@pytest.mark.parametrize("bad", [10**6, 65, -1, 2.5, "many"])
def test_loader_workers_is_bounded(bad: Any) -> None:
    with pytest.raises(ValidationError) as info:
        jpeg_spec(loader_workers=bad)
    assert info.value.errors()[0]["loc"] == ("loader_workers",)


def jpeg_spec(**overrides: Any) -> Any:
    return parse_spec(
        {
            "model": {"name": "mlp", "args": {"width": 16}},
            "dataset": {"name": "synthetic-images", "args": {"height": SIDE, "width": SIDE}},
            "max_steps": 6,
            "batch_size": 8,
            "grad_accum_steps": 2,
            "device": "cpu",
            "precision": "fp32",
            "optimizer": {"name": "sgd", "lr": 0.05},
            "checkpoint": {"every_steps": 3, "keep_last": 2},
            "telemetry": {"flush_every_steps": 2},
            **overrides,
        }
    )


def components(crops: list[torch.Tensor]) -> Components:
    torch.manual_seed(0)
    # Dropout: the training process's RNG must not be drawn from by starting the loader.
    model = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Dropout(0.5), torch.nn.Linear(3 * SIDE * SIDE, 2)
    )
    return Components(model=model, dataset=JpegCrops(crops), loss_fn=F.cross_entropy)


def test_resume_with_loader_processes_is_bitwise_exact(
    tmp_path: Path, crops: list[torch.Tensor]
) -> None:
    threads = ListSink()
    straight = Trainer(
        jpeg_spec(loader_workers=0), RunContext(None, sink=threads), components(crops)
    )
    straight.train()
    assert type(straight.feeder) is Feeder
    (data,) = threads.events(DATA_EVENT)
    assert (data["data"]["loader"], data["data"]["loader_workers"]) == ("threads", 0)
    every = [p for p in range(48) if p % BAD == 0]  # skipped in this process: gathered too
    assert threads.events(DATA_SKIPPED_EVENT)[-1]["data"]["count"] == len(every)

    ref: list[Trainer] = []
    stop = lambda: "preempt" if ref[0].step == 3 else None  # noqa: E731
    spec = jpeg_spec(loader_workers=2)
    first = Trainer(spec, RunContext(str(tmp_path), should_stop=stop), components(crops))
    ref.append(first)
    with pytest.raises(PreemptedError):
        first.train()
    sink = ListSink()
    second = Trainer(spec, RunContext(str(tmp_path), sink=sink), components(crops))
    assert second.train().resumed_from == 3
    assert isinstance(second.feeder, ProcessFeeder) and second.feeder.misses == 1
    for (name, a), b in zip(
        straight.model.named_parameters(), second.model.parameters(), strict=True
    ):
        assert torch.equal(a, b), name

    # The data events reached the sink: how it is fed, the class names (shown printable)...
    (data,) = sink.events(DATA_EVENT)
    assert data["data"] == {
        "loader": "processes",
        "loader_workers": 2,
        "class_count": 2,
        "class_names": ["china", "flower?field"],
    }
    # ... and every skipped file of steps 4-6 (positions 24..47, every BAD-th), newest last.
    skipped = sink.events(DATA_SKIPPED_EVENT)
    assert skipped, "no data_skipped event"
    bad = [p for p in range(24, 48) if p % BAD == 0]
    assert skipped[-1]["data"]["count"] == len(bad)
    assert skipped[-1]["data"]["newest"] == [f"train/flower/bad-{p}.jpg" for p in bad[-5:]]
    assert [e["data"]["count"] for e in skipped] == sorted({e["data"]["count"] for e in skipped})


KILLED_RUN = textwrap.dedent(
    """
    import psutil
    from amptrain.contract.spec import parse_spec
    from amptrain.engine import RunContext, Trainer

    spec = parse_spec({
        "model": {"name": "mlp", "args": {"width": 8}},
        "dataset": {"name": "synthetic-classification", "args": {"features": 4}},
        "max_steps": 10000000, "batch_size": 4, "device": "cpu", "loader_workers": 2,
    })
    told = []

    def stop():
        kids = psutil.Process().children()
        if kids and not told:
            print(" ".join(str(k.pid) for k in kids), flush=True)
            told.append(True)
        return None

    Trainer(spec, RunContext(None, should_stop=stop)).train()
    """
)


def test_loader_processes_die_with_a_training_process_killed_by_sigkill() -> None:
    proc = subprocess.Popen([sys.executable, "-c", KILLED_RUN], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2, pids  # the two loader processes, found while it trained
        workers = [psutil.Process(pid) for pid in pids]
        assert all(w.ppid() == proc.pid for w in workers)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    deadline = time.monotonic() + 20  # torch's workers look at their parent every 5 s
    while time.monotonic() < deadline and any(_alive(w) for w in workers):
        time.sleep(0.2)
    assert not any(_alive(w) for w in workers), [w.pid for w in workers if _alive(w)]


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class ManyClasses:
    """A dataset naming more classes, with longer names, than an event shows."""

    class_names = [f"class-{i:04d}-" + "x" * 100 + "\x1b[31m" for i in range(1500)]


def test_the_data_event_shows_a_bounded_list_of_printable_class_names() -> None:
    details = data_details(Feeder(ManyClasses(), CPU, depth=0))
    assert details["class_count"] == 1500
    names = details["class_names"]
    assert len(names) == MAX_CLASS_NAMES_SHOWN and names[0].startswith("class-0000-xx")
    assert all(len(n) == MAX_CLASS_NAME_CHARS and n.isprintable() for n in names)
    assert shown("train/a\nb.jpg") == "train/a?b.jpg"


def test_a_prefetch_window_larger_than_the_memory_is_refused_naming_both_numbers() -> None:
    """64 loader processes each holding 2 micro-batches of 65,536 images of 3x256x256 ahead
    (6.6 TB of shared memory) fit no machine: ``too_large`` before any process is started,
    naming the window and what the process has."""
    from amptrain.contract.errors import TooLargeError
    from amptrain.contract.sizing import format_bytes

    spec = parse_spec(
        {
            "model": {"name": "mlp", "args": {"width": 1}},
            "dataset": {"name": "synthetic-images", "args": {"height": 256, "width": 256}},
            "max_steps": 1,
            "batch_size": 65_536,
            "device": "cpu",
            "loader_workers": 64,
        }
    )
    data = JpegCrops([])
    data.info = DataInfo("classification", (3, 256, 256), 10)
    with pytest.raises(TooLargeError) as err:
        feeder_for(spec, data, torch.device("cpu"), (0, 1, 65_536), False, 2, None)
    window = 129 * 65_536 * (3 * 256 * 256 * 4 + 8)  # inputs as float32, int64 labels
    assert str(err.value).startswith(
        "too large for this worker: the loader's prefetch window (129 micro-batches of 65536 "
        f"samples) needs about {format_bytes(window)} of memory, but the training process has "
    )
