"""The image-folder path of ``bench/data_path.py --jpeg``: real photographs (scikit-learn's
two sample JPEGs) cut into 500x375 crops (about ImageNet's average image) written as JPEG
files in class folders, read by the ``image-folder`` dataset as a job reads them: a file
read beneath the data root, the header check, torchvision's decode, a random-resized crop
to 224 px, a flip, normalisation.

- images/s through the engine's Feeder with 0 loader processes (one background thread, the
  thread path) and with 1, 2, ... processes (:class:`~amptrain.engine.loader.ProcessFeeder`),
  and per process;
- whether the decode path releases the GIL: how long this thread waits while another one
  decodes a large JPEG, and the same batches built by 2 threads at once;
- the share of each step the Trainer waits on data with each process count (ResNet-50 bf16
  at batch 256 on CUDA, the built-in ``cnn`` at batch 32 on a CPU).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from sklearn.datasets import load_sample_images
from torchvision.io import decode_jpeg, encode_jpeg

from amptrain.components import registry
from amptrain.contract.spec import ComponentRef
from amptrain.engine.data import Feeder
from amptrain.engine.loader import ProcessFeeder
from bench.data_path import steady_wait, wait_spec

SIDE, CLASSES = 224, 4
PHOTO = (375, 500)  # height, width: about ImageNet's average training image
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def write_jpeg_folder(root: Path, count: int = 64) -> Path:
    """``count`` crops of the two sample photographs (PHOTO pixels, JPEG quality 90, about
    ImageNet's size and quality) under ``root/photos/<class>/``: the layout ``image-folder``
    reads. Returns ``root``."""
    photos = load_sample_images().images
    h, w = PHOTO
    for i in range(count):
        photo = photos[i % 2]
        top, left = 7 * i % (photo.shape[0] - h), 41 * i % (photo.shape[1] - w)
        folder = root / "photos" / f"class{i % CLASSES}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(photo[top : top + h, left : left + w]).save(
            folder / f"{i:04d}.jpg", quality=90
        )
    return root


def image_folder(root: Path) -> Any:
    """The ``image-folder`` dataset over the photos, as a job builds it: 224 px training
    views (a file read, the header check, decode, random-resized crop, flip, normalise)."""
    ref = ComponentRef(name="image-folder", args={"path": "photos", "image_size": SIDE})
    return registry.build_dataset(ref, seed=0, data_roots=[str(root)])


def _feeder(data: Any, device: torch.device, workers: int) -> Feeder:
    if workers:
        return ProcessFeeder(data, device, workers=workers)
    return Feeder(data, device, depth=2)


def decode_rate(data: Any, device: torch.device, workers: int, batch: int, n: int) -> float:
    """Sustained images/s through the Feeder (after 2 untimed batches: the fork, first touches)."""
    feeder = _feeder(data, device, workers)
    try:
        for i in range(2):
            feeder.get(i * batch, batch)
        started = time.perf_counter()
        for i in range(2, 2 + n):
            feeder.get(i * batch, batch)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return n * batch / (time.perf_counter() - started)
    finally:
        feeder.close()


def threads_speedup(data: Any, batch: int, n: int) -> float:
    """Images/s of 2 threads building batches at once over one thread's: ~2 if the decode
    path releases the GIL (and 2 cores are free), ~1 if it does not."""

    def run(offset: int) -> None:
        for i in range(n):
            data.batch((offset + i) * batch, batch)

    def timed(offsets: list[int]) -> float:
        # Background threads both times, as the Feeder's (the main thread's intra-op
        # parallelism behaves differently on a busy machine).
        threads = [threading.Thread(target=run, args=(k * n,)) for k in offsets]
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - started

    timed([0])  # untimed: first touches, lazy initialisation
    return 2 * timed([1]) / timed([2, 3])


def gil_probe() -> tuple[float, float]:
    """Whether ``decode_jpeg`` releases the GIL, measurable on a busy machine: one large
    JPEG (3416x3840) decoded in a thread while this thread wakes every millisecond; the
    decode's time and this thread's longest wait (as long as the decode: the GIL is held)."""
    photo = torch.from_numpy(load_sample_images().images[0]).permute(2, 0, 1)
    data = encode_jpeg(photo.repeat(1, 8, 6).contiguous(), quality=90)
    started = time.perf_counter()
    decode_jpeg(data)
    decode = time.perf_counter() - started
    worker = threading.Thread(target=decode_jpeg, args=(data,))
    worker.start()
    longest, last = 0.0, time.perf_counter()
    while worker.is_alive():
        time.sleep(0.001)
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    worker.join()
    return decode * 1e3, longest * 1e3


def data_wait(data: Any, device: torch.device, workers: int, steps: int) -> dict[str, Any]:
    """Train through the Trainer (``loader_workers``); the share of the steady state it
    spent waiting for data."""
    warmup = 5 if device.type == "cuda" else 1
    spec = wait_spec(device, SIDE, steps, warmup, loader_workers=workers)
    return steady_wait(spec, data, device, warmup)


def jpeg_report(device: torch.device, workers: list[int], steps: int) -> dict[str, Any]:
    """Runs and prints the JPEG path's measurements; returns them."""
    folder = Path(tempfile.mkdtemp(prefix="amptrain-jpeg-"))
    data = image_folder(write_jpeg_folder(folder))
    batch = 64 if device.type == "cuda" else 16
    print(
        f"jpeg path: image-folder, {PHOTO[1]}x{PHOTO[0]} JPEG files -> random-resized crop "
        f"{SIDE}px, batch {batch}"
    )
    decode_ms, longest_ms = gil_probe()
    print(
        f"  GIL: a thread's decode_jpeg of 3416x3840 takes {decode_ms:.0f} ms; meanwhile this "
        f"thread waited {longest_ms:.0f} ms at most (released if far below)"
    )
    speedup = threads_speedup(data, batch, 3)
    print(f"  2 threads building batches at once: {speedup:.2f}x one thread (needs 2 free cores)")
    rates, waits = {}, {}
    for n in workers:
        rates[n] = decode_rate(data, device, n, batch, 6)
        per = rates[n] / max(n, 1)
        how = f"{n} loader process(es)" if n else "1 thread (no processes)"
        print(f"  {how:26} {rates[n]:8,.0f} images/s  {per:7,.0f} per process")
    for n in workers:
        waits[n] = w = data_wait(data, device, n, steps)
        print(
            f"  data wait, {n} process(es) ({w['model']}, batch {w['batch']}): "
            f"{w['data_wait_fraction']:.2%} of {w['step_ms']:.1f} ms steps"
        )
    shutil.rmtree(folder, ignore_errors=True)
    return {
        "gil_probe_ms": {"decode": decode_ms, "longest_wait": longest_ms},
        "threads_speedup": speedup,
        "images_per_second": rates,
        "data_wait": waits,
    }
