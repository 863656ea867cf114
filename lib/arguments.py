"""`FitArguments`: the one dataclass of training options (F-CORE-4).

Every option of Hugging Face ``transformers.TrainingArguments`` and ``Seq2SeqTrainingArguments`` is a field
here under the same name, type and default (except ``output_dir``, which defaults to ``"taskfit_output"``
instead of being required), plus the taskfit placement fields (``accelerator``, ``strategy``, ``devices``,
``num_nodes``, ``precision``, ``checkpoint_io``). ``Fit(...)`` keyword arguments, YAML/JSON configs and the
``taskfit`` CLI are views of this class.

Options whose feature has not landed yet are accepted and stored, but :meth:`FitArguments.check_implemented`
refuses them (``NotImplementedError`` naming the option and the issue where it lands, see
:data:`PENDING_OPTIONS`); options taskfit will never support raise ``ValueError`` at construction.
"""

import contextlib
import copy
import functools
import json
import math
import os
import re
from dataclasses import dataclass, field, fields
from functools import lru_cache
from pathlib import Path
from collections.abc import Callable
from typing import Any

from taskfit.arguments_setters import (  # noqa: F401 - the option tables are re-exported
    BUILT_LOGGERS, DDP_BACKENDS, DEBUG_OPTIONS, FSDP_OPTIONS, HALF_PRECISION_BACKENDS, HUB_STRATEGIES,
    INTERVAL_STRATEGIES, LOG_LEVELS, LR_SCHEDULERS, OPTIMIZERS, PRECISIONS, REPORT_TO, SAVE_STRATEGIES,
    ArgumentSetters, field_kinds,
)
from taskfit.registry import invalid_choice, unknown_option

SECRET_FIELDS = ("hub_token", "push_to_hub_token")


#: option name -> the issue where its feature lands. An option is *pending* when its value differs from the
#: default (or matches the rule in ``_PENDING_WHEN``) and it is still listed here; remove a row when it lands.
#: (``torchdynamo`` is a deprecated alias copied into ``torch_compile_backend``, which is what gets reported.)
PENDING_OPTIONS: dict[str, str] = {}

#: options that are only partly pending: the value is pending when the predicate is true.
_PENDING_WHEN: dict[str, Callable[[Any], bool]] = {}


class _FieldMetadata(dict):
    """A field's metadata that lists only what ``argparse`` takes (``help``): ``transformers.HfArgumentParser``
    passes ``dict(field.metadata)`` to ``add_argument`` as keyword arguments, and ``group`` is not one of them;
    ``metadata["group"]`` still reads it."""

    def keys(self) -> Any:
        return [k for k in dict.keys(self) if k != "group"]

    def __iter__(self) -> Any:
        return iter(self.keys())

    def copy(self) -> dict[str, Any]:
        return {k: self[k] for k in self.keys()}


def _opt(default: Any, help: str, group: str, factory: Callable[[], Any] | None = None) -> Any:
    """A dataclass field with ``metadata={"help": ..., "group": ...}`` (the group orders the CLI help)."""
    metadata = _FieldMetadata(help=help, group=group)
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(repr=False)
class FitArguments(ArgumentSetters):
    """Every training option in one validated dataclass; mirrors ``transformers.TrainingArguments``.

    Field names, types and defaults are those of HF ``TrainingArguments`` and ``Seq2SeqTrainingArguments``
    (see each field's ``metadata["help"]``), so an HF config carries over unchanged. Groups:

    - output: ``output_dir``, ``overwrite_output_dir``, ``run_name``, ``do_train``/``do_eval``/``do_predict``
      (informational, as in HF).
    - training: batch sizes (per device, samples), ``gradient_accumulation_steps``, ``num_train_epochs``,
      ``max_steps`` (optimizer steps), ``max_grad_norm``, ``seed``/``data_seed``/``full_determinism``.
    - optimizer / schedule: ``optim``, ``optim_args``, ``learning_rate``, ``weight_decay``, ``adam_*``,
      ``lr_scheduler_type``, ``lr_scheduler_kwargs``, ``warmup_steps``/``warmup_ratio``.
    - evaluation / logging / checkpoint: ``eval_strategy``/``eval_steps``/``eval_delay``, ``logging_*``,
      ``report_to``, ``save_*``, ``load_best_model_at_end``, ``metric_for_best_model``, ``greater_is_better``.
    - data: ``dataloader_*``, ``group_by_length``, ``remove_unused_columns``, ``label_names``.
    - precision / memory: ``bf16``/``fp16``/``precision``, ``tf32``, ``gradient_checkpointing``, ``torch_compile*``.
    - placement (taskfit): ``accelerator``, ``strategy``, ``devices``, ``num_nodes``, ``checkpoint_io``; HF
      distributed options ``ddp_*``, ``fsdp*``, ``deepspeed``.
    - publishing: ``push_to_hub``, ``hub_*``; generation (seq2seq): ``predict_with_generate``, ``generation_*``.

    Construction normalises and validates (``__post_init__``): every error is a ``ValueError`` naming the bad
    value and the valid choices, raised before any work. Deprecated HF aliases (``evaluation_strategy``,
    ``per_gpu_*_batch_size``, ``no_cuda``, ``fp16_backend``, ``torchdynamo``) are copied into their
    replacement and reset to their default. ``report_to`` becomes a list (``"none"`` -> ``[]``; ``"all"`` and
    the HF default ``None`` -> every built logger, currently ``["csv"]``); ``fsdp`` and ``debug`` become lists of
    options; JSON strings given for dict options are decoded.

    Raises:
        ValueError: a bad value, a conflict between options, or an option taskfit never supports (apex,
            IPEX, jit eval, the legacy prediction loop, ``past_index``, SageMaker ``mp_parameters``).
    """

    # HF TrainingArguments, in signature order.
    output_dir: str = _opt("taskfit_output", "Directory (local path or fsspec URL) for checkpoints, logs and predictions.", "output")
    overwrite_output_dir: bool = _opt(False, "Accepted for HF compatibility; has no effect in taskfit.", "output")
    do_train: bool = _opt(False, "Informational flag for scripts (as in HF); Fit does not read it.", "output")
    do_eval: bool = _opt(False, "Informational flag for scripts; set True when eval_strategy != 'no'.", "output")
    do_predict: bool = _opt(False, "Informational flag for scripts (as in HF); Fit does not read it.", "output")
    eval_strategy: str = _opt("no", "When to evaluate during training: no | steps | epoch.", "evaluation")
    prediction_loss_only: bool = _opt(False, "In evaluation and prediction, return only the loss.", "evaluation")
    per_device_train_batch_size: int = _opt(8, "Training batch size per device (samples).", "training")
    per_device_eval_batch_size: int = _opt(8, "Evaluation batch size per device (samples).", "evaluation")
    per_gpu_train_batch_size: int | None = _opt(None, "Deprecated alias of per_device_train_batch_size.", "compat")
    per_gpu_eval_batch_size: int | None = _opt(None, "Deprecated alias of per_device_eval_batch_size.", "compat")
    gradient_accumulation_steps: int = _opt(1, "Micro-batches accumulated per optimizer step (>= 1).", "training")
    eval_accumulation_steps: int | None = _opt(None, "Prediction steps accumulated on device before moving outputs to CPU; None = all.", "evaluation")
    eval_delay: float | None = _opt(0, "Epochs or steps (per eval_strategy) to wait before the first evaluation.", "evaluation")
    learning_rate: float = _opt(5e-05, "Initial (peak) learning rate of the optimizer.", "optimizer")
    weight_decay: float = _opt(0.0, "Decoupled weight decay, skipped for biases and norm weights.", "optimizer")
    adam_beta1: float = _opt(0.9, "beta1 of Adam-type optimizers, in [0, 1).", "optimizer")
    adam_beta2: float = _opt(0.999, "beta2 of Adam-type optimizers, in [0, 1).", "optimizer")
    adam_epsilon: float = _opt(1e-08, "epsilon of Adam-type optimizers.", "optimizer")
    max_grad_norm: float = _opt(1.0, "Gradient clipping max norm (L2); 0 disables clipping.", "training")
    num_train_epochs: float = _opt(3.0, "Epochs to train (a fraction trains part of the last epoch); ignored if max_steps > 0.", "training")
    max_steps: int = _opt(-1, "Total optimizer steps; overrides num_train_epochs when > 0 (-1 = use epochs).", "training")
    lr_scheduler_type: str = _opt("linear", "Learning-rate schedule name (linear, cosine, constant, ...).", "schedule")
    lr_scheduler_kwargs: dict | str = _opt(None, "Extra keyword arguments for the schedule (dict or JSON string).", "schedule", dict)
    warmup_ratio: float = _opt(0.0, "Fraction of total steps in [0, 1] used for linear warmup from 0.", "schedule")
    warmup_steps: int | float = _opt(0, "Linear warmup from 0: optimizer steps when >= 1, a fraction of the run's steps "
                               "when in (0, 1) (HF 5); overrides warmup_ratio when > 0.", "schedule")
    log_level: str | None = _opt("passive", "Python log level on the main process: debug|info|warning|error|critical|passive.", "logging")
    log_level_replica: str | None = _opt("warning", "Python log level on replica processes (same choices as log_level).", "logging")
    log_on_each_node: bool = _opt(True, "Log with log_level on the main process of every node, not only node 0.", "logging")
    logging_dir: str | None = _opt(None, "Directory for logger output; None = <output_dir>/logs.", "logging")
    logging_strategy: str = _opt("steps", "When to log: no | steps | epoch.", "logging")
    logging_first_step: bool = _opt(False, "Also log (and evaluate) at the first optimizer step.", "logging")
    logging_steps: float = _opt(500, "Optimizer steps between logs; a float < 1 is a ratio of total steps.", "logging")
    logging_nan_inf_filter: bool = _opt(True, "Leave nan/inf step losses out of the logged loss average (logging only).", "logging")
    save_strategy: str = _opt("steps", "When to save checkpoints: no | steps | epoch | best.", "checkpoint")
    save_steps: float = _opt(500, "Optimizer steps between checkpoints; a float < 1 is a ratio of total steps.", "checkpoint")
    save_total_limit: int | None = _opt(None, "Keep at most this many checkpoints (the best is never deleted); None/0 = all.", "checkpoint")
    save_safetensors: bool | None = _opt(True, "Write weights as safetensors instead of torch.save pickles.", "checkpoint")
    save_on_each_node: bool = _opt(False, "Save checkpoints on every node (non-shared storage), not only node 0.", "checkpoint")
    save_only_model: bool = _opt(False, "Save only model weights (no optimizer/scheduler/RNG state; cannot resume).", "checkpoint")
    restore_callback_states_from_checkpoint: bool = _opt(False, "Restore callback states saved in the checkpoint on resume.", "checkpoint")
    no_cuda: bool = _opt(False, "Deprecated alias of use_cpu.", "compat")
    use_cpu: bool = _opt(False, "Force the CPU even when CUDA or MPS is available.", "hardware")
    use_mps_device: bool = _opt(False, "Deprecated (MPS is picked automatically); use accelerator='mps'.", "hardware")
    seed: int = _opt(42, "Random seed set at the start of training (python, numpy, torch, accelerator).", "training")
    data_seed: int | None = _opt(None, "Seed of the data samplers; None = seed.", "training")
    jit_mode_eval: bool = _opt(False, "Not supported (PyTorch jit trace for inference); must stay False.", "compat")
    use_ipex: bool = _opt(False, "Not supported (Intel Extension for PyTorch); must stay False.", "compat")
    bf16: bool = _opt(False, "bfloat16 mixed precision (same as precision='bf16-mixed').", "precision")
    fp16: bool = _opt(False, "float16 mixed precision with loss scaling (same as precision='16-mixed').", "precision")
    fp16_opt_level: str = _opt("O1", "Apex AMP level; only 'O1' (native AMP) is accepted.", "compat")
    half_precision_backend: str = _opt("auto", "Mixed-precision backend: auto | cpu_amp ('apex' is not supported).", "precision")
    bf16_full_eval: bool = _opt(False, "Evaluate in pure bfloat16 (faster, may change metrics).", "precision")
    fp16_full_eval: bool = _opt(False, "Evaluate in pure float16 (faster, may change metrics).", "precision")
    tf32: bool | None = _opt(None, "Enable TF32 matmul/cuDNN on Ampere+ CUDA GPUs; None = PyTorch default.", "precision")
    local_rank: int = _opt(-1, "Rank of this process within its node (set by launchers; -1 = not distributed).", "distributed")
    ddp_backend: str | None = _opt(None, "torch.distributed backend: nccl | gloo | mpi | ccl | hccl | xccl; None = auto.", "distributed")
    tpu_num_cores: int | None = _opt(None, "Number of TPU cores (set by the launcher).", "hardware")
    tpu_metrics_debug: bool = _opt(False, "Deprecated: use debug='tpu_metrics_debug'.", "hardware")
    debug: str | list[str] = _opt("", "Debug features, space separated: underflow_overflow | tpu_metrics_debug.", "precision")
    dataloader_drop_last: bool = _opt(False, "Drop the last incomplete batch of each epoch.", "data")
    eval_steps: float | None = _opt(None, "Optimizer steps between evaluations; float < 1 = ratio of total steps; None = logging_steps.", "evaluation")
    dataloader_num_workers: int = _opt(0, "DataLoader worker processes (0 = load in the main process).", "data")
    dataloader_prefetch_factor: int | None = _opt(None, "Batches prefetched per worker (needs dataloader_num_workers > 0).", "data")
    past_index: int = _opt(-1, "Not supported (TransformerXL/XLNet mems); must stay -1.", "compat")
    run_name: str | None = _opt(None, "Name of the run for loggers; None = output_dir.", "logging")
    disable_tqdm: bool | None = _opt(None, "Disable progress bars; None = decide from the log level.", "logging")
    remove_unused_columns: bool | None = _opt(True, "Drop dataset columns the model's forward does not accept.", "data")
    label_names: list[str] | None = _opt(None, "Input keys that hold labels; None = ['labels'] (QA models: start/end positions).", "data")
    load_best_model_at_end: bool | None = _opt(False, "Load the best checkpoint (metric_for_best_model) at the end of training.", "checkpoint")
    metric_for_best_model: str | None = _opt(None, "Metric (with or without 'eval_') that ranks checkpoints; default 'loss' when needed.", "checkpoint")
    greater_is_better: bool | None = _opt(None, "Whether a larger metric_for_best_model is better; None = not name.endswith('loss').", "checkpoint")
    ignore_data_skip: bool = _opt(False, "On resume, do not skip already-seen batches (faster, not exact).", "checkpoint")
    fsdp: bool | str | list[str] = _opt("", "HF FSDP options, e.g. 'full_shard auto_wrap offload'; normalised to a list.", "distributed")
    fsdp_min_num_params: int = _opt(0, "Deprecated: FSDP size-based auto-wrap threshold (parameters); use fsdp_config.", "distributed")
    fsdp_config: dict | str | None = _opt(None, "FSDP settings: dict, JSON string or path to a JSON file.", "distributed")
    fsdp_transformer_layer_cls_to_wrap: str | None = _opt(None, "Deprecated: layer class name(s) to auto-wrap; use fsdp_config.", "distributed")
    accelerator_config: dict | str | None = _opt(None, "HF Accelerate options (split_batches, dispatch_batches, ...): dict, JSON or path.", "distributed")
    deepspeed: dict | str | None = _opt(None, "DeepSpeed config: dict, JSON string or path to a JSON file.", "distributed")
    label_smoothing_factor: float = _opt(0.0, "Label smoothing in [0, 1) for classification losses.", "training")
    optim: str = _opt("adamw_torch", "Optimizer name (adamw_torch, adamw_torch_fused, sgd, adafactor, adamw_bnb_8bit, ...).", "optimizer")
    optim_args: str | dict | None = _opt(None, "Extra optimizer arguments: dict, JSON object or 'k1=v1,k2=v2'.", "optimizer")
    adafactor: bool = _opt(False, "Deprecated: use optim='adafactor'.", "optimizer")
    group_by_length: bool = _opt(False, "Group training samples of similar length into batches (less padding).", "data")
    length_column_name: str | None = _opt("length", "Dataset column with precomputed lengths for group_by_length.", "data")
    report_to: str | list[str] | None = _opt(None, "Loggers: none | all | csv | tensorboard | mlflow | wandb (str or list); None = csv.", "logging")
    ddp_find_unused_parameters: bool | None = _opt(None, "DDP find_unused_parameters; None = False with gradient checkpointing, else True.", "distributed")
    ddp_bucket_cap_mb: int | None = _opt(None, "DDP gradient bucket size (MiB).", "distributed")
    ddp_broadcast_buffers: bool | None = _opt(None, "DDP broadcast_buffers; None = False with gradient checkpointing, else True.", "distributed")
    dataloader_pin_memory: bool = _opt(True, "Pin host memory in DataLoaders for faster host-to-device copies.", "data")
    dataloader_persistent_workers: bool = _opt(False, "Keep DataLoader workers alive between epochs (needs workers > 0).", "data")
    skip_memory_metrics: bool = _opt(True, "Skip memory-usage metrics (collecting them slows training).", "evaluation")
    use_legacy_prediction_loop: bool = _opt(False, "Not supported (HF legacy prediction loop); must stay False.", "compat")
    push_to_hub: bool = _opt(False, "Publish the model to hub_model_id on every save (see hub_strategy).", "hub")
    resume_from_checkpoint: str | bool | None = _opt(None, "Checkpoint to resume from: a path, or True for the newest in output_dir.", "checkpoint")
    hub_model_id: str | None = _opt(None, "Where to publish: a repository name or remote fsspec URL.", "hub")
    hub_strategy: str = _opt("every_save", "What to publish and when: end | every_save | checkpoint | all_checkpoints.", "hub")
    hub_token: str | None = _opt(None, "Token for the publishing store (redacted in logs).", "hub")
    hub_private_repo: bool = _opt(False, "Create the published repository as private.", "hub")
    hub_always_push: bool = _opt(False, "Push every save even if the previous push has not finished.", "hub")
    gradient_checkpointing: bool = _opt(False, "Recompute activations in backward to save memory (slower).", "precision")
    gradient_checkpointing_kwargs: dict | str | None = _opt(None, "Keyword arguments for gradient checkpointing (dict or JSON string).", "precision")
    include_inputs_for_metrics: bool = _opt(False, "Pass the inputs to compute_metrics as well.", "evaluation")
    eval_do_concat_batches: bool = _opt(True, "Concatenate eval outputs across batches (False = keep a list per batch).", "evaluation")
    fp16_backend: str = _opt("auto", "Deprecated alias of half_precision_backend.", "compat")
    evaluation_strategy: str | None = _opt(None, "Deprecated alias of eval_strategy.", "compat")
    push_to_hub_model_id: str | None = _opt(None, "Deprecated: use hub_model_id.", "hub")
    push_to_hub_organization: str | None = _opt(None, "Deprecated: use hub_model_id.", "hub")
    push_to_hub_token: str | None = _opt(None, "Deprecated: use hub_token (redacted in logs).", "hub")
    mp_parameters: str = _opt("", "Not supported (SageMaker model-parallel parameters); must stay empty.", "compat")
    auto_find_batch_size: bool = _opt(False, "Halve the batch size on out-of-memory and retry.", "training")
    full_determinism: bool = _opt(False, "Deterministic algorithms and CUBLAS/cuDNN settings (slower).", "training")
    torchdynamo: str | None = _opt(None, "Deprecated: use torch_compile_backend.", "precision")
    ray_scope: str | None = _opt("last", "Ray Tune checkpoint scope for hyperparameter search (accepted for later HPO).", "compat")
    ddp_timeout: int | None = _opt(1800, "Timeout of torch.distributed collectives (seconds).", "distributed")
    torch_compile: bool = _opt(False, "Compile the model with torch.compile.", "precision")
    torch_compile_backend: str | None = _opt(None, "torch.compile backend (implies torch_compile).", "precision")
    torch_compile_mode: str | None = _opt(None, "torch.compile mode (implies torch_compile).", "precision")
    dispatch_batches: bool | None = _opt(None, "Deprecated Accelerate option: iterate data on rank 0 and scatter.", "distributed")
    split_batches: bool | None = _opt(None, "Deprecated Accelerate option: split each batch across processes.", "distributed")
    include_tokens_per_second: bool | None = _opt(False, "Report training tokens per second per device.", "evaluation")
    include_num_input_tokens_seen: bool | None = _opt(False, "Track the number of input tokens seen.", "evaluation")
    neftune_noise_alpha: float | None = _opt(None, "NEFTune embedding-noise scale (training only); None = off.", "training")
    optim_target_modules: str | list[str] | None = _opt(None, "Module names optimised by GaLore-type optimizers.", "optimizer")
    batch_eval_metrics: bool = _opt(False, "Call compute_metrics per batch (with compute_result on the last).", "evaluation")
    # HF Seq2SeqTrainingArguments.
    sortish_sampler: bool = _opt(False, "Sort-ish sampler by length for seq2seq training (sets group_by_length).", "generation")
    predict_with_generate: bool = _opt(False, "Use generate() in evaluation/prediction (ROUGE/BLEU-style metrics).", "generation")
    generation_max_length: int | None = _opt(None, "max_length for generate() in evaluation.", "generation")
    generation_num_beams: int | None = _opt(None, "num_beams for generate() in evaluation.", "generation")
    generation_config: str | dict | None = _opt(None, "Generation config: path, model id, dict or JSON string.", "generation")
    # taskfit.
    eval_on_start: bool = _opt(False, "Run one evaluation before the first training step (sanity check).", "evaluation")
    save_on_interrupt: bool | None = _opt(None, "On SIGTERM/Ctrl-C: finish the step, then checkpoint (True: on both; None: on SIGTERM and SLURM's SIGUSR1 only; False: never).", "checkpoint")
    accelerator: str = _opt("auto", "Device kind: auto | cpu | cuda | mps | xla.", "placement")
    strategy: str = _opt("auto", "Distribution strategy: auto | single_device | dp | ddp | fsdp | deepspeed | ...", "placement")
    devices: int | str | list[int] = _opt("auto", "Devices: a count, a list of indices, 'auto' or -1 (all).", "placement")
    num_nodes: int = _opt(1, "Number of nodes (machines).", "placement")
    precision: str | None = _opt(None, "32-true | 64-true | 16-mixed | bf16-mixed | 16-true | bf16-true; None = from fp16/bf16.", "precision")
    checkpoint_io: str = _opt("auto", "Checkpoint storage plugin name (auto = fsspec with atomic writes).", "placement")
    # taskfit: Lightning's debugging switches (taskfit.debugging).
    fast_dev_run: bool | int = _opt(False, "Debug pass: True or N runs N batches (1 for True) of training and validation, one epoch, no checkpoints or loggers.", "training")
    limit_train_batches: int | float | None = _opt(None, "Training batches per epoch: a count, or a fraction of the epoch; None = all.", "training")
    limit_val_batches: int | float | None = _opt(None, "Validation batches per evaluation: a count or a fraction; 0 = no validation; None = all.", "training")
    limit_test_batches: int | float | None = _opt(None, "Test batches: a count or a fraction; None = all.", "training")
    limit_predict_batches: int | float | None = _opt(None, "Prediction batches: a count or a fraction; None = all.", "training")
    overfit_batches: int | float = _opt(0, "Train and validate on the same first N (or fraction of) training batches, unshuffled; 0 = off.", "training")
    num_sanity_val_steps: int = _opt(0, "Validation batches run before training as a check, not logged; -1 = all.", "training")
    detect_anomaly: bool = _opt(False, "Run training under torch.autograd.detect_anomaly (slow; names the op making NaN).", "training")
    profiler: str | None = _opt(None, "Profile the run: simple (time per action) | advanced (cProfile per action) | pytorch (torch.profiler Chrome trace under output_dir); None = off.", "logging")
    gradient_clip_algorithm: str = _opt("norm", "How max_grad_norm clips: norm (global L2 norm) | value (each element to [-v, v]).", "training")

    def __post_init__(self) -> None:
        self._normalize_and_validate()

    # ----------------------------------------------------------------------------------------------------------
    # Derived values
    def validate(self) -> "FitArguments":
        """Re-run normalisation and validation after direct attribute assignment; returns ``self``.

        Raises:
            ValueError: as for construction.
        """
        self.__post_init__()
        return self

    def get_process_log_level(self) -> int:
        """The ``logging`` level this process should use: ``log_level`` on the main process (every node's first
        process with ``log_on_each_node``), ``log_level_replica`` on the others; ``"passive"`` leaves the level of
        the ``taskfit`` logger as it is (``logging.WARNING`` when unset). Mirrors HF
        ``TrainingArguments.get_process_log_level``.

        Raises:
            ValueError: an unknown level name.
        """
        import logging

        levels = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
                  "error": logging.ERROR, "critical": logging.CRITICAL, "passive": -1}
        rank_var = "LOCAL_RANK" if self.log_on_each_node else "RANK"
        main = int(os.environ.get(rank_var, os.environ.get("RANK", "0")) or 0) == 0
        name = (self.log_level if main else self.log_level_replica) or "passive"
        if name not in levels:
            raise ValueError(f"log level {name!r} is not one of {', '.join(levels)}.")
        level = levels[name]
        return level if level != -1 else (logging.getLogger("taskfit").level or logging.WARNING)

    @contextlib.contextmanager
    def main_process_first(self, local: bool = True, desc: str = "work") -> Any:
        """Context manager: the main process (``local``: the first of each node, else global rank 0) runs the
        block first, e.g. to tokenise and cache a dataset, and the others wait at a barrier, then run it (reading
        the cache). Under torchrun (or SLURM/DeepSpeed launchers exporting ``RANK``/``WORLD_SIZE``) it forms the
        process group if needed; in a plain ``python train.py`` run the block runs before taskfit launches the other
        processes, which then run it after the main one. Mirrors HF ``TrainingArguments.main_process_first``.

        Args:
            local (bool): per node (True) or once for the whole job (False).
            desc (str): what the block does, for the log message of the waiting processes.
        """
        import logging

        import torch.distributed as dist

        launched = all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))
        if dist.is_available() and not dist.is_initialized() and launched and int(os.environ["WORLD_SIZE"]) > 1:
            # torchrun & co. started the processes: form the group now (Fit's strategy then reuses it)
            import datetime

            from taskfit.accelerators import CUDAAccelerator

            backend = self.ddp_backend or ("nccl" if CUDAAccelerator.is_available() else "gloo")
            dist.init_process_group(backend, init_method="env://",
                                    timeout=datetime.timedelta(seconds=float(self.ddp_timeout or 1800)))
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            yield  # one process, or taskfit's own launcher has not started the others yet (they run it later)
            return
        rank = int(os.environ.get("LOCAL_RANK", dist.get_rank())) if local else dist.get_rank()
        if rank != 0:
            logging.getLogger("taskfit").debug("Waiting for the main process to finish %s first.", desc)
            dist.barrier()
        try:
            yield
        finally:
            if rank == 0:
                dist.barrier()

    def resolved_precision(self) -> str:
        """The precision plugin name: ``"bf16-mixed"`` if ``bf16``, ``"16-mixed"`` if ``fp16``, else ``precision``,
        else ``"32-true"`` (mirrors how HF maps its ``fp16``/``bf16`` flags onto AMP)."""
        if self.bf16:
            return "bf16-mixed"
        if self.fp16:
            return "16-mixed"
        return self.precision or "32-true"

    @property
    def resolved_logging_dir(self) -> str:
        """``logging_dir``, else ``<output_dir>/logs``. Loggers write local files, so for a remote ``output_dir``
        (an fsspec URL such as ``s3://bucket/run``) the default is the local folder ``runs/<bucket>_<run>/logs``;
        a ``file://`` URL becomes its path."""
        if self.logging_dir:
            return self.logging_dir
        out = self.output_dir.rstrip("/")
        if out.startswith("file://"):
            out = out[len("file://"):]
        elif "://" in out:
            out = os.path.join("runs", out.split("://", 1)[1].strip("/").replace("/", "_"))
        return out + "/logs"

    @property
    def resolved_run_name(self) -> str:
        """``run_name`` or, as in HF, ``output_dir`` when it is None."""
        return self.run_name or self.output_dir

    def get_warmup_steps(self, num_training_steps: int) -> int:
        """Warmup length in optimizer steps: ``int(warmup_steps)`` if >= 1, ``ceil(num_training_steps *
        warmup_steps)`` if in (0, 1), else ``ceil(num_training_steps * warmup_ratio)`` (mirrors HF 5
        ``TrainingArguments.get_warmup_steps``; ``warmup_ratio`` is the 4.x spelling)."""
        if self.warmup_steps >= 1:
            return int(self.warmup_steps)
        ratio = self.warmup_steps if self.warmup_steps > 0 else self.warmup_ratio
        return math.ceil(num_training_steps * ratio)

    def interval_steps(self, kind: str, num_training_steps: int) -> int:
        """Absolute step interval for ``kind`` in ``logging|eval|save``: the ``*_steps`` value, or for a ratio
        (float < 1) ``ceil(num_training_steps * ratio)``, as HF's Trainer resolves it.

        Raises:
            ValueError: unknown ``kind``.
        """
        if kind not in ("logging", "eval", "save"):
            raise invalid_choice("interval kind", kind, ("logging", "eval", "save"))
        value = getattr(self, f"{kind}_steps")
        if value is None:
            value = self.logging_steps
        return max(1, math.ceil(num_training_steps * value)) if value < 1 else int(value)

    # ----------------------------------------------------------------------------------------------------------
    # The "not implemented yet" gate
    def pending_options(self) -> list[tuple[str, str]]:
        """``(option, issue)`` for every option set to a non-default value whose feature has not landed.

        Defaults never count. Options with partial support count only for the unbuilt values
        (``num_nodes != 1``, ``skip_memory_metrics=False``,
        ``report_to`` naming a logger other than ``csv``).
        """
        defaults = _default_values()
        out = []
        for name, issue in PENDING_OPTIONS.items():
            value = getattr(self, name)
            predicate = _PENDING_WHEN.get(name)
            if (predicate(value) if predicate else value != defaults[name]):
                out.append((name, issue))
        return out

    def check_implemented(self) -> "FitArguments":
        """Raise if any option asks for a feature that has not landed yet; returns ``self`` otherwise.

        Raises:
            NotImplementedError: naming every pending option with its value and the issue where it lands, e.g.
                ``torch_compile=True is not implemented yet (lands with the precision/efficiency issue #4)``.
        """
        pending = self.pending_options()
        if pending:
            lines = [f"{name}={_redacted(name, getattr(self, name))!r} is not implemented yet (lands with {issue})"
                     for name, issue in pending]
            raise NotImplementedError("; ".join(lines))
        return self

    # ----------------------------------------------------------------------------------------------------------
    # Construction helpers
    @classmethod
    def field_names(cls) -> list[str]:
        """All option names, in declaration order (HF signature order, then seq2seq, then taskfit)."""
        return [f.name for f in fields(cls)]

    @classmethod
    def field_kinds(cls, name: str) -> tuple[type, ...]:
        """Plain types option ``name`` accepts, e.g. ``(int, NoneType)`` (used by the CLI).

        Raises:
            ValueError: unknown option (with "Did you mean").
        """
        return field_kinds(cls, name)

    @classmethod
    def _check_keys(cls, keys: Any) -> None:
        names = set(cls.field_names())
        for key in keys:
            if key not in names:
                raise unknown_option("FitArguments option", key, names, "help(FitArguments) or `taskfit fit --help`",
                                     _OTHER_NAMES)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "FitArguments":
        """Build from a mapping of option names.

        Raises:
            ValueError: an unknown key (with "Did you mean"), or any validation error.
            TypeError: ``d`` is not a dict.
        """
        if not isinstance(d, dict):
            raise TypeError(f"FitArguments expects a mapping of options, got {type(d).__name__}.")
        cls._check_keys(d)
        return cls(**d)

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> "FitArguments":
        """Like :meth:`from_dict`, from keyword arguments."""
        return cls.from_dict(kwargs)

    def replace(self, **changes: Any) -> "FitArguments":
        """A validated copy with ``changes`` applied (``self`` is unchanged).

        Raises:
            ValueError: an unknown option name (with "Did you mean") or any validation error.
        """
        self._check_keys(changes)
        return type(self)(**{**self.to_dict(), **copy.deepcopy(changes)})

    def _apply(self, **changes: Any) -> "FitArguments":
        """Apply ``changes`` in place atomically: validate a copy first, then copy its values into ``self``."""
        candidate = self.replace(**changes)
        for f in fields(self):
            setattr(self, f.name, getattr(candidate, f.name))
        return self

    # ----------------------------------------------------------------------------------------------------------
    # Serialisation
    def to_dict(self, redact: bool = False) -> dict[str, Any]:
        """All options as a plain dict (deep copy). ``redact=True`` replaces set tokens by ``"<HUB_TOKEN>"``-style
        placeholders, as HF's ``to_dict`` does; the default keeps them so that round trips are exact."""
        d = {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self)}
        if redact:
            d = {k: _redacted(k, v) for k, v in d.items()}
        return d

    def to_json_string(self, redact: bool = True, indent: int = 2) -> str:
        """JSON text of :meth:`to_dict` (``FitArguments.from_json(a.to_json_string()) == a`` when no credential is
        set). Credentials are redacted unless ``redact=False`` (see :func:`redact_value`)."""
        return json.dumps(self.to_dict(redact=redact), indent=indent)

    def to_yaml(self, redact: bool = True) -> str:
        """YAML text of :meth:`to_dict`, in field order (``FitArguments.from_yaml(a.to_yaml()) == a`` when no
        credential is set). Credentials are redacted unless ``redact=False``."""
        import yaml

        return yaml.safe_dump(self.to_dict(redact=redact), sort_keys=False, default_flow_style=False)

    def to_sanitized_dict(self) -> dict[str, bool | int | float | str]:
        """Scalars only, for logger hyperparameter tables: other values become ``str(value)`` and tokens are
        redacted (mirrors ``TrainingArguments.to_sanitized_dict``)."""
        return {k: v if type(v) in (bool, int, float, str) else str(v) for k, v in self.to_dict(redact=True).items()}

    @classmethod
    def from_yaml(cls, path_or_text: str | os.PathLike) -> "FitArguments":
        """Load from a YAML file path or YAML text (safe loader).

        Raises:
            FileNotFoundError: a path ending in .yaml/.yml that does not exist.
            ValueError: not a mapping, an unknown key (with "Did you mean"), or a validation error.
        """
        return cls.from_dict(read_config(path_or_text, "yaml"))

    @classmethod
    def from_json(cls, path_or_text: str | os.PathLike) -> "FitArguments":
        """Load from a JSON file path or JSON text (errors as :meth:`from_yaml`)."""
        return cls.from_dict(read_config(path_or_text, "json"))

    def save(self, path: str | os.PathLike, redact: bool = True) -> Path:
        """Write to ``path`` as YAML (``.yaml``/``.yml``) or JSON (``.json``); returns the path. Credentials (tokens,
        passwords and keys in option values, URL passwords) are written as placeholders unless ``redact=False``.

        Raises:
            ValueError: another extension.
        """
        path = Path(path)
        fmt = _format_of(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_yaml(redact) if fmt == "yaml" else self.to_json_string(redact) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "FitArguments":
        """Read a file written by :meth:`save` (format by extension; errors as :meth:`from_yaml`)."""
        path = Path(path)
        return cls.from_dict(read_config(path, _format_of(path)))

    def __repr__(self) -> str:
        defaults = _default_values()
        changed = [f"{f.name}={_redacted(f.name, getattr(self, f.name))!r}" for f in fields(self)
                   if getattr(self, f.name) != defaults.get(f.name)]
        return f"{type(self).__name__}({', '.join(changed)})"


_SECRET_KEY = re.compile(r"token|secret|passw|api[_-]?key|access[_-]?key|private[_-]?key|credential|auth",
                         re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^/\s:@]+:)[^/\s@]+@", re.IGNORECASE)


def redact_value(name: str, value: Any) -> Any:
    """``value`` of option (or key) ``name`` with credentials replaced: a set value of a secret option
    (``hub_token``) or of any key that names a credential (``token``, ``secret``, ``password``, ``api_key``,
    ``access_key``, ``credentials``, ... inside dict options such as storage options) becomes ``"<NAME>"``;
    passwords in URLs (``s3://user:pass@host``) become ``<REDACTED>``; dicts and lists are redacted recursively."""
    if value is None:
        return None
    if name in SECRET_FIELDS or (_SECRET_KEY.search(str(name)) and not isinstance(value, (bool, dict, list))):
        return f"<{str(name).upper()}>"
    if isinstance(value, dict):
        return {k: redact_value(str(k), v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_value(name if not isinstance(v, (dict, list)) else "", v) for v in value)
    if isinstance(value, str):
        return _URL_PASSWORD.sub(lambda m: m.group("head") + "<REDACTED>@", value)
    return value


def _redacted(name: str, value: Any) -> Any:
    return redact_value(name, value)


@lru_cache(maxsize=1)
def _default_values_cached() -> tuple[tuple[str, Any], ...]:
    return tuple(FitArguments().to_dict().items())


def _default_values() -> dict[str, Any]:
    """Normalised default value of every option (what ``FitArguments()`` holds)."""
    return dict(_default_values_cached())


def _format_of(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in (".yaml", ".yml"):
        return "yaml"
    if suffix == ".json":
        return "json"
    raise invalid_choice("config file extension", suffix or str(path), (".yaml", ".yml", ".json"))


def read_config(path_or_text: str | os.PathLike, fmt: str | None = None) -> dict[str, Any]:
    """Read a YAML/JSON mapping from a file path or from text (the CLI uses this for its ``--config``).

    Args:
        path_or_text: a ``Path``, a path string (an existing file, or a name ending in .yaml/.yml/.json), or the
            text itself.
        fmt: ``"yaml"`` or ``"json"``; None = from the file extension (text defaults to YAML, a JSON superset).

    Raises:
        FileNotFoundError: a path that does not exist.
        ValueError: the content is not a mapping (or unparsable).
    """
    text, where = path_or_text, "text"
    is_path = isinstance(path_or_text, os.PathLike) or (
        isinstance(path_or_text, str) and "\n" not in path_or_text
        and (os.path.isfile(path_or_text) or path_or_text.lower().endswith((".yaml", ".yml", ".json"))))
    if isinstance(path_or_text, (str, os.PathLike)) and "\n" not in str(path_or_text) and os.path.isdir(path_or_text):
        raise IsADirectoryError(f"Config {str(path_or_text)!r} is a directory; give the path of a YAML or JSON file.")
    if is_path:
        path = Path(path_or_text)
        if not path.is_file():
            raise FileNotFoundError(f"Config file {str(path)!r} does not exist.")
        text, where = path.read_text(encoding="utf-8"), str(path)
        fmt = fmt or _format_of(path)
    import yaml

    try:
        data = json.loads(text) if fmt == "json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as err:
        raise ValueError(f"Cannot parse {fmt or 'yaml'} config ({where}): {err}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"A config ({where}) must be a mapping of option names, got {type(data).__name__}.")
    return data


#: names users bring from Lightning / plain PyTorch habits -> the FitArguments option
_OTHER_NAMES = {"lr": "learning_rate", "epochs": "num_train_epochs", "max_epochs": "num_train_epochs",
                "num_epochs": "num_train_epochs", "batch_size": "per_device_train_batch_size",
                "accumulate_grad_batches": "gradient_accumulation_steps", "gradient_clip_val": "max_grad_norm",
                "log_every_n_steps": "logging_steps", "default_root_dir": "output_dir", "weight_decay_rate": "weight_decay"}


def _init_with_suggestions(init: Any) -> Any:
    """Wrap the dataclass ``__init__`` so an unknown keyword names the closest options (not a bare TypeError)."""

    @functools.wraps(init)
    def __init__(self: FitArguments, *args: Any, **kwargs: Any) -> None:
        type(self)._check_keys(kwargs)
        init(self, *args, **kwargs)

    return __init__


FitArguments.__init__ = _init_with_suggestions(FitArguments.__init__)  # type: ignore[method-assign]

__all__ = ["BUILT_LOGGERS", "PENDING_OPTIONS", "FitArguments", "read_config"]
