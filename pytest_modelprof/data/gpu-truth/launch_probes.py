"""What a kernel launch costs beside the kernel: the host's time per kernel an op launches, and the GPU's gap between kernels.

Two families of rows:

- ``rnn``: cuDNN's recurrent layers (``nn.LSTM``, ``nn.GRU``, ``nn.RNN``), one ATen op (``_cudnn_rnn``, and
  ``_cudnn_rnn_backward`` in training) that launches a few kernels per time step and layer. Each row: the kernels the
  GPU ran for one call (count and microseconds, from the profiler), the host's time to issue a call (from the call until
  it returns, before waiting for the GPU: ``issue_us``) and a call's time on the GPU's clock (CUDA events around calls
  back to back: ``step_us``). The ``tiny`` sizes (hidden 64, batch 1) make the kernels so short that the host sets the
  pace; the ``large`` ones are a training workload's.
- ``gap``: a chain of one kernel, launched back to back while the stream is held by a sleeping kernel, so that the host
  is far ahead of the GPU when they run: CUDA events' time over the chain per kernel (``per_kernel_us``) against the
  kernel's own duration from the profiler (``kernel_us``); the difference is the GPU's time between two kernels of a
  stream when nothing waits on the host.

    python launch_probes.py OUT.json [--algo | --split | --sync | --phases NAMES]

``--algo``: instead, which recurrent algorithm cuDNN ran (``algo``), by cell, hidden size, batch, layers and dtype.
``--split``: instead, the host's time for a recurrent layer's inference, training forward, backward and whole step (``split``).
``--sync``: instead, whether a recurrent layer's call waits for the GPU (``sync``): its time to issue behind a sleeping kernel.
``--phases NAMES``: instead, the host's time for each phase of those ``capture.py`` training steps (``phases``).
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, __file__.rpartition("/")[0] or ".")
from capture import _host  # noqa: E402
from host_probes import _Seen  # noqa: E402

SIZES = {"tiny": (64, 64, 1), "large": (512, 1024, 32)}  # input size, hidden size, batch


def _kernels(fn):
    """The kernels one call of ``fn`` ran: name -> [count, microseconds]; and the ATen ops it dispatched."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            name = event.name[:120]
            count, us = kernels.get(name, (0, 0.0))
            kernels[name] = (count + 1, us + event.time_range.elapsed_us())
    return {name: [c, round(us, 3)] for name, (c, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1])}


def _issue_and_step(fn, calls=10, repeats=5):
    issue = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        issue.append((time.perf_counter() - start) * 1e6)
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    steps = []
    for _ in range(calls):
        begin.record()
        fn()
        end.record()
        end.synchronize()
        steps.append(begin.elapsed_time(end) * 1e3)
    return {"issue_us": round(min(issue), 2), "issue_us_median": round(statistics.median(issue), 2),
            "step_us": round(statistics.median(steps), 2), "step_us_min": round(min(steps), 2)}


def rnn_rows():
    configs = []
    for layers, bidirectional in ((1, False), (2, False), (2, True), (3, False)):
        for seq in (32, 256):
            for size in SIZES:
                for dtype in ((torch.float32, torch.float16) if size == "large" else (torch.float32,)):
                    configs.append(("LSTM", layers, bidirectional, seq, size, dtype))
    for cell in ("GRU", "RNN"):
        for seq in (32, 256):
            for size in SIZES:
                configs.append((cell, 2, False, seq, size, torch.float32))
    rows = []
    for cell, layers, bidirectional, seq, size, dtype in configs:
        n_in, hidden, batch = SIZES[size]
        model = getattr(nn, cell)(n_in, hidden, layers, batch_first=True, bidirectional=bidirectional)
        model = model.to("cuda", dtype)
        x = torch.randn(batch, seq, n_in, device="cuda", dtype=dtype)
        for train in (False, True):
            if train:
                def fn():
                    out, _ = model(x)
                    out.float().sum().backward()
            else:
                def fn():
                    with torch.no_grad():
                        model(x)
            for _ in range(3):
                fn()
            seen = _Seen()
            with seen:
                fn()
            kernels = _kernels(fn)
            row = {"cell": cell, "layers": layers, "bidirectional": bidirectional, "seq": seq, "size": size,
                   "input": n_in, "hidden": hidden, "batch": batch, "dtype": str(dtype).removeprefix("torch."),
                   "train": train, **_issue_and_step(fn),
                   "kernel_count": sum(c for c, _ in kernels.values()),
                   "kernel_us": round(sum(us for _, us in kernels.values()), 2),
                   "ops": dict(seen.ops), "kernels": kernels}
            rows.append(row)
            print(cell, layers, bidirectional, seq, size, row["dtype"], train, row["kernel_count"], row["kernel_us"],
                  row["issue_us"], row["step_us"], flush=True)
        model.zero_grad(set_to_none=True)
    return rows


def gap_rows(chain=400):
    rows = []
    cases = []
    for n in (1, 1 << 14, 1 << 18, 1 << 21, 1 << 23):
        x = torch.zeros(n, device="cuda")
        cases.append((f"add_ {n}", lambda x=x: x.add_(1.0)))
    for n in (1 << 10, 1 << 20):
        x = torch.ones(n, device="cuda")
        out = torch.empty((), device="cuda")
        cases.append((f"sum {n}", lambda x=x, out=out: torch.sum(x, dim=0, out=out)))
    for n in (64, 1024):
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
        cases.append((f"mm bf16 {n}", lambda a=a, out=out: torch.mm(a, a, out=out)))
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for name, op in cases:
        for _ in range(20):
            op()
        kernels = _kernels(lambda op=op: [op() for _ in range(50)])
        per_kernel = []
        for _ in range(5):
            torch.cuda.synchronize()
            torch.cuda._sleep(200_000_000)  # holds the stream while the chain is queued behind it
            begin.record()
            for _ in range(chain):
                op()
            end.record()
            end.synchronize()
            per_kernel.append(begin.elapsed_time(end) * 1e3 / chain)
        count = sum(c for c, _ in kernels.values())
        row = {"case": name, "chain": chain, "per_kernel_us": round(min(per_kernel), 3),
               "per_kernel_us_median": round(statistics.median(per_kernel), 3),
               "kernels_per_op": count / 50, "kernel_us": round(sum(us for _, us in kernels.values()) / count, 3),
               "kernels": kernels}
        rows.append(row)
        print(name, row["per_kernel_us"], row["kernels_per_op"], row["kernel_us"], flush=True)
    return rows


def algo_rows():
    """Which of cuDNN's recurrent algorithms ran (kernels per step, or one persistent kernel) by cell, sizes and dtype."""
    rows = []
    for cell in ("LSTM", "GRU", "RNN"):
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            for hidden in (32, 64, 128, 256, 512, 1024):
                for batch in (1, 8, 32, 128):
                    for layers in (1, 2):
                        model = getattr(nn, cell)(hidden, hidden, layers, batch_first=True).to("cuda", dtype)
                        x = torch.randn(batch, 16, hidden, device="cuda", dtype=dtype)
                        with torch.no_grad():
                            model(x)
                            kernels = _kernels(lambda model=model, x=x: model(x))
                        count = sum(c for c, _ in kernels.values())
                        rows.append({"cell": cell, "dtype": str(dtype).removeprefix("torch."), "hidden": hidden,
                                     "input": hidden, "batch": batch, "layers": layers, "seq": 16,
                                     "kernel_count": count, "kernel_us": round(sum(us for _, us in kernels.values()), 2),
                                     "kernels": dict(list(kernels.items())[:3])})
                        print(cell, rows[-1]["dtype"], hidden, batch, layers, count, flush=True)
    return rows


def split_rows():
    """The host's time for a recurrent layer's forward pass in inference, its forward pass in training, its backward
    pass alone and the whole step, by sequence length and layers: where the host's time goes."""
    rows = []
    for cell in ("LSTM", "GRU"):
        for layers in (1, 2):
            for seq in (16, 64, 256):
                for size in SIZES:
                    n_in, hidden, batch = SIZES[size]
                    model = getattr(nn, cell)(n_in, hidden, layers, batch_first=True).to("cuda")
                    x = torch.randn(batch, seq, n_in, device="cuda")

                    def infer(model=model, x=x):
                        with torch.no_grad():
                            model(x)

                    def forward(model=model, x=x):
                        return model(x)[0].sum()

                    def step(model=model, x=x):
                        model(x)[0].sum().backward()

                    for fn in (infer, forward, step):
                        for _ in range(3):
                            fn()
                    backward = []
                    for _ in range(5):
                        loss = forward()
                        torch.cuda.synchronize()
                        start = time.perf_counter()
                        loss.backward()
                        backward.append((time.perf_counter() - start) * 1e6)
                    torch.cuda.synchronize()
                    row = {"cell": cell, "layers": layers, "seq": seq, "size": size, "input": n_in, "hidden": hidden,
                           "batch": batch, "infer": _issue_and_step(infer), "forward": _issue_and_step(forward),
                           "backward_issue_us": round(min(backward), 2), "step": _issue_and_step(step),
                           "kernels": {name: sum(c for c, _ in _kernels(fn).values()) for name, fn in
                                       (("infer", infer), ("forward", forward), ("step", step))}}
                    rows.append(row)
                    print(cell, layers, seq, size, row["infer"]["issue_us"], row["forward"]["issue_us"],
                          row["backward_issue_us"], row["step"]["issue_us"], row["step"]["step_us"], row["kernels"], flush=True)
    return rows


def sync_rows():
    """Whether a recurrent layer's call waits for the GPU on the host: its time to issue with the GPU idle, and with the
    stream held by a sleeping kernel first (a call that waits takes the sleep too), in inference (``eval()``) and training
    mode, with and without grad; and the time of a call with CUDA events."""
    rows = []
    for size in SIZES:
        n_in, hidden, batch = SIZES[size]
        model = nn.LSTM(n_in, hidden, 2, batch_first=True).to("cuda")
        x = torch.randn(batch, 256, n_in, device="cuda")
        for mode in ("eval", "train"):
            model.train(mode == "train")
            for grad in (False, True):
                def fn(grad=grad):
                    with torch.set_grad_enabled(grad):
                        return model(x)[0]

                for _ in range(3):
                    fn()
                held = []
                for _ in range(5):
                    torch.cuda.synchronize()
                    torch.cuda._sleep(100_000_000)
                    start = time.perf_counter()
                    fn()
                    held.append((time.perf_counter() - start) * 1e6)
                torch.cuda.synchronize()
                sleep = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                sleep[0].record()
                torch.cuda._sleep(100_000_000)
                sleep[1].record()
                sleep[1].synchronize()
                row = {"size": size, "mode": mode, "grad": grad, **_issue_and_step(fn), "held_issue_us": round(min(held), 2),
                       "sleep_us": round(sleep[0].elapsed_time(sleep[1]) * 1e3, 1)}
                rows.append(row)
                print(row, flush=True)
    return rows


def phase_rows(names):
    """The host's time for each phase of a training step of ``capture.py``'s workloads, the GPU idle at its start: the
    forward pass with its loss, the backward pass, the optimizer's step and zero_grad; each phase's ATen ops (as a
    dispatch mode sees them) and its kernels' count and time on the GPU (whether the host or the GPU sets its pace)."""
    from capture import WORKLOADS, loss_of

    rows = []
    for name in names:
        build, make_x, train, dtype, autocast, opt_name = WORKLOADS[name]
        torch.manual_seed(0)
        model = build().to("cuda")
        if dtype is not None:
            model = model.to(dtype)
        model.train(True)
        x = make_x("cuda", dtype or torch.float32)
        opt = {"sgdm": lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9), "adamw": torch.optim.AdamW,
               "adam": torch.optim.Adam}[opt_name](model.parameters())
        state = {}

        def forward():
            with torch.autocast("cuda", dtype=autocast, enabled=autocast is not None):
                state["loss"] = loss_of(model(x))

        def backward():
            state.pop("loss").backward()

        def step():
            opt.step()

        def zero():
            model.zero_grad(set_to_none=True)

        phases = (("forward", forward), ("backward", backward), ("optimizer", step), ("zero_grad", zero))
        for _ in range(3):
            for _, fn in phases:
                fn()
        torch.cuda.synchronize()
        times = {label: [] for label, _ in phases}
        for _ in range(7):
            for label, fn in phases:
                torch.cuda.synchronize()
                start = time.perf_counter()
                fn()
                times[label].append((time.perf_counter() - start) * 1e6)
        torch.cuda.synchronize()
        row = {"name": name}
        for label, fn in phases:
            if label == "backward":
                forward()
                torch.cuda.synchronize()
            seen = _Seen()
            with seen:
                fn()
            if label == "backward":
                forward()
                torch.cuda.synchronize()
            kernels = _kernels(fn)
            if label == "forward":
                state.pop("loss", None)
            row[label] = {"issue_us": round(min(times[label]), 1), "issue_us_median": round(statistics.median(times[label]), 1),
                          "ops": sum(seen.ops.values()), "op_counts": dict(seen.ops),
                          "kernel_count": sum(c for c, _ in kernels.values()),
                          "kernel_us": round(sum(us for _, us in kernels.values()), 1)}
            if label == "forward":
                forward()
        state.clear()
        rows.append(row)
        print(name, {k: (v["issue_us"], v["ops"], v["kernel_count"], v["kernel_us"]) for k, v in row.items() if k != "name"}, flush=True)
        del model, opt, x
        torch.cuda.empty_cache()
    return rows


def main():
    torch.backends.cudnn.benchmark = False
    if "--phases" in sys.argv:
        rows = {"phases": phase_rows(sys.argv[sys.argv.index("--phases") + 1].split(","))}
    elif "--sync" in sys.argv:
        rows = {"sync": sync_rows()}
    elif "--split" in sys.argv:
        rows = {"split": split_rows()}
    elif "--algo" in sys.argv:
        rows = {"algo": algo_rows()}
    else:
        rows = {"gap": gap_rows(), "rnn": rnn_rows()}
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
           "host": _host(), **rows}
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
