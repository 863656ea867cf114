"""The FSDP options in their Hugging Face forms (``fsdp="full_shard offload auto_wrap"``, ``fsdp_config`` dict or
JSON file, ``fsdp_min_num_params``, ``fsdp_transformer_layer_cls_to_wrap``) resolved into one checked
:class:`FSDPOptions` (F-STRAT-4). Mirrors ``TrainingArguments.fsdp``/``fsdp_config`` and accelerate's
``FullyShardedDataParallelPlugin`` keys (with or without their ``fsdp_`` prefix)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from taskfit.redact import shown  # config values in messages: no credential shown

#: sharding strategy -> (FSDP2 ``reshard_after_forward``, mesh kind). ``no_shard`` replicates on a
#: ``(world, 1)`` mesh; the hybrid kinds shard within a node and replicate across nodes on a 2-D mesh.
SHARDING_STRATEGIES: dict[str, tuple[bool, str]] = {
    "full_shard": (True, "shard"),
    "shard_grad_op": (False, "shard"),
    "no_shard": (False, "replicate"),
    "hybrid_shard": (True, "hybrid"),
    "hybrid_shard_zero2": (False, "hybrid"),
}
STATE_DICT_TYPES = ("sharded", "full")
BACKWARD_PREFETCH = ("backward_pre", "backward_post", "no_prefetch")
#: every ``fsdp_config`` key taskfit reads (after removing an ``fsdp_`` prefix); see :class:`FSDPOptions`.
CONFIG_KEYS = ("sharding_strategy", "offload_params", "min_num_params", "transformer_layer_cls_to_wrap",
               "auto_wrap_policy", "backward_prefetch", "forward_prefetch", "limit_all_gathers", "use_orig_params",
               "sync_module_states", "cpu_ram_efficient_loading", "activation_checkpointing", "state_dict_type",
               "reshard_after_forward", "device_mesh", "version", "xla", "xla_fsdp_settings", "xla_fsdp_grad_ckpt",
               "xla_fsdp_v2")
_STATE_DICT_ALIASES = {"sharded": "sharded", "sharded_state_dict": "sharded", "full": "full",
                       "full_state_dict": "full"}
_BACKWARD_ALIASES = {"backward_pre": "backward_pre", "backward_post": "backward_post", "no_prefetch": "no_prefetch",
                     "none": "no_prefetch", "": "no_prefetch"}


def _choice(what: str, value: Any, choices: Any) -> ValueError:
    from taskfit.registry import invalid_choice

    return invalid_choice(what, value, tuple(choices))


@dataclass
class FSDPOptions:
    """Resolved FSDP settings.

    Attributes:
        sharding_strategy (str): one of :data:`SHARDING_STRATEGIES` (default ``"full_shard"``).
        offload_params (bool): keep parameters, gradients and optimizer state on the CPU (FSDP2
            ``CPUOffloadPolicy``; HF ``fsdp="... offload"``).
        transformer_layer_cls_to_wrap (list[str | type]): layer classes that each become one FSDP unit; default
            with ``auto_wrap``: the model's ``_no_split_modules``.
        min_num_params (int): size-based auto-wrap: a submodule becomes an FSDP unit once it holds at least this
            many parameters not already in a unit (0: off).
        auto_wrap (bool): HF ``fsdp="... auto_wrap"``.
        backward_prefetch (str): ``"backward_pre"`` (default; FSDP2's implicit prefetch of the next unit in
            backward), ``"backward_post"`` (FSDP2 has only pre-backward prefetching: treated as
            ``backward_pre``), ``"no_prefetch"``.
        forward_prefetch (bool): explicitly prefetch the next unit's all-gather in forward.
        limit_all_gathers (bool): accepted for FSDP1 configs; a no-op (FSDP2 has no rate limiter: its
            stream-based memory management frees all-gather buffers deterministically).
        use_orig_params (bool): accepted; FSDP2 always trains the original parameters (one DTensor each), so
            ``True`` is what happens anyway and ``False`` is ignored with a warning.
        sync_module_states (bool): broadcast rank 0's parameters and buffers before sharding (default True, as
            accelerate; the same initial weights on every rank, as DDP).
        cpu_ram_efficient_loading (bool): HF: only rank 0 loads the weights. The model here is built by the
            user before ``fit``, so this implies ``sync_module_states`` (rank 0's weights win).
        activation_checkpointing (bool): recompute the activations of every layer unit in backward.
        state_dict_type (str): ``"sharded"`` (default: each rank writes its shard with
            ``torch.distributed.checkpoint``) or ``"full"`` (rank 0 writes the gathered ``model.safetensors``
            and ``optimizer.pt``).
        reshard_after_forward (bool | None): override the strategy's choice (FSDP2 option).
        device_mesh (tuple[int, int] | None): ``(replicate, shard)`` sizes for the hybrid strategies (default
            ``(num_nodes, processes per node)``).
    """

    sharding_strategy: str = "full_shard"
    offload_params: bool = False
    transformer_layer_cls_to_wrap: list[Any] = field(default_factory=list)
    min_num_params: int = 0
    auto_wrap: bool = False
    backward_prefetch: str = "backward_pre"
    forward_prefetch: bool = False
    limit_all_gathers: bool = True
    use_orig_params: bool = True
    sync_module_states: bool = True
    cpu_ram_efficient_loading: bool = False
    activation_checkpointing: bool = False
    state_dict_type: str = "sharded"
    reshard_after_forward: bool | None = None
    device_mesh: tuple[int, int] | None = None


def read_fsdp_config(config: dict | str | None) -> dict[str, Any]:
    """``fsdp_config`` as a dict with the ``fsdp_`` prefixes removed: a dict, a JSON string, or a path to a JSON
    file (HF ``TrainingArguments.fsdp_config``).

    Raises:
        ValueError: an unreadable file, JSON that is not an object, or an unknown key (naming the valid keys).
    """
    from taskfit.json_options import load_json_object

    config = load_json_object(config, "fsdp_config")
    out = {}
    for key, value in config.items():
        k = key[5:] if key.startswith("fsdp_") else key
        if k not in CONFIG_KEYS:
            raise _choice("fsdp_config key", key, CONFIG_KEYS)
        out[k] = value
    return out


def _bool(name: str, value: Any) -> bool:
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if isinstance(value, bool):
        return value
    raise ValueError(f"fsdp_config {name!r} must be true or false; got {shown(name, value)}.")


def _names(value: Any) -> list[Any]:
    if value is None or value == "":
        return []
    if isinstance(value, (str, type)):
        value = [value]
    out: list[Any] = []
    for v in value:
        out.extend(s.strip() for s in v.split(",") if s.strip()) if isinstance(v, str) else out.append(v)
    return out


def resolve_fsdp_options(words: Any = None, config: dict | str | None = None, *, legacy_min_num_params: int = 0,
                         legacy_layer_classes: Any = None, gradient_checkpointing: bool = False,
                         **overrides: Any) -> FSDPOptions:
    """Merge HF's ``fsdp`` (list of words or one string), ``fsdp_config``, the deprecated ``fsdp_min_num_params`` /
    ``fsdp_transformer_layer_cls_to_wrap`` and the strategy constructor's ``overrides`` (same names as
    :class:`FSDPOptions`; they win) into :class:`FSDPOptions`. The connector calls it with the run's options.

    Args:
        words (list[str] | str | None): ``fsdp`` (``"full_shard offload auto_wrap"``).
        config (dict | str | None): ``fsdp_config`` (dict, JSON string or JSON file path).
        legacy_min_num_params (int): ``fsdp_min_num_params`` (parameters).
        legacy_layer_classes (str | list | None): ``fsdp_transformer_layer_cls_to_wrap``.
        gradient_checkpointing (bool): ``gradient_checkpointing`` (for the conflict check).
        **overrides: :class:`FSDPOptions` fields; None leaves a field as the options give it.

    Raises:
        ValueError: an unknown sharding strategy / state dict type / backward prefetch / key (naming the valid
            choices), both size- and class-based auto-wrap, ``activation_checkpointing`` together with
            ``gradient_checkpointing``, XLA settings (use ``strategy="xla_fsdp"``), a bad ``device_mesh``.
    """
    words = list(words or [])
    if isinstance(words, str):
        words = words.split()
    cfg = read_fsdp_config(config)
    _refuse_xla(cfg)
    opts = FSDPOptions()
    opts.sharding_strategy = _sharding_strategy(words, cfg, overrides.pop("sharding_strategy", None))
    opts.offload_params = "offload" in words or _bool("offload_params", cfg.get("offload_params", False))
    opts.auto_wrap = "auto_wrap" in words or bool(cfg.get("auto_wrap_policy"))
    opts.min_num_params = int(cfg.get("min_num_params", 0) or legacy_min_num_params or 0)
    opts.transformer_layer_cls_to_wrap = _names(cfg.get("transformer_layer_cls_to_wrap") or legacy_layer_classes)
    _apply_config(opts, cfg)
    valid = {f.name for f in fields(FSDPOptions)}
    for name, value in overrides.items():
        if name not in valid:
            raise _choice("FSDPStrategy option", name, sorted(valid))
        if value is not None:
            setattr(opts, name, _names(value) if name == "transformer_layer_cls_to_wrap" else value)
    _normalise(opts)
    if opts.activation_checkpointing and gradient_checkpointing:
        raise ValueError("fsdp_config activation_checkpointing=True and gradient_checkpointing=True cannot be used "
                         "together (both would recompute the same layers); with FSDP use activation_checkpointing "
                         "alone (mirrors the HF Trainer's rule).")
    return opts


def _refuse_xla(cfg: dict[str, Any]) -> None:
    """Raises:
        ValueError: PyTorch/XLA FSDP keys in the config of the FSDP2 strategy."""
    for k in ("xla", "xla_fsdp_v2", "xla_fsdp_grad_ckpt"):
        if cfg.get(k):
            raise ValueError(f"fsdp_config {k!r} asks for PyTorch/XLA FSDP; use strategy='xla_fsdp' (the accelerators "
                             "issue #6), not the FSDP2 strategy.")
    if cfg.get("xla_fsdp_settings"):
        raise ValueError("fsdp_config 'xla_fsdp_settings' only applies to strategy='xla_fsdp'.")


def _sharding_strategy(words: list[str], cfg: dict[str, Any], override: Any) -> str:
    """The one sharding strategy the words, the config (names or accelerate's numbers 1-5) and the constructor's
    ``override`` (which wins) give; ``"full_shard"`` when none does.

    Raises:
        ValueError: several different ones, or an unknown one (naming the valid choices).
    """
    sharding = [w for w in words if w in SHARDING_STRATEGIES]
    if "sharding_strategy" in cfg:
        value = cfg["sharding_strategy"]
        value = {1: "full_shard", 2: "shard_grad_op", 3: "no_shard", 4: "hybrid_shard", 5: "hybrid_shard_zero2"}.get(
            value, value)
        sharding.append(str(value).lower().replace("_hybrid", "hybrid"))
    if override is not None:
        sharding = [str(override).lower()]
    if len(set(sharding)) > 1:
        raise ValueError(f"FSDP got several sharding strategies {sorted(set(sharding))}; give one of "
                         f"{list(SHARDING_STRATEGIES)}.")
    if sharding and sharding[0] not in SHARDING_STRATEGIES:
        raise _choice("FSDP sharding strategy", sharding[0], SHARDING_STRATEGIES)
    return sharding[0] if sharding else FSDPOptions.sharding_strategy


def _apply_config(opts: FSDPOptions, cfg: dict[str, Any]) -> None:
    """Copy the switches and choices ``cfg`` sets onto ``opts`` (checked later by :func:`_normalise`).

    Raises:
        ValueError: a switch that is not true or false.
    """
    for name in ("forward_prefetch", "limit_all_gathers", "use_orig_params", "sync_module_states",
                 "cpu_ram_efficient_loading", "activation_checkpointing"):
        if name in cfg:
            setattr(opts, name, _bool(name, cfg[name]))
    if "backward_prefetch" in cfg:
        opts.backward_prefetch = cfg["backward_prefetch"]
    if "state_dict_type" in cfg:
        opts.state_dict_type = cfg["state_dict_type"]
    if "reshard_after_forward" in cfg:
        opts.reshard_after_forward = _bool("reshard_after_forward", cfg["reshard_after_forward"])
    if cfg.get("device_mesh") is not None:
        opts.device_mesh = cfg["device_mesh"]


def _normalise(opts: FSDPOptions) -> None:
    """Spell ``opts``' choices canonically and apply the implied switches (a size or class auto-wrap turns
    ``auto_wrap`` on; ``cpu_ram_efficient_loading`` implies ``sync_module_states``).

    Raises:
        ValueError: an unknown state dict type or backward prefetch (naming the choices), a negative
            ``min_num_params``, both auto-wrap kinds, a bad ``device_mesh``.
    """
    sdt = str(opts.state_dict_type).lower()
    if sdt not in _STATE_DICT_ALIASES:
        raise _choice("FSDP state_dict_type", opts.state_dict_type, STATE_DICT_TYPES)
    opts.state_dict_type = _STATE_DICT_ALIASES[sdt]
    bp = str(opts.backward_prefetch or "").lower()
    if bp not in _BACKWARD_ALIASES:
        raise _choice("FSDP backward_prefetch", opts.backward_prefetch, BACKWARD_PREFETCH)
    opts.backward_prefetch = _BACKWARD_ALIASES[bp]
    if opts.min_num_params < 0:
        raise ValueError(f"FSDP min_num_params must be >= 0 (parameters); got {opts.min_num_params}.")
    if opts.min_num_params and opts.transformer_layer_cls_to_wrap:
        raise ValueError("FSDP auto-wrap takes either min_num_params (by size) or transformer_layer_cls_to_wrap (by "
                         f"layer class), not both; got {opts.min_num_params} and {opts.transformer_layer_cls_to_wrap}.")
    if opts.min_num_params or opts.transformer_layer_cls_to_wrap:
        opts.auto_wrap = True
    if opts.cpu_ram_efficient_loading:
        opts.sync_module_states = True
    if opts.device_mesh is not None:
        mesh = tuple(opts.device_mesh)
        if len(mesh) != 2 or not all(isinstance(n, int) and n >= 1 for n in mesh):
            raise ValueError(f"FSDP device_mesh must be (replicate, shard) sizes >= 1; got {opts.device_mesh!r}.")
        opts.device_mesh = mesh  # type: ignore[assignment]
