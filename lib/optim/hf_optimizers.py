"""The HF ``optim`` names served by optional packages, built with the arguments ``transformers.Trainer`` passes
(mirrors ``transformers.trainer_optimizer``'s handlers, 5.x): ``adafactor`` (HF's own Adafactor, extra ``hf``),
GaLore (``galore_*``, extra ``galore``), APOLLO (``apollo_*``, extra ``apollo``), schedule-free
(``schedule_free_*``, extra ``schedulefree``), ``grokadamw`` (extra ``grokadamw``), ``stable_adamw``
(torch-optimi, extra ``optimi``), torchao's low-bit AdamW (``adamw_torch_4bit``/``adamw_torch_8bit``, extra
``torchao``) and LOMO / AdaLomo (``lomo``, ``adalomo``, extra ``lomo``: the update runs inside the backward pass,
see :func:`fused_backward_of`). Each package is imported only when its optimizer is built; a missing one raises
``ModuleNotFoundError`` naming the extra to install, before any training work.

Names whose optimizer needs something taskfit's loop does not do (the layer-wise GaLore /
APOLLO hooks that step inside backward, an XLA / NPU / apex / torchdistx build) raise ``NotImplementedError``
naming the reason (see :data:`UNSUPPORTED`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

#: name -> why taskfit cannot build it (raised as NotImplementedError when the name is used)
UNSUPPORTED = {
    "galore_adamw_layerwise": "layer-wise GaLore steps inside backward hooks with one optimizer and scheduler per "
                              "parameter; use galore_adamw",
    "galore_adamw_8bit_layerwise": "layer-wise GaLore steps inside backward hooks; use galore_adamw_8bit",
    "galore_adafactor_layerwise": "layer-wise GaLore steps inside backward hooks; use galore_adafactor",
    "apollo_adamw_layerwise": "layer-wise APOLLO steps inside backward hooks; use apollo_adamw",
    "adamw_torch_xla": "it needs torch_xla (syncfree AdamW); on XLA use adamw_torch",
    "adamw_torch_npu_fused": "it needs torch_npu (Ascend NPU); use adamw_torch_fused",
    "adamw_anyprecision": "it needs torchdistx, which has no current release; use adamw_torch",
    "adamw_apex_fused": "apex is not supported; use adamw_torch_fused",
    "adamw_hf": "transformers 5 removed its own AdamW; use adamw_torch",
}


def require(module: str, package: str, extra: str, name: str) -> None:
    """Raise ``ModuleNotFoundError`` naming ``pip install 'taskfit[extra]'`` when ``module`` cannot be imported."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise ModuleNotFoundError(f"optim={name!r} needs the {package!r} package: pip install 'taskfit[{extra}]' "
                                  f"(or pip install {package}).")


def _f(optim_args: dict[str, Any], key: str, default: Any, kind: type = float) -> Any:
    """``kind(optim_args.pop(key, default))`` (HF reads optim_args as strings and converts them)."""
    value = optim_args.pop(key, default)
    if kind is bool and isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return value if value is None else kind(value)


def _no_leftovers(name: str, optim_args: dict[str, Any]) -> None:
    """Refuse ``optim_args`` keys the builder did not read (HF would drop them silently)."""
    if optim_args:
        raise TypeError(f"optim_args {sorted(optim_args)} are not read by optim={name!r}; remove them.")


def _adam(args: Any) -> dict[str, Any]:
    return {"betas": (args.adam_beta1, args.adam_beta2), "eps": args.adam_epsilon}


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

    from taskfit.optim.optimizers import _construct

    return _construct(name, Adafactor, param_groups, {"lr": args.learning_rate, "scale_parameter": False,
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
    """GaLore (``galore_adamw``, ``galore_adamw_8bit``, ``galore_adafactor``) with HF's options: ``rank`` (128),
    ``update_proj_gap`` (200), ``scale`` (0.25), ``proj_type`` ("std") from ``optim_args`` for the target
    modules; Adafactor also gets ``scale_parameter=False, relative_step=False``.

    Raises:
        ModuleNotFoundError: galore-torch missing (``pip install 'taskfit[galore]'``).
        ValueError: ``optim_target_modules`` unset or matching nothing.
    """
    require("galore_torch", "galore-torch", "galore", name)
    import galore_torch

    optim_args = dict(optim_args)
    cls = {"galore_adamw": galore_torch.GaLoreAdamW, "galore_adamw_8bit": galore_torch.GaLoreAdamW8bit,
           "galore_adafactor": galore_torch.GaLoreAdafactor}[name]
    extra = {"rank": _f(optim_args, "rank", 128, int), "update_proj_gap": _f(optim_args, "update_proj_gap", 200, int),
             "scale": _f(optim_args, "scale", 0.25), "proj_type": optim_args.pop("proj_type", "std")}
    if name == "galore_adamw_8bit" and not all(p.is_cuda for p in model.parameters()):
        raise ValueError("optim='galore_adamw_8bit' needs CUDA parameters (its step calls torch.cuda.synchronize); "
                         "on the CPU use galore_adamw.")
    kwargs: dict[str, Any] = {"lr": args.learning_rate}
    if name == "galore_adafactor":
        kwargs.update(scale_parameter=False, relative_step=False)
    _no_leftovers(name, optim_args)
    return cls(_target_groups(model, args, name, extra), **kwargs)


def build_apollo(*, args: Any, optim_args: dict[str, Any], name: str, model: nn.Module, **_: Any) -> Any:
    """APOLLO (``apollo_adamw``) with HF's options: ``rank`` (128), ``proj`` ("random"), ``scale_type``
    ("channel"), ``update_proj_gap`` (200), ``scale`` (1.0), ``proj_type`` ("std") and the Adam betas/eps for
    the target modules.

    Raises:
        ModuleNotFoundError: apollo-torch missing (``pip install 'taskfit[apollo]'``).
        ValueError: ``optim_target_modules`` unset or matching nothing.
    """
    require("apollo_torch", "apollo-torch", "apollo", name)
    from apollo_torch import APOLLOAdamW

    optim_args = dict(optim_args)
    extra = {"rank": _f(optim_args, "rank", 128, int), "proj": optim_args.pop("proj", "random"),
             "scale_type": optim_args.pop("scale_type", "channel"),
             "update_proj_gap": _f(optim_args, "update_proj_gap", 200, int), "scale": _f(optim_args, "scale", 1.0),
             "proj_type": optim_args.pop("proj_type", "std"), **_adam(args)}
    _no_leftovers(name, optim_args)
    return APOLLOAdamW(_target_groups(model, args, name, extra), lr=args.learning_rate)


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
    kwargs = {"lr": args.learning_rate, "alpha_init": _f(optim_args, "alpha_init", 0.98),
              "lamb": _f(optim_args, "lamb", 2.0), "gamma": _f(optim_args, "gamma", 0.1),
              "grokking_signal_decay_rate": _f(optim_args, "grokking_signal_decay_rate", 0.1),
              "gradient_clipping": _f(optim_args, "gradient_clipping", 1.0)}
    _no_leftovers(name, optim_args)
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
        cls, extra = schedulefree.RAdamScheduleFree, _adam(args)
    elif name == "schedule_free_adamw":
        cls, extra = schedulefree.AdamWScheduleFree, {**_adam(args), "warmup_steps": getattr(args, "warmup_steps", 0)}
    else:
        cls, extra = schedulefree.SGDScheduleFree, {"warmup_steps": getattr(args, "warmup_steps", 0)}
    kwargs.update(extra, weight_decay=getattr(args, "weight_decay", 0.0), weight_lr_power=_f(optim_args, "weight_lr_power", 2.0),
                  r=_f(optim_args, "r", 0.0))
    _no_leftovers(name, optim_args)
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
    kwargs = {"decouple_lr": _f(optim_args, "decouple_lr", False, bool), "max_lr": _f(optim_args, "max_lr", None),
              "kahan_sum": _f(optim_args, "kahan_sum", None, bool)}
    _no_leftovers(name, optim_args)
    return StableAdamW(param_groups, lr=args.learning_rate, **_adam(args), weight_decay=getattr(args, "weight_decay", 0.0),
                       **kwargs)


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
    kwargs = {"block_size": _f(optim_args, "block_size", 256, int),
              "bf16_stochastic_round": _f(optim_args, "bf16_stochastic_round", False, bool)}
    _no_leftovers(name, optim_args)
    return cls(param_groups, lr=args.learning_rate, **_adam(args), **kwargs)


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

    _no_leftovers(name, dict(optim_args))
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
    if strategy.world_size > 1 or strategy.engine_owns_step or "SingleDeviceStrategy" not in {
            c.__name__ for c in type(strategy).__mro__}:
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


#: name -> builder (registered in taskfit.optim.optimizers.OPTIMIZERS); builders marked in NEEDS_MODEL get model=
BUILDERS = {
    "adafactor": build_hf_adafactor,
    **dict.fromkeys(("galore_adamw", "galore_adamw_8bit", "galore_adafactor"), build_galore),
    "apollo_adamw": build_apollo,
    "grokadamw": build_grokadamw,
    **dict.fromkeys(("schedule_free_adamw", "schedule_free_sgd", "schedule_free_radam"), build_schedule_free),
    "stable_adamw": build_stable_adamw,
    **dict.fromkeys(("adamw_torch_4bit", "adamw_torch_8bit"), build_torchao),
    **dict.fromkeys(("lomo", "adalomo"), build_lomo),
}
NEEDS_MODEL = ("galore_adamw", "galore_adamw_8bit", "galore_adafactor", "apollo_adamw", "lomo", "adalomo")
#: the extra that installs each built name's package
EXTRAS = {"adafactor": "hf", **dict.fromkeys(NEEDS_MODEL[:3], "galore"), "apollo_adamw": "apollo",
          "grokadamw": "grokadamw", **dict.fromkeys(("schedule_free_adamw", "schedule_free_sgd", "schedule_free_radam"),
                                                    "schedulefree"),
          "stable_adamw": "optimi", "adamw_torch_4bit": "torchao", "adamw_torch_8bit": "torchao",
          "lomo": "lomo", "adalomo": "lomo"}


def set_optimizer_mode(optimizers: Any, mode: str) -> None:
    """Call ``optimizer.train()`` / ``.eval()`` on the optimizers that have both (schedule-free), as HF's
    Trainer does before each training step and before each evaluation; other optimizers are left alone."""
    for opt in optimizers or ():
        opt = getattr(opt, "optimizer", opt) if not hasattr(opt, mode) else opt  # a LightningOptimizer wrapper
        if callable(getattr(opt, "train", None)) and callable(getattr(opt, "eval", None)):
            getattr(opt, mode)()
