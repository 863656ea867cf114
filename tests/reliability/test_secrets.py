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


def test_F_REL_6_log_records_and_stage_errors_are_redacted_but_metric_names_stay(caplog):
    """The taskfit logger's filter and the error redaction take URL passwords and credential values out, and leave
    metric and option names that merely contain ``token`` or ``auth`` (``train_tokens_per_second``,
    ``max_new_tokens``, ``pad_token_id``, ``author``) readable."""
    import logging

    from taskfit.redact import redact_exception

    log = logging.getLogger("taskfit")
    with caplog.at_level(logging.INFO, logger="taskfit"):
        log.info("push to %s failed", f"s3://user:{SECRETS[1]}@bucket/m")
        log.info("%s", {"train_tokens_per_second": 12.5, "max_new_tokens": 3, "pad_token_id": 0, "author": "me",
                        "auth_token": SECRETS[0]})
    text = caplog.text
    assert _leaks(text) == [] and "s3://user:<REDACTED>@bucket/m" in text
    assert "'train_tokens_per_second': 12.5, 'max_new_tokens': 3, 'pad_token_id': 0, 'author': 'me'" in text
    try:
        try:
            raise OSError(2, "No such file", f"/data/user:{SECRETS[1]}@host/x")
        except OSError as inner:
            raise ValueError(f"resume failed: password={SECRETS[2]}") from inner
    except ValueError as exc:
        redact_exception(exc)
        import traceback

        printed = "".join(traceback.format_exception(exc))
    assert _leaks(printed) == [] and "password=<REDACTED>" in printed and "user:<REDACTED>@host" in printed
