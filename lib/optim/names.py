"""Optimizer and LR-schedule names (torch-free, so ``FitArguments`` can validate them without importing torch).

The registries in :mod:`taskfit.optim.optimizers` and :mod:`taskfit.optim.schedulers` are built from these
lists, so a name is valid in ``FitArguments`` exactly when the registry knows it.
"""

#: ``optim`` names that build an optimizer today (F-LOOP-4). ``lion`` is taskfit's name for lion-pytorch's Lion.
IMPLEMENTED_OPTIMIZERS = (
    "adamw_torch", "adamw_torch_fused", "sgd", "adagrad", "rmsprop", "adafactor", "lion",
    # bitsandbytes (extra ``bnb``), HF's names and mapping
    "adamw_bnb_8bit", "adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit", "ademamix", "ademamix_8bit",
    "paged_ademamix_32bit", "paged_ademamix_8bit", "lion_8bit", "lion_32bit", "paged_lion_8bit", "paged_lion_32bit",
    "rmsprop_bnb", "rmsprop_bnb_8bit", "rmsprop_bnb_32bit",
    # optional packages, HF's arguments (taskfit.optim.hf_optimizers; each names its extra when missing)
    "galore_adamw", "galore_adamw_8bit", "galore_adafactor", "apollo_adamw", "grokadamw", "schedule_free_adamw",
    "schedule_free_sgd", "schedule_free_radam", "stable_adamw", "adamw_torch_4bit", "adamw_torch_8bit",
    "lomo", "adalomo",
    # one optimizer per parameter, stepped inside backward (taskfit.optim.layerwise)
    "galore_adamw_layerwise", "galore_adamw_8bit_layerwise", "galore_adafactor_layerwise", "apollo_adamw_layerwise",
)
PENDING_OPTIMIZER_NOTE = "not built in taskfit yet; use one of the built optimizers or pass your own"
#: HF ``optim`` names accepted by ``FitArguments`` whose optimizer taskfit cannot build: building one raises
#: ``NotImplementedError`` with the reason (``taskfit.optim.hf_optimizers.UNSUPPORTED``).
PENDING_OPTIMIZERS = (
    "adamw_hf", "adamw_torch_xla", "adamw_torch_npu_fused", "adamw_apex_fused", "adamw_anyprecision",
)
#: optimizers that read ``optim_target_modules`` (HF: GaLore and APOLLO); any other refuses the option.
TARGET_MODULE_OPTIMIZERS = tuple(n for n in IMPLEMENTED_OPTIMIZERS + PENDING_OPTIMIZERS
                                 if n.startswith(("galore_", "apollo_")))
OPTIMIZER_NAMES = IMPLEMENTED_OPTIMIZERS + PENDING_OPTIMIZERS

#: ``lr_scheduler_type`` names (HF ``SchedulerType``, F-LOOP-5).
LR_SCHEDULER_NAMES = (
    "linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup", "inverse_sqrt",
    "reduce_lr_on_plateau", "cosine_with_min_lr", "cosine_warmup_with_min_lr", "warmup_stable_decay", "greedy",
)
