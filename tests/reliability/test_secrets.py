"""Credentials are redacted by default wherever arguments are written (F-REL-6): ``FitArguments.save``,
``to_json_string``/``to_yaml``, checkpoints, the final model folder, logger hyperparameters and the repr; tokens,
credential-like keys inside dict options and passwords in URLs. ``redact=False`` is the explicit opt-out."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from taskfit import Fit, FitArguments

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "checkpoint"))
import job  # noqa: E402

SECRETS = ("tok-SECRET-1", "pw-SECRET-2", "key-SECRET-3")


def _args(out: str, **kw) -> FitArguments:
    return FitArguments(output_dir=out, hub_token=SECRETS[0], hub_model_id=f"s3://user:{SECRETS[1]}@bucket/model",
                        deepspeed={"storage": {"aws_secret_access_key": SECRETS[2], "region": "x"}}, **kw)


def _leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


def test_F_REL_6_save_and_text_forms_redact_by_default(tmp_path):
    a = _args("o")
    for path in (a.save(tmp_path / "a.json"), a.save(tmp_path / "a.yaml")):
        text = path.read_text()
        assert _leaks(text) == [] and "<HUB_TOKEN>" in text and "user:<REDACTED>@bucket" in text
        assert "<AWS_SECRET_ACCESS_KEY>" in text and "region" in text
    assert _leaks(a.to_json_string()) == _leaks(a.to_yaml()) == _leaks(repr(a)) == []
    assert _leaks(str(a.to_sanitized_dict())) == []
    assert _leaks(a.to_json_string(redact=False)) == list(SECRETS)  # the explicit opt-out keeps them
    assert a.hub_token == SECRETS[0]  # redaction never changes the arguments themselves


def test_F_REL_6_no_file_a_run_writes_holds_a_credential(tmp_path):
    out = tmp_path / "out"
    args = _args(str(out), max_steps=4, save_steps=2, per_device_train_batch_size=4, report_to="csv",
                 disable_tqdm=True)
    torch.manual_seed(0)
    fit = Fit(args.replace(deepspeed=None), strategy="auto")
    fit.fit(job.Net(), job.data())
    fit.save_model(str(out / "final"))
    written = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "fit_args.json" for p in written)
    secrets = SECRETS[:2]
    leaks = {str(p.relative_to(out)): [s for s in secrets if s in p.read_bytes().decode("latin-1")]
             for p in written}
    assert {k: v for k, v in leaks.items() if v} == {}
