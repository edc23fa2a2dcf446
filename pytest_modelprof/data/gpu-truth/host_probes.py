"""The host's time to issue one op on a CUDA device, by op and by who issues it; a module call's; an optimizer step's.

Each op runs on tensors so small that its kernels take a few microseconds: the host, not the GPU, sets the pace,
and the time from the first call of a loop until the loop returns (before waiting for the GPU: ``issue``) is the
host's time to issue the calls. Who issues them:

- ``plain``: Python under ``torch.no_grad()`` (an inference forward, an optimizer's step);
- ``recorded``: Python with autograd recording (a training step's forward);
- ``engine``: autograd's engine in C++ (the backward pass): a chain of the op's calls backpropagated, less the
  chain's forward.

Each row also has the ATen ops a dispatch mode sees per call (what the engine's meters see: views and metadata ops
included), so that a time per op can be worked out from a time per call. Then the time a module call adds to the op
it runs, an optimizer step's time by optimizer and number of parameter tensors, and a backward call's fixed time.

    python host_probes.py OUT.json [--quick]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, __file__.rpartition("/")[0] or ".")
from capture import _host  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
REPEATS = 7


class _Seen(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def _sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _timed(loop, calls):
    """Best and median microseconds per call of ``loop`` (which makes ``calls`` calls): to issue, and to finish."""
    issue, done = [], []
    loop()  # warm-up: cuDNN's plans, the caching allocator's blocks
    for _ in range(REPEATS):
        _sync()
        start = time.perf_counter()
        loop()
        issued = time.perf_counter()
        _sync()
        finished = time.perf_counter()
        issue.append((issued - start) / calls * 1e6)
        done.append((finished - start) / calls * 1e6)
    return {"issue_us": round(min(issue), 3), "issue_us_median": round(statistics.median(issue), 3),
            "done_us": round(min(done), 3)}


def _seen(fn):
    mode = _Seen()
    with mode:
        fn()
    return dict(mode.ops)


def _t(*shape, dtype=torch.float32, grad=False):
    return torch.randn(*shape, device=DEVICE, dtype=dtype, requires_grad=grad)


def _ops():
    """name -> (make(grad) -> (op, input), chainable: the op's output can be its next call's input)."""
    def unary(fn, *shape, dtype=torch.float32):
        return lambda grad: (fn, _t(*shape, dtype=dtype, grad=grad))

    def module(make_module, *shape, dtype=torch.float32, train=False):
        def make(grad):
            m = make_module().to(DEVICE, dtype).train(train)
            m.requires_grad_(grad)
            return (lambda x: F.conv2d(x, m.weight, m.bias, m.stride, m.padding, m.dilation, m.groups)) if isinstance(m, nn.Conv2d) else m.forward, _t(*shape, dtype=dtype, grad=grad)
        return make

    def linear(d, dtype=torch.float32, bias=True):
        def make(grad):
            weight = _t(d, d, dtype=dtype, grad=grad)
            b = _t(d, dtype=dtype, grad=grad) if bias else None
            return (lambda x: F.linear(x, weight, b)), _t(4, d, dtype=dtype, grad=grad)
        return make

    def attention(dtype):
        def make(grad):
            return (lambda x: F.scaled_dot_product_attention(x, x, x)), _t(1, 2, 16, 64, dtype=dtype, grad=grad)
        return make

    bf16 = torch.bfloat16
    return {
        "add": (unary(lambda x: x + x, 64), True),
        "mul_scalar": (unary(lambda x: x * 0.5, 64), True),
        "relu": (unary(F.relu, 64), True),
        "gelu": (unary(F.gelu, 64), True),
        "silu": (unary(F.silu, 64), True),
        "sigmoid": (unary(torch.sigmoid, 64), True),
        "softmax": (unary(lambda x: F.softmax(x, -1), 4, 64), True),
        "sum_dim": (unary(lambda x: x.sum(-1, keepdim=True).expand_as(x), 4, 64), True),
        "mean": (unary(lambda x: x.mean(), 64), False),
        "dropout_train": (unary(lambda x: F.dropout(x, 0.1, True), 64), True),
        "clone": (unary(torch.clone, 64), True),
        "contiguous_t": (unary(lambda x: x.t().contiguous(), 8, 8), True),
        "view_reshape": (unary(lambda x: x.view(8, 8).t().reshape(64), 64), True),
        "cat": (unary(lambda x: torch.cat([x, x])[:64], 64), True),
        "linear": (linear(64), True),
        "linear_nobias": (linear(64, bias=False), True),
        "linear_bf16": (linear(64, bf16), True),
        "matmul": (lambda grad: ((lambda x, w=_t(64, 64, grad=grad): x @ w), _t(4, 64, grad=grad)), True),
        "bmm": (lambda grad: ((lambda x, w=_t(2, 64, 64, grad=grad): torch.bmm(x, w)), _t(2, 4, 64, grad=grad)), True),
        "layer_norm": (lambda grad: ((lambda x, m=nn.LayerNorm(64).to(DEVICE).requires_grad_(grad): m(x)), _t(4, 64, grad=grad)), True),
        "layer_norm_bf16": (lambda grad: ((lambda x, m=nn.LayerNorm(64).to(DEVICE, bf16).requires_grad_(grad): m(x)), _t(4, 64, dtype=bf16, grad=grad)), True),
        "rms_norm": (lambda grad: ((lambda x, m=nn.RMSNorm(64).to(DEVICE).requires_grad_(grad): m(x)), _t(4, 64, grad=grad)), True),
        "group_norm": (lambda grad: ((lambda x, m=nn.GroupNorm(4, 16).to(DEVICE).requires_grad_(grad): m(x)), _t(1, 16, 4, 4, grad=grad)), True),
        "conv3x3": (module(lambda: nn.Conv2d(16, 16, 3, padding=1), 1, 16, 8, 8), True),
        "conv1x1": (module(lambda: nn.Conv2d(16, 16, 1, bias=False), 1, 16, 8, 8), True),
        "conv1x1_stride2": (module(lambda: nn.Conv2d(16, 16, 1, stride=2, bias=False), 1, 16, 8, 8), False),
        "conv_depthwise7": (module(lambda: nn.Conv2d(16, 16, 7, padding=3, groups=16), 1, 16, 8, 8), True),
        "conv3x3_fp16": (module(lambda: nn.Conv2d(16, 16, 3, padding=1, bias=False), 1, 16, 8, 8, dtype=torch.float16), True),
        "batch_norm_train": (module(lambda: nn.BatchNorm2d(16), 1, 16, 8, 8, train=True), True),
        "batch_norm_eval": (module(lambda: nn.BatchNorm2d(16), 1, 16, 8, 8), True),
        "max_pool": (unary(lambda x: F.max_pool2d(x, 3, 1, 1), 1, 16, 8, 8), True),
        "avg_pool_adaptive": (unary(lambda x: F.adaptive_avg_pool2d(x, 1), 1, 16, 8, 8), False),
        "sdpa_bf16": (attention(bf16), True),
        "sdpa_fp32": (attention(torch.float32), True),
        "embedding": (lambda grad: ((lambda i, w=_t(100, 64, grad=grad): F.embedding(i, w)),
                                    torch.randint(0, 100, (4, 16), device=DEVICE)), False),
        "cross_entropy": (lambda grad: ((lambda x, t=torch.randint(0, 64, (4,), device=DEVICE): F.cross_entropy(x, t)),
                                        _t(4, 64, grad=grad)), False),
    }


def op_rows(calls):
    rows = []
    for name, (make, chainable) in _ops().items():
        fn, x = make(False)

        def plain(fn=fn, x=x):
            with torch.no_grad():
                for _ in range(calls):
                    fn(x)

        row = {"op": name, "calls": calls, "plain": _timed(plain, calls)}
        with torch.no_grad():
            row["plain"]["seen"] = _seen(lambda: fn(x))
        fn, x = make(True)

        def recorded(fn=fn, x=x):
            for _ in range(calls):
                fn(x)

        row["recorded"] = _timed(recorded, calls)
        row["recorded"]["seen"] = _seen(lambda: fn(x))
        if chainable and x.requires_grad:
            def forward(fn=fn, x=x):
                y = x
                for _ in range(calls):
                    y = fn(y)
                return y

            def both(forward=forward):
                forward().float().sum().backward()

            fwd, bwd = _timed(forward, calls), _timed(both, calls)
            row["engine"] = {"issue_us": round(bwd["issue_us"] - fwd["issue_us"], 3),
                             "issue_us_median": round(bwd["issue_us_median"] - fwd["issue_us_median"], 3)}
            y = forward()
            mode = _Seen()
            loss = y.float().sum()
            with mode:
                loss.backward()
            row["engine"]["seen_per_call"] = {k: round(v / calls, 3) for k, v in mode.ops.items()}
        rows.append(row)
        print(name, {k: v["issue_us"] for k, v in row.items() if isinstance(v, dict)}, flush=True)
    return rows


def module_rows(calls):
    """The time a module call adds to its op: ``calls`` ReLU modules in a Sequential against F.relu in a loop."""
    x = _t(64)
    seq = nn.Sequential(*[nn.ReLU() for _ in range(calls)])
    nested = nn.Sequential(*[nn.Sequential(nn.ReLU()) for _ in range(calls)])

    def functional():
        y = x
        for _ in range(calls):
            y = F.relu(y)

    rows = []
    with torch.no_grad():
        for name, fn in (("F.relu", functional), ("nn.ReLU", lambda: seq(x)), ("nested nn.ReLU", lambda: nested(x))):
            rows.append({"case": name, "grad": False, **_timed(fn, calls)})
    xg = _t(64, grad=True)
    for name, fn in (("F.relu", lambda: [F.relu(xg) for _ in range(calls)]), ("nn.ReLU", lambda: seq(xg))):
        rows.append({"case": name, "grad": True, **_timed(fn, calls)})
    for r in rows:
        print(r, flush=True)
    return rows


def optimizer_rows(counts):
    rows = []
    makers = {
        "sgd_momentum_foreach": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        "sgd_momentum_for_loop": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=False),
        "sgd_plain": lambda ps: torch.optim.SGD(ps, lr=0.1),
        "adamw_foreach": lambda ps: torch.optim.AdamW(ps, lr=1e-3),
        "adamw_fused": lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=True),
        "adamw_for_loop": lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=False),
        "adam_foreach": lambda ps: torch.optim.Adam(ps, lr=1e-3),
    }
    for n in counts:
        params = [torch.randn(16, device=DEVICE, requires_grad=True) for _ in range(n)]
        for p in params:
            p.grad = torch.randn_like(p)
        for name, make in makers.items():
            if "fused" in name and DEVICE != "cuda":
                continue
            opt = make(params)
            opt.step()  # its state
            step = _timed(opt.step, 1)
            mode = _Seen()
            with mode:
                opt.step()
            grads = [p.grad for p in params]

            def zero(opt=opt, grads=grads):
                opt.zero_grad(set_to_none=True)
                for p, g in zip(params, grads):
                    p.grad = g

            rows.append({"optimizer": name, "tensors": n, "step": step, "seen": dict(mode.ops), "zero_grad_and_reset": _timed(zero, 1)})
            print(name, n, step["issue_us"], flush=True)
    return rows


def backward_rows():
    """A backward call's fixed time: one op's graph, backpropagated."""
    x = _t(64, grad=True)
    rows = []
    for ops in (1, 8):
        def both(ops=ops):
            y = x
            for _ in range(ops):
                y = y * 1.5
            y.sum().backward()
        rows.append({"ops_in_graph": ops, **_timed(both, 1)})
    print(rows, flush=True)
    return rows


def main():
    quick = "--quick" in sys.argv
    calls = 20 if quick else 200
    out = {
        "device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
        "torch": torch.__version__,
        "host": _host() if DEVICE == "cuda" else None,
        "threads": torch.get_num_threads(),
        "ops": op_rows(calls),
        "modules": module_rows(calls),
        "optimizers": optimizer_rows((8, 64) if quick else (8, 64, 256)),
        "backward": backward_rows(),
    }
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
