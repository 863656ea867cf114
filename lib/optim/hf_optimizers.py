"""The HF ``optim`` names served by optional packages, built with the arguments ``transformers.Trainer`` passes
(mirrors ``transformers.trainer_optimizer``'s handlers, 5.x): ``adafactor`` (HF's own Adafactor, extra ``hf``),
GaLore (``galore_*``, extra ``galore``), APOLLO (``apollo_*``, extra ``apollo``), schedule-free
(``schedule_free_*``, extra ``schedulefree``), ``grokadamw`` (extra ``grokadamw``), ``stable_adamw``
(torch-optimi, extra ``optimi``), torchao's low-bit AdamW (``adamw_torch_4bit``/``adamw_torch_8bit``, extra
``torchao``) and LOMO / AdaLomo (``lomo``, ``adalomo``, extra ``lomo``: the update runs inside the backward pass,
see :func:`fused_backward_of`). The ``*_layerwise`` GaLore / APOLLO names build one optimizer per parameter,
stepped inside backward (:mod:`taskfit.optim.layerwise`). Each package is imported only when its optimizer is
built; a missing one raises ``ModuleNotFoundError`` naming the extra to install, before any training work.

Names whose optimizer needs something taskfit does not have (an XLA / NPU / apex / torchdistx build, transformers
4's own AdamW) raise ``NotImplementedError`` naming the reason (see :data:`UNSUPPORTED`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from taskfit.optim.construct import adam_kwargs, construct, is_single_process, no_leftovers, option, require
from taskfit.optim.layerwise import build_layer_wise, with_plain_state

__all__ = ["BUILDERS", "EXTRAS", "NEEDS_MODEL", "UNSUPPORTED", "fused_backward_of", "optimizers_with_modes",
           "require", "set_optimizer_mode"]

#: name -> why taskfit cannot build it (raised as NotImplementedError when the name is used)
UNSUPPORTED = {
    "adamw_torch_xla": "it needs torch_xla (syncfree AdamW); on XLA use adamw_torch",
    "adamw_torch_npu_fused": "it needs torch_npu (Ascend NPU); use adamw_torch_fused",
    "adamw_anyprecision": "it needs torchdistx, which has no current release; use adamw_torch",
    "adamw_apex_fused": "apex is not supported; use adamw_torch_fused",
    "adamw_hf": "transformers 5 removed its own AdamW; use adamw_torch",
}

def build_hf_adafactor(*, param_groups: list[dict[str, Any]], args: Any, optim_args: dict[str, Any], name: str,
                       weight_decay: float, **_: Any) -> torch.optim.Optimizer:
    """``transformers.optimization.Adafactor(groups, lr=learning_rate, scale_parameter=False,
    relative_step=False)``, as HF's Trainer builds ``optim="adafactor"`` (``optim_args`` may set
    ``eps``, ``clip_threshold``, ``decay_rate``, ``beta1``, ``warmup_init``).

    Raises:
        ModuleNotFoundError: transformers is not installed (``pip install 'taskfit[hf]'``).
    """
    require("transformers", "transformers", "hf", name)
    from transformers.optimization import Adafactor

    return construct(name, Adafactor, param_groups, {"lr": args.learning_rate, "scale_parameter": False,
                                                     "relative_step": False}, optim_args)


def _target_groups(model: nn.Module, args: Any, name: str, extra: dict[str, Any]) -> list[dict[str, Any]]:
    """HF ``_setup_low_rank_optimizer``: the weights of the ``nn.Linear`` modules named by
    ``optim_target_modules`` (names, regexes or ``"all-linear"``) get the low-rank options ``extra``; every other
    parameter is a plain group. (HF does not split these optimizers' parameters by weight decay.)

    Raises:
        ValueError: ``optim_target_modules`` unset, or no linear module matches it.
    """
    targets = getattr(args, "optim_target_modules", None)
    if targets is None:
        raise ValueError(f"optim={name!r} needs optim_target_modules (module names, a regex or 'all-linear').")
    from transformers.trainer_utils import check_target_module_exists

    all_linear = isinstance(targets, str) and targets.replace("_", "-") == "all-linear"
    names = [f"{mod_name}.weight" for mod_name, module in model.named_modules()
             if isinstance(module, nn.Linear) and (all_linear or check_target_module_exists(targets, mod_name))]
    if not names:
        raise ValueError(f"optim={name!r}: no nn.Linear module matches optim_target_modules={targets!r}.")
    target = [p for n, p in model.named_parameters() if n in names]
    other = [p for n, p in model.named_parameters() if n not in names]
    return [{"params": other}, {"params": target, **extra}]


def build_galore(*, args: Any, optim_args: dict[str, Any], name: str, model: nn.Module, **_: Any) -> Any:
    """GaLore (``galore_adamw``, ``galore_adamw_8bit``, ``galore_adafactor`` and their ``*_layerwise`` forms) with
    HF's options: ``rank`` (128), ``update_proj_gap`` (200), ``scale`` (0.25), ``proj_type`` ("std") from
    ``optim_args`` for the target modules; Adafactor also gets ``scale_parameter=False, relative_step=False``
    (the layer-wise Adafactor too: transformers 5 leaves them out there, and its ``galore_adafactor_layerwise``
    then fails with "Cannot combine manual `lr` and `relative_step=True` options"). A ``*_layerwise`` name builds
    one optimizer per parameter (:func:`taskfit.optim.layerwise.build_layer_wise`).

    Raises:
        ModuleNotFoundError: galore-torch missing (``pip install 'taskfit[galore]'``).
        ValueError: ``optim_target_modules`` unset or matching nothing; the 8-bit form on CPU parameters; a
            layer-wise name with ``gradient_accumulation_steps`` other than 1.
    """
    require("galore_torch", "galore-torch", "galore", name)
    import galore_torch

    optim_args = dict(optim_args)
    base = name.removesuffix("_layerwise")
    cls = {"galore_adamw": galore_torch.GaLoreAdamW, "galore_adamw_8bit": galore_torch.GaLoreAdamW8bit,
           "galore_adafactor": galore_torch.GaLoreAdafactor}[base]
    extra = {"rank": option(optim_args, "rank", 128, int),
             "update_proj_gap": option(optim_args, "update_proj_gap", 200, int),
             "scale": option(optim_args, "scale", 0.25), "proj_type": optim_args.pop("proj_type", "std")}
    if base == "galore_adamw_8bit" and not all(p.is_cuda for p in model.parameters()):
        raise ValueError(f"optim={name!r} needs CUDA parameters (its step calls torch.cuda.synchronize); on the CPU "
                         f"use {name.replace('_8bit', '')}.")
    kwargs: dict[str, Any] = {"lr": args.learning_rate}
    if base == "galore_adafactor":
        kwargs.update(scale_parameter=False, relative_step=False)
    no_leftovers(name, optim_args)
    groups = _target_groups(model, args, name, extra)
    if name != base:
        return build_layer_wise(name, cls, groups, kwargs, args)
    return with_plain_state(cls(groups, **kwargs))  # optimizer.pt loads with weights_only=True


def build_apollo(*, args: Any, optim_args: dict[str, Any], name: str, model: nn.Module, **_: Any) -> Any:
    """APOLLO (``apollo_adamw``, ``apollo_adamw_layerwise``) with HF's options: ``rank`` (128), ``proj``
    ("random"), ``scale_type`` ("channel"), ``update_proj_gap`` (200), ``scale`` (1.0), ``proj_type`` ("std")
    and the Adam betas/eps for the target modules; the layer-wise name builds one optimizer per parameter.

    Raises:
        ModuleNotFoundError: apollo-torch missing (``pip install 'taskfit[apollo]'``).
        ValueError: ``optim_target_modules`` unset or matching nothing; the layer-wise name with
            ``gradient_accumulation_steps`` other than 1.
    """
    require("apollo_torch", "apollo-torch", "apollo", name)
    from apollo_torch import APOLLOAdamW

    optim_args = dict(optim_args)
    extra = {"rank": option(optim_args, "rank", 128, int), "proj": optim_args.pop("proj", "random"),
             "scale_type": optim_args.pop("scale_type", "channel"),
             "update_proj_gap": option(optim_args, "update_proj_gap", 200, int),
             "scale": option(optim_args, "scale", 1.0), "proj_type": optim_args.pop("proj_type", "std"),
             **adam_kwargs(args)}
    no_leftovers(name, optim_args)
    groups, kwargs = _target_groups(model, args, name, extra), {"lr": args.learning_rate}
    if name.endswith("_layerwise"):
        return build_layer_wise(name, APOLLOAdamW, groups, kwargs, args)
    return with_plain_state(APOLLOAdamW(groups, **kwargs))


def build_grokadamw(*, param_groups: list[dict[str, Any]], args: Any, optim_args: dict[str, Any], name: str,
                    **_: Any) -> Any:
    """``grokadamw.GrokAdamW(groups, lr, alpha_init=0.98, lamb=2.0, gamma=0.1, grokking_signal_decay_rate=0.1,
    gradient_clipping=1.0)`` (each overridable in ``optim_args``), as HF builds it (no Adam betas).

    Raises:
        ModuleNotFoundError: grokadamw missing (``pip install 'taskfit[grokadamw]'``).
    """
    require("grokadamw", "grokadamw", "grokadamw", name)
    from grokadamw import GrokAdamW

    optim_args = dict(optim_args)
    kwargs = {"lr": args.learning_rate, "alpha_init": option(optim_args, "alpha_init", 0.98),
              "lamb": option(optim_args, "lamb", 2.0), "gamma": option(optim_args, "gamma", 0.1),
              "grokking_signal_decay_rate": option(optim_args, "grokking_signal_decay_rate", 0.1),
              "gradient_clipping": option(optim_args, "gradient_clipping", 1.0)}
    no_leftovers(name, optim_args)
    return GrokAdamW(param_groups, **kwargs)


def build_schedule_free(*, param_groups: list[dict[str, Any]], args: Any, optim_args: dict[str, Any], name: str,
                        **_: Any) -> Any:
    """schedule-free AdamW / SGD / RAdam with HF's arguments: ``weight_decay``, ``warmup_steps`` (AdamW, SGD;
    the field's value as given), ``weight_lr_power`` (2.0), ``r`` (0.0), Adam betas/eps (AdamW, RAdam). The
    training loop calls ``optimizer.train()`` before each training step and ``optimizer.eval()`` before each
    evaluation, as HF's Trainer does.

    Raises:
        ModuleNotFoundError: schedulefree missing (``pip install 'taskfit[schedulefree]'``).
    """
    require("schedulefree", "schedulefree", "schedulefree", name)
    import schedulefree

    optim_args = dict(optim_args)
    kwargs: dict[str, Any] = {"lr": args.learning_rate}
    if name == "schedule_free_radam":
        cls, extra = schedulefree.RAdamScheduleFree, adam_kwargs(args)
    elif name == "schedule_free_adamw":
        cls = schedulefree.AdamWScheduleFree
        extra = {**adam_kwargs(args), "warmup_steps": getattr(args, "warmup_steps", 0)}
    else:
        cls, extra = schedulefree.SGDScheduleFree, {"warmup_steps": getattr(args, "warmup_steps", 0)}
    kwargs.update(extra, weight_decay=getattr(args, "weight_decay", 0.0),
                  weight_lr_power=option(optim_args, "weight_lr_power", 2.0), r=option(optim_args, "r", 0.0))
    no_leftovers(name, optim_args)
    return cls(param_groups, **kwargs)


def build_stable_adamw(*, param_groups: list[dict[str, Any]], args: Any, optim_args: dict[str, Any], name: str,
                       **_: Any) -> Any:
    """``optimi.StableAdamW(groups, lr, betas, eps, weight_decay, decouple_lr=False, max_lr=None,
    kahan_sum=None)`` (the last three from ``optim_args``), as HF builds ``stable_adamw``.

    Raises:
        ModuleNotFoundError: torch-optimi missing (``pip install 'taskfit[optimi]'``).
    """
    require("optimi", "torch-optimi", "optimi", name)
    from optimi import StableAdamW

    optim_args = dict(optim_args)
    kwargs = {"decouple_lr": option(optim_args, "decouple_lr", False, bool),
              "max_lr": option(optim_args, "max_lr", None),
              "kahan_sum": option(optim_args, "kahan_sum", None, bool)}
    no_leftovers(name, optim_args)
    return StableAdamW(param_groups, lr=args.learning_rate, **adam_kwargs(args),
                       weight_decay=getattr(args, "weight_decay", 0.0), **kwargs)


def build_torchao(*, param_groups: list[dict[str, Any]], args: Any, optim_args: dict[str, Any], name: str,
                  **_: Any) -> Any:
    """torchao ``AdamW4bit`` / ``AdamW8bit`` with HF's arguments: lr, betas, eps, ``block_size`` (256) and
    ``bf16_stochastic_round`` (False) from ``optim_args``.

    Raises:
        ModuleNotFoundError: torchao missing (``pip install 'taskfit[torchao]'``).
    """
    require("torchao", "torchao", "torchao", name)
    from torchao.optim import AdamW4bit, AdamW8bit

    optim_args = dict(optim_args)
    cls = AdamW4bit if name == "adamw_torch_4bit" else AdamW8bit
    kwargs = {"block_size": option(optim_args, "block_size", 256, int),
              "bf16_stochastic_round": option(optim_args, "bf16_stochastic_round", False, bool)}
    no_leftovers(name, optim_args)
    return cls(param_groups, lr=args.learning_rate, **adam_kwargs(args), **kwargs)


def build_lomo(*, args: Any, optim_args: dict[str, Any], name: str, model: nn.Module, **_: Any) -> Any:
    """``lomo_optim.Lomo(model, lr=learning_rate)`` / ``AdaLomo(model, lr=learning_rate)``, as HF builds
    ``lomo`` / ``adalomo`` (no other option; HF ignores ``optim_args`` for them, taskfit refuses them). The
    optimizer registers gradient hooks on ``model``'s parameters and updates each parameter inside
    ``fused_backward(loss, lr)``, which the fit loop calls instead of the backward pass (its ``step`` does
    nothing), with the learning rate of the current step, as HF's ``training_step`` and accelerate do.

    Raises:
        ModuleNotFoundError: lomo-optim missing (``pip install 'taskfit[lomo]'``).
        ValueError: ``adalomo`` without a usable CUDA device (lomo-optim allocates AdaLomo's state with
            ``.cuda()``), or a model with a 0-dim trainable parameter (AdaLomo factors each parameter's
            second moment by rows and columns).
        TypeError: ``optim_args`` given.
    """
    require("lomo_optim", "lomo-optim", "lomo", name)
    from lomo_optim import AdaLomo, Lomo

    no_leftovers(name, dict(optim_args))
    if name == "adalomo":
        try:
            torch.zeros(1).cuda()  # what AdaLomo does for its state
        except (AssertionError, RuntimeError) as err:
            raise ValueError(f"optim='adalomo' needs a CUDA device: lomo-optim's AdaLomo keeps its state on the "
                             f"GPU ({err}). On the CPU use optim='lomo'.") from None
        flat = [n for n, p in model.named_parameters() if p.requires_grad and p.dim() == 0]
        if flat:
            raise ValueError(f"optim='adalomo' cannot optimise 0-dim parameters {flat}: AdaLomo factors each "
                             "parameter's second moment by rows and columns. Give them shape (1,).")
    return (AdaLomo if name == "adalomo" else Lomo)(model, lr=args.learning_rate)


def fused_backward_of(optimizer: Any, strategy: Any) -> Any:
    """For a LOMO / AdaLomo optimizer, ``loss -> None`` that runs ``optimizer.fused_backward(loss, lr)`` with
    ``lr`` the first group's current rate (HF: ``Trainer._get_learning_rate()`` passed to accelerate's
    ``backward``, which calls ``lomo_backward``); None for any other optimizer. The fit loop decides once per run
    and then calls it instead of ``strategy.backward``; the optimizer's ``step`` is skipped (a no-op in
    accelerate) and clipping finds no gradients (HF logs ``grad_norm`` 0.0).

    Raises:
        ValueError: a LOMO optimizer with several processes or a wrapping strategy, or with a gradient scaler
            (``16-mixed``): its hooks update the local parameters during backward, before any gradient sync,
            and read unscaled gradients.
    """
    import sys

    module = sys.modules.get("lomo_optim")  # not imported: no LOMO optimizer exists
    if module is None or not isinstance(optimizer, (module.Lomo, module.AdaLomo)):
        return None
    if not is_single_process(strategy):
        raise ValueError(f"optim={type(optimizer).__name__} updates parameters inside backward and runs on a single "
                         f"process (strategy 'single_device'); got {type(strategy).__name__} with "
                         f"{strategy.world_size} process(es).")
    if getattr(strategy.precision, "scaler", None) is not None:
        raise ValueError(f"optim={type(optimizer).__name__} does not work with a gradient scaler (precision "
                         "'16-mixed'): use 'bf16-mixed' or '32-true'.")
    groups = optimizer.param_groups

    def backward(loss: torch.Tensor) -> None:
        optimizer.fused_backward(loss, groups[0]["lr"])
    return backward


_GALORE = ("galore_adamw", "galore_adamw_8bit", "galore_adafactor")
_LAYER_WISE = (*(f"{n}_layerwise" for n in _GALORE), "apollo_adamw_layerwise")
_SCHEDULE_FREE = ("schedule_free_adamw", "schedule_free_sgd", "schedule_free_radam")
#: name -> builder (registered in taskfit.optim.optimizers.OPTIMIZERS); builders marked in NEEDS_MODEL get model=
BUILDERS = {
    "adafactor": build_hf_adafactor,
    **dict.fromkeys((*_GALORE, *_LAYER_WISE[:3]), build_galore),
    **dict.fromkeys(("apollo_adamw", "apollo_adamw_layerwise"), build_apollo),
    "grokadamw": build_grokadamw,
    **dict.fromkeys(_SCHEDULE_FREE, build_schedule_free),
    "stable_adamw": build_stable_adamw,
    **dict.fromkeys(("adamw_torch_4bit", "adamw_torch_8bit"), build_torchao),
    **dict.fromkeys(("lomo", "adalomo"), build_lomo),
}
NEEDS_MODEL = (*_GALORE, "apollo_adamw", *_LAYER_WISE, "lomo", "adalomo")
#: the extra that installs each built name's package
EXTRAS = {"adafactor": "hf", **dict.fromkeys((*_GALORE, *_LAYER_WISE[:3]), "galore"),
          **dict.fromkeys(("apollo_adamw", "apollo_adamw_layerwise"), "apollo"), "grokadamw": "grokadamw",
          **dict.fromkeys(_SCHEDULE_FREE, "schedulefree"), "stable_adamw": "optimi", "adamw_torch_4bit": "torchao",
          "adamw_torch_8bit": "torchao", "lomo": "lomo", "adalomo": "lomo"}


def optimizers_with_modes(optimizers: Any) -> list[Any]:
    """The optimizers (unwrapped from a ``LightningOptimizer``) that have both ``train()`` and ``eval()``
    (schedule-free): the fit loop asks once per run and switches only these."""
    out = []
    for opt in optimizers or ():
        opt = getattr(opt, "optimizer", opt) if not hasattr(opt, "train") else opt  # a LightningOptimizer wrapper
        if callable(getattr(opt, "train", None)) and callable(getattr(opt, "eval", None)):
            out.append(opt)
    return out


def set_optimizer_mode(optimizers: Any, mode: str) -> None:
    """Call ``optimizer.train()`` / ``.eval()`` (``mode``) on the optimizers that have both (schedule-free), as
    HF's Trainer does before each training step and before each evaluation; other optimizers are left alone."""
    for opt in optimizers_with_modes(optimizers):
        getattr(opt, mode)()
