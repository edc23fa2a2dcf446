"""Sizes that depend on data, in analytic runs: the tokens a mixture-of-experts router sends each expert.

Fake tensors carry no values, so an op whose output size depends on them (``nonzero``,
and ``torch.where(mask)``, which calls it) cannot run on them. The one place models do
this routinely is routing: a router picks experts (``topk``/``argmax`` indices over the
experts), and each expert takes the tokens whose choice is its own
(``torch.where(indices == e)``, or a ``one_hot`` of the indices, sliced per expert).
:class:`Routing` follows that chain and answers ``nonzero`` with the *balanced* count:
indices drawn over ``n`` experts are taken to hit each one equally, so a mask of
``indices == e`` holds ``numel / n`` true elements. Routers that count each expert's tokens
(ones scattered at the chosen experts and summed over the tokens, as JetMoE does, or a
``bincount``/``histc`` of the indices) and read the counts back (``tolist()``, ``item()``)
to split the tokens get the same balanced counts, the first ``total mod n`` experts one
token more. The counts of all experts add up to the tokens times the experts each token
picks, exactly as in a real run; so do the experts' FLOPs, which are linear in their tokens.
A capacity router (Switch Transformers: each expert keeps a sequence's tokens up to its
capacity, its place in the queue a ``cumsum`` of the one-hot choices along the sequence)
keeps ``min(L / n, capacity)`` of each sequence of L for every expert: exact where no expert
of a real run's split overflows either. The experts that get any token (``nonzero`` of
``counts > 0``) are the first ``min(n, total)``, and their indices are given as values, so
that a loop over them reads each expert's number. Memory follows the balanced split (a
real run's split depends on the data). A ``nonzero`` of anything else is refused with a
clear error: profile that model on real tensors. (The experts' grouped product in full
precision, which PyTorch's meta kernel refuses, is answered by :mod:`.kernel_outputs`.)
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any

import torch

from ..errors import ProfileError
from ..ops import beneath_the_run
from .layers import Layer

aten = torch.ops.aten

_INDICES_AT = {aten.topk.default: 1, aten.sort.default: 1, aten.sort.stable: 1, aten.max.dim: 1, aten.min.dim: 1}
_INDICES = {aten.argmax.default, aten.argmin.default}
_VIEWS = {
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten.permute.default,
    aten.transpose.int,
    aten.t.default,
    aten.select.int,
    aten.slice.Tensor,
    aten.squeeze.dim,
    aten.squeeze.default,
    aten.unsqueeze.default,
    aten.expand.default,
    aten.clone.default,
    aten._to_copy.default,
    aten.alias.default,
    aten.detach.default,
}


class Routing(Layer):  # type: ignore[no-untyped-call]
    """Follows router indices and the masks made of them; answers ``nonzero`` on those masks."""

    def __init__(self) -> None:
        super().__init__()
        # id(tensor) -> (tensor, value): ("indices", n) uniform over n choices; ("density", p) a mask
        self._known: dict[int, tuple[weakref.ref[torch.Tensor], tuple[Any, ...]]] = {}
        self._decided: dict[int, tuple[weakref.ref[torch.Tensor], torch.Tensor]] = {}
        self.acted = 0  # the reads it answered and sizes it decided: a block memo (observe/blocks.py) replays no call that needed one

    def _get(self, t: Any) -> tuple[Any, ...] | None:
        if not isinstance(t, torch.Tensor):
            return None
        entry = self._known.get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else None

    def follows(self, t: torch.Tensor) -> bool:
        """Whether ``t`` is a tensor this mode follows, or one whose value it decided."""
        return self._get(t) is not None or self.decided(t) is not None

    def _set(self, t: Any, value: tuple[Any, ...]) -> None:
        if isinstance(t, torch.Tensor):
            self._known[id(t)] = (weakref.ref(t), value)

    def handle(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        if func not in _FOLLOWED:
            return self.below(func, types, args, kwargs)  # most ops: nothing to follow
        kwargs = kwargs or {}
        if func is aten.nonzero.default:
            self.acted += 1
            return self._nonzero(args[0])
        if func is aten._local_scalar_dense.default and (known := self._get(args[0])) is not None and known[0] == "count":
            self.acted += 1
            return int(known[1])  # one expert's tokens, read (tolist, item)
        if func is aten.bincount.default and (counted := self._bincount(args, kwargs)) is not None:
            self.acted += 1
            return counted
        out = self.below(func, types, args, kwargs)
        follow = _FOLLOW.get(func)
        if follow is not None:
            follow(self, func, args, kwargs, out)
        return out

    def _set_match(self, out: torch.Tensor, left: Any, right: Any) -> None:
        """``indices == e`` (one expert: 1 in n), and ``indices == arange(C)`` (one_hot's
        decomposition: each index matches one class of C)."""
        for indices, other in ((left, right), (right, left)):
            known = self._get(indices)
            if known is None or known[0] != "indices":
                continue
            if isinstance(other, int) or (isinstance(other, torch.Tensor) and other.numel() == 1):
                self._set(out, ("density", 1 / known[1]))
            elif (classes := self._get(other)) is not None and classes[0] == "arange" and classes[1] >= known[1]:
                self._set(out, ("density", 1 / classes[1]))
            return

    def _set_kept(self, out: torch.Tensor, left: Any, right: Any) -> None:
        """``mask * within``: of the tokens a one-hot mask gives each expert along a dimension of L (a share
        ``p``, so L * p each, balanced), those within its capacity: min(L * p, capacity) of the L."""
        for mask, within in ((left, right), (right, left)):
            chosen, places = self._get(mask), self._get(within)
            if chosen is not None and places is not None and chosen[0] == "density" and places[0] == "within":
                length, capacity = places[2], places[3]
                self._set(out, ("density", max(0.0, min(length * chosen[1], capacity)) / length if length else 0.0))
                return

    def decided(self, t: torch.Tensor) -> torch.Tensor | None:
        """The value the balanced split gives ``t`` (``nonzero`` of the experts that get tokens: the first k,
        in order), on the CPU; None where it gives none."""
        entry = self._decided.get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else None

    def _bincount(self, args: Any, kwargs: dict[str, Any]) -> torch.Tensor | None:
        """``bincount`` of indices over n experts, unweighted: every expert gets tokens, so n bins (or
        ``minlength``), holding the tokens' count."""
        known = self._get(args[0])
        if known is None or known[0] != "indices" or (args[1] if len(args) > 1 else kwargs.get("weights")) is not None:
            return None
        minlength = args[2] if len(args) > 2 else kwargs.get("minlength", 0)
        out = torch.empty((max(int(known[1]), minlength),), dtype=torch.long, device=args[0].device)
        self._set(out, ("counts", args[0].numel()))
        return out

    def _split_counts(self, func: Any, args: Any, out: Any, total: float) -> None:
        """One expert's count (``select``, or each of ``unbind``'s) of a 1-D tensor of counts: the balanced
        split of ``total`` over its elements, the first ``total mod n`` one more, so that they add up."""
        counts = args[0]
        if counts.dim() != 1 or counts.numel() == 0:
            return
        n = counts.numel()
        share, extra = divmod(int(total), n)
        if func is aten.unbind.int:
            for e, one in enumerate(out):
                self._set(one, ("count", share + (e < extra)))
        else:  # select.int(counts, 0, e)
            e = args[2] % n
            self._set(out, ("count", share + (e < extra)))

    def _nonzero(self, mask: torch.Tensor) -> torch.Tensor:
        known = self._get(mask)
        if known is not None and known[0] == "first":  # the experts that get tokens: the first k
            hit = int(known[1])
            out = torch.empty((hit, 1), dtype=torch.long, device=mask.device)
            with beneath_the_run():
                value = torch.arange(hit, dtype=torch.long).unsqueeze(1)
            key = id(out)
            self._decided[key] = (weakref.ref(out, lambda _: self._decided.pop(key, None)), value)
            return out
        if known is None or known[0] != "density":
            raise ProfileError(
                "nonzero (or torch.where(mask)) needs the values of its input, which an analytic run does not have "
                "(it knows the values of tensors made from constants and from real inputs, not of tensors computed from "
                "the weights, from meta tensors or random numbers); analytic mode sizes it otherwise only for a router's "
                "masks (indices from topk/argmax compared with an expert, or their one_hot): profile this model on real tensors"
            )
        rows = round(mask.numel() * known[1])
        return torch.empty((rows, mask.dim()), dtype=torch.long, device=mask.device)


# what each op's output is known to be, from what is known of its arguments (after the op ran) -----------------
# (one look-up per op: the branches of a chain of tests cost the ops at its end, the views among them, more)

Follow = Callable[[Routing, Any, Any, dict[str, Any], Any], None]


def _by_element(routing: Routing, func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:
    known = routing._get(args[0])
    if known is not None and known[0] == "counts":
        routing._split_counts(func, args, out, known[1])


def _indices_at(routing: Routing, func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:
    at = 2 if func is aten.topk.default else 1
    dim = args[at] if len(args) > at else kwargs.get("dim", -1)
    if isinstance(dim, int) and args[0].dim():
        routing._set(out[_INDICES_AT[func]], ("indices", args[0].shape[dim]))


def _indices(routing: Routing, func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    if isinstance(dim, int):
        routing._set(out, ("indices", args[0].shape[dim]))


def _one_hot(routing: Routing, func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:  # where it is not decomposed
    known = routing._get(args[0])
    classes = args[1] if len(args) > 1 else kwargs.get("num_classes", -1)
    if known is not None and known[0] == "indices":
        routing._set(out, ("density", 1 / max(known[1], classes if isinstance(classes, int) else 0)))


def _arange(routing: Routing, func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:
    routing._set(out, ("arange", out.numel()))


def _eq(routing: Routing, func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:
    routing._set_match(out, args[0], args[1])


def _scatter(routing: Routing, func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:  # ones at the chosen indices: a mask
    known, dim = routing._get(args[2]), args[1]
    if known is not None and known[0] == "indices" and args[3] == 1 and args[0].dim():
        routing._set(out, ("density", args[2].shape[dim] / args[0].shape[dim]))


def _cumsum(routing: Routing, func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:
    known = routing._get(args[0])  # each token's place in its expert's queue (a capacity router)
    if known is not None and known[0] == "density" and args[0].dim():
        routing._set(out, ("priority", known[1], args[0].shape[args[1]]))


def _within(routing: Routing, func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:
    known = routing._get(args[0])  # the places within an expert's capacity
    if known is not None and known[0] == "priority" and isinstance(args[1], (int, float)):
        capacity = math.floor(args[1]) if func is aten.le.Scalar else math.ceil(args[1]) - 1
        routing._set(out, ("within", known[1], known[2], capacity))


def _mul(routing: Routing, func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:
    routing._set_kept(out, args[0], args[1])  # a mask times its places within capacity: the tokens each expert keeps


def _any_token(routing: Routing, func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:
    if args[1] == 0:  # the experts that get any token
        known = routing._get(args[0])
        if known is not None and known[0] == "counts" and args[0].dim() == 1 and args[0].numel():
            routing._set(out, ("first", min(args[0].numel(), int(known[1]))))


def _index(routing: Routing, func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:
    known, indices = routing._get(args[0]), args[1]  # one expert's slice of a mask: its share
    if known is not None and known[0] == "density" and len(indices) == 1 and indices[0] is not None:
        if not indices[0].is_floating_point() and indices[0].dtype != torch.bool:
            routing._set(out, known)


def _sum(routing: Routing, func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:
    known = routing._get(args[0])  # a mask's true elements, counted
    if known is not None and known[0] == "density":
        routing._set(out, ("counts", round(args[0].numel() * known[1])))


def _histc(routing: Routing, func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:
    known = routing._get(args[0])  # indices binned by expert
    if known is not None and known[0] == "indices":
        routing._set(out, ("counts", args[0].numel()))


def _view(routing: Routing, func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:
    known = routing._get(args[0])
    if known is not None:
        routing._set(out, known)


def _by_element_or_view(routing: Routing, func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:
    known = routing._get(args[0])
    if known is not None and known[0] == "counts":
        routing._split_counts(func, args, out, known[1])
    elif known is not None:
        routing._set(out, known)


_FOLLOW: dict[Any, Follow] = {
    **dict.fromkeys(_VIEWS, _view),
    **dict.fromkeys(_INDICES_AT, _indices_at),
    **dict.fromkeys(_INDICES, _indices),
    aten.one_hot.default: _one_hot,
    **dict.fromkeys((aten.arange.default, aten.arange.start, aten.arange.start_step), _arange),
    **dict.fromkeys((aten.eq.Scalar, aten.eq.Tensor), _eq),
    **dict.fromkeys((aten.scatter.value, aten.scatter_.value), _scatter),
    aten.cumsum.default: _cumsum,
    **dict.fromkeys((aten.le.Scalar, aten.lt.Scalar), _within),
    aten.mul.Tensor: _mul,
    **dict.fromkeys((aten.gt.Scalar, aten.ne.Scalar), _any_token),
    aten.index.Tensor: _index,
    **dict.fromkeys((aten.sum.dim_IntList, aten.sum.default), _sum),
    aten.histc.default: _histc,
    aten.unbind.int: _by_element,  # (unbind and select take one count out of a tensor of counts)
    aten.select.int: _by_element_or_view,
}
# every op the mode acts on: the rest pass through untouched
_FOLLOWED = frozenset({*_FOLLOW, aten.nonzero.default, aten._local_scalar_dense.default, aten.bincount.default})
