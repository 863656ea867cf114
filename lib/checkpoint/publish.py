"""Publishing the model, its card, metrics and checkpoints to a remote fsspec store (F-CKPT-6; HF ``push_to_hub``).

``push_to_hub=True`` publishes to ``hub_model_id``: any fsspec URL (``s3://bucket/models/name``, ``memory://``,
``file://``, a local path), or a bare name (``"my-model"``, ``"org/my-model"``) that resolves under
``$TASKFIT_HUB_ROOT`` (default ``~/.cache/taskfit/hub``). Without ``hub_model_id`` the name is the last component
of ``output_dir`` (as HF does). What goes up, per ``hub_strategy`` (mirrors ``TrainingArguments.hub_strategy``):

============== =====================================================================================
``end``        at the end of training: the final model (weights + ``config.json``), ``README.md`` (the model
               card), ``train_results.json`` / ``all_results.json`` and ``fit_args.json``
``every_save`` ``end`` plus, at every checkpoint save, the model of that checkpoint at the target's root
``checkpoint`` ``every_save`` plus the latest checkpoint under ``<target>/last-checkpoint/`` (so
               ``resume_from_checkpoint="<target>/last-checkpoint"`` continues the run from the store)
``all_checkpoints`` ``every_save`` plus every checkpoint under ``<target>/checkpoint-N/``
============== =====================================================================================

Every uploaded folder gets ``manifest.json`` (sizes, SHA-256) written last, after the old one was removed, so
an interrupted upload never looks complete. Pushes run on one background thread (never two at once, so never
two for the same target); with ``hub_always_push=False`` a save-time push is *skipped* while the previous one is
still in flight (HF rule), with ``True`` it waits its turn. A failed push is retried ``retries`` times with
exponential backoff, logged, and reported by :meth:`Publisher.finish` at the end of training; training never
fails because a push failed. ``hub_token`` becomes the store's ``token`` storage option and
``hub_private_repo`` a private ACL (S3); neither is written to any file or log.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from taskfit.__about__ import __version__
from taskfit.checkpoint.writer import MANIFEST_NAME, WEIGHTS_NAME, WEIGHTS_NAME_PT, model_files, read_manifest
from taskfit.io.async_checkpoint_io import snapshot
from taskfit.io.checkpoint_io import file_entry, filesystem, join, serialize, write_bytes_atomic

if TYPE_CHECKING:
    from taskfit.protocols import FitView

log = logging.getLogger("taskfit")
DEFAULT_ROOT = os.path.join("~", ".cache", "taskfit", "hub")


def hub_target(args: Any) -> str:
    """The URL or path ``push_to_hub`` publishes to (see the module docstring for the rules)."""
    name = args.hub_model_id or args.push_to_hub_model_id
    if not name:
        name = os.path.basename(str(args.output_dir).rstrip("/")) or "model"
    if not args.hub_model_id and args.push_to_hub_organization:
        name = f"{args.push_to_hub_organization}/{name}"
    if "://" in name or os.path.isabs(name):
        return name.rstrip("/")
    root = os.path.expanduser(os.environ.get("TASKFIT_HUB_ROOT", DEFAULT_ROOT))
    return join(root, name)


def hub_storage_options(args: Any, target: str) -> dict[str, Any]:
    """fsspec storage options from ``hub_token`` / ``hub_private_repo`` for the store of ``target``."""
    options: dict[str, Any] = {}
    token = args.hub_token or args.push_to_hub_token
    if token:
        options["token"] = token
    if args.hub_private_repo and target.startswith(("s3://", "s3a://")):
        options["s3_additional_kwargs"] = {"ACL": "private"}
    return options


def create_model_card(fit: FitView, model_name: str | None = None, dataset: str | list[str] | None = None,
                      finetuned_from: str | None = None, tags: str | list[str] | None = None,
                      metrics: dict[str, Any] | None = None, meta: dict[str, Any] | None = None) -> str:
    """Markdown model card (``README.md``): model class and parameter count, the arguments that matter, final
    (``metrics``, default: the ``train_*`` values logged so far) and best metrics, the last evaluation, the datasets
    named, the taskfit version. Mirrors HF ``Trainer.create_model_card``; no credential is ever included.
    ``meta``: HF's metadata keywords (``language``, ``license``, ``tasks``, ``dataset_tags``, ``dataset_args``:
    a string or a list each), written into the card's YAML block when given."""
    a, st = fit.args, fit.state
    model = fit.model
    n_params = sum(p.numel() for p in model.parameters()) if model is not None else 0
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad) if model is not None else 0
    name = model_name or os.path.basename(hub_target(a)) or "model"
    datasets = [dataset] if isinstance(dataset, str) else list(dataset or [])
    train = dict(metrics) if metrics is not None else {
        k: v for row in st.log_history for k, v in row.items() if k.startswith("train_") or k == "total_flos"}
    train = {k: v for k, v in train.items() if isinstance(v, (int, float, str))}
    evals = next((row for row in reversed(st.log_history) if "eval_runtime" in row), {})  # the last evaluation
    evals = {k: v for k, v in evals.items() if k not in ("epoch", "step") and not k.endswith(("_runtime", "_second"))}
    tags = [tags] if isinstance(tags, str) else list(tags or [])
    lines = ["---", "library_name: taskfit", f"tags: {json.dumps(['taskfit', *tags])}"]
    if datasets:
        lines.append(f"datasets: {json.dumps(datasets)}")
    for key, value in (meta or {}).items():  # HF's card metadata, as given (JSON is valid YAML)
        if value is not None:
            lines.append(f"{key}: {json.dumps(value)}")
    lines += ["---", "", f"# {name}", ""]
    about = f"A `{type(model).__name__}` with {n_params:,} parameters ({n_train:,} trainable), trained with taskfit."
    if finetuned_from:
        about += f" Fine-tuned from `{finetuned_from}`."
    lines += [about, ""]
    if datasets:
        lines += ["## Data", "", *[f"- {d}" for d in datasets], ""]
    strategy = fit.strategy
    rows = [("optimizer", a.optim), ("learning_rate", a.learning_rate), ("lr_scheduler_type", a.lr_scheduler_type),
            ("warmup", a.warmup_steps or a.warmup_ratio), ("weight_decay", a.weight_decay),
            ("precision", strategy.precision.name), ("strategy", strategy.name), ("world_size", strategy.world_size),
            ("per_device_train_batch_size", a.per_device_train_batch_size),
            ("gradient_accumulation_steps", a.gradient_accumulation_steps),
            ("total_train_batch_size", a.per_device_train_batch_size * a.gradient_accumulation_steps
             * strategy.world_size),
            ("max_steps / steps done", f"{st.max_steps} / {st.global_step}"), ("epochs", round(st.epoch, 4)),
            ("seed", a.seed)]
    lines += ["## Training", "", "| argument | value |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows], ""]
    results = {**train, **evals}
    if st.best_metric is not None:
        results["best " + str(a.metric_for_best_model)] = f"{st.best_metric} (global_step {st.best_global_step})"
    if results:
        lines += ["## Results", "", "| metric | value |", "|---|---|",
                  *[f"| {k} | {v} |" for k, v in results.items()], ""]
    lines += ["## Versions", "", f"- taskfit {__version__}", f"- torch {_torch_version()}", ""]
    return "\n".join(lines)


def _torch_version() -> str:
    import torch

    return torch.__version__


class PushError(RuntimeError):
    """A push that failed after all its retries (reported at the end of training, never raised into it)."""


class Publisher:
    """Uploads folders to the publishing target on one background thread, with retries.

    Args:
        target (str): URL or path of the published model (see :func:`hub_target`).
        storage_options (dict): fsspec options for the target store.
        always_push (bool): ``hub_always_push``; False skips a save-time push while another is in flight.
        retries (int): extra attempts after a failed upload.
        backoff (float): seconds before the first retry; doubled for each further one.
            ``retries``/``backoff`` default to the class attributes ``RETRIES`` (3) and ``BACKOFF`` (1.0 s).

    Attributes:
        errors (list[str]): one line per push that failed after its retries.
        pushed (list[str]): the folders uploaded completely, in order.
        skipped (int): save-time pushes skipped because the previous one was still running.
    """

    RETRIES = 3
    BACKOFF = 1.0

    def __init__(self, target: str, storage_options: dict | None = None, always_push: bool = False,
                 retries: int | None = None, backoff: float | None = None) -> None:
        self.target, self.storage_options = target, storage_options or {}
        self.always_push = always_push
        self.retries = self.RETRIES if retries is None else retries
        self.backoff = self.BACKOFF if backoff is None else backoff
        self.errors: list[str] = []
        self.pushed: list[str] = []
        self.skipped = 0
        self._executor: ThreadPoolExecutor | None = None
        self._futures: list[Future] = []

    def busy(self) -> bool:
        """True while a push is queued or running."""
        self._futures = [f for f in self._futures if not f.done()]
        return bool(self._futures)

    def submit(self, what: str, job: Callable[[], None], optional: bool = True) -> bool:
        """Queue ``job`` (an upload); ``optional`` pushes are skipped when busy and not ``always_push``.
        Returns whether it was queued."""
        if optional and not self.always_push and self.busy():
            self.skipped += 1
            log.info("Push of %s skipped: the previous push to %s is still running (hub_always_push=False).",
                     what, self.target)
            return False
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="taskfit-push")
        self._futures.append(self._executor.submit(self._run, what, job))
        return True

    def _run(self, what: str, job: Callable[[], None]) -> None:
        delay = self.backoff
        for attempt in range(self.retries + 1):
            try:
                job()
                self.pushed.append(what)
                return
            except Exception as exc:  # retried, then reported: a push never breaks training
                if attempt == self.retries:
                    msg = f"push of {what} to {self.target} failed after {attempt + 1} attempts: " \
                          f"{type(exc).__name__}: {exc}"
                    self.errors.append(msg)
                    log.error(msg)
                    return
                log.warning("Push of %s failed (%s: %s); retrying in %.2f s.", what, type(exc).__name__, exc, delay)
                time.sleep(delay)
                delay *= 2

    def finish(self) -> list[str]:
        """Wait for every queued push; return (and log) the failures."""
        for f in list(self._futures):
            f.result()
        self._futures = []
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        if self.errors:
            log.error("Publishing to %s had %d failed push(es); the local model and checkpoints are intact:\n%s",
                      self.target, len(self.errors), "\n".join(self.errors))
        return list(self.errors)

    # ---- uploads --------------------------------------------------------------------------------------------
    def upload_files(self, folder: str, files: dict[str, Any]) -> None:
        """Write ``{name: object}`` into ``folder`` (relative to the target, "" for its root): the old manifest is
        removed first and the new one written last."""
        dest = join(self.target, folder) if folder else self.target
        fs, manifest_path = filesystem(join(dest, MANIFEST_NAME), self.storage_options)
        if fs.exists(manifest_path):
            fs.rm(manifest_path)
        entries = {}
        for name, obj in files.items():
            if name == MANIFEST_NAME:
                continue
            data = serialize(name, obj)
            write_bytes_atomic(join(dest, name), data, self.storage_options)
            entries[name] = file_entry(data)
        manifest = {"format": "taskfit-published", "version": 1, "files": dict(sorted(entries.items())),
                    "taskfit_version": __version__}
        write_bytes_atomic(join(dest, MANIFEST_NAME), json.dumps(manifest, indent=2).encode(), self.storage_options)

    def upload_folder(self, source: str, folder: str, read: Callable[[str], bytes], names: list[str]) -> None:
        """Copy the files ``names`` of the complete checkpoint folder ``source`` (read with ``read``) to ``folder``
        under the target, keeping the checkpoint's own manifest and writing it last."""
        dest = join(self.target, folder)
        fs, manifest_path = filesystem(join(dest, MANIFEST_NAME), self.storage_options)
        if fs.exists(manifest_path):
            fs.rm(manifest_path)
        for name in names:
            if name != MANIFEST_NAME:
                write_bytes_atomic(join(dest, name), read(join(source, name)), self.storage_options)
        write_bytes_atomic(join(dest, MANIFEST_NAME), read(join(source, MANIFEST_NAME)), self.storage_options)


def make_publisher(fit: FitView) -> Publisher | None:
    """The publisher for ``fit.args`` (None without ``push_to_hub``); only the global-zero process publishes."""
    a = fit.args
    if not a.push_to_hub or not fit.is_global_zero:
        return None
    target = hub_target(a)
    return Publisher(target, hub_storage_options(a, target), always_push=bool(a.hub_always_push))


def push_checkpoint(fit: FitView, publisher: Publisher, path: str) -> None:
    """After the save of checkpoint ``path``: queue what ``hub_strategy`` publishes at a save."""
    strategy = fit.args.hub_strategy
    if strategy == "end":
        return
    io = fit.strategy.checkpoint_io
    name = path.rstrip("/").rsplit("/", 1)[-1]

    def job() -> None:
        deadline = time.monotonic() + 600.0
        while not io.exists(join(path, MANIFEST_NAME)):  # an async save may still be writing it
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path} did not become a complete checkpoint within 600 s.")
            time.sleep(0.05)
        names = list(read_manifest(io, path)["files"])  # validated: no name leaves the checkpoint folder
        model = [n for n in names if n in (WEIGHTS_NAME, WEIGHTS_NAME_PT, "config.json")]
        publisher.upload_files("", {n: io.read_bytes(join(path, n)) for n in model})
        if strategy == "checkpoint":
            publisher.upload_folder(path, "last-checkpoint", io.read_bytes, names)
        elif strategy == "all_checkpoints":
            publisher.upload_folder(path, name, io.read_bytes, names)

    publisher.submit(name, job, optional=True)


def push_final(fit: FitView, publisher: Publisher, metrics: dict[str, Any], dataset: Any = None,
               weights: dict[str, Any] | None = None, card: dict[str, Any] | None = None) -> None:
    """Queue the end-of-training push: final model (``weights``: the full state dict, gathered by every rank
    beforehand under sharded strategies), model card (``card``: HF's ``create_model_card`` keywords), metrics and
    arguments (a snapshot is taken now)."""
    files = snapshot(model_files(fit, weights))
    card = dict(card or {})
    meta = {k: card.pop(k, None) for k in ("language", "license", "tasks", "dataset_tags", "dataset_args")}
    files["README.md"] = create_model_card(fit, dataset=dataset, metrics=metrics, meta=meta, **card)
    files["train_results.json"] = dict(metrics)
    files["all_results.json"] = dict(metrics)
    files["fit_args.json"] = fit.args.to_json_string(redact=True)
    publisher.submit("final model", lambda: publisher.upload_files("", files), optional=False)
