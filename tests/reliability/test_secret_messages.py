"""F-REL-6: no message, warning, log line or traceback text taskfit produces holds a credential value. Fake
credentials go through every option that can hold one (``hub_token``, ``push_to_hub_token``, a URL password in
``hub_model_id`` / ``push_to_hub_model_id``, credential keys inside ``deepspeed`` / ``fsdp_config`` strings and
dicts); a failing and a succeeding run are grepped: stdout, stderr (tracebacks, warnings) and every file the run
writes (logs, ``trainer_state.json``, the run summary, checkpoint JSONs). Before the fix, the conflict of
``push_to_hub_token`` and ``hub_token`` raised a ``ValueError`` printing both tokens."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SECRETS = ("tok-SECRET-A1", "tok-SECRET-B2", "pw-SECRET-C3", "key-SECRET-D4", "987654321013")

FAILING = r"""
import traceback, warnings
warnings.simplefilter("always")
from taskfit import FitArguments
A, B, C, D, N = SECRETS
cases = {
    "token_conflict": dict(hub_token=A, push_to_hub_token=B),
    "model_id_conflict": dict(hub_model_id="org/other", push_to_hub_model_id=f"s3://user:{C}@bucket/m"),
    "bad_deepspeed_json": dict(deepspeed='{"zero_optimization": {"stage": 2, "aws_secret_access_key": "' + D + '"'),
    "bad_fsdp_config_json": dict(fsdp_config="{'auth_token': '" + A + "', broken"),
    "token_wrong_type": dict(hub_token=int(N)),
    "token_in_list": dict(hub_token=[A]),
}
for name, kw in cases.items():
    try:
        FitArguments(output_dir=OUT, **kw)
        print(name, "ACCEPTED")
    except Exception:
        print(name, "REFUSED")
        traceback.print_exc()
FitArguments(output_dir=OUT, hub_token=A, push_to_hub_token=B)  # uncaught: the interpreter prints it
"""

SUCCEEDING = r"""
import sys, warnings
warnings.simplefilter("always")
sys.path.insert(0, JOBDIR)
import torch, job
from taskfit import Fit
A, B, C, D, N = SECRETS
torch.manual_seed(0)
fit = Fit(output_dir=OUT, push_to_hub_token=A, push_to_hub_model_id=f"https://user:{C}@host/org/model",
          max_steps=4, save_steps=2, logging_steps=1, per_device_train_batch_size=4, report_to="csv",
          disable_tqdm=False, logging_dir=OUT + "/logs")
print(fit.args)
fit.fit(job.Net(), job.data())
fit.save_model(OUT + "/final")
print("DONE")
"""


def _run(script: str, out: Path) -> subprocess.CompletedProcess:
    head = f"SECRETS = {SECRETS!r}\nOUT = {str(out)!r}\nJOBDIR = {str(Path(__file__).parent.parent / 'checkpoint')!r}\n"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "always"}
    return subprocess.run([sys.executable, "-c", head + script], capture_output=True, text=True, timeout=300,
                          env=env, cwd=out.parent)


def _leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


def _written(out: Path) -> dict[str, list[str]]:
    leaks = {str(p.relative_to(out)): _leaks(p.read_bytes().decode("latin-1")) for p in out.rglob("*") if p.is_file()}
    return {k: v for k, v in leaks.items() if v}


def test_F_REL_6_refused_options_print_no_credential(tmp_path):
    out = tmp_path / "failing"
    proc = _run(FAILING, out)
    assert proc.returncode != 0  # the last, uncaught conflict
    assert "conflicts with hub_token" in proc.stderr  # the message still says what is wrong
    for name in ("token_conflict", "model_id_conflict", "bad_deepspeed_json", "bad_fsdp_config_json",
                 "token_wrong_type", "token_in_list"):
        assert f"{name} REFUSED" in proc.stdout + proc.stderr or f"{name} ACCEPTED" in proc.stdout
    assert _leaks(proc.stdout) == [] and _leaks(proc.stderr) == []
    if out.exists():
        assert _written(out) == {}


def test_F_REL_6_a_run_with_credentials_prints_and_writes_none(tmp_path):
    out = tmp_path / "ok"
    proc = _run(SUCCEEDING, out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "DONE" in proc.stdout and "FutureWarning" in proc.stderr  # the deprecated spellings warned
    assert (out / "checkpoint-4" / "trainer_state.json").is_file()
    assert _leaks(proc.stdout) == [] and _leaks(proc.stderr) == []
    assert _written(out) == {}


URLS = r"""
import logging, os, traceback, warnings
warnings.simplefilter("always")
logging.basicConfig(level=logging.WARNING)
logging.getLogger("taskfit").setLevel(logging.DEBUG)  # every taskfit record, debug ones included
sys.path.insert(0, JOBDIR)
import torch, job
from taskfit import Fit
from taskfit.checkpoint.publish import Publisher
Publisher.RETRIES = 0  # one failed push is enough to print the target
A, B, C, D, N = SECRETS
os.environ.update(MLFLOW_HTTP_REQUEST_MAX_RETRIES="0", MLFLOW_HTTP_REQUEST_TIMEOUT="2")
host = "127.0.0.1:1"  # nothing listens there: every remote access fails at once
cases = {
    "output_dir": dict(output_dir=f"s3://user:{C}@{host}/bucket/out", save_steps=1),
    "logging_dir": dict(logging_dir=f"ftp://user:{C}@{host}/logs", report_to="tensorboard"),
    "resume_remote": dict(resume_from_checkpoint=f"s3://user:{C}@{host}/bucket/ckpt"),
    "resume_local": dict(resume_from_checkpoint=f"{OUT}/user:{C}@host/ckpt"),
    "hub_url": dict(push_to_hub=True, hub_model_id=f"https://user:{C}@{host}/org/model", save_steps=1),
    "mlflow_uri": dict(report_to="mlflow"),
    "deepspeed_section": dict(strategy="deepspeed",
                              deepspeed={"bf16": "token=" + A, "zero_optimization": {"stage": 1}}),
    "deepspeed_json": dict(strategy="deepspeed", deepspeed='{"api_key": "' + D + '", broken'),
    "fsdp_bool": dict(strategy="fsdp", fsdp_config={"use_orig_params": "password=" + B}),
}
for name, kw in cases.items():
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    if name == "mlflow_uri":
        os.environ["MLFLOW_TRACKING_URI"] = f"http://user:{C}@{host}/"
    try:
        torch.manual_seed(0)
        fit = Fit(**{"output_dir": OUT, "max_steps": 1, "per_device_train_batch_size": 4, "disable_tqdm": True,
                     **kw})
        fit.fit(job.Net(), job.data())
        print(name, "ACCEPTED", flush=True)
    except Exception:
        print(name, "REFUSED", flush=True)
        traceback.print_exc()
"""


@pytest.mark.slow  # about 25 s on a loaded 2-core machine (nine configurations); make test-reliability runs it
def test_F_REL_6_urls_and_configs_with_credentials_print_none(tmp_path):
    """A password in a URL of every path option (``output_dir``, ``logging_dir``, ``resume_from_checkpoint`` remote
    and local, the publishing target, the MLflow tracking URI) and a credential inside strategy configurations
    that the strategy refuses: what the storage, tracking and strategy code print (taskfit's log records, its
    errors, the errors of fsspec/botocore/MLflow that leave a stage) shows no secret."""
    out = tmp_path / "urls"
    proc = _run("import sys\n" + URLS, out)
    text = proc.stdout + proc.stderr
    for name in ("output_dir", "logging_dir", "resume_remote", "resume_local", "mlflow_uri", "deepspeed_section",
                 "deepspeed_json", "fsdp_bool"):
        assert f"{name} REFUSED" in text, text[-3000:]
    assert "hub_url ACCEPTED" in text and "failed after 1 attempts" in text  # a failed push is logged, not raised
    assert "user:<REDACTED>@127.0.0.1:1" in text  # the messages still name the target
    assert _leaks(proc.stdout) == [] and _leaks(proc.stderr) == [], [ln for ln in text.splitlines() if _leaks(ln)]
    assert _written(out) == {}
