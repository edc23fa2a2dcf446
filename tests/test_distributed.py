"""One rank of a sharded step (``profile(world_size=N, parallelize=fn)``) against closed forms:
FSDP2's per-rank parameter, gradient and AdamW-state bytes, its all-gather and reduce-scatter
volumes (NCCL's definitions), DDP's all-reduce of every gradient, and a Megatron-style tensor
parallel MLP's FLOPs and all-reduce. Real (CPU tensors) and analytic (meta, no memory) alike."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys

import pytest
import torch
from torch import nn

from pytest_modelprof import ProfileError, profile

dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("this build of PyTorch has no torch.distributed", allow_module_level=True)

from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

WIDTH, LAYERS, WORLD, BATCH = 256, 4, 4, 8
FLOAT = 4


def stack() -> nn.Sequential:
    return nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])


def fsdp(model: nn.Module, mesh) -> None:
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def total(collectives, kind: str, phase: str | None = None) -> tuple[int, int, float]:
    rows = [c for c in collectives if c.kind == kind and (phase is None or c.phase == phase)]
    return sum(c.calls for c in rows), sum(c.bytes for c in rows), sum(c.bus_bytes for c in rows)


@pytest.fixture(params=["cpu", "meta"], ids=["real", "analytic"])
def device(request):
    return request.param


def test_fsdp2_holds_a_rank_s_share_and_gathers_every_parameter_twice(device):
    model = stack()
    params = sum(p.numel() for p in model.parameters())
    P = params * FLOAT  # bytes of all parameters, unsharded
    optimizer = torch.optim.AdamW(model.parameters())
    result = profile(model, torch.randn(BATCH, WIDTH), train=True, optimizer=optimizer, world_size=WORLD, parallelize=fsdp, device=device)
    assert (result.world_size, result.rank) == (WORLD, 0)
    # per rank: 1/N of the parameters, gradients and AdamW's two moments (WIDTH is divisible: no padding)
    memory = result.memory
    assert memory.category_max["parameters"] == P // WORLD
    assert sum(grad for _, _, grad in memory.parameters) == P // WORLD
    steps = 2 * LAYERS * FLOAT  # AdamW's step counter per parameter tensor: a float32 scalar on the CPU
    assert memory.category_max["optimizer_state"] == 2 * P // WORLD + steps
    # the all-gathered copies while they live: at least one layer's, never the whole model's
    layer = (WIDTH * WIDTH + WIDTH) * FLOAT
    assert layer <= memory.category_max["unsharded_parameters"] < P
    # resharded after forward: every parameter is all-gathered in the forward pass and again in the backward pass
    assert total(result.collectives, "all_gather", "forward")[:2] == (LAYERS, P)
    assert total(result.collectives, "all_gather", "backward")[:2] == (LAYERS, P)
    calls, payload, bus = total(result.collectives, "all_gather")
    assert bus == payload * (WORLD - 1) / WORLD
    # gradients reduce-scattered once: the input is the unsharded gradients
    calls, payload, bus = total(result.collectives, "reduce_scatter")
    assert (calls, payload, bus) == (LAYERS, P, P * (WORLD - 1) / WORLD)
    assert result.comm_bytes == 3 * P
    assert {c.group_size for c in result.collectives} == {WORLD} and {c.dtype for c in result.collectives} == {"float32"}
    assert not result.uncounted
    assert not dist.is_initialized()  # the fake process group is gone


def test_a_sharded_profile_round_trips_through_the_artifact_schema():
    from importlib import resources

    import jsonschema

    from pytest_modelprof import Profile

    result = profile(stack(), torch.randn(BATCH, WIDTH), train=True, world_size=WORLD, parallelize=fsdp, device="meta")
    schema = json.loads(resources.files("pytest_modelprof").joinpath("schema", "profile.schema.json").read_text())
    document = json.loads(json.dumps(result.to_dict()))
    jsonschema.validate(document, {"$schema": schema["$schema"], "$defs": schema["$defs"], "$ref": "#/$defs/profile"})
    again = Profile.from_dict(document)
    assert again.collectives == result.collectives and again.comm_bytes == result.comm_bytes == 3 * 4 * sum(
        p.numel() for p in stack().parameters()
    )


def test_real_and_analytic_fsdp2_steps_agree():
    # a convolutional network with buffers and an optimizer with momentum: the same ops, FLOPs, collectives
    # and memory from real CPU tensors and from fake ones (DTensor's own shape propagation left out of both)
    import torchvision

    def shard(model, mesh):
        for name in ("layer1", "layer2", "layer3", "layer4"):
            fully_shard(getattr(model, name), mesh=mesh)
        fully_shard(model, mesh=mesh)

    model = torchvision.models.resnet18(num_classes=10)
    runs = [
        profile(
            model,
            torch.randn(2, 3, 32, 32),
            train=True,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
            world_size=WORLD,
            parallelize=shard,
            device=device,
        )
        for device in ("cpu", "meta")
    ]
    real, analytic = runs
    assert {(r.op, r.phase): (r.calls, r.flops) for r in real.ops} == {(r.op, r.phase): (r.calls, r.flops) for r in analytic.ops}
    assert real.collectives == analytic.collectives
    assert real.memory.peak_bytes == analytic.memory.peak_bytes
    assert real.memory.peak_breakdown == analytic.memory.peak_breakdown


def test_a_rank_s_flops_are_those_of_its_batch(device):
    # FSDP shards parameters, not work: each rank runs the whole model on its own batch
    model = stack()
    sharded = profile(model, torch.randn(BATCH, WIDTH), world_size=WORLD, parallelize=fsdp, device=device)
    assert sharded.forward_flops == LAYERS * (2 * BATCH * WIDTH * WIDTH + BATCH * WIDTH)  # a product and a bias add per layer
    assert sharded.model == "Sequential"  # the caller's model, not its sharded copy's class


def megatron_mlp(model: nn.Module, mesh) -> None:
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})


def test_a_tensor_parallel_mlp_does_1_over_n_of_the_products_and_all_reduces_its_output(device):
    hidden, ffn = 64, 256
    model = nn.Sequential(nn.Linear(hidden, ffn, bias=False), nn.ReLU(), nn.Linear(ffn, hidden, bias=False))
    result = profile(model, torch.randn(BATCH, hidden), train=True, world_size=WORLD, parallelize=megatron_mlp, device=device)
    products = 2 * BATCH * hidden * ffn  # FLOPs of each dense product
    assert result.forward_flops == 2 * products // WORLD + BATCH * ffn // WORLD  # two sharded products, the ReLU on the shard
    assert result.op("aten.mm", "forward").flops == 2 * products // WORLD
    # the row-parallel product's partial sums are all-reduced: the (BATCH, hidden) output
    calls, payload, bus = total(result.collectives, "all_reduce", "forward")
    assert (calls, payload) == (1, BATCH * hidden * FLOAT)
    assert bus == payload * 2 * (WORLD - 1) / WORLD
    assert result.memory.category_max["parameters"] == 2 * hidden * ffn * FLOAT // WORLD
    # kept for the backward pass: the ReLU's output, on this rank's columns (the input is the model's, an input)
    assert result.memory.category_max["activations"] == BATCH * ffn // WORLD * FLOAT


class HeadParallelAttention(nn.Module):
    """Self-attention whose head count follows its projections' width: under column-parallel q, k, v
    (Megatron-style) each rank runs its own heads."""

    def __init__(self, hidden: int, head_dim: int) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, seq, t.shape[-1] // self.head_dim, self.head_dim).transpose(1, 2)

        y = nn.functional.scaled_dot_product_attention(heads(self.q(x)), heads(self.k(x)), heads(self.v(x)))
        return self.o(y.transpose(1, 2).reshape(batch, seq, -1))


def test_a_tensor_parallel_attention_block_runs_1_over_n_of_the_heads(device):
    hidden, head_dim, seq = 64, 16, 32  # 4 heads: one per rank
    plan = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "o": RowwiseParallel()}
    x = torch.randn(2, seq, hidden)
    result = profile(
        HeadParallelAttention(hidden, head_dim),
        x,
        world_size=WORLD,
        parallelize=lambda m, mesh: parallelize_module(m, mesh, plan),
        device=device,
    )
    dense = profile(HeadParallelAttention(hidden, head_dim), x, device=device)
    tokens = 2 * seq
    products = result.op("aten.mm", "forward").flops
    assert products == 4 * 2 * tokens * hidden * hidden // WORLD  # the four projections, on this rank's columns or rows
    assert result.forward_flops * WORLD == dense.forward_flops  # and the attention of its heads
    calls, payload, _ = total(result.collectives, "all_reduce", "forward")
    assert (calls, payload) == (1, tokens * hidden * FLOAT)  # the output projection's partial sums


def test_ddp_all_reduces_every_gradient_in_buckets():
    model = stack()
    G = sum(p.numel() for p in model.parameters()) * FLOAT
    result = profile(
        model,
        torch.randn(BATCH, WIDTH),
        train=True,
        world_size=WORLD,
        parallelize=lambda m, mesh: DistributedDataParallel(m, bucket_cap_mb=0.3),
        device="cpu",
    )
    calls, payload, bus = total(result.collectives, "all_reduce", "backward")
    assert payload == G and bus == G * 2 * (WORLD - 1) / WORLD
    assert calls >= 2  # the buckets, each an all-reduce
    assert result.memory.category_max["parameters"] == G  # replicated


def test_the_process_group_is_torn_down_after_an_error():
    def broken(model, mesh):
        raise ValueError("no plan for this model")

    with pytest.raises(ProfileError, match=r"parallelize.*raised ValueError: no plan for this model"):
        profile(stack(), torch.randn(BATCH, WIDTH), world_size=WORLD, parallelize=broken)
    assert not dist.is_initialized()


def test_a_process_group_of_the_caller_is_refused_and_left_alone():
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        with pytest.raises(ProfileError, match="already initialized"):
            profile(stack(), torch.randn(BATCH, WIDTH), world_size=WORLD, parallelize=fsdp)
        assert dist.is_initialized()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"parallelize": fsdp}, "pass world_size= too"),
        ({"world_size": 4}, "needs parallelize=fn"),
        ({"world_size": 0, "parallelize": fsdp}, "world_size must be a positive int"),
        ({"world_size": 4, "parallelize": fsdp, "rank": 4}, r"rank must be an int in \[0, 4\)"),
        ({"world_size": 8, "parallelize": fsdp, "mesh": (2, 2)}, "product is world_size=8"),
        ({"world_size": 4, "parallelize": fsdp, "latency": True}, "nothing to time"),
    ],
)
def test_bad_sharding_arguments_say_what_was_expected(options, message):
    with pytest.raises(ProfileError, match=message):
        profile(stack(), torch.randn(BATCH, WIDTH), **options)
    assert not dist.is_initialized()


RANK = """
import inspect, json, sys
import torch, torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

rank, world, store, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
mesh = init_device_mesh("cpu", (world,))
model = nn.Sequential(*[nn.Linear({width}, {width}) for _ in range({layers})])
for layer in model:
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
optimizer = torch.optim.AdamW(model.parameters())
calls = []

def recorded(kind, call, at):
    signature = inspect.signature(call)
    payload = list(signature.parameters)[at]  # all-gather: the output; reduce-scatter: the input

    def wrapper(*args, **kwargs):
        tensor = signature.bind(*args, **kwargs).arguments[payload]
        calls.append((kind, tensor.numel() * tensor.element_size()))
        return call(*args, **kwargs)
    return wrapper

x = torch.randn({batch}, {width})
for step in range(2):  # the second step is the steady one
    if step == 1:
        for name, kind, at in (("all_gather_single", "all_gather", 0), ("all_gather_into_tensor", "all_gather", 0),
                               ("reduce_scatter_single", "reduce_scatter", 1), ("reduce_scatter_tensor", "reduce_scatter", 1)):
            if hasattr(dist, name):
                setattr(dist, name, recorded(kind, getattr(dist, name), at))
    model(x).sum().backward()
    if step == 1:
        grads = sum(p.grad.to_local().numel() * p.grad.element_size() for p in model.parameters())
    optimizer.step()
    optimizer.zero_grad()
local = lambda t: t.to_local() if hasattr(t, "to_local") else t
params = sum(local(p).numel() * p.element_size() for p in model.parameters())
state = sum(local(t).numel() * t.element_size() for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor))
json.dump({{"params": params, "grads": grads, "state": state, "calls": calls}}, open(out, "w"))
dist.destroy_process_group()
"""


@pytest.mark.skipif(not dist.is_gloo_available(), reason="needs the gloo backend")
def test_four_real_gloo_processes_hold_and_move_what_the_fake_rank_reports(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK.format(width=WIDTH, layers=LAYERS, batch=BATCH))
    ranks = [
        subprocess.Popen([sys.executable, str(script), str(r), str(WORLD), str(tmp_path / "store"), str(tmp_path / f"{r}.json")])
        for r in range(WORLD)
    ]
    assert [process.wait(timeout=300) for process in ranks] == [0] * WORLD
    model = stack()
    optimizer = torch.optim.AdamW(model.parameters())
    result = profile(model, torch.randn(BATCH, WIDTH), train=True, optimizer=optimizer, world_size=WORLD, parallelize=fsdp, device="meta")
    for r in range(WORLD):
        real = json.loads((tmp_path / f"{r}.json").read_text())
        assert real["params"] == result.memory.category_max["parameters"]
        assert real["grads"] == sum(grad for _, _, grad in result.memory.parameters)
        assert real["state"] == result.memory.category_max["optimizer_state"]
        for kind in ("all_gather", "reduce_scatter"):
            sizes = [size for name, size in real["calls"] if name == kind]
            assert (len(sizes), sum(sizes)) == total(result.collectives, kind)[:2], kind


class Block(nn.Module):
    def __init__(self, checkpointed: bool) -> None:
        super().__init__()
        self.up, self.down, self.checkpointed = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH), checkpointed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def run(x: torch.Tensor) -> torch.Tensor:
            return self.down(torch.relu(self.up(x)))

        return torch.utils.checkpoint.checkpoint(run, x, use_reentrant=False) if self.checkpointed else run(x)


def test_activation_checkpointing_and_keeping_parameters_gathered_show_in_the_rank_s_step():
    def keep_gathered(model, mesh):
        for layer in model:
            fully_shard(layer, mesh=mesh, reshard_after_forward=False)
        fully_shard(model, mesh=mesh)

    def run(checkpointed: bool, parallelize):
        model = nn.Sequential(*[Block(checkpointed) for _ in range(LAYERS)])
        return profile(model, torch.randn(4 * BATCH, WIDTH), train=True, world_size=WORLD, parallelize=parallelize, device="meta")

    plain, checkpointed, gathered = run(False, fsdp), run(True, fsdp), run(False, keep_gathered)
    # checkpointing: the backward pass runs each block's forward again, as far as the tensors it saves (torch stops
    # the recomputation early: the last product's output is not saved), and only the blocks' inputs are kept
    rows = 4 * BATCH
    assert checkpointed.recompute_flops == LAYERS * (2 * rows * WIDTH * 4 * WIDTH + 2 * rows * 4 * WIDTH)  # up (+bias), relu
    assert checkpointed.memory.category_max["activations"] < plain.memory.category_max["activations"] / 4
    # not resharded after forward: no all-gather in the backward pass, the whole model gathered at once
    assert total(gathered.collectives, "all_gather", "backward")[0] == 0
    assert total(plain.collectives, "all_gather", "backward")[0] == LAYERS
    layer = sum(p.numel() for p in Block(False).parameters()) * FLOAT
    assert gathered.memory.category_max["unsharded_parameters"] == LAYERS * layer
    assert plain.memory.category_max["unsharded_parameters"] < LAYERS * layer


def test_the_collectives_table_shows_each_place_and_the_step_s_totals():
    from pytest_modelprof.report import format_collectives, format_count

    result = profile(stack(), torch.randn(BATCH, WIDTH), train=True, world_size=WORLD, parallelize=fsdp, device="meta")
    lines = format_collectives(result).splitlines()
    assert lines[0] == f"collectives of rank 0 of {WORLD}, per step"
    P = sum(p.numel() for p in stack().parameters()) * FLOAT
    all_gathers = next(line.split() for line in lines if line.split()[:3] == ["all_gather", "step", "(total)"])
    assert all_gathers[3] == str(2 * LAYERS) and " ".join(all_gathers[4:6]) == format_count(2 * P, "B")
    with pytest.raises(ValueError, match="not of a sharded step"):
        format_collectives(profile(stack(), torch.randn(BATCH, WIDTH), device="meta"))


def test_each_fsdp2_collective_is_attributed_to_the_module_it_serves():
    # a backward prefetch runs in the hook of the layer after, but gathers the parameters of the layer before
    result = profile(stack(), torch.randn(BATCH, WIDTH), train=True, world_size=WORLD, parallelize=fsdp, device="meta")
    layer = (WIDTH * WIDTH + WIDTH) * FLOAT
    for index in range(LAYERS):
        rows = sorted((c.kind, c.phase, c.calls, c.bytes) for c in result.collectives if c.module == str(index))
        assert rows == [("all_gather", "backward", 1, layer), ("all_gather", "forward", 1, layer), ("reduce_scatter", "backward", 1, layer)]
    assert not [c for c in result.collectives if c.module not in {str(i) for i in range(LAYERS)}]


def _nccl_call_by_hand(kind: str, bus: float, ranks: int, nodes: int) -> float:
    """One collective on H100s as NCCL's tuning model prices it (latencies in us: a base per protocol, then a
    hop per step of the ring, NVLink within the node, the network between nodes), each protocol carrying its
    share of the bus bandwidth: 370 GB/s over NVLink, 47.5 GB/s over each 400 Gb/s NIC; the fastest wins."""
    steps, crossings = ranks - 1, nodes - 1  # an all-gather or a reduce-scatter
    bandwidth = 370e9 if nodes == 1 else min(370e9, ranks // nodes * 47.5e9)  # the node's GPUs' NICs carry the crossings
    protocols = {  # base, NVLink hop, network hop, share of the bandwidth
        "LL": (6.6, 0.6, 2.7, 1 / 3 if nodes == 1 else 1 / 4),
        "LL128": (14.0, 1.9, 4.0, 0.92),
        "Simple": (8.4, 3.4, 14.0, 1.0),
    }
    return min(
        (base + (steps - crossings) * nvlink + crossings * network) * 1e-6 + bus / (bandwidth * share)
        for base, nvlink, network, share in protocols.values()
    )


def test_a_sharded_step_on_a_target_gpu_adds_its_collectives_to_the_predicted_time():
    P = sum(p.numel() for p in stack().parameters()) * FLOAT

    def run(world: int):
        model = stack()
        optimizer = torch.optim.AdamW(model.parameters())
        return profile(model, torch.randn(BATCH, WIDTH), train=True, optimizer=optimizer, world_size=world, parallelize=fsdp, target="h100")

    for world, nodes in ((4, 1), (16, 2)):  # 8 GPUs to a node
        result = run(world)
        assert result.target == "h100" and result.fits and {c.nodes for c in result.collectives} == {nodes}
        assert sum(c.bus_bytes for c in result.collectives) == pytest.approx(3 * P * (world - 1) / world)  # 2P gathered, P scattered
        comm = sum(c.calls * _nccl_call_by_hand(c.kind, c.bus_bytes / c.calls, world, nodes) for c in result.collectives)
        predicted = result.predicted
        assert predicted.comm_seconds == pytest.approx(comm, rel=1e-12)
        compute = predicted.seconds - predicted.comm_seconds
        assert compute > 0 and predicted.overlapped_seconds == pytest.approx(max(compute, comm), rel=1e-12)
        # the caching allocator's 512-byte blocks: each parameter's shard rounded up
        shards = [(WIDTH * WIDTH) // world * FLOAT, WIDTH // world * FLOAT] * LAYERS
        assert result.memory.category_max["parameters"] == sum(-(-b // 512) * 512 for b in shards)
        # the optimizer as CUDA runs it: foreach kernels
        assert any(row.op.startswith("aten._foreach_") for row in result.ops if row.phase == "optimizer")
        from pytest_modelprof.report import format_predicted

        assert "after the kernels above (none overlapped)" in format_predicted(result).splitlines()[1]


def test_profile_ranks_shows_the_uneven_shards_of_the_last_ranks():
    from pytest_modelprof import profile_ranks

    def shard(model, mesh):
        fully_shard(model, mesh=mesh)

    # FSDP2 splits dim 0 in chunks of ceil(6 / 4) = 2 rows: ranks 0-2 hold two rows each, rank 3 none
    results = profile_ranks(nn.Linear(10, 6), torch.randn(2, 10), train=True, world_size=WORLD, parallelize=shard, device="meta")
    assert [r.rank for r in results] == list(range(WORLD))
    held = [dict((name, weight) for name, weight, _ in r.memory.parameters) for r in results]
    assert held == [{"weight": 2 * 10 * FLOAT, "bias": 2 * FLOAT}] * 3 + [{"weight": 0, "bias": 0}]
    # every rank all-gathers and reduce-scatters the padded shards: the same volume
    assert len({r.comm_bytes for r in results}) == 1
    assert [r.rank for r in profile_ranks(nn.Linear(10, 6), torch.randn(2, 10), world_size=WORLD, parallelize=shard, ranks=[3])] == [3]


def test_mixed_precision_gathers_bf16_parameters_and_reduces_fp32_gradients():
    from torch.distributed.fsdp import MixedPrecisionPolicy

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)

    def shard(model, mesh):
        for layer in model:
            fully_shard(layer, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)

    result = profile(stack(), torch.randn(BATCH, WIDTH), train=True, world_size=WORLD, parallelize=shard, device="meta")
    params = sum(p.numel() for p in stack().parameters())
    gathers = [c for c in result.collectives if c.kind == "all_gather"]
    assert {c.dtype for c in gathers} == {"bfloat16"} and sum(c.bytes for c in gathers) == 2 * params * 2  # twice, 2 bytes each
    scatters = [c for c in result.collectives if c.kind == "reduce_scatter"]
    assert {c.dtype for c in scatters} == {"float32"} and sum(c.bytes for c in scatters) == params * FLOAT
    assert result.memory.category_max["parameters"] == params * FLOAT // WORLD  # the fp32 shards stay
    layer = (WIDTH * WIDTH + WIDTH) * 2
    assert result.memory.category_max["unsharded_parameters"] >= layer  # the gathered copies are bf16


def test_the_module_tree_shows_the_collectives_each_module_is_served_by():
    from pytest_modelprof.report import format_tree_table

    result = profile(stack(), torch.randn(BATCH, WIDTH), train=True, world_size=WORLD, parallelize=fsdp, device="meta")
    layer = (WIDTH * WIDTH + WIDTH) * FLOAT
    assert [result.module(str(i)).comm_bytes for i in range(LAYERS)] == [3 * layer] * LAYERS  # 2 all-gathers, 1 reduce-scatter
    assert result.module("").comm_bytes == result.comm_bytes
    header = format_tree_table(result, depth=1).splitlines()[0].split()
    assert "comm" in header
    assert "comm" not in format_tree_table(profile(stack(), torch.randn(BATCH, WIDTH), device="meta"), depth=1).splitlines()[0].split()


class ShardableMLP(nn.Module):
    def __init__(self, hidden: int = 64, ffn: int = 256) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(hidden, ffn, bias=False), nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


@pytest.mark.filterwarnings("ignore:FSDP2-wrapped module:UserWarning")  # torch's, on the row-parallel output's view
def test_two_dimensional_fsdp_and_tensor_parallelism(device):
    hidden, ffn, dp, tp = 64, 256, 2, 2

    def two_d(model, mesh):
        for block in model:
            parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])

    model = nn.Sequential(ShardableMLP(hidden, ffn), ShardableMLP(hidden, ffn))
    result = profile(
        model, torch.randn(BATCH, hidden), train=True, world_size=dp * tp, parallelize=two_d, mesh={"dp": dp, "tp": tp}, device=device
    )
    block = 2 * hidden * ffn * FLOAT  # one block's parameter bytes
    assert result.memory.category_max["parameters"] == 2 * block // (dp * tp)  # sharded both ways
    assert result.forward_flops == 2 * (2 * 2 * BATCH * hidden * ffn // tp + BATCH * ffn // tp)  # per block: two products, a ReLU
    gathers = [c for c in result.collectives if c.kind == "all_gather"]
    assert {c.group_size for c in gathers} == {dp} and sum(c.bytes for c in gathers) == 2 * 2 * block // tp  # the TP shards, twice
    reduces = [c for c in result.collectives if c.kind == "all_reduce" and c.phase == "forward"]
    assert {c.group_size for c in reduces} == {tp} and sum(c.bytes for c in reduces) == 2 * BATCH * hidden * FLOAT


def test_hybrid_sharding_reduce_scatters_within_a_replica_and_all_reduces_across(device):
    # HSDP: fully_shard on a 2-D mesh (replicate x shard): shards over the shard dimension, replicas all-reduce
    replicas, shards = 2, 4
    model = stack()
    P = sum(p.numel() for p in model.parameters()) * FLOAT
    result = profile(
        model,
        torch.randn(BATCH, WIDTH),
        train=True,
        world_size=replicas * shards,
        parallelize=fsdp,
        mesh={"replicate": replicas, "shard": shards},
        device=device,
    )
    assert result.memory.category_max["parameters"] == P // shards
    by_kind = {kind: total(result.collectives, kind)[:2] for kind in ("all_gather", "reduce_scatter", "all_reduce")}
    assert by_kind == {"all_gather": (2 * LAYERS, 2 * P), "reduce_scatter": (LAYERS, P), "all_reduce": (LAYERS, P // shards)}
    assert {c.kind: c.group_size for c in result.collectives} == {"all_gather": shards, "reduce_scatter": shards, "all_reduce": replicas}


# -- an elementwise optimizer's step on the local shards (distributed.on_local_shards) -------------------------


@pytest.mark.parametrize(
    ("make", "counters"),  # counters: AdamW's step counters, one per parameter
    [(lambda p: torch.optim.AdamW(p), 2 * LAYERS), (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), 0)],
    ids=["adamw", "sgd"],
)
def test_a_sharded_step_s_optimizer_runs_on_the_local_shards_and_counts_the_rank_s_share(make, counters, monkeypatch):
    """An elementwise step over 1/N of every parameter: the unsharded step's ops, call for call, at 1/N of its
    FLOPs (AdamW's step counters, one scalar add per parameter on every rank, aside). DTensor's own step on
    torch 2.11 also counted the ops its sharding propagation ran on fake tensors of the global shape."""
    from pytest_modelprof.engine import distributed

    swapped = []
    swaps = distributed._swaps
    monkeypatch.setattr(distributed, "_swaps", lambda optimizer: swapped.append(len(swaps(optimizer))) or swaps(optimizer))
    model = stack()
    x = torch.randn(BATCH, WIDTH)
    sharded = profile(
        model, x, train=True, optimizer=make(model.parameters()), world_size=WORLD, parallelize=fsdp, device="meta", target="h100"
    )
    assert swapped == [2 * LAYERS, 2 * LAYERS]  # the first step's and the metered step's, each over every parameter
    whole = profile(model, x, train=True, optimizer=make(model.parameters()), device="meta", target="h100")
    assert sharded.optimizer_flops - counters == (whole.optimizer_flops - counters) / WORLD > 0
    ops = [(o.op, o.calls) for o in whole.ops if o.phase == "optimizer"]
    assert sorted((o.op, o.calls) for o in sharded.ops if o.phase == "optimizer") == sorted(ops)
    # its state: one or two fp32 tensors of each parameter's shard, and AdamW's step counters (4-byte scalars
    # on the rank's device), each in the caching allocator's 512-byte blocks
    states = 2 if counters else 1
    shards = sum(-(-p.numel() * FLOAT // WORLD // 512) * 512 for p in model.parameters())
    assert sharded.memory.category_max["optimizer_state"] == states * shards + counters * 512


def test_the_step_on_the_local_shards_updates_each_shard_as_the_dtensor_step_does():
    from torch.distributed.tensor import DTensor, Shard

    from pytest_modelprof.engine.distributed import Parallel, fake_world, on_local_shards

    def sharded(values):
        return [nn.Parameter(DTensor.from_local(v.clone(), mesh, [Shard(0)], run_check=False)) for v in values]

    torch.manual_seed(0)
    values = [torch.randn(8, 3), torch.randn(5)]
    grads = [[torch.randn_like(v) for v in values] for _ in range(2)]
    with fake_world(Parallel(WORLD, fsdp, 0, (WORLD,))) as mesh:
        results = []
        for local in (False, True):
            params = sharded(values)
            optimizer = torch.optim.AdamW(params, lr=0.1, weight_decay=0.1)
            for step in grads:
                for p, g in zip(params, step):
                    p.grad = DTensor.from_local(g.clone(), mesh, [Shard(0)], run_check=False)
                with on_local_shards(optimizer) if local else contextlib.nullcontext():
                    optimizer.step()
            state = optimizer.state[params[0]]
            assert isinstance(state["exp_avg"], DTensor) and state["exp_avg"].placements == (Shard(0),)
            assert all(isinstance(p, DTensor) for p in optimizer.param_groups[0]["params"])
            results.append([p.to_local().clone() for p in params] + [state["exp_avg_sq"].to_local().clone()])
    for through_dtensor, on_shards in zip(*results):
        torch.testing.assert_close(on_shards, through_dtensor, rtol=0, atol=0)


def test_an_optimizer_not_known_to_be_elementwise_steps_through_dtensor():
    from torch.distributed.tensor import DTensor, Replicate, Shard

    from pytest_modelprof.engine.distributed import Parallel, _swaps, fake_world

    class Clipped(torch.optim.SGD):  # a subclass may reduce over a parameter (a norm): not swapped
        pass

    with fake_world(Parallel(WORLD, fsdp, 0, (WORLD,))) as mesh:
        p = nn.Parameter(DTensor.from_local(torch.randn(4, 2), mesh, [Shard(0)], run_check=False))
        p.grad = DTensor.from_local(torch.randn(4, 2), mesh, [Shard(0)], run_check=False)
        assert len(_swaps(torch.optim.SGD([p], lr=0.1))) == 1
        assert _swaps(Clipped([p], lr=0.1)) == []
        plain = nn.Parameter(torch.randn(3))
        assert _swaps(torch.optim.SGD([p, plain], lr=0.1)) == []  # a group that mixes DTensors and plain tensors
        p.grad = DTensor.from_local(torch.randn(4 * WORLD, 2), mesh, [Replicate()], run_check=False)
        assert _swaps(torch.optim.SGD([p], lr=0.1)) == []  # a gradient sharded otherwise: DTensor redistributes it
