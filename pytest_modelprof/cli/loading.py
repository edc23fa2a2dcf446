"""What ``modelprof profile`` profiles: the model its MODEL names, built with the ``--kw``
arguments, and the inputs its ``--input`` shapes describe; each fault a one-line usage error
that says what was expected."""

from __future__ import annotations

import ast
import difflib
import importlib
import importlib.util
import inspect
import math
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .usage import CliError, one_line

LARGEST_SIZE = 2**63 - 1  # torch holds sizes as signed 64-bit integers


def load_factory(spec: str) -> Any:
    """The callable that ``spec`` names: ``package.module:callable`` or ``file.py[:callable]``."""
    target, separator, attribute = spec.rpartition(":")
    if not separator or spec.endswith(".py"):
        target, attribute = spec, ""
    if target.endswith(".py"):
        module = _import_file(spec, Path(target))
        attribute = attribute or "model"
    else:
        if not attribute:
            raise CliError(f"unknown model {spec!r}: expected package.module:callable, e.g. torchvision.models:resnet50")
        try:
            module = importlib.import_module(target)
        except ImportError as error:
            raise CliError(f"unknown model {spec!r}: {error}") from error
        except Exception as error:  # the module itself failed while it was imported
            raise CliError(f"importing {target} raised {type(error).__name__}: {one_line(error)}") from error
    factory = getattr(module, attribute, None)
    if factory is None:
        close = did_you_mean(attribute, [n for n in dir(module) if not n.startswith("_")])
        hint = f"; did you mean {close!r}?" if close else ""
        raise CliError(f"unknown model {spec!r}: {module.__name__} has no {attribute!r}{hint}")
    if not callable(factory):
        raise CliError(f"unknown model {spec!r}: {attribute!r} is not callable")
    return factory


def did_you_mean(name: str, names: list[str]) -> str | None:
    """The one of ``names`` that ``name`` most likely meant: the same name in another case
    (``ResNet18`` for ``resnet18``), else the closest; None when none is close."""
    same = sorted(n for n in names if n.lower() == name.lower())
    if same:
        return same[0]
    close = difflib.get_close_matches(name, names, n=1)
    return close[0] if close else None


def _import_file(spec: str, path: Path) -> Any:
    if not path.is_file():
        raise CliError(f"unknown model {spec!r}: no file {path}")
    module_spec = importlib.util.spec_from_file_location(path.stem, path)
    if module_spec is None or module_spec.loader is None:
        raise CliError(f"unknown model {spec!r}: cannot import {path}")
    module = importlib.util.module_from_spec(module_spec)
    sys.path.insert(0, str(path.resolve().parent))
    try:
        module_spec.loader.exec_module(module)
    except Exception as error:
        raise CliError(f"importing {path} raised {type(error).__name__}: {one_line(error)}") from error
    finally:
        sys.path.pop(0)
    return module


def build_model(factory: Any, kwargs: dict[str, Any], analytic: bool) -> nn.Module:
    """``factory(**kwargs)``, on the meta device for an ``analytic`` run where it can be built there."""
    try:
        if analytic:
            try:
                with torch.device("meta"):
                    model = factory(**kwargs)
            except NotImplementedError:  # needs real values while it builds (e.g. torchvision's RegNet)
                model = factory(**kwargs)
        else:
            model = factory(**kwargs)
    except Exception as error:
        name = getattr(factory, "__qualname__", repr(factory))
        message = f"building the model: {name}({_arguments(kwargs)}) raised {type(error).__name__}: {one_line(error)}"
        raise CliError(with_memory_hint(message, "meta" if analytic else "cpu")) from error
    if not isinstance(model, nn.Module):
        raise CliError(f"the model's callable returned {type(model).__name__}, not a torch.nn.Module")
    return model


def _arguments(kwargs: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in kwargs.items())


def model_on_meta(model: nn.Module) -> bool:
    return any(t.device.type == "meta" for t in (*model.parameters(), *model.buffers()))


def with_memory_hint(message: str, device: str) -> str:
    """``message``, with the hint of an analytic run where it says memory ran out on a real device."""
    if device != "meta" and ("allocate" in message or "out of memory" in message.lower()):
        return message + "; an analytic run allocates nothing: --device meta"
    return message


def with_shape_hint(message: str, model: nn.Module, shapes: list[tuple[int, ...]]) -> str:
    """``message``, with a hint where commas were likely meant as ``x``: the model was given more
    inputs than its ``forward`` takes, and each of them has one dimension (``--input 1,3,224,224``)."""
    if len(shapes) < 2 or any(len(shape) != 1 for shape in shapes):
        return message
    try:
        inspect.signature(model.forward).bind(*shapes)
    except TypeError:
        joined = "x".join(str(shape[0]) for shape in shapes)
        return message + f"; x joins one input's sizes (--input {joined}), commas separate inputs"
    except ValueError:  # no signature to read (a builtin): nothing to say
        pass
    return message


def parse_shapes(text: str) -> list[tuple[int, ...]]:
    """The shapes of ``--input``: dimensions joined by ``x``, inputs separated by commas."""
    shapes = []
    for part in text.split(","):
        dims = part.strip().lower().split("x")
        if not all(d.isascii() and d.isdigit() and int(d) > 0 for d in dims):
            raise CliError(f"bad shape {part.strip()!r}: expected positive integers joined by x, e.g. 1x3x224x224")
        for index, size in enumerate(int(d) for d in dims):
            if size > LARGEST_SIZE:
                raise CliError(f"bad shape {part.strip()!r}: dimension {index} is {size}, over torch's limit of {LARGEST_SIZE} (2**63 - 1)")
        shapes.append(tuple(int(d) for d in dims))
    return shapes


def parse_keywords(items: list[str]) -> dict[str, Any]:
    """The ``--kw KEY=VALUE`` arguments: each value a Python literal, else the string as written."""
    kwargs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise CliError(f"bad --kw {item!r}: expected KEY=VALUE, e.g. num_classes=10")
        try:
            kwargs[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):  # not a literal: a string
            kwargs[key] = value
    return kwargs


def make_inputs(shapes: list[tuple[int, ...]], dtype: torch.dtype, device: str) -> tuple[torch.Tensor, ...]:
    """Random floats, or zeros for integer inputs (valid indices for any embedding)."""
    make = torch.randn if dtype.is_floating_point else torch.zeros
    inputs = []
    for shape in shapes:
        shown, elements = "x".join(map(str, shape)), math.prod(shape)
        if elements * dtype.itemsize > LARGEST_SIZE:  # no tensor is that large, not even a fake one
            raise CliError(f"bad shape {shown!r}: {elements:,} elements of {dtype.itemsize} bytes, over torch's limit of 2**63 - 1 bytes")
        try:
            inputs.append(make(shape, dtype=dtype, device=device))
        except (RuntimeError, MemoryError) as error:
            size = elements * dtype.itemsize / 1e9
            kind = str(dtype).removeprefix("torch.")
            hint = ": an analytic run allocates nothing: --device meta" if device != "meta" else f": {one_line(error)}"
            raise CliError(f"cannot allocate an input of shape {shown} ({size:,.1f} GB of {kind}){hint}") from error
    return tuple(inputs)
