"""The one table of ATen ops: what the engine knows of each, keyed by overload packet.

The FLOP formulas, the cost model, kernel scratch, the allocator and the kernel outputs of analytic runs all
read an op's class here (:func:`op_info`): adding an op is a row in the tables below, named
once. An entry is keyed by the op's overload packet (``torch.ops.aten.mm``); a look-up from an
overload (``torch.ops.aten.mm.default``) goes through its packet. Ops of a communication namespace (c10d, FSDP's
copies) are one class whatever their name.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import torch

aten = torch.ops.aten

Family = Literal[
    "view",
    "metadata",
    "creation",
    "data_movement",
    "elementwise",
    "reduction",
    "product",
    "convolution",
    "attention",
    "normalization",
    "recurrent",
    "loss",
    "foreach",
    "selection",
    "indexing",
    "sampling",
    "pooling",
    "communication",
]
# the cost model's kind of kernel (:mod:`..targets.cost`): "memory" for every op with a kernel of no other kind,
# "none" for an op that launches none
Kernel = Literal[
    "matmul",
    "conv",
    "conv_narrow",
    "attention",
    "rnn",
    "norm",
    "norm_backward",
    "norm_native",
    "norm_native_backward",
    "pool",
    "pool_backward",
    "memory",
    "none",
]
# the allocations a CUDA kernel makes through the caching allocator while it runs (:mod:`..targets.scratch`),
# by the kind of kernel that makes them
Scratch = Literal[
    "reduction",
    "convolution_bias",
    "flash_backward",
    "cudnn_attention_backward",
    "efficient_attention",
    "embedding_backward",
    "norm_backward",
    "grid_sampler",
    "ctc",
    "reduced_loss",
    "rnn",
]
# a CUDA reduction's accumulator per input element: opmath (float for half inputs), the input's own dtype,
# Welford's (mean, m2, n), a value with its index, a boolean
Accumulator = Literal["opmath", "same", "welford", "index", "boolean"]


@dataclass(frozen=True)
class OpInfo:
    """What the engine knows of one op."""

    name: str  # as the op is reported: "aten.mm"
    family: Family
    flops_per_element: int = 0  # elementwise and foreach ops: per output element; reductions and losses: per input element
    kernel: Kernel = "memory"
    moves_data: bool = False  # data movement, creation or random numbers: 0 FLOPs where it has no formula of its own
    iterated: bool = False  # an elementwise op whose kernels lay out their output in a TensorIterator
    reduced_loss: bool = False  # reduced, its output keeps the storage made for the elementwise loss
    synchronizing: bool = False  # the host waits for its result (a value read back from the GPU)
    scratch: Scratch | None = None  # what its CUDA kernel allocates while it runs, if anything
    accumulator: Accumulator | None = None  # a reduction's, where its CUDA kernel stages partial results
    cublas: bool = False  # runs through cuBLAS: the thread's cuBLAS workspace is allocated by its first call
    cublas_lt: bool = False  # through cuBLASLt too (a bias epilogue, integer and fp8 products): its workspace as well
    math: torch.dtype | None = None  # the dtype its math runs in where its floating tensors do not say it (integer products)


# FLOPs per output element of elementwise kernels (in-place variants share them)
ELEMENTWISE_FLOPS: dict[str, int] = {
    **dict.fromkeys(
        """add sub rsub mul div neg abs sign sgn reciprocal sqrt rsqrt exp exp2 expm1 log log2
        log10 log1p sin cos tan asin acos atan atan2 sinh cosh tanh asinh acosh atanh erf erfc
        erfinv sigmoid relu threshold leaky_relu clamp_min clamp_max maximum minimum fmax fmin
        pow floor ceil round trunc frac remainder fmod floor_divide eq ne lt le gt ge
        logical_not logical_and logical_or logical_xor bitwise_not bitwise_and bitwise_or
        bitwise_xor isnan isinf nan_to_num square copysign hypot xlogy special_xlog1py
        heaviside signbit sinc threshold_backward digamma lgamma polygamma mvlgamma i0 igamma igammac
        special_i0e special_i1 special_i1e special_ndtri special_log_ndtr special_erfcx special_entr
        special_zeta special_bessel_j0 special_bessel_j1 special_bessel_y0 special_bessel_y1
        special_modified_bessel_i0 special_modified_bessel_i1 special_modified_bessel_k0
        special_modified_bessel_k1 special_scaled_modified_bessel_k0 special_scaled_modified_bessel_k1
        special_spherical_bessel_j0 special_airy_ai""".split(),
        1,
    ),
    **dict.fromkeys(
        """clamp clip hardtanh relu6 silu glu _prelu_kernel prelu leaky_relu_backward
        hardtanh_backward hardsigmoid_backward hardshrink hardshrink_backward softshrink_backward
        rrelu_with_noise rrelu_with_noise_backward""".split(),
        2,
    ),
    **dict.fromkeys(
        "addcmul addcdiv lerp softplus logit softshrink sigmoid_backward tanh_backward elu_backward _prelu_kernel_backward".split(), 3
    ),
    **dict.fromkeys("elu celu hardsigmoid log_sigmoid_forward log_sigmoid_backward softplus_backward hardswish_backward".split(), 4),
    "polar": 4,  # (r cos t, r sin t)
    **dict.fromkeys("gelu selu hardswish mish glu_backward".split(), 5),
    "silu_backward": 6,
    "gelu_backward": 9,
    "mish_backward": 10,
    # dropout: compare with a random draw, then multiply by mask and scale
    "native_dropout": 2,
    "native_dropout_backward": 2,
}
# elementwise ops whose kernels make their output otherwise than in a TensorIterator: empty_like their input
# (nan_to_num, dropout) or contiguous (pow with a number for base)
_NOT_ITERATED = {"nan_to_num", "native_dropout", "native_dropout_backward", "rrelu_with_noise", "mvlgamma"}

# FLOPs per input element of reductions
REDUCTION_FLOPS: dict[str, int] = {
    **dict.fromkeys("sum mean nansum prod amax amin max min argmax argmin aminmax all any _is_all_true _is_any_true".split(), 1),
    **dict.fromkeys("cumsum cumprod logcumsumexp cummax cummin".split(), 1),
    **dict.fromkeys("norm linalg_vector_norm".split(), 2),
    **dict.fromkeys("var std var_mean std_mean logsumexp".split(), 3),
}

# losses: FLOPs per input element, reduction included
LOSS_FLOPS = {
    "mse_loss": 3,  # subtract, square, reduce
    "l1_loss": 3,
    "smooth_l1_loss": 4,
    "huber_loss": 4,
    "binary_cross_entropy": 8,  # -(t log x + (1-t) log(1-x)), reduce
    "binary_cross_entropy_with_logits": 8,
    "soft_margin_loss": 4,
}
# their backward ops take (grad_output, input, target, ...): per input element
LOSS_BACKWARD_FLOPS = {
    "mse_loss_backward": 3,  # (x - t) * 2 * g / n
    "smooth_l1_loss_backward": 3,
    "huber_loss_backward": 3,
    "binary_cross_entropy_backward": 5,  # g * (x - t) / (x (1 - x))
    "soft_margin_loss_backward": 4,
}
# losses whose reduced output keeps the storage made for the elementwise loss (CPU and CUDA kernels alike)
_REDUCED_LOSSES = "mse_loss smooth_l1_loss soft_margin_loss binary_cross_entropy".split()

# views and aliases: no kernel
_VIEWS = """view _unsafe_view reshape _reshape_alias expand expand_as permute transpose t squeeze unsqueeze
slice select as_strided alias detach split split_with_sizes unsafe_split unsafe_split_with_sizes chunk unbind
narrow unfold view_as_real view_as_complex _conj _neg_view lift_fresh diagonal""".split()
# allocation without initialisation: no kernel
_UNINITIALISED = "empty empty_like empty_strided new_empty new_empty_strided".split()
# tensor creation and random numbers
_CREATION = """zeros zeros_like new_zeros ones ones_like new_ones full full_like new_full scalar_tensor arange linspace eye
bernoulli rand rand_like randn randn_like randint randint_like randperm normal uniform _fused_dropout
hann_window hamming_window blackman_window bartlett_window kaiser_window exponential geometric cauchy
log_normal random multinomial""".split()
# copies, concatenation, indexing, padding, nearest-neighbour upsampling, embedding lookups, storage changes, checks
_DATA_MOVEMENT = """clone copy _copy_from _copy_from_and_resize _to_copy contiguous cat stack hstack vstack flip roll
index index_select gather scatter masked_select masked_scatter index_put _index_put_impl take
_unsafe_index _unsafe_index_put repeat repeat_interleave tile constant_pad_nd reflection_pad1d
reflection_pad2d reflection_pad3d replication_pad1d replication_pad2d replication_pad3d
embedding upsample_nearest1d upsample_nearest2d upsample_nearest3d _upsample_nearest_exact1d
_upsample_nearest_exact2d _upsample_nearest_exact3d masked_fill where fill zero
tril triu one_hot pixel_shuffle pixel_unshuffle channel_shuffle native_channel_shuffle im2col _local_scalar_dense item
resize_ set_ select_backward slice_backward diag_embed diagonal_backward
select_scatter slice_scatter diagonal_scatter as_strided_scatter diagonal_copy narrow_copy unbind_copy
as_strided_copy expand_copy permute_copy view_copy transpose_copy t_copy unsqueeze_copy squeeze_copy
select_copy slice_copy split_copy alias_copy detach_copy _assert_async _assert_tensor_metadata
_functional_assert_async sym_constrain_range_for_size lift lift_fresh_copy _has_compatible_shallow_copy_type
_nested_tensor_from_mask _nested_tensor_from_mask_left_aligned to_padded_tensor _nested_from_padded _foreach_copy
max_unpool2d max_unpool3d _sparse_coo_tensor_with_dims_and_tensors
_sparse_coo_tensor_unsafe sparse_coo_tensor _coalesce coalesce _indices _values indices values
_pack_padded_sequence _pack_padded_sequence_backward _pad_packed_sequence""".split()
# no kernel beyond the views and uninitialised allocations: a value read on the host, a storage swapped or resized
_NO_KERNEL = "_local_scalar_dense item set_ resize_".split()
# sorting and selection: outputs by values
_SELECTION = "sort topk kthvalue median nanmedian nonzero nonzero_static argwhere _unique2 unique_dim unique_consecutive".split()
# the host waits for these: a value read back, an output sized by values
_SYNCHRONIZING = "_local_scalar_dense item nonzero masked_select".split()

# the kernels of the cost model's compute kinds (a matrix product's in-place variants included); the quantized
# products: int8 x int8 (cuBLASLt's integer product), fp8 with scales, weight-only int4 (tinygemm's tensor-core kernel
# on CUDA; its CPU form takes the CPU's packing)
_PRODUCTS = """mm addmm bmm baddbmm addbmm _grouped_mm addmv mv dot vdot addr _addmm_activation
_int_mm _scaled_mm _scaled_mm_v2 _weight_int4pack_mm _weight_int4pack_mm_for_cpu""".split()
# weight-only int8: CUDA's kernel computes an output element per thread on CUDA cores (float32), off the tensor cores
_CUDA_CORE_PRODUCTS = ["_weight_int8pack_mm"]
_INTEGER_PRODUCTS = {"_int_mm": torch.int8}  # int8 (or uint8) x int8 into int32, on the tensor cores' int8 math
_CONVOLUTIONS = "convolution convolution_backward cudnn_convolution cudnn_convolution_transpose _convolution".split()
_NARROW_CONVOLUTIONS = "_conv_depthwise2d conv_depthwise3d".split()
# 2-d max and average pooling (a 1-d pool is one of them on CUDA): their CUDA kernels work out each element's window,
# or the outputs it feeds, in integer arithmetic (measured: see ..targets.cost.pool_seconds). The others (3-d, adaptive,
# fractional: other kernels, whose backward passes scatter over the output's gradient) are priced by their bytes
_POOLS = "max_pool2d_with_indices max_pool2d_with_indices_backward avg_pool2d avg_pool2d_backward".split()
_ATTENTION = [
    f"{base}{suffix}"
    for base in (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_flash_attention",
        "_efficient_attention",
        "_cudnn_attention",
    )
    for suffix in ("", "_backward", "_forward")
]
_RECURRENT = ["_cudnn_rnn", "_cudnn_rnn_backward"]
_NORMALIZATIONS = """native_batch_norm _native_batch_norm_legit _native_batch_norm_legit_no_training
_native_batch_norm_legit_functional _batch_norm_with_update _batch_norm_no_update cudnn_batch_norm miopen_batch_norm
native_batch_norm_backward batch_norm_backward cudnn_batch_norm_backward miopen_batch_norm_backward native_layer_norm
native_layer_norm_backward native_group_norm native_group_norm_backward _fused_rms_norm _fused_rms_norm_backward""".split()
# batch norm in PyTorch's own CUDA kernels (one block per channel gathers its statistics, a block per plane normalises):
# eager PyTorch takes them over cuDNN's where cuDNN does not take the op: weights that are not float32 (a model in
# half precision, bfloat16 autocast), no weights (affine=False), a 2-d input
_NATIVE_BATCH_NORMS = """native_batch_norm native_batch_norm_backward _native_batch_norm_legit
_native_batch_norm_legit_no_training _native_batch_norm_legit_functional""".split()

# the ops whose CUDA kernels allocate scratch, by kind (reductions and reduced losses: below)
_SCRATCH: dict[Scratch, list[str]] = {
    "convolution_bias": ["convolution_backward"],
    "flash_backward": ["_scaled_dot_product_flash_attention_backward", "_flash_attention_backward"],
    "cudnn_attention_backward": ["_scaled_dot_product_cudnn_attention_backward", "_cudnn_attention_backward"],
    "efficient_attention": [
        "_scaled_dot_product_efficient_attention",
        "_efficient_attention_forward",
        "_scaled_dot_product_efficient_attention_backward",
        "_efficient_attention_backward",
    ],
    "embedding_backward": ["embedding_dense_backward"],
    "norm_backward": ["native_layer_norm_backward", "_fused_rms_norm_backward"],
    "grid_sampler": ["cudnn_grid_sampler", "cudnn_grid_sampler_backward"],
    "ctc": ["_ctc_loss", "_ctc_loss_backward", "_cudnn_ctc_loss"],
    "rnn": _RECURRENT,
}
# the reductions whose CUDA kernels stage partial results, by their accumulator
_ACCUMULATORS: dict[str, Accumulator] = {
    **dict.fromkeys("sum nansum mean prod linalg_vector_norm norm".split(), "opmath"),
    **dict.fromkeys("amax amin max min".split(), "same"),
    **dict.fromkeys("argmax argmin".split(), "index"),
    **dict.fromkeys("var std var_mean std_mean".split(), "welford"),
    **dict.fromkeys("any all".split(), "boolean"),
}
_CUBLAS = "mm addmm bmm baddbmm _addmm_activation addmv mv dot _int_mm _scaled_mm _scaled_mm_v2".split()
# a product with a bias epilogue, and cuBLASLt's integer and fp8 products (fp8 with row-wise scales takes CUTLASS's
# kernel on sm_90 instead: its workspaces are then overstated)
_CUBLAS_LT = "addmm _addmm_activation _int_mm _scaled_mm _scaled_mm_v2".split()

# Collectives and FSDP2's copies in and out of its all-gather buffers: data moved, 0 FLOPs
# (what a collective moves is the collective meter's)
COMMUNICATION_NAMESPACES = frozenset({"c10d", "_c10d_functional", "c10d_functional", "fsdp"})

# Shape and metadata queries, by overload: not computation, not even listed
_METADATA = [
    ("sym_is_contiguous" if hasattr(aten, "sym_is_contiguous") else "is_contiguous", ("default",)),
    ("is_contiguous", ("default", "memory_format")),
    *((name, ("default",)) for name in "is_strides_like_format is_non_overlapping_and_dense is_same_size".split()),
    *((name, ("default",)) for name in "size sym_size stride sym_stride storage_offset sym_storage_offset numel sym_numel dim".split()),
    ("_linalg_check_errors", ("default",)),  # LAPACK's info codes checked: not computation
    # which kernel CTC takes on CUDA: a question answered, not a computation
    ("_use_cudnn_ctc_loss", ()),
    ("_use_miopen_ctc_loss", ()),
]
_PRIM_METADATA = ["layout", "device"]
_PROFILER = ["_record_function_enter", "_record_function_enter_new", "_record_function_exit"]  # markers (optimizers emit them)


def _build() -> dict[Any, OpInfo]:
    facts: dict[str, dict[str, Any]] = {}

    def add(names: Iterable[str], **fact: Any) -> None:
        for name in names:
            facts.setdefault(name, {}).update(fact)

    add((name + suffix for name in _DATA_MOVEMENT for suffix in ("", "_")), family="data_movement", moves_data=True)
    add((name + suffix for name in [*_UNINITIALISED, *_CREATION] for suffix in ("", "_")), family="creation", moves_data=True)
    add((name + suffix for name in _VIEWS for suffix in ("", "_")), family="view", moves_data=True)
    add([*_VIEWS, *_UNINITIALISED, *_NO_KERNEL], kernel="none")
    add(_SYNCHRONIZING, synchronizing=True)
    add(_SELECTION, family="selection")
    for name, per_element in ELEMENTWISE_FLOPS.items():
        add([name, name + "_"], family="elementwise", flops_per_element=per_element)
        add([f"_foreach_{name}", f"_foreach_{name}_"], family="foreach", flops_per_element=per_element)
    add(set(ELEMENTWISE_FLOPS) - _NOT_ITERATED | {"where"}, iterated=True)
    for name, per_element in REDUCTION_FLOPS.items():
        add([name], family="reduction", flops_per_element=per_element)
    for name, per_element in {**LOSS_FLOPS, **LOSS_BACKWARD_FLOPS}.items():
        add([name], family="loss", flops_per_element=per_element)
    add(_REDUCED_LOSSES, family="loss", reduced_loss=True)
    add((name + suffix for name in _PRODUCTS for suffix in ("", "_")), family="product", kernel="matmul")
    add(_CUDA_CORE_PRODUCTS, family="product")
    for name, dtype in _INTEGER_PRODUCTS.items():
        add([name], math=dtype)
    add(_CONVOLUTIONS, family="convolution", kernel="conv")
    add(_NARROW_CONVOLUTIONS, family="convolution", kernel="conv_narrow")
    add(_ATTENTION, family="attention", kernel="attention")
    add(_RECURRENT, family="recurrent", kernel="rnn")
    add(_POOLS, family="pooling")
    add((name for name in _POOLS if name.endswith("_backward")), kernel="pool_backward")
    add((name for name in _POOLS if not name.endswith("_backward")), kernel="pool")
    add(_NORMALIZATIONS, family="normalization")
    add((name for name in _NORMALIZATIONS if name.endswith("_backward")), kernel="norm_backward")
    add((name for name in _NORMALIZATIONS if not name.endswith("_backward")), kernel="norm")
    add((name for name in _NATIVE_BATCH_NORMS if name.endswith("_backward")), kernel="norm_native_backward")
    add((name for name in _NATIVE_BATCH_NORMS if not name.endswith("_backward")), kernel="norm_native")
    add((name for name, _ in _METADATA), family="metadata")
    add(["embedding_dense_backward"], family="indexing")
    add(_SCRATCH["grid_sampler"], family="sampling")
    add(_SCRATCH["ctc"], family="loss")
    for kind, names in _SCRATCH.items():
        add(names, scratch=kind)
    for name, accumulator in _ACCUMULATORS.items():
        add([name], scratch="reduction", accumulator=accumulator)
    add(_REDUCED_LOSSES, scratch="reduced_loss")
    add(_CUBLAS, cublas=True)
    add(_CUBLAS_LT, cublas_lt=True)
    registry: dict[Any, OpInfo] = {}
    for name, fact in facts.items():
        packet = getattr(aten, name, None)
        if packet is not None:
            registry[packet] = OpInfo(str(packet), **fact)
    for namespace, names in ((torch.ops.prim, _PRIM_METADATA), (torch.ops.profiler, _PROFILER)):
        for name in names:
            packet = getattr(namespace, name, None)
            if packet is not None:
                registry[packet] = OpInfo(str(packet), "metadata")
    for name in ("flex_attention", "flex_attention_backward"):  # higher-order operators a CUDA target runs as one kernel
        hop = getattr(torch.ops.higher_order, name, None)
        if hop is not None:
            registry[hop] = OpInfo(f"higher_order.{name}", "attention", kernel="attention")
    return registry


REGISTRY: dict[Any, OpInfo] = _build()
_COMMUNICATION = {namespace: OpInfo(namespace, "communication", moves_data=True) for namespace in COMMUNICATION_NAMESPACES}


def packet_of(func: Any) -> Any:
    """The overload packet of ``func`` (an overload such as ``torch.ops.aten.mm.default``, or a packet itself)."""
    return getattr(func, "_overloadpacket", func)


def op_info(func: Any) -> OpInfo | None:
    """What the engine knows of ``func`` (an overload packet such as ``torch.ops.aten.mm``, or one of its
    overloads); None for an op no table names."""
    info = REGISTRY.get(packet_of(func))
    if info is None:
        return _COMMUNICATION.get(getattr(func, "namespace", ""))
    return info


def _overloads(packet: Any, names: tuple[str, ...]) -> list[Any]:
    return [getattr(packet, overload) for overload in (names or packet.overloads())]


# the metadata queries a dispatch mode answers at once, by overload
METADATA = frozenset(
    {
        *(overload for name, names in _METADATA if hasattr(aten, name) for overload in _overloads(getattr(aten, name), names)),
        *(getattr(torch.ops.prim, name).default for name in _PRIM_METADATA),
        *(
            overload
            for name in _PROFILER
            if (packet := getattr(torch.ops.profiler, name, None)) is not None
            for overload in _overloads(packet, ())
        ),
    }
)
# ``record_function``'s markers, by overload: FSDP2 and the optimizers open ranges (of the ops reaching the fake
# mode in a sharded analytic step, about one in thirteen); no tensor goes in or out, so a dispatch mode with no
# other mode beneath it but a fake mode runs them itself (see analytic/layers.py)
MARKERS = frozenset(
    getattr(packet, overload)
    for name, overload in (("_record_function_enter_new", "default"), ("_record_function_exit", "_RecordFunction"))
    if (packet := getattr(torch.ops.profiler, name, None)) is not None and overload in packet.overloads()
)
# the reduced losses' overloads (see :attr:`OpInfo.reduced_loss`)
REDUCED_LOSSES = frozenset(packet.default for packet, info in REGISTRY.items() if info.reduced_loss)
