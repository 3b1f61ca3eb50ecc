"""Built-in components: deterministic datasets, model shapes, registry errors, losses."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

from amptrain.components import registry
from amptrain.components.base import DataInfo
from amptrain.components.sampling import BufferPool
from amptrain.contract.errors import InvalidSpecError
from amptrain.contract.spec import ComponentRef

SMALL = {
    "synthetic-classification": {"features": 8, "classes": 4, "num_samples": 50},
    "synthetic-images": {"channels": 3, "height": 16, "width": 12, "classes": 5},
    "synthetic-text": {"vocab_size": 16, "seq_len": 8, "num_samples": 30},
}
PAIRS = [
    ("mlp", "synthetic-classification"),
    ("mlp", "synthetic-images"),
    ("cnn", "synthetic-images"),
    ("transformer", "synthetic-text"),
]


def _dataset(name: str, seed: int = 0, **args: Any) -> Any:
    return registry.build_dataset(ComponentRef(name=name, args={**SMALL[name], **args}), seed=seed)


@pytest.mark.parametrize("name", list(SMALL))
def test_batches_are_a_pure_function_of_seed_and_indices(name: str) -> None:
    ds = _dataset(name)
    x, y = ds.batch(40, 70)  # crosses an epoch boundary of the small pools
    parts = [ds.batch(40, 13), ds.batch(53, 1), ds.batch(54, 56)]
    assert torch.equal(x, torch.cat([p[0] for p in parts]))
    assert torch.equal(y, torch.cat([p[1] for p in parts]))
    again = _dataset(name).batch(40, 70)  # a fresh instance (a resumed run) sees the same data
    assert torch.equal(x, again[0]) and torch.equal(y, again[1])
    assert not torch.equal(x, _dataset(name, seed=1).batch(40, 70)[0])
    assert x.shape == (70, *ds.info.input_shape)
    assert y.dtype == torch.long and int(y.min()) >= 0 and int(y.max()) < ds.info.num_classes


@pytest.mark.parametrize("name", list(SMALL))
def test_fill_writes_the_batch_in_parts_from_several_threads(name: str) -> None:
    ds = _dataset(name)
    x, y = ds.batch(40, 70)  # crosses an epoch boundary of the small pools
    inputs, targets = torch.full_like(x, -1), torch.full_like(y, -1)
    cuts = [(0, 13), (13, 30), (30, 70)]
    with ThreadPoolExecutor(3) as pool:
        parts = [pool.submit(ds.fill, 40 + a, inputs[a:b], targets[a:b]) for a, b in cuts]
        for part in parts:
            part.result()
    assert torch.equal(inputs, x) and torch.equal(targets, y)  # to the bit, as batch() has it


def test_pools_visit_every_sample_once_per_epoch_in_a_new_order() -> None:
    ds = _dataset("synthetic-classification")
    first, second = ds.batch(0, 50)[0], ds.batch(50, 50)[0]
    key = lambda t: sorted(map(tuple, t.tolist()))  # noqa: E731
    assert key(first) == key(second) == key(ds.inputs)
    assert not torch.equal(first, second)


def test_data_seed_changes_the_task_but_not_the_shapes() -> None:
    a, b = _dataset("synthetic-text"), _dataset("synthetic-text", data_seed=1)
    assert a.info == b.info and not torch.equal(a.inputs, b.inputs)


def test_synthetic_text_targets_are_next_tokens_of_a_sparse_chain() -> None:
    ds = _dataset("synthetic-text", branching=2)
    x, y = ds.batch(0, 30)
    assert torch.equal(x[:, 1:], y[:, :-1])
    pairs = {(a, b) for a, b in zip(x.flatten().tolist(), y.flatten().tolist(), strict=True)}
    successors = {a: {b for a2, b in pairs if a2 == a} for a, _ in pairs}
    assert max(len(s) for s in successors.values()) <= 2


def test_synthetic_images_have_any_size_and_class_dependent_means() -> None:
    ds = _dataset("synthetic-images", channels=1, height=40, width=24, noise=0.0)
    x, y = ds.batch(0, 64)
    assert x.shape == (64, 1, 40, 24)
    # Noise-free samples of one class are shifts of one pattern: same pixel multiset.
    same = (y == y[0]).nonzero().flatten()
    assert torch.allclose(x[same[0]].flatten().sort().values, x[same[-1]].flatten().sort().values)


def test_synthetic_images_are_built_a_batch_at_a_time_the_same_on_host_and_device() -> None:
    ds = _dataset("synthetic-images", classes=7)
    x, y = ds.batch(1000, 300)
    # The device path (gathers instead of a loop), run here on the CPU: the same samples.
    gx, gy = ds.gathered(1000, 300, torch.device("cpu"))
    assert torch.equal(x, gx) and torch.equal(y, gy)
    counts = torch.bincount(y, minlength=7)
    assert int(counts.min()) > 20  # every class drawn, none starved (300 draws, 7 classes)
    assert abs(float(x.mean())) < 0.1 and 0.9 < float(x.std()) < 1.3


@pytest.mark.heavy
def test_synthetic_images_on_a_device_keep_small_tables_not_the_patterns() -> None:
    # ImageNet-sized: the full patterns of 1000 classes of 3x224x224, wrap-padded, are 900 MiB.
    ds = _dataset("synthetic-images", classes=1000, height=224, width=224)
    x, y = ds.gathered(3, 2, torch.device("cpu"))  # the device path, run on the CPU
    assert x.shape == (2, 3, 224, 224) and x.is_contiguous(memory_format=torch.channels_last)
    assert ds._padded is None  # the device path never made the full patterns
    tables, bank = ds._on(torch.device("cpu"))
    held = [*tables.rows, *tables.stats, *(t for taps in tables.cols for t in taps), bank]
    assert sum(t.numel() * t.element_size() for t in held) < 64 * 2**20
    host_x, host_y = ds.batch(3, 2)  # builds the host's patterns: the same samples
    assert torch.equal(x, host_x) and torch.equal(y, host_y)


def test_synthetic_image_patterns_are_normalised_per_class() -> None:
    ds = _dataset("synthetic-images", classes=6)
    patterns = ds._tables.grid(torch.arange(6)).double()
    assert patterns.mean(dim=(1, 2, 3)).abs().max() < 1e-5
    assert (patterns.std(dim=(1, 2, 3)) - 1).abs().max() < 1e-5


@pytest.mark.gpu
def test_synthetic_images_on_cuda_equal_the_host_batch() -> None:
    ds = _dataset("synthetic-images")
    x, y = ds.batch(5, 64)
    gx, gy = ds.batch_on(5, 64, torch.device("cuda"))
    assert gx.is_cuda and torch.equal(gy.cpu(), y)
    assert gx.is_contiguous(memory_format=torch.channels_last)  # gathered so, not copied after
    # The same operations as on the host, one kernel each: equal to the bit, like on the CPU.
    assert torch.equal(gx.cpu(), x)


@pytest.mark.parametrize(("model", "data"), PAIRS)
def test_models_produce_logits_for_their_data(model: str, data: str) -> None:
    ds = _dataset(data)
    net = registry.build_model(ComponentRef(name=model, args={}), ds.info)
    x, y = ds.batch(0, 4)
    logits = net(x)
    expected = (
        (4, *ds.info.input_shape, ds.info.num_classes)
        if ds.info.task == "language_model"
        else (4, ds.info.num_classes)
    )
    assert logits.shape == expected
    loss = registry.loss_for(ds.info)(logits, y)
    assert loss.dim() == 0 and loss.dtype == torch.float32
    assert abs(float(loss.detach()) - math.log(ds.info.num_classes)) < 1.0  # starts near chance


def test_transformer_is_causal_and_its_head_is_tied() -> None:
    info = DataInfo("language_model", (8,), 20)
    net = registry.build_model(
        ComponentRef(name="transformer", args={"d_model": 16, "n_heads": 2}), info
    )
    x = torch.randint(20, (1, 8))
    y = x.clone()
    y[0, 5:] = (y[0, 5:] + 1) % 20
    torch.testing.assert_close(net(x)[0, :5], net(y)[0, :5])  # the future does not leak back
    assert not torch.allclose(net(x)[0, 5:], net(y)[0, 5:])
    # Tied: the only (vocab, d_model) parameter is the token embedding; no separate head.
    assert [n for n, p in net.named_parameters() if p.shape == (20, 16)] == ["tok.weight"]


def test_loss_is_fp32_under_low_precision_autocast() -> None:
    info = DataInfo("language_model", (4,), 1000)
    logits = torch.randn(2, 4, 1000) * 20
    targets = torch.randint(1000, (2, 4))
    exact = registry.loss_for(info)(logits, targets)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = registry.loss_for(info)(logits.bfloat16(), targets)
    assert low.dtype == torch.float32
    torch.testing.assert_close(low, exact, rtol=0.02, atol=0.05)


@pytest.mark.parametrize(
    ("kind", "ref", "message"),
    [
        (
            "model",
            {"name": "mlp", "args": {"widht": 3}},
            "model.args.widht: unexpected argument; allowed: depth, dropout, width",
        ),
        (
            "model",
            {"name": "transformer", "args": {"d_model": 10, "n_heads": 4}},
            "model.args.n_heads: must divide d_model (10); got 4",
        ),
        (
            "model",
            {"name": "nope"},
            "model.name: unknown model 'nope'; registered: mlp, cnn, transformer",
        ),
        (
            "model",
            {"name": "cnn"},
            "model.name: model 'cnn' takes images, but the dataset yields vectors",
        ),
        (
            "dataset",
            {"name": "synthetic-text", "args": {"vocab_size": 1.5}},
            "dataset.args.vocab_size: expected int, got float 1.5",
        ),
        ("dataset", {"name": "nope"}, "dataset.name: unknown dataset 'nope'"),
    ],
)
def test_registry_errors_name_the_field(kind: str, ref: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidSpecError) as err:
        if kind == "model":
            lm = ref["name"] == "transformer"
            info = DataInfo("language_model" if lm else "classification", (8,), 3)
            registry.build_model(ComponentRef(**ref), info)
        else:
            registry.build_dataset(ComponentRef(**ref), seed=0)
    assert err.value.message.startswith(message)
    assert err.value.code == "invalid_spec" and not err.value.retryable


def test_batch_buffers_are_reused_only_once_nothing_holds_them() -> None:
    pool = BufferPool(keep=2)
    first = pool.empty(4, 3)
    ptr = first.data_ptr()
    view = first[1:]
    del first
    assert pool.empty(4, 3).data_ptr() != ptr  # a view still uses it
    del view
    again = pool.empty(4, 3)
    assert again.data_ptr() == ptr and again.shape == (4, 3) and again.is_contiguous()
    saved = torch.nn.Linear(3, 2)(again.fill_(1.0))  # autograd saved it for backward
    del again
    assert pool.empty(4, 3).data_ptr() != ptr
    saved.sum().backward()  # the graph lets go
    assert pool.empty(4, 3).data_ptr() == ptr
    ds = _dataset("synthetic-images")
    x1, _ = ds.batch(0, 8)
    expected = x1.clone()
    x2, _ = ds.batch(8, 8)  # x1 is still held: a different buffer
    assert torch.equal(x1, expected) and x1.data_ptr() != x2.data_ptr()
