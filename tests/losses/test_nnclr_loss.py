"""nnclr_loss: the paper's formula written here (Dwibedi et al. 2021, eq. 2 with the
prediction head, symmetrised as in their Algorithm 1), the nearest-neighbour lookup, the
support set's fill, wrap and "not used until full" rule, 2 gloo processes against one
process on the global batch (loss, gradients and the one support set, which every rank
fills with every rank's projections and searches whole), the queue through checkpoints
on 2 processes (and checkpoints of the former per-rank queues), config errors, and
VISSL's name ``nnclr_info_nce_loss``."""

from __future__ import annotations

import math
import os
import tempfile
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.losses import build_loss
from vissl.losses.nnclr_loss import NNCLRLoss
from vissl.utils.hydra_config import hydra_compose_and_validate
from vissl.utils.test_utils import spawn_gloo

KEY = "config.LOSS.nnclr_loss"
T = 0.1


# ----------------------------------------------------------------------------- reference
def _unit(v: torch.Tensor) -> torch.Tensor:
    return v / torch.sqrt((v * v).sum())


def ref_nearest(z: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
    """NN(z, Q): the entry of Q of highest cosine similarity with z, normalised (loop)."""
    best, best_cos = None, -math.inf
    for q in support:
        cos = float((z.double() @ q.double()) / (z.double().norm() * q.double().norm()))
        if cos > best_cos:
            best, best_cos = q, cos
    assert best is not None
    return _unit(best.double())


def ref_nnclr(
    p: torch.Tensor, z: torch.Tensor, supports: list[torch.Tensor | None], temperature: float = T
) -> torch.Tensor:
    """The symmetrised NNCLR loss of a view-major batch of ``n`` samples (rows ``0..n-1``
    view 1, ``n..2n-1`` view 2), written from the paper, in float64:

        L_i = -log exp(NN(z1_i) . p2_i / T) / sum_k exp(NN(z1_i) . p2_k / T)   (and 1 <-> 2)
        loss = mean_i (L_i(1 -> 2) + L_i(2 -> 1)) / 2

    ``supports[i]`` is sample i's support set, or None when it is not full yet: then the
    positive is z itself. Differentiable in ``p`` only (the positives are constants)."""
    n = p.shape[0] // 2
    total = torch.zeros((), dtype=torch.float64)
    for anchor_view, other_view in ((0, 1), (1, 0)):
        others = [_unit(p[other_view * n + k].double()) for k in range(n)]
        for i in range(n):
            zi = z[anchor_view * n + i].detach().double()
            support = supports[i]
            positive = _unit(zi) if support is None else ref_nearest(zi, support)
            logits = torch.stack([positive @ o / temperature for o in others])
            total = total - (logits[i] - torch.logsumexp(logits, dim=0))
    return total / (2 * n)


class _TinyModel(nn.Module):
    """trunk + [projector, predictor] heads, chained, like the base model (no BatchNorm,
    so that 2 ranks and one process compute the same projections)."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.trunk = nn.Linear(5, 6)
        self.heads = nn.ModuleList(
            [nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8)), nn.Linear(8, 8)]
        )

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        out = self.trunk(x)
        for head in self.heads:
            out = head(out)
        return [out]


def _bound(queue_size: int = 6, seed: int = 0) -> tuple[NNCLRLoss, _TinyModel]:
    loss = NNCLRLoss(temperature=T, queue_size=queue_size, embedding_dim=8)
    model = _TinyModel(seed)
    loss.bind_model(model)
    return loss, model


def _set_queue(loss: NNCLRLoss, queue: torch.Tensor, written: int) -> None:
    loss.load_state_dict({"queue": queue, "written": torch.tensor(written)})


def _fill(loss: NNCLRLoss, seed: int) -> torch.Tensor:
    """A full support set of random unit vectors."""
    g = torch.Generator().manual_seed(seed)
    queue = nn.functional.normalize(torch.randn(loss.queue_size, 8, generator=g), dim=1)
    _set_queue(loss, queue, loss.queue_size)
    return queue


# ----------------------------------------------------------------------------- formula
def test_full_queue_matches_the_papers_formula_and_gradients() -> None:
    loss, model = _bound()
    queue = _fill(loss, seed=1)
    x = torch.randn(10, 5, generator=torch.Generator().manual_seed(2))
    p = model(x)[0]
    z = loss.capture.value
    assert z is not None
    value = loss(p)
    value.backward()
    grads = {n: q.grad.clone() for n, q in model.named_parameters()}

    model.zero_grad()
    p_ref = model(x)[0]
    z_ref = loss.capture.take("test")
    ref = ref_nnclr(p_ref, z_ref, [queue] * 5)
    assert value.item() == pytest.approx(ref.item(), rel=1e-5)
    ref.backward()
    for n, q in model.named_parameters():
        torch.testing.assert_close(grads[n], q.grad.float(), rtol=1e-4, atol=1e-6)
    # the positives are constants: the projector gets gradients only through the predictor
    assert grads["heads.0.0.weight"].abs().sum() > 0


def test_the_gradient_flows_through_the_predictions_only() -> None:
    loss = NNCLRLoss(temperature=T, queue_size=4, embedding_dim=8)
    loss.capture = SimpleNamespace(take=lambda _: z)  # type: ignore[assignment]
    for filled in (False, True):
        if filled:
            _fill(loss, seed=3)
        p = torch.randn(6, 8, requires_grad=True)
        z = torch.randn(6, 8, requires_grad=True)
        loss(p).backward()
        assert p.grad is not None and p.grad.abs().sum() > 0
        assert z.grad is None


def test_a_bf16_autocast_still_computes_in_fp32() -> None:
    loss, model = _bound()
    queue = _fill(loss, seed=4)
    x = torch.randn(8, 5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        p = model(x)[0]
        z = loss.capture.value
        value = loss(p)
    assert value.dtype == torch.float32
    assert value.item() == pytest.approx(ref_nnclr(p, z, [queue] * 4).item(), rel=1e-5)


# ----------------------------------------------------------------------------- lookup
def test_nearest_neighbour_is_the_support_entry_of_highest_cosine() -> None:
    """Known neighbours: the support set is the 8 axes and their opposites; each z is a
    noisy, rescaled copy of one of them, so its neighbour is that entry (not the one of
    largest raw dot product: z is normalised before the lookup)."""
    loss = NNCLRLoss(temperature=T, queue_size=16, embedding_dim=8)
    axes = torch.cat([torch.eye(8), -torch.eye(8)])
    _set_queue(loss, axes, 16)
    g = torch.Generator().manual_seed(5)
    which = torch.tensor([3, 9, 0, 15])
    z = axes[which] * torch.tensor([[5.0], [0.1], [2.0], [30.0]])
    z = z + 0.05 * torch.randn(4, 8, generator=g)
    got = loss.support(nn.functional.normalize(z, dim=1))
    torch.testing.assert_close(got, axes[which])
    for row, k in zip(z, which, strict=True):
        torch.testing.assert_close(ref_nearest(row, axes).float(), axes[k])


def test_lookup_carries_no_gradient() -> None:
    loss = NNCLRLoss(temperature=T, queue_size=4, embedding_dim=8)
    _fill(loss, seed=6)
    z = nn.functional.normalize(torch.randn(3, 8), dim=1).requires_grad_()
    assert not loss.support(z).requires_grad


# ----------------------------------------------------------------------------- queue
def test_queue_fills_wraps_and_is_used_only_once_full() -> None:
    """queue_size 10, 4 samples per step: steps 1-3 write 4, 8, 12 projections of view 1;
    the support set is used from step 4 (12 >= 10), never before (even though the
    third step's lookup could have found 8 written rows)."""
    loss, model = _bound(queue_size=10)
    g = torch.Generator().manual_seed(7)
    written: list[torch.Tensor] = []
    for step in range(4):
        x = torch.randn(8, 5, generator=g)
        with torch.no_grad():
            p = model(x)[0]
        z = loss.capture.value
        assert z is not None
        full = step == 3
        supports = [loss.queue.clone()] * 4 if full else [None] * 4
        assert loss.is_full().item() is full
        assert loss(p).item() == pytest.approx(ref_nnclr(p, z, supports).item(), rel=1e-5)
        written.extend(nn.functional.normalize(z[:4], dim=1))
        assert loss.written.item() == 4 * (step + 1)
        # slot j holds the last projection written at a position = j (mod 10)
        for slot in range(10):
            last = (
                max(i for i in range(len(written)) if i % 10 == slot)
                if len(written) > slot
                else None
            )
            if last is None:
                assert torch.equal(loss.queue[slot], torch.zeros(8))
            else:
                torch.testing.assert_close(loss.queue[slot], written[last])


def test_a_batch_larger_than_the_queue_keeps_its_last_rows_in_order() -> None:
    loss = NNCLRLoss(temperature=T, queue_size=3, embedding_dim=8)
    rows = nn.functional.normalize(torch.randn(4, 8), dim=1)
    loss.enqueue(rows)
    # as if written one by one: rows 0, 1, 2 to slots 0, 1, 2, then row 3 to slot 0
    torch.testing.assert_close(loss.queue, rows[[3, 1, 2]])
    assert loss.written.item() == 4
    loss.enqueue(rows[:2])  # slots 1, 2
    torch.testing.assert_close(loss.queue, rows[[3, 0, 1]])


def test_evaluation_does_not_enqueue() -> None:
    loss, model = _bound(queue_size=4)
    loss.eval()
    loss(model(torch.randn(6, 5))[0])
    assert loss.written.item() == 0 and not loss.queue.any()


def test_the_queue_is_in_state_dict_and_another_shape_is_not_loaded() -> None:
    loss = NNCLRLoss(temperature=T, queue_size=4, embedding_dim=8)
    queue = _fill(loss, seed=8)
    state = loss.state_dict()
    assert set(state) == {"queue", "written"}
    other = NNCLRLoss(temperature=T, queue_size=4, embedding_dim=8)
    other.load_state_dict(state)
    assert torch.equal(other.queue, queue) and other.written.item() == 4
    smaller = NNCLRLoss(temperature=T, queue_size=3, embedding_dim=8)
    smaller.load_state_dict(state)  # another shape: starts empty (a warning)
    assert smaller.written.item() == 0 and not smaller.queue.any()
    with pytest.raises(RuntimeError, match="Unexpected"):  # still strict for other keys
        other.load_state_dict({**state, "other": torch.zeros(1)})


def test_a_one_process_checkpoint_of_the_per_rank_queue_loads_as_the_whole_queue() -> None:
    """Before the support set was global, a checkpoint held the queue under
    ``per_rank[0]["loss"]`` and an empty ``classy_state_dict["loss"]``: both still load.
    A queue that wrapped comes back oldest entry first; one not yet full keeps its
    count (it is used once full, as before)."""
    old = nn.functional.normalize(torch.randn(5, 8), dim=1)
    loss = NNCLRLoss(temperature=T, queue_size=5, embedding_dim=8)
    loss.load_state_dict({})  # the old classy_state_dict["loss"]
    loss.load_rank_state_dict({"queue": old, "written": torch.tensor(12)})
    # 12 written into 5 slots: slot 12 % 5 = 2 is the oldest
    torch.testing.assert_close(loss.queue, old[[2, 3, 4, 0, 1]])
    assert loss.written.item() == 5 and loss.is_full().item()
    partial = NNCLRLoss(temperature=T, queue_size=5, embedding_dim=8)
    partial.load_rank_state_dict({"queue": old, "written": torch.tensor(3)})
    torch.testing.assert_close(partial.queue[:3], old[:3])
    assert partial.written.item() == 3 and not partial.is_full().item()
    wide = NNCLRLoss(temperature=T, queue_size=5, embedding_dim=4)
    wide.load_rank_state_dict({"queue": old, "written": torch.tensor(5)})  # a warning
    assert wide.written.item() == 0


# ----------------------------------------------------------------------------- 2 ranks
WORLD, B = 2, 3


def _inputs(rank: int) -> torch.Tensor:
    """Rank ``rank``'s (2 * B, 5) inputs, view-major."""
    g = torch.Generator().manual_seed(40 + rank)
    x1 = torch.randn(B, 5, generator=g)
    return torch.cat([x1, x1 + 0.3 * torch.randn(B, 5, generator=g)])


def _start_queue() -> torch.Tensor:
    """The support set every rank starts from (5 entries, full)."""
    g = torch.Generator().manual_seed(60)
    return nn.functional.normalize(torch.randn(5, 8, generator=g), dim=1)


def _ddp_worker(rank: int, world: int) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = _TinyModel(seed=11)
    loss = NNCLRLoss(temperature=T, queue_size=5, embedding_dim=8)
    loss.bind_model(model)
    _set_queue(loss, _start_queue(), 5)
    ddp = DDP(model)
    value = loss(ddp(_inputs(rank)))
    value.backward()
    return {
        "loss": value.item(),
        "grads": {n: q.grad.clone() for n, q in model.named_parameters()},
        "queue": loss.queue.clone(),
        "written": loss.written.item(),
    }


def _global_batch() -> torch.Tensor:
    per_rank = [_inputs(r) for r in range(WORLD)]
    return torch.cat([x[:B] for x in per_rank] + [x[B:] for x in per_rank])


def test_two_ranks_equal_one_process_on_the_global_batch_with_one_support_set() -> None:
    """Both ranks search the same support set and contrast with the predictions of the
    whole global batch. The mean of the ranks' losses is the loss of one process on the
    global batch (and the paper's formula), DDP's averaged gradient is its gradient, and
    after the step every rank's queue is that process's: the view-1 projections of both
    ranks, in rank order."""
    results = spawn_gloo(_ddp_worker, WORLD)
    model = _TinyModel(seed=11)
    one = NNCLRLoss(temperature=T, queue_size=5, embedding_dim=8)
    one.bind_model(model)
    _set_queue(one, _start_queue(), 5)
    x = _global_batch()
    value = one(model(x))
    value.backward()
    mean = sum(r["loss"] for r in results) / WORLD
    assert mean == pytest.approx(value.item(), rel=1e-5)
    assert results[0]["loss"] != pytest.approx(results[1]["loss"], rel=1e-3)
    for n, q in model.named_parameters():
        for r in results:
            torch.testing.assert_close(r["grads"][n], q.grad, rtol=1e-4, atol=1e-6)
    # a gradient far above atol: 1 / world_size of it would fail the comparison
    assert model.heads[1].weight.grad.abs().max() > 1000 * 1e-6
    for r in results:
        torch.testing.assert_close(r["queue"], one.queue)
        assert r["written"] == one.written.item() == 5 + WORLD * B

    # the paper's formula, written in the test, over the global batch and the one queue
    reference = _TinyModel(seed=11)
    capture = NNCLRLoss(temperature=T, queue_size=5, embedding_dim=8)
    capture.bind_model(reference)
    p = reference(x)[0]
    z = capture.capture.take("test")
    ref = ref_nnclr(p, z, [_start_queue()] * (WORLD * B))
    assert mean == pytest.approx(ref.item(), rel=1e-5)
    # 6 projections (rank 0's 3, then rank 1's) into 5 slots from slot 5 % 5 = 0: row 0
    # lands in slot 0 and is overwritten by row 5, rank 1's last
    z1 = nn.functional.normalize(z[: WORLD * B].detach(), dim=1)
    torch.testing.assert_close(results[1]["queue"], z1[[5, 1, 2, 3, 4]])


def _shared_queue_worker(rank: int, world: int) -> dict[str, Any]:
    """Step 1 from an empty queue of 2 * B: every rank writes its z1, so the queue is
    full and the same on both ranks. Step 2 (the same weights): rank 1 is given rank
    0's step-1 inputs, so its nearest neighbours must be rank 0's entries."""
    model = _TinyModel(seed=11)
    loss = NNCLRLoss(temperature=T, queue_size=WORLD * B, embedding_dim=8)
    loss.bind_model(model)
    with torch.no_grad():
        loss(model(_inputs(rank)))
        z1 = nn.functional.normalize(model.heads[0](model.trunk(_inputs(rank)[:B])), dim=1)
        queue = loss.queue.clone()
        x = _inputs(0) if rank == 1 else _inputs(rank)
        z = nn.functional.normalize(model.heads[0](model.trunk(x[:B])), dim=1)
        index = (z @ loss.queue.t()).argmax(dim=1)
        positives = loss.support(z)
    return {
        "z1": z1,
        "queue": queue,
        "full": bool(loss.is_full()),
        "index": index,
        "positives": positives,
    }


def test_rank_1_holds_and_finds_rank_0s_projections() -> None:
    results = spawn_gloo(_shared_queue_worker, WORLD)
    for r in results:
        assert r["full"]
        # the one support set: rank 0's view-1 projections, then rank 1's, on every rank
        torch.testing.assert_close(r["queue"], torch.cat([results[0]["z1"], results[1]["z1"]]))
    # rank 1's search covers rank 0's entries: its neighbours are rows 0..B-1
    assert results[1]["index"].tolist() == list(range(B))
    torch.testing.assert_close(results[1]["positives"], results[0]["z1"])


def _fake_task(loss: NNCLRLoss, model: nn.Module) -> Any:
    """What checkpoint_state / restore_checkpoint_state read from a task."""
    from vissl.trainer.precision import Precision

    return SimpleNamespace(
        base_model=model,
        loss=loss,
        meters=[],
        hooks=[],
        optimizer=None,
        precision=Precision(),
        phase_idx=0,
        train_phase_idx=0,
        num_updates=4,
        iteration=4,
        local_iteration_num=4,
        train=True,
        config=AttrDict({"SEED_VALUE": 0}),
        phase_loss_state=lambda: (0.0, 0),
        pending_resume=None,
    )


def _old_queue(rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(70 + rank)
    return nn.functional.normalize(torch.randn(5, 8, generator=g), dim=1)


def _checkpoint_worker(rank: int, world: int, path: str, old_format: bool) -> dict[str, Any]:
    """Save a checkpoint on 2 processes and restore it into a fresh loss on each.
    ``old_format``: the checkpoint as today's main wrote it, each rank's own queue of 5
    under ``per_rank[r]["loss"]`` (7 and 8 written) and nothing in
    ``classy_state_dict["loss"]``; the run resumes with one queue of 10."""
    from vissl.trainer.checkpointing import checkpoint_state, restore_checkpoint_state
    from vissl.utils.distributed import barrier

    loss, model = _bound(queue_size=10, seed=12)
    _set_queue(loss, torch.cat([_old_queue(0), _old_queue(1)]), 13)
    state = checkpoint_state(_fake_task(loss, model), phase_complete=True)
    if rank == 0:
        if old_format:
            state["classy_state_dict"]["loss"] = state["loss"] = {}
            for r, per_rank in enumerate(state["classy_state_dict"]["per_rank"]):
                per_rank["loss"] = {"queue": _old_queue(r), "written": torch.tensor(7 + r)}
        torch.save(state, path)
    barrier()
    fresh, fresh_model = _bound(queue_size=10, seed=13)
    restore_checkpoint_state(_fake_task(fresh, fresh_model), torch.load(path, weights_only=False))
    return {"queue": fresh.queue.clone(), "written": fresh.written.item()}


def test_the_support_set_is_saved_once_and_restored_on_every_rank() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "state.torch")
        results = spawn_gloo(_checkpoint_worker, WORLD, path, False)
        saved = torch.load(path, weights_only=False)
    expected = torch.cat([_old_queue(0), _old_queue(1)])
    assert torch.equal(saved["classy_state_dict"]["loss"]["queue"], expected)
    assert all("loss" not in r for r in saved["classy_state_dict"]["per_rank"])
    for r in results:
        assert torch.equal(r["queue"], expected) and r["written"] == 13


def test_a_two_process_checkpoint_of_per_rank_queues_loads_them_in_rank_order() -> None:
    """Each old queue oldest entry first (rank 0: 7 written into 5 slots, the oldest in
    slot 2; rank 1: 8 written, slot 3), rank 0's first: the 10 entries fill the new
    global queue, the same on both ranks."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "state.torch")
        results = spawn_gloo(_checkpoint_worker, WORLD, path, True)
    expected = torch.cat([_old_queue(0)[[2, 3, 4, 0, 1]], _old_queue(1)[[3, 4, 0, 1, 2]]])
    for r in results:
        torch.testing.assert_close(r["queue"], expected)
        assert r["written"] == 10


# ----------------------------------------------------------------------------- config
def _config(*overrides: str) -> Any:
    _, cfg = hydra_compose_and_validate(["config=test/integration_test/quick_nnclr", *overrides])
    return cfg


def test_quick_config_builds_and_infers_the_width() -> None:
    cfg = _config("config.LOSS.nnclr_loss.embedding_dim=5")
    loss = build_loss(cfg.LOSS, cfg)
    assert isinstance(loss, NNCLRLoss)
    assert (loss.embedding_dim, loss.queue_size, loss.temperature) == (32, 16, 0.1)


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("config.MODEL.HEAD.PARAMS=[[mlp,{dims:[128,32]}]]", "projector and a predictor"),
        (
            "config.MODEL.HEAD.PARAMS=[[mlp,{dims:[128,32]}],[mlp,{dims:[32,16]}]]",
            "widths must match",
        ),
        (
            "config.MODEL.HEAD.PARAMS=[[mlp,{dims:[128,32]}],[mlp,{dims:[16,32]}]]",
            "input width 16",
        ),
        ("config.DATA.TRAIN.TRANSFORMS.0.num_times=3", "exactly 2 views"),
    ],
)
def test_config_mistakes_are_config_errors(override: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        cfg = _config(override)
        build_loss(cfg.LOSS, cfg)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("temperature", 0),
        ("temperature", -0.1),
        ("temperature", "a"),
        ("queue_size", 0),
        ("queue_size", 2.5),
        ("queue_size", True),
        ("embedding_dim", -1),
    ],
)
def test_bad_values_name_their_key(key: str, value: Any) -> None:
    with pytest.raises(ConfigError) as err:
        build_loss(AttrDict(name="nnclr_loss", nnclr_loss={key: value}))
    assert err.value.key_path == f"{KEY}.{key}"


def test_wrong_width_and_missing_bind_are_explained() -> None:
    loss = NNCLRLoss(temperature=T, queue_size=4, embedding_dim=8)
    with pytest.raises(RuntimeError, match="bind_model"):
        loss(torch.randn(4, 8))
    with pytest.raises(ConfigError, match="embedding_dim is 8"):
        loss(torch.randn(4, 6))


# ----------------------------------------------------------------------------- host reads
def test_a_step_reads_nothing_back_from_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether the support set is used is decided on the device (torch.where on the
    count): the forward, the enqueue and the backward never turn a tensor into a Python
    value, before or after the queue is full."""
    loss, model = _bound(queue_size=6)
    batches = [torch.randn(8, 5) for _ in range(3)]

    def refuse(self: torch.Tensor, *args: Any) -> Any:
        raise AssertionError("a host read of a tensor during the step")

    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    for x in batches:  # 4, 8, 12 written: the third step uses the full queue
        loss(model(x)).backward()
    monkeypatch.undo()
    assert loss.written.item() == 12


# ----------------------------------------------------------------------------- VISSL's name
VISSL = [
    "config.LOSS.name=nnclr_info_nce_loss",
    "config.LOSS.nnclr_info_nce_loss.temperature=0.2",
    "config.LOSS.nnclr_info_nce_loss.queue_size=24",
]


def test_vissl_name_and_keys_build_the_nnclr_loss() -> None:
    """``nnclr_info_nce_loss`` (VISSL's NNCLR pull request) with its keys: the width is
    inferred into ``buffer_params.embedding_dim``, and the loss is nnclr_loss's."""
    cfg = _config(*VISSL, "config.LOSS.nnclr_info_nce_loss.buffer_params.embedding_dim=5")
    loss = build_loss(cfg.LOSS, cfg)
    assert isinstance(loss, NNCLRLoss) and type(loss).__name__ == "NNCLRInfoNCELoss"
    assert (loss.embedding_dim, loss.queue_size, loss.temperature) == (32, 24, 0.2)
    assert cfg.LOSS.nnclr_info_nce_loss.buffer_params.embedding_dim == 32
    # the same value as nnclr_loss on the same model and batch
    model = _TinyModel()
    ours = NNCLRLoss(temperature=0.2, queue_size=6, embedding_dim=8)
    vissl = build_loss(
        AttrDict(
            name="nnclr_info_nce_loss",
            nnclr_info_nce_loss={
                "temperature": 0.2,
                "queue_size": 6,
                "buffer_params": {"embedding_dim": 8, "world_size": 1},
            },
        )
    )
    x = torch.randn(8, 5)
    values = []
    for loss in (ours, vissl):
        loss.bind_model(model)
        _fill(loss, seed=9)
        values.append(loss(model(x)[0]).item())
    assert values[0] == pytest.approx(values[1], rel=1e-6)


def test_vissl_prediction_head_params_must_be_the_predictor_head() -> None:
    predictor = "{dims:[32,64,32],use_relu:true,use_bn:true}"
    cfg = _config(*VISSL, f"config.LOSS.nnclr_info_nce_loss.prediction_head_params={predictor}")
    assert build_loss(cfg.LOSS, cfg).embedding_dim == 32  # the last head's arguments: fine
    key = "config.LOSS.nnclr_info_nce_loss.prediction_head_params"
    for overrides in (
        [f"{key}={{dims:[32,128,32],use_relu:true,use_bn:true}}"],  # another predictor
        [  # VISSL's layout: the predictor only in the loss
            f"{key}={predictor}",
            "config.MODEL.HEAD.PARAMS=[[mlp,{dims:[128,64,32],use_relu:true,use_bn:true}]]",
        ],
    ):
        cfg = _config(*VISSL, *overrides)
        with pytest.raises(ConfigError, match="last in config.MODEL.HEAD.PARAMS") as err:
            build_loss(cfg.LOSS, cfg)
        assert err.value.key_path == key


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"queue_size": 0}, "queue_size"),
        ({"temperature": -1}, "temperature"),
        ({"buffer_params": {"embedding_dim": 0}}, "buffer_params.embedding_dim"),
        ({"buffer_params": {"embedding_size": 8}}, "buffer_params.embedding_size"),
        ({"embedding_dim": 8}, "embedding_dim"),  # nnclr_loss's key, not VISSL's
    ],
)
def test_vissl_key_errors_name_vissls_keys(params: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_loss(AttrDict(name="nnclr_info_nce_loss", nnclr_info_nce_loss=params))
    assert err.value.key_path == f"config.LOSS.nnclr_info_nce_loss.{key}"


def test_unknown_nnclr_loss_key_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        build_loss(AttrDict(name="nnclr_loss", nnclr_loss={"queue_length": 8}))
    assert err.value.key_path == f"{KEY}.queue_length"
