"""Values that an analytic run knows: tensors made from constants and from the caller's real tensors.

Fake tensors carry no values, so Python that reads one (``bool(mask.all())``, ``.item()``,
``.tolist()``, ``torch.equal``) and ops whose output size depends on one (``nonzero``,
``masked_select``, ``unique``, ``repeat_interleave``) cannot run on them. Models read
values mostly where they follow from constants: ``nn.TransformerEncoder`` compares the
mask it is given with a causal mask to choose its causal path, a decoder builds its mask
with ``torch.full(...).triu(1)``, positions come from ``arange``, a padding mask arrives
with the inputs. :class:`KnownValues` works out, on the CPU beside the run, the value of
each small tensor (:data:`LIMIT` elements at most) made only from constants and from the
caller's real input tensors and buffers, and answers those reads with it. Random numbers,
uninitialised memory, the weights and meta tensors have no known value: a read of a
tensor made from them still fails (see :func:`unknown_value_hint`). A read of a value made from
random numbers (LayerDrop's ``torch.rand([]) < p``, deciding whether to skip a layer) fails
with its own hint: an analytic run draws none, and a value it would invent would decide
the step's cost.

Aliasing is followed as it is in a real run: a view's value is a view of its base's, so
writes through either reach both; a write whose operands are not all known makes the
written tensor, and every tensor sharing its storage, unknown.

A check of a value the run does not know, whose failing branch raises at once, is taken to pass
(:func:`~.paths.passing_value`): ``torch.distributions`` validating its parameters (``if not
torch._is_all_true(scale > 0): raise ValueError``), ``F.gaussian_nll_loss``'s ``if
torch.any(var < 0): raise``, a model's ``assert (x >= 0).all()``. The real run that an analytic
run stands for passes them, or it would not be profiled; the check's own ops are counted as run.

Unknown values are taken to be finite numbers unless the model puts non-finite ones there: an
operand that is a non-finite number (``masked_fill(mask, float("-inf"))``), a known value that
holds one (the log of a known padding mask), or a value made from either. Tests of finiteness on
the others have their finite answer (``isinf``, ``isnan``, ``x != x``, ``x == inf``), so that a
model guarding against overflow (DETR's training layers: ``if torch.isinf(h).any() or
torch.isnan(h).any(): clamp``) runs as a real run on sound values does. Overflow and division by
zero, which a real run may meet, are not followed.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch._ops import HigherOrderOperator
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensor
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map

from ..ops import METADATA, VALUES_LIMIT, beneath_the_run, bound_arguments
from .beside import detached, fake_mode_alone, in_place_foreach, of_the_fake_mode_alone, unsafe_viewed, writes_in_place_alone
from .finiteness import EQUALITY, FINITENESS_TESTS, is_finite_number, on_finite_numbers
from .layers import Layer, fake_mode_beneath
from .packed import pad_packed
from .paths import passing_value

aten = torch.ops.aten

LIMIT = VALUES_LIMIT  # elements: a tensor larger than this is not worked out (a causal mask of 2048 tokens is at it)

# ops whose outputs hold no defined values: allocation without initialisation
_UNINITIALISED = (
    aten.empty,
    aten.empty_like,
    aten.empty_strided,
    aten.new_empty,
    aten.new_empty_strided,
    aten.empty_permuted,
    aten.resize_,
    aten.set_,
)
# reads of values, answered from a known value: a Python scalar, and outputs whose size depends on the values
_SCALAR_READS = frozenset({aten._local_scalar_dense.default, aten.equal.default})
_SIZED_BY_VALUES = frozenset(
    {
        aten.nonzero.default,
        aten.masked_select.default,
        aten._unique2.default,
        aten.unique_dim.default,
        aten.unique_consecutive.default,
        aten.repeat_interleave.Tensor,
        aten.bincount.default,
    }
)
# CTC's forward (sized by the longest target, tagged as sized by values whatever its arguments)
_CTC = frozenset(op for op in (getattr(aten._ctc_loss, name, None) for name in ("default", "Tensor")) if op is not None)
# ops sized by their boolean masks alone (an index, masked_select), whatever their other operands hold
_SIZED_BY_MASKS = frozenset({aten.index.Tensor, aten.masked_select.default})


class RandomValueRead(DataDependentOutputException):
    """A read of a value an analytic run cannot have: one made from random numbers."""


class KnownValues(Layer):  # type: ignore[no-untyped-call]
    """Works out the values of small tensors made from constants and ``sources`` (pairs of a run's fake
    tensor and the real tensor it stands for), and answers reads of them (see the module's notes)."""

    def __init__(
        self,
        sources: Iterable[tuple[torch.Tensor, torch.Tensor]] = (),
        decided: Callable[[torch.Tensor], torch.Tensor | None] | None = None,
        followed: Callable[[torch.Tensor], bool] = lambda t: False,
    ) -> None:
        super().__init__()
        self._decided = decided  # values a mode beneath gives its outputs (the experts a balanced router hits)
        self._followed = followed  # tensors a mode beneath follows (a router's indices and masks)
        self._values: dict[int, tuple[weakref.ref[torch.Tensor], torch.Tensor]] = {}
        # func -> (values computable, what it writes, whether it draws random numbers)
        self._ops: dict[Any, tuple[bool, tuple[tuple[int, str], ...], bool]] = {}
        self._kinds: dict[Any, int] = {}  # op -> its kind (see _kind)
        self._foreach: set[Any] = set()  # the in-place foreach ops among them (see beside.writes_in_place_alone)
        self._drawn: dict[int, weakref.ref[torch.Tensor]] = {}  # tensors made from random numbers
        self._unbounded: dict[int, weakref.ref[torch.Tensor]] = {}  # unknown values that may not be finite
        self.reads = 0  # values read or sized by: a block memo (observe/blocks.py) replays no call that read one
        for fake, real in sources:
            if (
                not isinstance(real, FakeTensor)
                and real.device.type != "meta"
                and real.numel() <= LIMIT
                and real.shape == fake.shape
                and real.dtype == fake.dtype
            ):
                # its own copy (values are written in place), made beneath the run's fake mode
                self._remember(fake, _on_cpu(aten._to_copy.default, (real,), {"device": torch.device("cpu")}))

    # the values ------------------------------------------------------------------

    def value(self, t: torch.Tensor) -> torch.Tensor | None:
        """``t``'s value on the CPU, or None where the run does not know it."""
        if not isinstance(t, FakeTensor):  # a real tensor is its own value (a subclass's, such as DTensor's, is not known)
            return t if type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type != "meta" else None
        entry = self._values.get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else None

    def follows(self, t: torch.Tensor, finiteness: bool = True) -> bool:
        """Whether the run knows ``t``'s value, that it is made of random draws, or (``finiteness``) that it may not be finite."""
        return self.value(t) is not None or self._is_drawn(t) or (finiteness and self._may_not_be_finite(t, None))

    def _remember(self, fake: torch.Tensor, real: torch.Tensor) -> None:
        key = id(fake)
        values = self._values

        def dead(_: object) -> None:  # the fake tensor is gone: so is its value
            values.pop(key, None)

        values[key] = (weakref.ref(fake, dead), real)

    def _is_drawn(self, t: torch.Tensor) -> bool:
        entry = self._drawn.get(id(t))
        return entry is not None and entry() is t

    def _made_by_draws(self, tensors: list[torch.Tensor], values: list[Any], overwritten: list[torch.Tensor], seeded: bool) -> bool:
        """Whether an op's outputs are made from random draws and known values alone: it draws (``seeded``)
        or reads a draw, and every other operand it reads has a known value (what a draw writes into,
        ``overwritten``, it does not read)."""
        read = [(t, v) for t, v in zip(tensors, values) if not any(t is w for w in overwritten)]
        draws = [self._is_drawn(t) for t, _ in read]
        return all(d or v is not None for d, (_, v) in zip(draws, read)) and (seeded or any(draws))

    def _draw(self, out: Any) -> None:
        """The tensors of ``out`` are made from random numbers."""
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._drawn[id(t)] = weakref.ref(t, _dropper(self._drawn, id(t)))

    def _forget(self, fake: torch.Tensor) -> None:
        """``fake`` was written with values the run does not know: it, and every tensor sharing its storage."""
        real = self.value(fake)
        self._values.pop(id(fake), None)
        if real is None or not isinstance(fake, FakeTensor):
            return
        storage = real.untyped_storage().data_ptr()
        for key, (_, other) in list(self._values.items()):
            if other.untyped_storage().data_ptr() == storage:
                del self._values[key]

    # dispatch --------------------------------------------------------------------

    def handle(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        kind = self._kinds.get(func)
        if kind is None:
            kind = self._kinds[func] = self._kind(func)
        if kind == _PASSED:
            return self.below(func, types, args, kwargs)
        kwargs = kwargs or {}
        if kind == _PLAIN and self._plain(args, kwargs):  # most ops: nothing known in, nothing known out
            # three ops made here as the fake mode beneath would make them, where it alone would see them
            if func in _VIEWS_BESIDE and of_the_fake_mode_alone(args[0]) and not self._followed(args[0]):
                if func is aten.detach.default:  # (autograd's, of each tensor it saves): only a router's follow a detach
                    return detached(args[0])
                if (viewed := unsafe_viewed(args[0], args[1] if len(args) > 1 else kwargs["size"])) is not None:
                    return viewed  # (no layer beneath acts on a contiguous tensor's, nor a router's on one it does not follow)
            if func in self._foreach and (mode := fake_mode_alone()) is not None and writes_in_place_alone(mode, args, kwargs):
                return None  # (nor on an in-place foreach op, which makes nothing)
            out = self.below(func, types, args, kwargs)
            if self._decided is not None and isinstance(out, FakeTensor) and (decided := self._decided(out)) is not None:
                self._remember(out, decided)
            return out
        flat = tree_flatten((args, kwargs))[0]
        tensors = [a for a in flat if isinstance(a, torch.Tensor)]
        values = [self.value(t) for t in tensors]
        known = all(v is not None for v in values) and all(v.numel() <= LIMIT for v in values if v is not None)
        if known and tensors and func in _SCALAR_READS:
            self.reads += 1
            return _on_cpu(func, self._real(args), self._real(kwargs))
        computable, written, seeded = self._ops.get(func) or self._describe(func)
        targets = [t for position, name in written for t in _tensors(args[position] if position < len(args) else kwargs.get(name))]
        drawn = (seeded or bool(self._drawn)) and self._made_by_draws(tensors, values, targets if seeded else [], seeded)
        if func is aten._local_scalar_dense.default and args[0].dtype == torch.bool and (passing := passing_value()) is not None:
            self.reads += 1
            return passing
        if drawn and func in _SCALAR_READS:
            raise RandomValueRead(func)
        if func is aten._local_scalar_dense.default and (constant := _constant_of(args[0], self._followed)) is not None:
            return _on_cpu(func, (constant,), {})  # (as the fake mode beneath answers it, without the way down)
        if known and tensors and func in _SIZED_BY_VALUES:
            return self._sized(func, args, kwargs, tensors[0].device)
        if func in _CTC:
            return self._ctc(func, args, kwargs)
        if func is aten._pack_padded_sequence.default:
            return self._pack(*args, **kwargs)
        try:
            out = self.below(func, types, args, kwargs)
        except (DataDependentOutputException, DynamicOutputShapeException) as error:
            # sized by values beneath (an index by a boolean mask runs nonzero in its fake kernel)
            masks = all(v is not None for t, v in zip(tensors, values) if t.dtype == torch.bool)
            if tensors and (known or (func in _SIZED_BY_MASKS and masks)):
                return self._sized(func, args, kwargs, tensors[0].device, remember=known, error=error)
            raise
        if self._decided is not None and isinstance(out, FakeTensor) and (decided := self._decided(out)) is not None:
            self._remember(out, decided)
            return out
        if drawn:
            self._draw(out)
        # never into a real tensor of the caller's: only the run's fake tensors have values written
        if known and computable and _small(out, targets) and all(isinstance(t, FakeTensor) for t in targets):
            try:
                real = _on_cpu(func, self._real(args), self._real(kwargs))  # writes into the written tensors' values
            except Exception:  # a value the CPU cannot work out is one the run does not know
                pass
            else:
                if self._remember_outputs(out, _apart_from_callers(real, tensors)):
                    return out
        for target in targets:
            if self.value(target) is not None:
                self._forget(target)
        overwritten = (
            targets
            if func.overloadpacket in _OVERWRITING
            else [t for _, name in written if name == "out" for t in _tensors(kwargs.get(name))]
        )
        self._follow_finiteness(func, flat, [(t, v) for t, v in zip(tensors, values) if not any(t is o for o in overwritten)], out)
        return out

    def _kind(self, func: Any) -> int:
        """Passed on (a higher-order operator, a metadata query); possibly plain (see _WATCHED; no random draw); or neither."""
        if isinstance(func, HigherOrderOperator) or func in METADATA:
            return _PASSED
        if in_place_foreach(func):
            self._foreach.add(func)
        return _PLAIN if func not in _WATCHED and not (self._ops.get(func) or self._describe(func))[2] else _FULL

    def _plain(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Whether an op possibly plain (:meth:`_kind`) is one of the many this mode has nothing to do for, decided without
        flattening its arguments: it reads fake tensors, none of them with a known value, a random draw's values or
        possibly non-finite ones, and no non-finite number. Any doubt: not plain."""
        values, drawn, unbounded = self._values, self._drawn, self._unbounded
        reads = False
        for argument in (*args, *kwargs.values()) if kwargs else args:
            for a in argument if isinstance(argument, (list, tuple)) else (argument,):
                if isinstance(a, FakeTensor):
                    if (key := id(a)) in values or key in drawn or key in unbounded:
                        return False
                    reads = True
                elif isinstance(a, torch.Tensor) or (isinstance(a, (float, complex)) and not is_finite_number(a)):
                    return False  # a real tensor (its own value), a subclass, or an infinity or NaN
                elif isinstance(a, (list, tuple)):
                    return False  # nested deeper than ATen's lists of tensors: the full path
        return reads

    # finiteness ------------------------------------------------------------------

    def _may_not_be_finite(self, t: torch.Tensor, value: torch.Tensor | None) -> bool:
        if value is not None:
            if not (value.is_floating_point() or value.is_complex()):
                return False
            with beneath_the_run():
                return not bool(torch.isfinite(value.float() if value.element_size() == 1 else value).all())  # 2.11 has no float8 isfinite
        entry = self._unbounded.get(id(t))
        return entry is not None and entry() is t

    def _follow_finiteness(self, func: Any, flat: list[Any], read: list[tuple[torch.Tensor, Any]], out: Any) -> None:
        """An op's outputs whose values the run does not know: marked as possibly not finite where an operand it
        reads (``read``: each with its value, or None) may not be (a non-finite number, a known value holding
        one, a marked tensor); else, for a test of finiteness (``isinf``, ``isnan``, ``x != x``, ``x == inf``),
        given the value it has on finite numbers."""
        produced = [t for t in _tensors(out) if isinstance(t, FakeTensor) and self.value(t) is None]
        if not produced:
            return
        if any(self._may_not_be_finite(t, v) for t, v in read):
            self.mark_unbounded(produced)
            return
        answer = on_finite_numbers(func, flat)
        if answer is not None:
            if len(produced) == 1 and produced[0].dtype == torch.bool and produced[0].numel() <= LIMIT:
                self._remember(produced[0], _on_cpu(aten.full.default, (list(produced[0].shape), answer), {"dtype": torch.bool}))
        elif any(isinstance(a, (float, complex)) and not is_finite_number(a) for a in flat):
            self.mark_unbounded(produced)

    def mark_unbounded(self, tensors: Iterable[torch.Tensor]) -> None:
        for t in tensors:
            self._unbounded[id(t)] = weakref.ref(t, _dropper(self._unbounded, id(t)))

    def _real(self, tree: Any, zeros: bool = False) -> Any:
        """``tree`` with each tensor replaced by its value (``zeros``: by zeros where it has none), devices by the CPU."""

        def swap(x: Any) -> Any:
            if isinstance(x, torch.Tensor):
                value = self.value(x)
                if value is None and zeros:
                    return _on_cpu(aten.zeros.default, (list(x.shape),), {"dtype": x.dtype})
                return value
            if isinstance(x, torch.device):
                return torch.device("cpu")
            return x

        real = tree_map(swap, tree)
        if isinstance(real, dict):
            if "device" in real:
                real["device"] = torch.device("cpu")
            if real.get("pin_memory"):
                real["pin_memory"] = False
        return real

    def _remember_outputs(self, out: Any, real: Any) -> bool:
        fakes, reals = tree_flatten(out)[0], tree_flatten(real)[0]
        if len(fakes) != len(reals):
            return False
        pairs = [(f, r) for f, r in zip(fakes, reals) if isinstance(f, torch.Tensor)]
        if not all(isinstance(r, torch.Tensor) and r.shape == f.shape and r.dtype == f.dtype for f, r in pairs):
            return False
        for fake, value in pairs:
            self._remember(fake, value)
        return True

    def _sized(self, func: Any, args: Any, kwargs: Any, device: torch.device, remember: bool = True, error: Exception | None = None) -> Any:
        """An op whose output size depends on values it has: its real outputs, as fake tensors with those
        values (``remember=False``: sized by its known boolean masks alone, its other operands taken as
        zeros, and its values unknown). Where the CPU cannot run it, ``error`` (else its own) is raised."""
        self.reads += 1
        try:
            real = _on_cpu(func, self._real(args, zeros=not remember), self._real(kwargs, zeros=not remember))
        except Exception as failure:
            raise (error or failure) from None

        def fake(r: Any) -> Any:
            if not isinstance(r, torch.Tensor):
                return r
            made = torch.empty(r.shape, dtype=r.dtype, device=device)
            if remember:
                self._remember(made, r)
            return made

        return tree_map(fake, real)

    def _ctc(self, func: Any, args: Any, kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``_ctc_loss``'s outputs, sized as its kernels size them (aten/src/ATen/native/LossCTC.cpp,
        cuda/LossCTC.cu): the loss per sequence, and the forward variables ``log_alpha`` over the
        input steps and the targets extended with blanks, for the longest target: ``targets.size(1)``
        for padded targets, the largest of the lengths for concatenated ones (a value it must know)."""
        bound = bound_arguments(func, args, kwargs)
        log_probs, targets, lengths = bound["log_probs"], bound["targets"], bound["target_lengths"]
        if targets.dim() == 2:
            longest = targets.shape[1]
        else:
            value = self.value(lengths) if isinstance(lengths, torch.Tensor) else lengths
            if value is None:
                raise DynamicOutputShapeException(func)
            with _disable_current_modes():
                longest = max((int(n) for n in value.tolist()), default=0) if isinstance(value, torch.Tensor) else max(value, default=0)
        steps, batch = log_probs.shape[0], log_probs.shape[1]
        options = {"dtype": log_probs.dtype, "device": log_probs.device}
        return torch.empty(batch, **options), torch.empty(batch, steps, 2 * longest + 1, **options)

    def _pack(self, input: torch.Tensor, lengths: torch.Tensor, batch_first: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """``pack_padded_sequence``'s kernel: the steps' rows in one tensor, and how many sequences each
        step holds, a CPU tensor (PyTorch's recurrent kernels read it as numbers): worked out here from
        the lengths' known value."""
        value = self.value(lengths)
        if value is None:
            raise DynamicOutputShapeException(aten._pack_padded_sequence.default)
        with _disable_current_modes():
            counts = [int(n) for n in value.tolist()]
            steps = max(counts, default=0)
            # the kernel's checks (aten/src/ATen/native/PackedSequence.cpp)
            if counts and counts[-1] <= 0:
                raise RuntimeError("Length of all samples has to be greater than 0, but found an element in 'lengths' that is <= 0")
            if any(later > earlier for earlier, later in zip(counts, counts[1:])):
                raise RuntimeError("`lengths` array must be sorted in decreasing order when `enforce_sorted` is True")
            batch_sizes = torch.tensor([sum(1 for n in counts if n > t) for t in range(steps)], dtype=torch.int64)
        features = input.shape[2:]
        return input.new_empty((sum(counts), *features)), batch_sizes

    def started(self) -> None:
        # the padding back of a packed sequence is a composite that reads its batch sizes in C++:
        # run as its Python equivalent (pad_packed), which reads them as numbers
        self._patched = "_pad_packed_sequence" not in vars(torch._VF)
        if self._patched:  # (torch._VF looks its functions up: one set on it comes first, until deleted)
            setattr(torch._VF, "_pad_packed_sequence", pad_packed)  # noqa: B010 (the module is typed)

    def stopped(self) -> None:
        if self._patched:
            delattr(torch._VF, "_pad_packed_sequence")

    def _describe(self, func: Any) -> tuple[bool, tuple[tuple[int, str], ...], bool]:
        """Whether ``func``'s outputs have values to work out (not random, not uninitialised), the
        arguments (position, name) it writes into, and whether it draws random numbers."""
        seeded = torch.Tag.nondeterministic_seeded in func.tags
        computable = func.overloadpacket not in _UNINITIALISED and not seeded
        written = tuple((i, a.name) for i, a in enumerate(func._schema.arguments) if a.alias_info is not None and a.alias_info.is_write)
        self._ops[func] = (computable, written, seeded)
        return computable, written, seeded


def _apart_from_callers(real: Any, operands: list[torch.Tensor]) -> Any:
    """``real`` with each value that is a view of a real (not fake) operand copied: the run's fake view of a
    caller's tensor is a view of its fake copy, so writes through it must never reach the caller's memory."""
    callers = {t.untyped_storage().data_ptr() for t in operands if not isinstance(t, FakeTensor)}
    if not callers:
        return real

    def apart(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.untyped_storage().data_ptr() in callers:
            return _on_cpu(aten.clone.default, (value,), {})
        return value

    return tree_map(apart, real)


# ops that overwrite the tensor they write, without reading it
_OVERWRITING = frozenset({aten.copy_, aten.fill_, aten.zero_})
# ops this mode answers, sizes or tests whatever their operands: never plain (see KnownValues._plain)
_WATCHED = frozenset(
    {*_SCALAR_READS, *_SIZED_BY_VALUES, *_SIZED_BY_MASKS, *_CTC, aten._pack_padded_sequence.default, *FINITENESS_TESTS, *EQUALITY}
)
_PASSED, _PLAIN, _FULL = range(3)  # the kinds of op (see KnownValues._kind)
_VIEWS_BESIDE = frozenset({aten.detach.default, aten._unsafe_view.default})  # made above the fake mode (see beside.py)


def _dropper(marks: dict[int, weakref.ref[torch.Tensor]], key: int) -> Callable[[object], None]:
    return lambda _: marks.pop(key, None)  # type: ignore[return-value]  # the tensor is gone: so is its mark


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _small(out: Any, written: list[torch.Tensor]) -> bool:
    """Whether an op's outputs (or, for an op that returns nothing, the tensors it writes) are fake tensors
    small enough to work out."""
    outputs = _tensors(out) or written
    return bool(outputs) and all(isinstance(o, FakeTensor) and o.numel() <= LIMIT for o in outputs)


def _constant_of(t: Any, followed: Callable[[torch.Tensor], bool]) -> torch.Tensor | None:
    """The value a fake tensor holds as its mode's constant (an optimizer's step count), where that mode would answer a
    read of it by reading the constant: a CPU tensor of static shapes, of the fake mode the run's ops reach, that no
    mode between (a router) follows. None elsewhere."""
    if type(t) is not FakeTensor or t.constant is None or t.device.type != "cpu" or followed(t):
        return None
    mode = t.fake_mode
    return t.constant if mode.shape_env is None and fake_mode_beneath() is mode else None


def _on_cpu(func: Any, args: Any, kwargs: Any) -> Any:
    """``func`` on real tensors, beneath none of the run's modes (the fake mode would take them), untracked
    by autograd."""
    with beneath_the_run():
        return func(*args, **kwargs)


def unknown_value_hint(error: BaseException) -> str:
    """What to add to the message of ``error`` where it is an analytic run's read of a value it does not have."""
    if isinstance(error, RandomValueRead):
        return (
            " (the model reads a random number in Python, as LayerDrop does to decide whether to skip a layer: an analytic "
            "run draws no random numbers, and the draw decides the step's cost. Turn the random skipping off to profile "
            "every layer (a layer-drop probability of 0, such as layerdrop=0 in a Hugging Face config), or profile it on "
            "real tensors)"
        )
    if not isinstance(error, (DataDependentOutputException, DynamicOutputShapeException)):
        return ""
    return (
        " (the model reads the values of a tensor, or sizes an output by them: an analytic run knows the values only of "
        f"tensors of at most {LIMIT} elements made from constants and from real input tensors and buffers, not of "
        "tensors computed from the weights, from meta tensors or from random numbers; profile it on real tensors)"
    )
