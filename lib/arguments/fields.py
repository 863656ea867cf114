"""The Hugging Face option fields of `FitArguments`: every ``transformers.TrainingArguments`` (5.x) and
``Seq2SeqTrainingArguments`` field, under HF's name, type and default and in HF's order.

These are dataclass mixins; :class:`taskfit.arguments.fit_arguments.FitArguments` combines them with the 4.x spellings
(:mod:`taskfit.arguments.legacy`) and the taskfit-only options (:mod:`taskfit.arguments.taskfit_fields`). The one
deliberate default difference, ``report_to=None`` (a local CSV log) instead of HF 5's ``"none"``, is listed in
the "Argument differences" table of the HF guide and in ``tests/hf_diff/test_arguments_fields.py``.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# the choices HfArgumentParser checks while parsing (HF's enum / choices options); FitArguments checks the same
# tables again when it is built
from taskfit.arguments.choices import DDP_BACKENDS as _DDP_BACKENDS
from taskfit.arguments.choices import HUB_STRATEGIES as _HUB
from taskfit.arguments.choices import INTERVAL_STRATEGIES as _INTERVALS
from taskfit.arguments.choices import LOG_LEVELS as _LOG_LEVELS
from taskfit.arguments.choices import LR_SCHEDULERS as LR_SCHEDULER_NAMES
from taskfit.arguments.choices import MULTIPROCESSING_CONTEXTS as _MP_CONTEXTS
from taskfit.arguments.choices import OPTIMIZERS as OPTIMIZER_NAMES
from taskfit.arguments.choices import SAVE_STRATEGIES as _SAVES
from taskfit.arguments.choices import TRAIN_SAMPLING_STRATEGIES as _SAMPLINGS


#: each option field -> its help group (orders the CLI help). Kept out of ``Field.metadata``, which
#: ``transformers.HfArgumentParser`` passes to ``argparse.add_argument`` as keyword arguments.
_GROUPS: dict[Any, str] = {}


def _opt(default: Any, help: str, group: str, factory: Callable[[], Any] | None = None, **argparse: Any) -> Any:
    """A dataclass field with ``metadata={"help": ...}`` (as HF's fields, so ``HfArgumentParser`` reads it) and
    ``group`` recorded for :func:`field_group`; ``argparse`` keywords (``nargs``, ``const``) join the metadata,
    which ``transformers.HfArgumentParser`` passes to ``add_argument``."""
    metadata = {"help": help, **argparse}
    f = field(default_factory=factory, metadata=metadata) if factory is not None else field(default=default,
                                                                                         metadata=metadata)
    _GROUPS[f] = group
    return f


#: kinds an option accepts beyond its annotation. The annotations stay in the shapes ``HfArgumentParser`` can
#: turn into one argparse type (HF's own annotations for HF fields); these are the other values Python callers may
#: pass (``fsdp=True``, ``resume_from_checkpoint=True``, ``devices=[0, 1]``). Lightning's two-type switches
#: (``fast_dev_run``, ``limit_*_batches``) carry their kinds in their annotation (``taskfit.arguments.taskfit_fields``).
EXTRA_KINDS: dict[str, tuple[type, ...]] = {
    "devices": (int, list), "fsdp": (bool,), "resume_from_checkpoint": (bool,), "trackio_static_space_id": (bool,),
}


def field_group(f: Any) -> str:
    """The help group (``"training"``, ``"placement"``, ...) of an option field of ``FitArguments``."""
    return _GROUPS.get(f, "compat")


def _default_optim() -> str:
    """HF 5: ``adamw_torch_fused`` with torch >= 2.8 (fused AdamW has CPU and CUDA kernels there), else
    ``adamw_torch``. Read from the installed torch version without importing torch."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        major, minor = (int("".join(c for c in part if c.isdigit()) or 0) for part in version("torch").split(".")[:2])
    except (PackageNotFoundError, ValueError):  # pragma: no cover - torch is a dependency
        return "adamw_torch"
    return "adamw_torch_fused" if (major, minor) >= (2, 8) else "adamw_torch"


DEFAULT_OPTIM = _default_optim()


@dataclass(repr=False)
class HFTrainingFields:
    """``transformers.TrainingArguments`` 5.x fields, in its signature order (help texts say what taskfit does)."""

    output_dir: str | None = _opt(None, "Directory (local path or fsspec URL) for checkpoints, logs and predictions; None = 'trainer_output' (as HF).", "output")
    per_device_train_batch_size: int = _opt(8, "Training batch size per device (samples).", "training")
    num_train_epochs: float = _opt(3.0, "Epochs to train (a fraction trains part of the last epoch); ignored if max_steps > 0.", "training")
    max_steps: int = _opt(-1, "Total optimizer steps; overrides num_train_epochs when > 0 (-1 = use epochs).", "training")
    learning_rate: float = _opt(5e-05, "Initial (peak) learning rate of the optimizer.", "optimizer")
    lr_scheduler_type: str = _opt("linear", "Learning-rate schedule name (linear, cosine, constant, ...).", "schedule", choices=LR_SCHEDULER_NAMES)
    lr_scheduler_kwargs: dict | str | None = _opt(None, "Extra keyword arguments for the schedule (dict or JSON string).", "schedule")
    warmup_steps: float = _opt(0, "Linear warmup from 0: optimizer steps when >= 1, a fraction of the run's steps "
                                     "when in (0, 1) (HF 5).", "schedule")
    optim: str = _opt(DEFAULT_OPTIM, "Optimizer name (adamw_torch_fused, adamw_torch, sgd, adafactor, adamw_bnb_8bit, galore_adamw, ...).", "optimizer", choices=OPTIMIZER_NAMES)
    optim_args: str | dict | None = _opt(None, "Extra optimizer arguments: dict, JSON object or 'k1=v1,k2=v2'.", "optimizer")
    weight_decay: float = _opt(0.0, "Decoupled weight decay, skipped for biases and norm weights.", "optimizer")
    adam_beta1: float = _opt(0.9, "beta1 of Adam-type optimizers, in [0, 1).", "optimizer")
    adam_beta2: float = _opt(0.999, "beta2 of Adam-type optimizers, in [0, 1).", "optimizer")
    adam_epsilon: float = _opt(1e-08, "epsilon of Adam-type optimizers.", "optimizer")
    optim_target_modules: None | str | list[str] = _opt(None, "Module names optimised by GaLore/APOLLO optimizers (names, a regex or 'all-linear').", "optimizer")
    gradient_accumulation_steps: int = _opt(1, "Micro-batches accumulated per optimizer step (>= 1).", "training")
    average_tokens_across_devices: bool = _opt(True, "Normalise a token-averaged loss by the token count of all processes (HF 5 num_items_in_batch).", "training")
    max_grad_norm: float = _opt(1.0, "Gradient clipping max norm (L2); 0 disables clipping.", "training")
    label_smoothing_factor: float = _opt(0.0, "Label smoothing in [0, 1) for classification losses.", "training")
    bf16: bool = _opt(False, "bfloat16 mixed precision (same as precision='bf16-mixed').", "precision")
    fp16: bool = _opt(False, "float16 mixed precision with loss scaling (same as precision='16-mixed').", "precision")
    bf16_full_eval: bool = _opt(False, "Evaluate in pure bfloat16 (faster, may change metrics).", "precision")
    fp16_full_eval: bool = _opt(False, "Evaluate in pure float16 (faster, may change metrics).", "precision")
    tf32: bool | None = _opt(None, "Enable TF32 matmul/cuDNN on Ampere+ CUDA GPUs; None = PyTorch default.", "precision")
    activation_checkpointing: bool | None = _opt(None, "Recompute activations in backward to save memory (slower); None = off.", "precision", nargs="?", const=True)
    activation_checkpointing_kwargs: dict | str | None = _opt(None, "Keyword arguments for activation checkpointing (dict or JSON string).", "precision")
    gradient_checkpointing: bool | None = _opt(None, "Deprecated HF 5 alias of activation_checkpointing (mirrors it).", "precision", nargs="?", const=True)
    gradient_checkpointing_kwargs: dict | str | None = _opt(None, "Deprecated HF 5 alias of activation_checkpointing_kwargs (mirrors it).", "precision")
    torch_compile: bool = _opt(False, "Compile the model with torch.compile.", "precision")
    torch_compile_backend: str | None = _opt(None, "torch.compile backend (implies torch_compile).", "precision")
    torch_compile_mode: str | None = _opt(None, "torch.compile mode (implies torch_compile).", "precision")
    use_liger_kernel: bool = _opt(False, "Liger Triton kernels (CUDA only); not supported: True raises.", "precision")
    liger_kernel_config: dict | None = _opt(None, "Liger kernel options; not supported: a value raises.", "precision")
    use_cache: bool = _opt(False, "model.config.use_cache of a plain model, set for the run (as HF).", "training")
    neftune_noise_alpha: float | None = _opt(None, "NEFTune embedding-noise scale (training only); None = off.", "training")
    torch_empty_cache_steps: int | None = _opt(None, "Release cached accelerator memory every N steps (no effect on CPU); None = never.", "precision")
    auto_find_batch_size: bool = _opt(False, "Halve the batch size on out-of-memory and retry.", "training")
    logging_strategy: str = _opt("steps", "When to log: no | steps | epoch.", "logging", choices=_INTERVALS)
    logging_steps: float = _opt(500, "Optimizer steps between logs; a float < 1 is a ratio of total steps.", "logging")
    logging_first_step: bool = _opt(False, "Also log (and evaluate) at the first optimizer step.", "logging")
    log_on_each_node: bool = _opt(True, "Log with log_level on the main process of every node, not only node 0.", "logging")
    logging_nan_inf_filter: bool = _opt(True, "Leave nan/inf step losses out of the logged loss average (logging only).", "logging")
    include_num_input_tokens_seen: str | bool = _opt("no", "Track input tokens seen: no | all | non_padding (True = all).", "evaluation")
    log_level: str | None = _opt("passive", "Python log level on the main process: debug|info|warning|error|critical|passive.", "logging", choices=_LOG_LEVELS)
    log_level_replica: str | None = _opt("warning", "Python log level on replica processes (same choices as log_level).", "logging", choices=_LOG_LEVELS)
    disable_tqdm: bool | None = _opt(None, "Disable progress bars; None = decide from the log level.", "logging")
    report_to: None | str | list[str] = _opt(None, "Loggers: none | all | csv | tensorboard | mlflow | wandb (str or list); None = csv.", "logging")
    run_name: str | None = _opt(None, "Name of the run for loggers; None = output_dir.", "logging")
    project: str = _opt("huggingface", "Project name for loggers that group runs (wandb, trackio).", "logging")
    trackio_space_id: str | None = _opt(None, "Trackio Space (no trackio logger in taskfit; a value warns).", "logging")
    trackio_bucket_id: str | None = _opt(None, "Trackio bucket (no trackio logger in taskfit; a value warns).", "logging")
    trackio_static_space_id: str | None = _opt(None, "Trackio static Space (no trackio logger in taskfit; a value warns).", "logging")
    eval_strategy: str = _opt("no", "When to evaluate during training: no | steps | epoch.", "evaluation", choices=_INTERVALS)
    eval_steps: float | None = _opt(None, "Optimizer steps between evaluations; float < 1 = ratio of total steps; None = logging_steps.", "evaluation")
    eval_delay: float | None = _opt(0, "Epochs or steps (per eval_strategy) to wait before the first evaluation.", "evaluation")
    per_device_eval_batch_size: int = _opt(8, "Evaluation batch size per device (samples).", "evaluation")
    prediction_loss_only: bool = _opt(False, "In evaluation and prediction, return only the loss.", "evaluation")
    eval_on_start: bool = _opt(False, "Run one evaluation before the first training step (sanity check).", "evaluation")
    eval_do_concat_batches: bool = _opt(True, "Concatenate eval outputs across batches (False = keep a list per batch).", "evaluation")
    eval_use_gather_object: bool = _opt(False, "Gather non-tensor eval outputs across processes with all_gather_object (mirrors HF; tensors are gathered either way).", "evaluation")
    eval_accumulation_steps: int | None = _opt(None, "Prediction steps accumulated on device before moving outputs to CPU; None = all.", "evaluation")
    include_for_metrics: list[str] = _opt(None, "Extra values passed to compute_metrics: 'inputs' and/or 'loss'.", "evaluation", list)
    batch_eval_metrics: bool = _opt(False, "Call compute_metrics per batch (with compute_result on the last).", "evaluation")
    save_only_model: bool = _opt(False, "Save only model weights (no optimizer/scheduler/RNG state; cannot resume).", "checkpoint")
    save_strategy: str = _opt("steps", "When to save checkpoints: no | steps | epoch | best.", "checkpoint", choices=_SAVES)
    save_steps: float = _opt(500, "Optimizer steps between checkpoints; a float < 1 is a ratio of total steps.", "checkpoint")
    save_on_each_node: bool = _opt(False, "Save checkpoints on every node (non-shared storage), not only node 0.", "checkpoint")
    save_total_limit: int | None = _opt(None, "Keep at most this many checkpoints (the best is never deleted); None/0 = all.", "checkpoint")
    enable_jit_checkpoint: bool = _opt(False, "Checkpoint on SIGTERM (taskfit's save_on_interrupt does this by default).", "checkpoint")
    push_to_hub: bool = _opt(False, "Publish the model to hub_model_id on every save (see hub_strategy).", "hub")
    hub_token: str | None = _opt(None, "Token for the publishing store (redacted in logs).", "hub")
    hub_private_repo: bool | None = _opt(None, "Create the published repository as private; None = the store's default.", "hub")
    hub_model_id: str | None = _opt(None, "Where to publish: a repository name or remote fsspec URL.", "hub")
    hub_strategy: str = _opt("every_save", "What to publish and when: end | every_save | checkpoint | all_checkpoints.", "hub", choices=_HUB)
    hub_always_push: bool = _opt(False, "Push every save even if the previous push has not finished.", "hub")
    hub_revision: str | None = _opt(None, "Hub branch to push to; not supported by taskfit's fsspec publishing: a value with push_to_hub raises.", "hub")
    load_best_model_at_end: bool | None = _opt(False, "Load the best checkpoint (metric_for_best_model) at the end of training.", "checkpoint")
    metric_for_best_model: str | None = _opt(None, "Metric (with or without 'eval_') that ranks checkpoints; default 'loss' when needed.", "checkpoint")
    greater_is_better: bool | None = _opt(None, "Whether a larger metric_for_best_model is better; None = not name.endswith('loss').", "checkpoint")
    ignore_data_skip: bool = _opt(False, "On resume, do not skip already-seen batches (faster, not exact).", "checkpoint")
    restore_callback_states_from_checkpoint: bool = _opt(False, "Restore callback states saved in the checkpoint on resume.", "checkpoint")
    full_determinism: bool = _opt(False, "Deterministic algorithms and CUBLAS/cuDNN settings (slower).", "training")
    seed: int = _opt(42, "Random seed set at the start of training (python, numpy, torch, accelerator).", "training")
    data_seed: int | None = _opt(None, "Seed of the data samplers; None = seed.", "training")
    use_cpu: bool = _opt(False, "Force the CPU even when CUDA or MPS is available.", "hardware")
    accelerator_config: dict | str | None = _opt(None, "HF Accelerate options (split_batches, dispatch_batches, ...): dict, JSON or path.", "distributed")
    parallelism_config: object | None = _opt(None, "accelerate ParallelismConfig (N-D parallelism); not supported: use strategy= (a value raises).", "distributed")
    dataloader_drop_last: bool = _opt(False, "Drop the last incomplete batch of each epoch.", "data")
    dataloader_num_workers: int = _opt(0, "DataLoader worker processes (0 = load in the main process).", "data")
    dataloader_pin_memory: bool = _opt(True, "Pin host memory in DataLoaders for faster host-to-device copies.", "data")
    dataloader_persistent_workers: bool = _opt(False, "Keep DataLoader workers alive between epochs (needs workers > 0).", "data")
    dataloader_prefetch_factor: int | None = _opt(None, "Batches prefetched per worker (needs dataloader_num_workers > 0).", "data")
    dataloader_multiprocessing_context: str | None = _opt(None, "Start method of DataLoader workers: fork | spawn | forkserver; None = default.", "data", choices=_MP_CONTEXTS)
    dataloader_in_order: bool = _opt(True, "Batches come in dataset order across processes (False is an Accelerate dispatch option; warns).", "data")
    remove_unused_columns: bool | None = _opt(True, "Drop dataset columns the model's forward does not accept.", "data")
    label_names: list[str] | None = _opt(None, "Input keys that hold labels; None = ['labels'] (QA models: start/end positions).", "data")
    train_sampling_strategy: str = _opt("random", "Training sampler: random | sequential | group_by_length.", "data", choices=_SAMPLINGS)
    length_column_name: str | None = _opt("length", "Dataset column with precomputed lengths for train_sampling_strategy='group_by_length'.", "data")
    ddp_find_unused_parameters: bool | None = _opt(None, "DDP find_unused_parameters; None = False.", "distributed")
    ddp_bucket_cap_mb: int | None = _opt(None, "DDP gradient bucket size (MiB).", "distributed")
    ddp_broadcast_buffers: bool | None = _opt(None, "DDP broadcast_buffers; None = torch's default (True).", "distributed")
    ddp_static_graph: bool | None = _opt(None, "DDP static_graph; None = torch's default (False).", "distributed")
    ddp_backend: str | None = _opt(None, "torch.distributed backend: nccl | gloo | mpi | ccl | hccl | xccl; None = auto.", "distributed", choices=_DDP_BACKENDS)
    ddp_timeout: int | None = _opt(1800, "Timeout of torch.distributed collectives (seconds).", "distributed")
    fsdp: None | str | list[str] = _opt(None, "HF FSDP options, e.g. 'full_shard auto_wrap offload'; normalised to a list.", "distributed", nargs="?", const=True)
    fsdp_config: dict | str | None = _opt(None, "FSDP settings: dict, JSON string or path to a JSON file.", "distributed")
    deepspeed: dict | str | None = _opt(None, "DeepSpeed config: dict, JSON string or path to a JSON file.", "distributed")
    debug: str | list[str] = _opt("", "Debug features, space separated: underflow_overflow | tpu_metrics_debug.", "precision")
    skip_memory_metrics: bool = _opt(True, "Skip memory-usage metrics (collecting them slows training).", "evaluation")
    do_train: bool = _opt(False, "Informational flag for scripts (as in HF); Fit does not read it.", "output")
    do_eval: bool = _opt(False, "Informational flag for scripts; set True when eval_strategy != 'no'.", "output")
    do_predict: bool = _opt(False, "Informational flag for scripts (as in HF); Fit does not read it.", "output")
    resume_from_checkpoint: str | None = _opt(None, "Checkpoint to resume from: a path, or True/'last'/'auto' for the newest in output_dir (None: 'auto' after an elastic restart).", "checkpoint")
    local_rank: int = _opt(-1, "Rank of this process within its node (set by launchers; -1 = not distributed).", "distributed")


@dataclass(repr=False)
class Seq2SeqFields:
    """``transformers.Seq2SeqTrainingArguments``' own fields (every ``FitArguments`` has them)."""

    sortish_sampler: bool = _opt(False, "Sort-ish sampler by length for seq2seq training (means train_sampling_strategy='group_by_length').", "generation")
    predict_with_generate: bool = _opt(False, "Use generate() in evaluation/prediction (ROUGE/BLEU-style metrics).", "generation")
    generation_max_length: int | None = _opt(None, "max_length for generate() in evaluation.", "generation")
    generation_num_beams: int | None = _opt(None, "num_beams for generate() in evaluation.", "generation")
    generation_config: str | dict | None = _opt(None, "Generation config: path, model id, dict or JSON string.", "generation")


SEQ2SEQ_FIELDS = ("sortish_sampler", "predict_with_generate", "generation_max_length", "generation_num_beams",
                  "generation_config")
