"""Loop state and control flags: plain objects saved and restored whole (DESIGN.md, F-LOOP-6).

``FitState`` mirrors HF ``TrainerState`` (its field names, so HF-style callbacks work unchanged) and adds the
position inside the epoch that exact mid-epoch resume needs. It holds the run's *progress* only, which a
checkpoint restores whole; the run's *plan* (step budget, intervals, batch layout, which process this is) is a
:class:`~taskfit.loops.plan.RunPlan` apart from it, which the state reads HF's plan attributes from
(``state.max_steps``...) and which a resume never touches. ``FitControl`` mirrors HF ``TrainerControl``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from taskfit.io.hf_checkpoint import exportable, export_callback_states, restore_callback_states
from taskfit.loops.plan import FIELDS as PLAN_FIELDS
from taskfit.loops.plan import RunPlan

HF_TRAINER_STATE_FIELDS = (
    "epoch", "global_step", "max_steps", "logging_steps", "eval_steps", "save_steps", "train_batch_size",
    "num_train_epochs", "num_input_tokens_seen", "total_flos", "log_history", "best_metric", "best_global_step",
    "best_model_checkpoint", "is_local_process_zero", "is_world_process_zero", "is_hyper_param_search", "trial_name",
    "trial_params", "stateful_callbacks")


def _from_plan(name: str) -> property:
    """An attribute of :class:`FitState` that reads the plan's field ``name``; setting it (as HF code sets
    ``TrainerState`` attributes) replaces the plan with one that has the new value (the plan itself is frozen)."""
    def get(self: "FitState") -> Any:
        return getattr(self.plan, name)

    def set_(self: "FitState", value: Any) -> None:
        self.plan = self.plan.replace(**{name: value})

    return property(get, set_, doc=f"The run plan's ``{name}``.")


@dataclass(init=False)
class FitState:
    """Everything that decides what the loop does next, and the run's plan to read HF's attributes from.

    Attributes:
        epoch (float): epochs done, fractional inside an epoch (HF semantics: micro-batches seen / per epoch).
        current_epoch (int): zero-based index of the running epoch (Lightning semantics).
        global_step (int): optimizer steps taken (one per accumulation window).
        batch_in_epoch (int): micro-batches consumed in the running epoch (the resume position).
        samples_seen (int): training samples consumed, all epochs.
        total_flos (float): floating point operations of the training so far (estimate).
        log_history (list[dict]): every dict passed to the loggers, with ``step``.
        best_metric (float | None), best_model_checkpoint (str | None), best_global_step (int | None).
        num_input_tokens_seen (int): tokens consumed (when counted).
        stateful_callbacks (dict): callback states keyed by callback name.
        plan (RunPlan): the run's plan; ``max_steps``, ``num_train_epochs``, ``batches_per_epoch``,
            ``logging_steps``/``eval_steps``/``save_steps``, ``train_batch_size`` and
            ``is_local_process_zero``/``is_world_process_zero`` read it (setting one, as HF code may, replaces
            the frozen plan with one holding the new value). It is no part of :meth:`state_dict`.
    """

    epoch: float = 0.0
    current_epoch: int = 0
    global_step: int = 0
    batch_in_epoch: int = 0
    samples_seen: int = 0
    total_flos: float = 0.0
    log_history: list[dict[str, Any]] = field(default_factory=list)
    best_metric: float | None = None
    best_model_checkpoint: str | None = None
    best_global_step: int | None = None
    num_input_tokens_seen: int = 0
    is_hyper_param_search: bool = False
    trial_name: str | None = None
    stateful_callbacks: dict[str, Any] = field(default_factory=dict)
    plan: RunPlan = field(default_factory=RunPlan)

    max_steps = _from_plan("max_steps")
    num_train_epochs = _from_plan("num_train_epochs")
    batches_per_epoch = _from_plan("batches_per_epoch")
    logging_steps = _from_plan("logging_steps")
    eval_steps = _from_plan("eval_steps")
    save_steps = _from_plan("save_steps")
    train_batch_size = _from_plan("train_batch_size")
    is_local_process_zero = _from_plan("is_local_process_zero")
    is_world_process_zero = _from_plan("is_world_process_zero")

    def __init__(self, plan: RunPlan | None = None, **values: Any) -> None:
        """``values``: progress fields and, as HF's ``TrainerState(max_steps=...)`` takes them, plan fields (over
        ``plan``, the default :class:`RunPlan` when None).

        Raises:
            TypeError: a name that is neither a progress nor a plan field (the valid names are listed).
        """
        unknown = sorted(set(values) - {f.name for f in _PROGRESS} - set(PLAN_FIELDS))
        if unknown:
            raise TypeError(f"FitState got unknown fields {unknown}; valid: "
                            f"{sorted([f.name for f in _PROGRESS] + list(PLAN_FIELDS))}.")
        for f in _PROGRESS:
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            setattr(self, f.name, values.get(f.name, default))
        changes = {k: values[k] for k in PLAN_FIELDS if k in values}
        self.plan = (plan or RunPlan()).replace(**changes) if changes else (plan or RunPlan())

    def state_dict(self) -> dict[str, Any]:
        """A deep copy of the progress fields (the plan is not in it: :meth:`RunPlan.state_dict`)."""
        import copy

        return {f.name: copy.deepcopy(getattr(self, f.name)) for f in _PROGRESS}

    def flat_dict(self) -> dict[str, Any]:
        """The progress and the plan in one dict (the loop state's layout before the plan was split off)."""
        return {**self.state_dict(), **self.plan.state_dict()}

    def hf_dict(self) -> dict[str, Any]:
        """The fields of HF ``transformers.TrainerState`` only, so that ``TrainerState.load_from_json`` reads a
        ``trainer_state.json`` written from it (the resume position lives in ``training_state.pt``)."""
        state = self.flat_dict()
        out = {k: state.get(k) for k in HF_TRAINER_STATE_FIELDS}
        out["trial_params"] = None
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Set the progress from :meth:`state_dict` output; the plan stays this run's (keys that are no progress
        field, such as a plan field of an older flat state, are ignored)."""
        for f in _PROGRESS:
            if f.name in state:
                setattr(self, f.name, state[f.name])

    def save_to_json(self, json_path: str) -> None:
        """Write :meth:`hf_dict` to the local file ``json_path`` as HF ``TrainerState.save_to_json`` writes it
        (``indent=2``, sorted keys, a final newline), so that ``transformers.TrainerState.load_from_json`` reads it.

        Raises:
            OSError: the file cannot be written.
        """
        import json

        with open(json_path, "w", encoding="utf-8") as f:
            f.write(json.dumps(self.hf_dict(), indent=2, sort_keys=True, default=str) + "\n")

    @classmethod
    def load_from_json(cls, json_path: str) -> "FitState":
        """A state from a ``trainer_state.json`` (HF ``TrainerState.load_from_json``; written by taskfit or by
        ``transformers.Trainer``), its plan fields as the state's plan. Keys that are no field (HF's
        ``trial_params``) are left out.

        Raises:
            OSError: the file cannot be read. json.JSONDecodeError: it is not JSON.
        """
        import json

        with open(json_path, encoding="utf-8") as f:
            data = json.loads(f.read())
        return cls.from_flat(data)

    def compute_steps(self, args: Any, max_steps: int) -> None:
        """Set ``logging_steps``/``eval_steps``/``save_steps`` from ``args`` (HF ``TrainerState.compute_steps``): a
        value below 1 is a ratio of ``max_steps`` (rounded up), None leaves the field as it is. The plan is
        replaced by one with those intervals."""
        import math

        changes = {}
        for kind in ("logging", "eval", "save"):
            steps = getattr(args, f"{kind}_steps")
            if steps is not None:
                changes[f"{kind}_steps"] = math.ceil(max_steps * steps) if steps < 1 else steps
        self.plan = self.plan.replace(**changes)

    @classmethod
    def from_flat(cls, values: dict[str, Any]) -> "FitState":
        """A state from a dict of progress and plan fields in one (:meth:`flat_dict`, ``trainer_state.json``)."""
        state = cls(plan=RunPlan.from_dict(values))
        state.load_state_dict(values)
        return state


#: the progress fields of :class:`FitState` (everything but the plan)
_PROGRESS = tuple(f for f in dataclasses.fields(FitState) if f.name != "plan")


def plan_fields() -> tuple[str, ...]:
    """The names of the run plan's fields (derived by the run, never restored; :class:`RunPlan`)."""
    return PLAN_FIELDS


@dataclass
class FitControl:
    """Flags callbacks set to steer the loop (mirrors HF ``TrainerControl``). The loop resets the per-step
    flags after acting on them."""

    should_training_stop: bool = False
    should_epoch_stop: bool = False
    should_save: bool = False
    should_evaluate: bool = False
    should_log: bool = False

    def _new_training(self) -> None:
        self.should_training_stop = False

    def _new_epoch(self) -> None:
        self.should_epoch_stop = False

    def _new_step(self) -> None:
        self.should_save = self.should_evaluate = self.should_log = False

    def state_dict(self) -> dict[str, bool]:
        return dataclasses.asdict(self)

    def state(self) -> dict[str, Any]:
        """HF ``TrainerControl.state()`` (an ``ExportableState``): the flags as ``args``, no ``attributes``."""
        return {"args": dataclasses.asdict(self), "attributes": {}}

    def load_state_dict(self, state: dict[str, bool]) -> None:
        for k, v in state.items():
            setattr(self, k, v)


class LossSums:
    """The fit loop's running loss sums of this process (what the logged ``loss`` and ``train_loss`` are made of).

    The running sum is HF's ``tr_loss += loss`` per micro-batch in float32, added in place on the training device
    (nothing kept or converted per step), with HF's ``logging_nan_inf_filter`` (a non-finite loss counts as
    ``tr_loss / (1 + steps since the last log)``) applied lazily where the sum is read
    (:class:`~taskfit.loops.loss_filter.NonFiniteLossFilter`). A CPU loss kept per step (as its value or as a
    tensor) was measured: a tensor kept per step fragments the heap (the transformer workload of the overhead
    suite took 3.4x the hand-written loop's minor page faults), and ``.item()`` per step breaks DESIGN's hot path.

    Attributes:
        tr_loss (Tensor): 0-dim float32, this rank's sum of step losses since the last log (on the training device).
        filtered (bool): ``logging_nan_inf_filter`` is on (set by :meth:`start`).
        steps_since_log (int): optimizer steps in ``tr_loss``.
        total_loss (float): sum over the run of the logged step losses (averaged over ranks: equal everywhere).
        grad_norm (Tensor | None): the last clipped step's gradient norm (global: equal everywhere).
        loss_start_step (int): the step ``total_loss`` counts from (0 once restored from a checkpoint).
        nan_filter (NonFiniteLossFilter): ``logging_nan_inf_filter`` of the losses, applied where read.
    """

    def __init__(self, start_step: int = 0) -> None:
        import torch

        from taskfit.loops.loss_filter import NonFiniteLossFilter

        self.nan_filter = NonFiniteLossFilter()
        self.tr_loss = torch.zeros(())
        self.filtered = False
        self.steps_since_log = 0
        self.total_loss = 0.0
        self.grad_norm: Any = None
        self.loss_start_step = start_step

    def start(self, device: Any, filtered: bool) -> None:
        """Before the loop: the (possibly restored) sum moved to ``device`` (torch.device), the filter on or off."""
        self.tr_loss = self.tr_loss.to(device)
        self.filtered = filtered
        self.nan_filter.reset(self.tr_loss, self.steps_since_log)

    def add(self, loss: Any) -> None:
        """Add one micro-batch's detached one-element ``loss`` (no host sync; filtered where read)."""
        if loss.dim():  # shape (1,): its one element
            loss = loss.reshape(())
        self.tr_loss += loss
        if self.filtered:
            self.nan_filter.add(loss, self.steps_since_log)

    def read(self) -> Any:
        """The sum with the filter applied (a host sync for a device's losses): a log row, a checkpoint, the end of
        training."""
        self.nan_filter.apply(self.tr_loss, self.steps_since_log)
        return self.tr_loss

    def clear(self) -> None:
        """After a log row: the next interval starts from zero."""
        self.tr_loss.zero_()
        self.nan_filter.reset()


def upgrade_training_state(saved: dict[str, Any]) -> dict[str, Any]:
    """``saved`` (a :meth:`TrainingState.state_dict`, any version) in the current layout: ``state`` is the resume
    point's progress and ``plan`` the plan of the run that wrote it. Versions up to 3 kept the plan fields inside
    ``state``; versions 1 and 2 marked a checkpoint taken after an epoch's end with ``loop.epoch_done`` and kept
    that epoch's position, which becomes the next epoch's start, as version 3 on write it. Returns a new dict
    (``saved`` is not changed)."""
    version = saved.get("version", 1)
    if version >= 4:
        return saved
    flat = saved.get("state") or {}
    state = {k: v for k, v in flat.items() if k not in PLAN_FIELDS}
    loop = dict(saved.get("loop") or {})
    if loop.pop("epoch_done", False) and version < 3:
        state["current_epoch"] = state.get("current_epoch", 0) + 1
        state["batch_in_epoch"] = 0
    return {**saved, "version": TrainingState.VERSION, "state": state, "loop": loop,
            "plan": {k: v for k, v in flat.items() if k in PLAN_FIELDS}}


class TrainingState:
    """Everything that decides what a run does next and everything it logs, saved and restored whole
    (``state_dict``/``load_state_dict``; mirrors torchtune's ``TrainingProgress``).

    It is a view over the objects the run owns: the loop state (:class:`FitState`: step, epoch, position in the
    epoch, log history, best metric, callback states), the control flags, the loop's :class:`LossSums`, the
    precision plugin (grad scaler), the callbacks, the module's ``self.log`` epoch aggregates and this process's
    RNG states. Per-rank parts (RNG, running loss sum) are kept per rank: ``state_dict`` holds the running loss sum
    of every rank (``tr_loss_per_rank``, gathered, a collective), this rank's RNG states (``rng``) and this rank's
    streaming-data state (``data``: JSON values, or None without a stateful iterable, see
    :mod:`taskfit.data.stateful`), which the checkpoint writes into this rank's own files.

    Args:
        state (FitState), control (FitControl), sums (LossSums): the run's loop objects.
        precision (Precision): the precision plugin (``state_dict``/``load_state_dict``).
        callbacks (list): the callbacks (``state_dict``/``load_state_dict``, or HF ``state()``).
        module (TaskModule | None): whose ``_results`` (``self.log`` aggregates) are saved.
        all_gather (Callable[[Tensor], Tensor]): the strategy's ``all_gather``; ``rank``/``world_size`` (int).
        accelerator (Accelerator | None): asked for its device RNG state (CUDA, MPS, XLA) next to the host ones.
        restore_hf_callbacks (bool): ``restore_callback_states_from_checkpoint`` (HF callbacks are restored only
            with it, as HF does; taskfit/Lightning callbacks always are).

    Version history: 1 = the loop sums of rank 0 only (read: every rank gets rank 0's sums); 2 = per rank;
    3 = ``state`` is the resume point (a checkpoint taken after an epoch's end records the next epoch's start);
    4 = the run's plan apart, under ``plan`` (for the runs that resume from it: they compare the batch layout),
    ``state`` the progress only. Older files are read through :func:`upgrade_training_state`.

    Restoring is "load, then continue": :meth:`load_state_dict` sets the progress (the plan is not in the state:
    it stays the new run's :class:`~taskfit.loops.plan.RunPlan`) and keeps the RNG states, which the fit loop
    applies once, through :meth:`restore_rng`, at the point of the loop where they were saved.
    """

    VERSION = 4

    def __init__(self, state: FitState, control: FitControl, sums: LossSums, precision: Any = None,
                 callbacks: list[Any] | None = None, module: Any = None, all_gather: Any = None, rank: int = 0,
                 world_size: int = 1, restore_hf_callbacks: bool = False, accelerator: Any = None) -> None:
        self.state, self.control, self.sums, self.precision = state, control, sums, precision
        self.callbacks, self.module, self.all_gather = list(callbacks or []), module, all_gather
        self.rank, self.world_size, self.restore_hf_callbacks = rank, world_size, restore_hf_callbacks
        self.accelerator = accelerator  # its device RNG state is saved with the host ones
        self.rng: dict[str, Any] | None = None  # restored RNG states, until restore_rng applies them
        #: the stateful training data (:func:`taskfit.data.stateful.stateful_source`, set by the fit loop) whose
        #: state this rank saves, and the restored state (JSON values) until the fit loop loads it into it
        self.data_source: Any = None
        self.data: Any = None
        #: set by the fit loop from an epoch's end (before on_train_epoch_end) to the next epoch's start: a
        #: checkpoint taken then resumes at the next epoch's start
        self.epoch_ended = False

    def resume_point(self) -> dict[str, Any]:
        """The :class:`FitState` dict a checkpoint taken now continues from: the live state, or the next
        epoch's start after an epoch's end."""
        state = self.state.state_dict()
        if self.epoch_ended:
            state["current_epoch"], state["batch_in_epoch"] = state["current_epoch"] + 1, 0
        return state

    def restore_rng(self) -> None:
        """Apply the restored RNG states (python, numpy, torch and the accelerator's) once; later calls, and
        calls without a restored state, do nothing."""
        if self.rng is not None:
            from taskfit.seed import set_rng_states

            rng, self.rng = self.rng, None
            set_rng_states(rng, self.accelerator)

    def state_dict(self) -> dict[str, Any]:
        """The whole state; ``rng`` is this process's (collected now), ``tr_loss_per_rank`` every process's
        (every rank must call this: it all-gathers)."""
        from taskfit.data.stateful import capture_state
        from taskfit.seed import rng_states

        s = self.sums
        tr = s.read().detach()  # a checkpoint reads the sum: fold and filter it now
        per_rank = self.all_gather(tr) if self.all_gather is not None and self.world_size > 1 else tr.unsqueeze(0)
        results = getattr(self.module, "_results", None)
        # HF ExportableState callbacks, as HF's TrainerState keeps them (written to trainer_state.json too)
        self.state.stateful_callbacks = export_callback_states(self.callbacks, self.control)
        return {
            "version": self.VERSION,
            "state": self.resume_point(),
            "plan": self.state.plan.state_dict(),
            "control": self.control.state_dict(),
            "loop": {"tr_loss_per_rank": per_rank.cpu().clone(), "steps_since_log": s.steps_since_log,
                     "total_loss": s.total_loss,
                     "grad_norm": None if s.grad_norm is None else s.grad_norm.detach().cpu().clone()},
            "precision": self.precision.state_dict() if self.precision is not None else {},
            "callbacks": callback_states(self.callbacks),
            "results": results.state_dict() if results is not None else {},
            "rng": rng_states(self.accelerator),
            "data": capture_state(self.data_source),
        }

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (any version): the progress of :class:`FitState` (the saved ``plan``
        is the old run's and is not loaded), control flags, precision, callbacks, ``self.log`` aggregates, loop
        sums, and the RNG states kept for :meth:`restore_rng`. This rank's running loss sum is its own saved one (the mean of the saved
        ranks' sums when the world size changed, which keeps the logged mean). A stateful stream's saved position
        (``data``) is kept for the fit loop, which loads it when it resumes mid-epoch."""
        import torch

        saved = upgrade_training_state(saved)
        self.state.load_state_dict(saved["state"])
        loop = saved.get("loop") or {}
        self.control.load_state_dict(saved.get("control", {}))
        self.control._new_step()
        if self.precision is not None and saved.get("precision") is not None:
            self.precision.load_state_dict(saved["precision"])
        restore_callbacks(self.callbacks, saved.get("callbacks", {}), self.restore_hf_callbacks,
                          saved["state"].get("stateful_callbacks"))
        results = getattr(self.module, "_results", None)
        if saved.get("results") and results is not None:
            results.load_state_dict(saved["results"])
        s = self.sums
        if loop:
            if "tr_loss_per_rank" in loop:
                per_rank = loop["tr_loss_per_rank"]
                tr = per_rank[self.rank] if len(per_rank) == self.world_size else per_rank.mean()
            else:
                tr = loop["tr_loss"]  # version 1: rank 0's sum only
            s.tr_loss = torch.as_tensor(tr).to(s.tr_loss.device, s.tr_loss.dtype).clone()
            s.steps_since_log, s.total_loss = int(loop["steps_since_log"]), float(loop["total_loss"])
            s.grad_norm = loop.get("grad_norm")
            s.loss_start_step = 0  # the sums now cover the whole run from step 0
        else:
            s.loss_start_step = self.state.global_step
        self.rng = saved.get("rng")
        self.data = saved.get("data")


def callback_states(callbacks: list[Any]) -> dict[str, Any]:
    """``{state_key: state}`` of every callback with ``state_dict()`` (taskfit / Lightning) or ``state()`` (HF
    ``ExportableState``; those are also kept HF's way in ``FitState.stateful_callbacks``)."""
    out = {}
    for cb in callbacks:
        if hasattr(cb, "state_dict"):
            out[getattr(cb, "state_key", type(cb).__qualname__)] = cb.state_dict()
        elif hasattr(cb, "state") and callable(cb.state):
            out[type(cb).__qualname__] = cb.state()
    return out


def restore_callbacks(callbacks: list[Any], states: dict[str, Any], restore_hf: bool,
                      stateful: dict[str, Any] | None = None) -> None:
    """taskfit/Lightning callbacks (``load_state_dict``) are always restored, as Lightning does; HF callbacks
    (``ExportableState``: ``state()`` with ``args``/``attributes``, saved HF's way in ``stateful``) only with
    ``restore_hf`` (HF's ``restore_callback_states_from_checkpoint``), as HF's ``Trainer._load_callback_state``:
    constructor ``args`` and ``attributes``, several of one class in order, and a warning (on HF's
    ``transformers.trainer`` logger) naming saved states no callback matches. Older checkpoints, without
    ``stateful``, restore the HF callbacks' ``attributes`` from ``states``."""
    import logging

    for cb in callbacks:
        if hasattr(cb, "load_state_dict"):
            key = getattr(cb, "state_key", type(cb).__qualname__)
            if key in states:
                cb.load_state_dict(states[key])
    if not restore_hf:
        return
    if not stateful:  # a checkpoint written before stateful_callbacks were kept: attributes only
        for cb in callbacks:
            old = states.get(type(cb).__qualname__)
            if exportable(cb) and isinstance(old, dict):
                for k, v in (old.get("attributes") or {}).items():
                    setattr(cb, k, v)
        return
    missing = restore_callback_states(callbacks, stateful)
    if missing:  # HF's words, on HF's logger (scripts written for transformers watch it)
        logging.getLogger("transformers.trainer").warning(
            f"Checkpoint included callbacks not included in current configuration. Ignoring. ({', '.join(missing)})")
