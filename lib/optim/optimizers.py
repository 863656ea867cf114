"""Optimizers by name (F-LOOP-4): ``optim``, ``optim_args`` and the weight-decay parameter groups.

Mirrors how HF ``Trainer.create_optimizer`` turns ``TrainingArguments`` into an optimizer: the name in
``args.optim`` picks the optimizer class (``"adamw_torch"``, ``"sgd"``, ...), ``learning_rate``,
``adam_beta1``/``adam_beta2``/``adam_epsilon`` and ``weight_decay`` set its hyperparameters, and parameters
are split into a decay group and a no-decay group (biases and normalisation layers, see
:func:`get_decay_parameter_names`). Built: ``adamw_torch``, ``adamw_torch_fused``, ``sgd``, ``adagrad``,
``rmsprop``, the bitsandbytes family (``adamw_bnb_8bit``, ``adamw_8bit``, ``paged_adamw_*``,
``lion_8bit``/``lion_32bit``, ``ademamix*``, ``rmsprop_bnb*``; extra ``bnb``), ``lion`` (lion-pytorch; extra
``lion``), and through :mod:`taskfit.optim.hf_optimizers` HF's ``adafactor`` (``transformers.optimization.Adafactor``),
GaLore and APOLLO (also layer-wise), schedule-free, GrokAdamW, StableAdamW, torchao's low-bit AdamW and LOMO.
The remaining HF names (XLA/NPU/apex/torchdistx builds, ``adamw_hf``) raise ``NotImplementedError`` with the
reason.
"""

from __future__ import annotations

import ast
import re
from typing import Any

import torch
from torch import nn

from taskfit.optim.construct import construct
from taskfit.optim.construct import require_distribution as _require
from taskfit.optim.hf_optimizers import BUILDERS, EXTRAS, NEEDS_MODEL, UNSUPPORTED
from taskfit.optim.names import IMPLEMENTED_OPTIMIZERS, PENDING_OPTIMIZERS, TARGET_MODULE_OPTIMIZERS
from taskfit.optim.param_kinds import split_by_tensor_kind, uses_multi_tensor_kernel
from taskfit.registry import Registry

__all__ = ["BNB_OPTIMIZERS", "OPTIMIZERS", "create_optimizer", "get_decay_parameter_names", "parse_optim_args"]

#: HF optimizer names served by bitsandbytes.
BNB_OPTIMIZERS = IMPLEMENTED_OPTIMIZERS[IMPLEMENTED_OPTIMIZERS.index("adamw_bnb_8bit"):
                                        IMPLEMENTED_OPTIMIZERS.index("rmsprop_bnb_32bit") + 1]

# Normalisation layers whose parameters (scale and shift) never get weight decay. ``_NormBase`` covers
# BatchNorm1d/2d/3d, SyncBatchNorm, InstanceNorm1d/2d/3d and their lazy variants.
_NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.LayerNorm,
    nn.GroupNorm,
    nn.modules.batchnorm._NormBase,
    nn.LocalResponseNorm,
    nn.CrossMapLRN2d,
) + ((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ())

# The name patterns of HF ``Trainer.get_decay_parameter_names`` (matched against the lower-cased full name).
_NO_DECAY_NAME_PATTERNS = tuple(
    re.compile(p) for p in (r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)")
)


def _is_norm_module(module: nn.Module) -> bool:
    """A torch normalisation layer, or any module whose class name contains "norm" (``T5LayerNorm``, ...)."""
    return isinstance(module, _NORM_TYPES) or "norm" in type(module).__name__.lower()


def get_decay_parameter_names(model: nn.Module) -> list[str]:
    """Names of the parameters of ``model`` that get weight decay.

    A parameter is left out (goes to the no-decay group) when either

    * the module that owns it directly is a normalisation layer: ``nn.LayerNorm``, ``nn.GroupNorm``,
      ``nn.BatchNorm*``/``nn.SyncBatchNorm``/``nn.InstanceNorm*``, ``nn.RMSNorm``, ``nn.LocalResponseNorm``,
      or any module whose class name contains ``"norm"`` in any case (HF ``T5LayerNorm``, ``LlamaRMSNorm``, a
      user's ``MyRMSNorm``); or
    * its full dotted name, lower-cased, matches one of HF's patterns: contains ``"bias"``, ``"layernorm"`` or
      ``"rmsnorm"``, or has a ``norm`` / ``*_norm`` path component (``"encoder.norm.weight"``,
      ``"attn_norm.weight"``).

    Mirrors ``transformers.Trainer.get_decay_parameter_names`` (which only knows ``nn.LayerNorm`` by type and
    relies on the name patterns for the rest); the type and class-name checks here also catch norm layers with
    arbitrary attribute names (``ln_f``, ``bn1``).

    Args:
        model (nn.Module): the model whose parameters are split.

    Returns:
        list[str]: names as in ``model.named_parameters(remove_duplicate=False)``, in that order. A parameter
        shared under several names appears once per name that qualifies.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"get_decay_parameter_names expects an nn.Module, got {type(model).__name__}.")
    names: list[str] = []
    for module_name, module in model.named_modules(remove_duplicate=False):
        if _is_norm_module(module):
            continue
        for param_name, param in module._parameters.items():
            if param is None:
                continue
            full = f"{module_name}.{param_name}" if module_name else param_name
            if not any(p.search(full.lower()) for p in _NO_DECAY_NAME_PATTERNS):
                names.append(full)
    return names


# ----------------------------------------------------------------------------------------------- optim_args
_TRUE, _FALSE, _NONE = {"true", "yes"}, {"false", "no"}, {"none", "null"}


def _parse_value(text: str) -> Any:
    """``"1"`` -> 1, ``"0.9"`` -> 0.9, ``"true"`` -> True, ``"none"`` -> None, ``"(0.9,0.99)"`` -> tuple."""
    low = text.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    if low in _NONE:
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        pass
    try:
        return float(text)  # "inf", "nan", "-inf"
    except ValueError:
        pass
    if text[0] in "([{'\"":
        raise ValueError(f"cannot parse value {text!r}")
    return text


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets or quotes.

    Raises:
        ValueError: unbalanced brackets or quotes.
    """
    pieces, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth < 0:
                raise ValueError(f"Bad optim_args {text!r}: unbalanced {ch!r}.")
        elif ch == "," and depth == 0:
            pieces.append(text[start:i])
            start = i + 1
    if depth or quote:
        raise ValueError(
            f"Bad optim_args {text!r}: unbalanced brackets or quotes in {text[start:].strip()!r}."
        )
    pieces.append(text[start:])
    return pieces


def parse_optim_args(optim_args: str | dict[str, Any] | None) -> dict[str, Any]:
    """Parse HF's ``optim_args`` string ``"momentum=0.9,nesterov=True,betas=(0.9,0.95)"`` into a dict.

    Mirrors ``TrainingArguments.optim_args`` ("optional arguments that are supplied to the optimizer"), except
    that HF keeps every value a string and each optimizer converts the few it knows; here values are converted
    once: ``true``/``false``/``yes``/``no`` (any case) -> bool, ``none``/``null`` -> None, Python literals
    (int, float, tuple, list, quoted string) via ``ast.literal_eval``, ``inf``/``nan`` -> float, anything else
    stays a ``str``. Commas inside brackets do not split, so tuple values work. Empty pieces (a trailing
    comma) are ignored.

    Args:
        optim_args (str | dict | None): the string, an already parsed mapping (returned as a shallow copy), or
            ``None``/``""`` for no extra arguments.

    Returns:
        dict[str, Any]: keyword arguments for the optimizer.

    Raises:
        ValueError: a piece without ``=``, an empty key or value, a key that is not an identifier, a key given
            twice, unbalanced brackets or quotes; the message names the bad piece.
        TypeError: ``optim_args`` is neither str, dict nor None, or a dict key is not a str.
    """
    if optim_args is None:
        return {}
    if isinstance(optim_args, dict):
        bad = [k for k in optim_args if not isinstance(k, str)]
        if bad:
            raise TypeError(f"optim_args keys must be str, got {bad!r}.")
        return dict(optim_args)
    if not isinstance(optim_args, str):
        raise TypeError(
            f"optim_args must be a str like 'a=1,b=0.9', a dict or None; got {type(optim_args).__name__}."
        )
    result: dict[str, Any] = {}
    for raw in _split_top_level(optim_args):
        piece = raw.strip()
        if not piece:
            continue
        key, sep, value = piece.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise ValueError(f"Bad optim_args piece {piece!r}: expected 'name=value' (in {optim_args!r}).")
        if not key.isidentifier():
            raise ValueError(f"Bad optim_args piece {piece!r}: {key!r} is not a valid argument name.")
        if key in result:
            raise ValueError(f"Bad optim_args piece {piece!r}: {key!r} is given twice.")
        try:
            result[key] = _parse_value(value)
        except ValueError as err:
            raise ValueError(f"Bad optim_args piece {piece!r}: {err}.") from None
    return result


# ------------------------------------------------------------------------------------------------- builders
def _build_adamw(
    *,
    param_groups: list[dict[str, Any]],
    args: Any,
    optim_args: dict[str, Any],
    name: str,
    weight_decay: float,
    fused: bool = False,
) -> torch.optim.Optimizer:
    """``torch.optim.AdamW`` with lr, betas=(adam_beta1, adam_beta2), eps=adam_epsilon
    (mirrors HF ``_get_adamw_torch``).

    ``optim_args`` may override any AdamW argument; ``beta1``/``beta2`` are accepted as aliases that replace
    one entry of ``betas``. ``fused=True`` (``adamw_torch_fused``) uses the fused kernel; so does plain
    ``adamw_torch`` when every parameter is a floating-point CUDA tensor and ``optim_args`` sets none of
    ``fused``/``foreach``/``differentiable``/``capturable``; otherwise torch picks its default (``foreach``).

    Raises:
        ValueError: ``fused=True`` on parameters whose device or dtype the fused kernel does not support.
    """
    optim_args = dict(optim_args)
    betas = list(optim_args.pop("betas", (args.adam_beta1, args.adam_beta2)))
    if "beta1" in optim_args:
        betas[0] = optim_args.pop("beta1")
    if "beta2" in optim_args:
        betas[1] = optim_args.pop("beta2")
    kwargs: dict[str, Any] = {
        "lr": args.learning_rate,
        "betas": (float(betas[0]), float(betas[1])),
        "eps": args.adam_epsilon,
        "weight_decay": weight_decay,
    }
    params = [p for g in param_groups for p in g["params"]]
    if not fused and params and all(p.device.type == "cuda" and p.is_floating_point() for p in params) \
            and not {"fused", "foreach", "differentiable", "capturable"} & set(optim_args):
        fused = True  # on CUDA the fused kernel is the fastest AdamW (F-ACC-2); optim_args may opt out
    if not fused:
        return construct(name, torch.optim.AdamW, param_groups, kwargs, optim_args)
    kwargs["fused"] = True
    supported = _fused_supported_devices()
    # several processes: meta parameters are placeholders the strategy fills from rank 0 (``rank_zero_init``),
    # whose real parameters this check sees; in one process they stay meta
    several = torch.distributed.is_available() and torch.distributed.is_initialized() \
        and torch.distributed.get_world_size() > 1
    placeholder = "meta" if several else None
    bad = sorted(
        {
            f"{p.device.type}/{p.dtype}"
            for g in param_groups
            for p in g["params"]
            if (p.device.type not in supported and p.device.type != placeholder) or not torch.is_floating_point(p)
        }
    )
    if bad:  # torch itself only checks this lazily, at the first step
        raise ValueError(
            f"optim={name!r}: torch {torch.__version__} has no fused AdamW kernel for parameters on "
            f"{', '.join(bad)} (it needs floating-point parameters on one of: {', '.join(supported)}). "
            f"Use optim='adamw_torch' instead."
        )
    try:
        return construct(name, torch.optim.AdamW, param_groups, kwargs, optim_args)
    except RuntimeError as err:  # e.g. fused with foreach=True or differentiable=True from optim_args
        raise ValueError(f"optim={name!r}: {err}") from err


def _fused_supported_devices() -> list[str]:
    """Device types with fused optimizer kernels in this torch build (2.13: ``cpu``, ``cuda``, ...)."""
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices
    except ImportError:  # pragma: no cover - private helper moved
        return ["cuda", "cpu", "mps", "xpu", "hpu"]
    return list(_get_fused_kernels_supported_devices())


def _build_torch(
    *,
    param_groups: list[dict[str, Any]],
    args: Any,
    optim_args: dict[str, Any],
    name: str,
    weight_decay: float,
    cls: type[torch.optim.Optimizer],
) -> torch.optim.Optimizer:
    """``cls(groups, lr=learning_rate, **optim_args)`` for SGD/Adagrad/RMSprop (HF ``_get_sgd`` etc.)."""
    return construct(
        name, cls, param_groups, {"lr": args.learning_rate, "weight_decay": weight_decay}, optim_args
    )


def _build_bnb(
    *, param_groups: list[dict[str, Any]], args: Any, optim_args: dict[str, Any], name: str, weight_decay: float
) -> torch.optim.Optimizer:
    """bitsandbytes optimizers under HF's names (mirrors ``Trainer.get_optimizer_cls_and_kwargs``).

    ``adamw_*``/``paged_adamw_*`` -> ``bnb.optim.AdamW``, ``ademamix*`` -> ``AdEMAMix``, ``lion_*``/``paged_lion_*``
    -> ``Lion``, ``rmsprop_bnb*`` -> ``RMSprop``; ``optim_bits`` is 8 when the name contains ``8bit`` else 32;
    ``is_paged`` when it contains ``paged``. Adam/Lion/AdEMAMix get ``betas=(adam_beta1, adam_beta2)``
    (AdEMAMix: ``beta3``, ``alpha``, ``t_alpha``, ``t_beta3`` from ``optim_args``), Adam/AdEMAMix
    ``eps=adam_epsilon``. 8-bit state: two uint8 tensors (1 byte each per element) plus block-wise absmax/qmap
    for parameters of >= 4096 elements (``min_8bit_size``); smaller ones keep 32-bit state.

    Raises:
        ModuleNotFoundError: bitsandbytes is not installed (``pip install 'taskfit[bnb]'``).
    """
    _require("bitsandbytes", "bnb", name)
    import bitsandbytes as bnb

    optim_args = dict(optim_args)
    kwargs: dict[str, Any] = {"lr": args.learning_rate, "weight_decay": weight_decay,
                              "optim_bits": 8 if "8bit" in name else 32}
    betas = (float(optim_args.pop("beta1", args.adam_beta1)), float(optim_args.pop("beta2", args.adam_beta2)))
    if "ademamix" in name:
        cls: type = bnb.optim.AdEMAMix
        kwargs.update(betas=(*betas, float(optim_args.pop("beta3", 0.9999))), eps=args.adam_epsilon,
                      alpha=float(optim_args.pop("alpha", 5.0)))
    elif "adam" in name:
        cls = bnb.optim.AdamW
        kwargs.update(betas=betas, eps=args.adam_epsilon)
    elif "lion" in name:
        cls = bnb.optim.Lion
        kwargs["betas"] = betas
    else:
        cls = bnb.optim.RMSprop
    if "rmsprop" not in name:
        kwargs["is_paged"] = "paged" in name
    return construct(name, cls, param_groups, kwargs, optim_args)


def _build_lion(
    *, param_groups: list[dict[str, Any]], args: Any, optim_args: dict[str, Any], name: str, weight_decay: float
) -> torch.optim.Optimizer:
    """``lion_pytorch.Lion(groups, lr, betas=(adam_beta1, adam_beta2), weight_decay)`` (extra ``lion``).

    One momentum buffer per parameter (``exp_avg``, 4 bytes/element in fp32), half of AdamW's state.

    Raises:
        ModuleNotFoundError: lion-pytorch is not installed (``pip install 'taskfit[lion]'``).
    """
    _require("lion-pytorch", "lion", name)
    from lion_pytorch import Lion

    optim_args = dict(optim_args)
    betas = (float(optim_args.pop("beta1", args.adam_beta1)), float(optim_args.pop("beta2", args.adam_beta2)))
    return construct(name, Lion, param_groups,
                      {"lr": args.learning_rate, "betas": betas, "weight_decay": weight_decay}, optim_args)


def _unsupported_builder(*, name: str, **_: Any) -> torch.optim.Optimizer:
    raise NotImplementedError(f"optim={name!r} is not supported by taskfit: {UNSUPPORTED[name]}.")


OPTIMIZERS = Registry("optimizer")
"""Optimizer names of ``TrainingArguments.optim`` -> builders ``f(param_groups=, args=, optim_args=, name=,
weight_decay=) -> torch.optim.Optimizer``. Reserved names carry ``pending`` and raise
``NotImplementedError``."""

OPTIMIZERS.register("adamw_torch", _build_adamw, description="torch.optim.AdamW (foreach where supported)")
OPTIMIZERS.register(
    "adamw_torch_fused", _build_adamw, fused=True, description="torch.optim.AdamW(fused=True)"
)
OPTIMIZERS.register("sgd", _build_torch, cls=torch.optim.SGD, description="torch.optim.SGD")
OPTIMIZERS.register("adagrad", _build_torch, cls=torch.optim.Adagrad, description="torch.optim.Adagrad")
OPTIMIZERS.register("rmsprop", _build_torch, cls=torch.optim.RMSprop, description="torch.optim.RMSprop")
OPTIMIZERS.register("lion", _build_lion, description="lion_pytorch.Lion (extra 'lion')")
for _name in BNB_OPTIMIZERS:
    OPTIMIZERS.register(_name, _build_bnb, description="bitsandbytes (extra 'bnb')")

for _name, _builder in BUILDERS.items():
    OPTIMIZERS.register(_name, _builder, description=f"{_builder.__doc__.split(chr(10))[0]} (extra {EXTRAS[_name]!r})")
for _name in PENDING_OPTIMIZERS:
    OPTIMIZERS.register(_name, _unsupported_builder, pending=f"not supported: {UNSUPPORTED[_name]}")
del _name, _builder


# ------------------------------------------------------------------------------------------------- creation
def _name_of(value: Any) -> Any:
    """Accept a plain name or an enum-like object with ``.value`` (HF
    ``OptimizerNames``/``SchedulerType``)."""
    return getattr(value, "value", value)


def _split_params(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """The decay / no-decay groups of HF ``Trainer.create_optimizer``, trainable parameters only, empty ones
    dropped."""
    decay_names = set(get_decay_parameter_names(model))
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for n, p in model.named_parameters():
        if p.requires_grad:
            (decay if n in decay_names else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def create_optimizer(model: nn.Module, args: Any) -> torch.optim.Optimizer:
    """Build the optimizer named by ``args.optim`` for the trainable parameters of ``model``.

    Mirrors ``transformers.Trainer.create_optimizer`` + ``Trainer.get_optimizer_cls_and_kwargs``. ``args`` is
    duck-typed and read by the ``TrainingArguments`` attribute names:

    * ``optim`` (str or enum with ``.value``, default ``"adamw_torch"``): a name of :data:`OPTIMIZERS`.
    * ``optim_args`` (str | dict | None): extra optimizer keyword arguments, see :func:`parse_optim_args`;
      they override the values below (e.g. ``"momentum=0.9,nesterov=True"`` for ``sgd``,
      ``"betas=(0.9,0.95)"`` or ``"beta2=0.95"`` for AdamW). A ``weight_decay`` here replaces
      ``args.weight_decay`` for the decay group.
    * ``learning_rate`` (float): ``lr`` of every optimizer.
    * ``weight_decay`` (float): decay of the decay group; the no-decay group (biases and normalisation layers,
      :func:`get_decay_parameter_names`) always has ``weight_decay=0.0``.
    * ``adam_beta1``, ``adam_beta2``, ``adam_epsilon`` (float): ``betas``/``eps`` of the AdamW variants only.

    Parameters with ``requires_grad=False`` are left out; an empty group is dropped, so the optimizer has one
    or two param groups (decay first); under tensor parallelism a group that mixes ``DTensor``s and plain
    tensors becomes one sub-group per kind with the same hyperparameters (decay sub-groups still first).

    Args:
        model (nn.Module): the model whose parameters are optimised.
        args (Any): an object with the attributes above (``FitArguments`` or HF ``TrainingArguments``).

    Returns:
        torch.optim.Optimizer: the optimizer.

    Raises:
        ValueError: unknown ``optim`` (lists the valid names with a "Did you mean"); bad ``optim_args``;
            ``model`` has no trainable parameter; ``adamw_torch_fused`` on parameters the fused kernel does
            not support.
            ``optim_target_modules`` set for an optimizer that does not read it (only GaLore/APOLLO do).
        NotImplementedError: ``optim`` is a reserved HF name that is not built (the message names it).
        ModuleNotFoundError: the optimizer's package is missing (the message names the extra: ``taskfit[bnb]``,
            ``taskfit[lion]``).
        TypeError: an ``optim_args`` key the optimizer does not accept (the message lists the accepted ones).
    """
    name = _name_of(getattr(args, "optim", "adamw_torch"))
    entry = OPTIMIZERS.get(name)
    if name in UNSUPPORTED:
        _unsupported_builder(name=name)  # raises NotImplementedError with the reason
    target_modules = getattr(args, "optim_target_modules", None)
    if target_modules is not None and name not in TARGET_MODULE_OPTIMIZERS:
        raise ValueError(f"optim_target_modules={target_modules!r} is only read by the GaLore/APOLLO optimizers "
                         f"({', '.join(TARGET_MODULE_OPTIMIZERS)}); optim={name!r} would ignore it. Unset it.")
    optim_args = parse_optim_args(getattr(args, "optim_args", None))
    weight_decay = float(optim_args.pop("weight_decay", getattr(args, "weight_decay", 0.0)))
    groups = _split_params(model, weight_decay)
    if not groups:
        raise ValueError(
            f"create_optimizer: {type(model).__name__} has no parameter with requires_grad=True."
        )
    extra = {"model": model} if name in NEEDS_MODEL else {}  # GaLore / APOLLO pick their target modules
    by_kind = split_by_tensor_kind(groups)  # before the build: torch writes its defaults into the group dicts
    optimizer = entry.build(
        param_groups=groups, args=args, optim_args=optim_args, name=name, weight_decay=weight_decay, **extra
    )
    if by_kind is not groups and uses_multi_tensor_kernel(optimizer):  # tensor parallelism left plain tensors
        optimizer = entry.build(
            param_groups=by_kind, args=args, optim_args=optim_args, name=name, weight_decay=weight_decay, **extra
        )
    return optimizer
