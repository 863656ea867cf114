"""Graceful stop on Ctrl-C, SIGTERM and SLURM's requeue signal: finish the current optimizer step, write a
complete checkpoint, say where it is and how to resume, and exit non-zero.

``Fit.fit`` installs a :class:`GracefulStop` around its training loop (main thread only). A signal only sets a
flag; the fit loop reads it at the end of each optimizer step (an attribute read, no system call). With several
processes the flag is combined over all ranks by a non-blocking all-reduce started at the end of one step and
read at the end of the next, so every rank stops after the same step (a signal that reaches one rank stops
them all) without waiting on the network in the step. Mirrors Lightning's signal connector (SIGTERM, and
``SIGUSR1`` + ``scontrol requeue`` under SLURM's ``--signal``).

- SIGTERM (what clusters send before pre-emption): stop, and save when ``save_on_interrupt`` is not False.
- SIGINT (Ctrl-C): stop, and save only with ``save_on_interrupt=True``; a second Ctrl-C interrupts at once.
- SIGUSR1 when ``$SLURM_JOB_ID`` is set (``sbatch --signal=USR1@90``): save, then ``scontrol requeue $SLURM_JOB_ID``.

The stopped run raises :class:`TrainingInterrupted` (a ``SystemExit`` with code ``128 + signal number``: 143
for SIGTERM, 130 for SIGINT, 138 for SIGUSR1) after the checkpoint is complete.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
from typing import Any, Callable

log = logging.getLogger("taskfit")


class TrainingInterrupted(SystemExit):
    """Training stopped on a signal after finishing an optimizer step.

    Attributes:
        code (int): exit status, ``128 + signum``.
        signum (int): the signal received.
        checkpoint (str | None): the newest complete checkpoint (None when there is none).
    """

    def __init__(self, signum: int, checkpoint: str | None) -> None:
        super().__init__(128 + signum)
        self.signum, self.checkpoint = signum, checkpoint


def resume_command(checkpoint: str) -> str:
    """The command that continues the run: this process's command line with ``--resume_from_checkpoint`` set
    for the ``taskfit`` CLI; for a script, the same command line (the script resumes when it calls
    ``fit.fit(..., resume_from_checkpoint=True)`` or names the checkpoint)."""
    argv = list(sys.argv)
    cli_file = os.path.abspath(os.path.join(os.path.dirname(__file__), "cli.py"))
    if argv and (os.path.basename(argv[0]) == "taskfit" or os.path.abspath(argv[0]) == cli_file):
        cmd = ["taskfit"] + argv[1:]
        if "--resume_from_checkpoint" in cmd:
            i = cmd.index("--resume_from_checkpoint")
            del cmd[i:i + 2]
        return shlex.join(cmd + ["--resume_from_checkpoint", checkpoint])
    return shlex.join([os.path.basename(sys.executable)] + argv)


class GracefulStop:
    """Signal handlers and the stop flag of one ``fit`` call.

    Args:
        save_on_interrupt (bool | None): True: checkpoint on every handled signal; None (default): on SIGTERM and
            SLURM's SIGUSR1, not on Ctrl-C; False: never (the run still stops after the step).
        world_size (int): processes; above 1 the flag is combined over ranks (see the module docstring).
        reduce_max (Callable[[Tensor], Any] | None): starts a non-blocking MAX all-reduce of a 1-element int
            tensor in place and returns an object with ``wait()`` (``torch.distributed.all_reduce(...,
            async_op=True)``); needed when ``world_size > 1``.
    """

    def __init__(self, save_on_interrupt: bool | None = None, world_size: int = 1, reduce_max: Any = None) -> None:
        self.save_on_interrupt = save_on_interrupt
        self.signum = 0            # the signal this process received (0: none)
        self.agreed = 0            # the signal every rank acts on (0: keep going)
        self.world_size, self._reduce_max = world_size, reduce_max
        self._pending: Any = None  # (work, tensor) of the all-reduce started at the previous step
        self.check: Any = None  # runs a collective, failures -> DistributedError (see install_graceful_stop)
        self._previous: dict[int, Any] = {}
        self._sigint_count = 0

    # ---------------------------------------------------------------------------------------- handlers ---
    def install(self) -> GracefulStop:
        """Install the handlers (main thread only; elsewhere nothing is installed). Returns ``self``."""
        if threading.current_thread() is not threading.main_thread():
            return self
        wanted = [signal.SIGTERM, signal.SIGINT]
        if os.environ.get("SLURM_JOB_ID") and hasattr(signal, "SIGUSR1"):
            wanted.append(signal.SIGUSR1)
        for signum in wanted:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def uninstall(self) -> None:
        """Put the previous handlers back and drop the flag's all-reduce (after an error it is not waited for:
        a peer may be gone; a traceback keeping it alive would carry a gloo work and its tensor to interpreter
        exit, a shutdown hazard)."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        self._pending = None

    def _handle(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT:
            self._sigint_count += 1
            if self._sigint_count > 1:  # a second Ctrl-C: stop now, as Python would
                self.uninstall()
                raise KeyboardInterrupt
        self.signum = self.signum or signum

    # ---------------------------------------------------------------------------------------- the flag ---
    def poll(self) -> int:
        """The signal every rank stops on after this optimizer step, or 0. Called once per optimizer step."""
        if self.world_size <= 1:
            self.agreed = self.signum
            return self.agreed
        import torch

        if self._pending is not None:  # started one step ago: long finished, so wait() does not stall
            work, tensor = self._pending
            self._wait(work)
            # a CPU tensor of the gloo group, reduced one step ago: reading it never waits for a device
            self.agreed = int(tensor.item())
        tensor = torch.tensor([self.signum], dtype=torch.int64)
        self._pending = (self._reduce_max(tensor), tensor)
        return self.agreed


    def _wait(self, work: Any) -> None:
        """Wait for the flag's all-reduce; a peer that stopped or vanished becomes the strategy's
        ``DistributedError`` (the same failure path as every other collective: bounded exit, no closing barrier)."""
        if self.check is not None:
            self.check("graceful-stop flag all-reduce", work.wait)
        else:
            work.wait()

    def should_save(self, signum: int) -> bool:
        """Whether a stop on ``signum`` writes a checkpoint (see ``save_on_interrupt``)."""
        if self.save_on_interrupt is not None:
            return bool(self.save_on_interrupt)
        return signum != signal.SIGINT

    def finish(self) -> None:
        """Complete the last all-reduce so no collective is left in flight (the fit ends with it: a pending gloo
        work still holding its tensor at interpreter exit is a shutdown hazard).

        Raises:
            DistributedError: a peer stopped or vanished (through ``check``).
        """
        pending, self._pending = self._pending, None
        if pending is not None:
            self._wait(pending[0])

    def stop(self, checkpoint_io: Any, output_dir: str, step: int, is_global_zero: bool) -> TrainingInterrupted:
        """After the step's checkpoint was started: wait for it to be complete, report the stop on rank zero
        (signal, newest complete checkpoint in ``output_dir``, resume command), requeue under SLURM for
        SIGUSR1, and return the exception to raise."""
        from taskfit.checkpoint.writer import list_checkpoints

        signum = self.agreed or self.signum
        self.finish()
        checkpoint_io.wait()  # an async save must be complete before it is named
        done = list_checkpoints(checkpoint_io, output_dir)
        checkpoint = done[-1][1] if done else None
        if is_global_zero:
            name = signal.Signals(signum).name
            if checkpoint:
                msg = (f"Received {name}: stopped after optimizer step {step}; the last complete checkpoint is "
                       f"{checkpoint}\n"
                       f"Resume with: {resume_command(checkpoint)}  (a script whose fit.fit(...) is given "
                       "resume_from_checkpoint=True continues from it)")
            else:
                msg = (f"Received {name}: stopped after optimizer step {step}; there is no complete checkpoint "
                       "(save_on_interrupt=True writes one on this signal too).")
            log.warning(msg)
            if signum == getattr(signal, "SIGUSR1", None) and os.environ.get("SLURM_JOB_ID"):
                requeue(os.environ["SLURM_JOB_ID"])
        return TrainingInterrupted(signum, checkpoint)


def requeue(job_id: str) -> int:
    """Run ``scontrol requeue JOB_ID`` (SLURM puts the job back in the queue; it restarts and resumes from the
    last checkpoint); returns its exit status, logging a failure instead of raising."""
    try:
        result = subprocess.run(["scontrol", "requeue", str(job_id)], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        log.error("Could not requeue SLURM job %s: %s", job_id, err)
        return 1
    if result.returncode:
        log.error("scontrol requeue %s failed (%d): %s", job_id, result.returncode, result.stderr.strip())
    else:
        log.warning("Requeued SLURM job %s.", job_id)
    return result.returncode


def reduce_max_over_ranks() -> Any:
    """A function starting a non-blocking MAX all-reduce of a CPU tensor over all processes (on the default
    group when it is gloo, else on a gloo group made once here: a collective call, so every rank calls this at
    the same point); None when ``torch.distributed`` is not initialised."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
    return lambda tensor: dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group, async_op=True)


def install_graceful_stop(save_on_interrupt: bool | None, world_size: int,
                          check: Callable[[str, Callable[[], Any]], Any] | None = None) -> GracefulStop:
    """A :class:`GracefulStop` for one ``fit`` call, handlers installed. ``check(what, fn)`` runs a collective
    and turns a communication failure into ``DistributedError`` (``Strategy.check_collective``)."""
    reduce_max = reduce_max_over_ranks() if world_size > 1 else None
    stop = GracefulStop(save_on_interrupt, world_size if reduce_max is not None else 1, reduce_max)
    stop.check = check
    return stop.install()
