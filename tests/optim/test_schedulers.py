"""F-LOOP-5: LR schedules by name (``lr_scheduler_type``, ``lr_scheduler_kwargs``,
``warmup_steps``/``warmup_ratio``).

Every expected learning rate below is written out in closed form from the HF formulas, independently of the
code.
"""

from __future__ import annotations

import enum
import json
import math
from types import SimpleNamespace

import pytest
import torch
from torch.optim.lr_scheduler import LambdaLR, ReduceLROnPlateau

from taskfit.optim.schedulers import (
    SCHEDULERS,
    accepted_scheduler_kwargs,
    create_scheduler,
    get_warmup_steps,
    is_metric_scheduler,
)

LR = 0.1
W, N = 4, 20  # warmup steps, training steps


def make_opt(lr=LR, groups=1):
    params = [{"params": [torch.nn.Parameter(torch.zeros(2))]} for _ in range(groups)]
    return torch.optim.SGD(params, lr=lr)


def run(name, kwargs=None, warmup_steps=W, n=N, lr=LR, extra_steps=2, warmup_ratio=0.0):
    """LR of group 0 after 0, 1, ..., n + extra_steps scheduler steps (one per optimizer step)."""
    opt = make_opt(lr)
    args = SimpleNamespace(
        lr_scheduler_type=name,
        lr_scheduler_kwargs=kwargs or {},
        warmup_steps=warmup_steps,
        warmup_ratio=warmup_ratio,
    )
    sched = create_scheduler(opt, args, n)
    lrs = []
    for _ in range(n + extra_steps + 1):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    return lrs


def check(lrs, expected):
    for step, value in expected.items():
        assert lrs[step] == pytest.approx(value, rel=1e-9, abs=1e-12), f"step {step}: {lrs[step]} != {value}"


def test_f_loop_5_registry_has_every_name():
    assert set(SCHEDULERS.names()) == {
        "linear",
        "cosine",
        "cosine_with_restarts",
        "polynomial",
        "constant",
        "constant_with_warmup",
        "inverse_sqrt",
        "reduce_lr_on_plateau",
        "cosine_with_min_lr",
        "cosine_warmup_with_min_lr",
        "warmup_stable_decay",
        "greedy",
    }


def test_f_loop_5_linear():
    lrs = run("linear")
    check(lrs, {0: 0.0, 1: LR / 4, 2: LR / 2, 4: LR, 12: LR * 8 / 16, 19: LR / 16, 20: 0.0, 22: 0.0})


def test_f_loop_5_cosine_default_and_num_cycles():
    lrs = run("cosine")
    check(
        lrs,
        {
            0: 0.0,
            2: LR / 2,
            4: LR,
            8: LR * 0.5 * (1 + math.cos(math.pi / 4)),
            12: LR / 2,
            16: LR * 0.5 * (1 + math.cos(3 * math.pi / 4)),
            20: 0.0,
        },
    )
    lrs = run("cosine", {"num_cycles": 1.0})  # a full cosine: down at the middle, back up at the end
    check(lrs, {4: LR, 8: LR / 2, 12: 0.0, 16: LR / 2, 20: LR})


def test_f_loop_5_cosine_with_restarts():
    lrs = run("cosine_with_restarts", {"num_cycles": 2})
    check(
        lrs,
        {
            0: 0.0,
            2: LR / 2,
            4: LR,
            6: LR * 0.5 * (1 + math.cos(math.pi / 4)),
            8: LR / 2,
            11: LR * 0.5 * (1 + math.cos(math.pi * 0.875)),
            12: LR,
            16: LR / 2,
            19: LR * 0.5 * (1 + math.cos(math.pi * 0.875)),
            20: 0.0,
            21: 0.0,
        },
    )
    check(run("cosine_with_restarts"), {12: LR / 2, 20: 0.0})  # default num_cycles=1 is plain cosine


def test_f_loop_5_polynomial_power_and_lr_end():
    lr_end, power = 0.01, 2.0
    lrs = run("polynomial", {"power": power, "lr_end": lr_end})
    check(
        lrs,
        {
            0: 0.0,
            2: LR / 2,
            4: LR,
            8: (LR - lr_end) * 0.75**2 + lr_end,
            12: (LR - lr_end) * 0.25 + lr_end,
            19: (LR - lr_end) / 256 + lr_end,
            20: lr_end,
            22: lr_end,
        },
    )
    check(run("polynomial"), {12: (LR - 1e-7) * 0.5 + 1e-7, 20: 1e-7})  # defaults: power 1, lr_end 1e-7
    with pytest.raises(ValueError, match=r"lr_end \(0.5\) must be smaller than initial lr \(0.1\)"):
        run("polynomial", {"lr_end": 0.5})


def test_f_loop_5_constant_and_constant_with_warmup():
    assert run("constant") == [LR] * (N + 3)  # HF's "constant" ignores warmup
    check(run("constant_with_warmup"), {0: 0.0, 1: LR / 4, 2: LR / 2, 4: LR, 12: LR, 22: LR})


def test_f_loop_5_inverse_sqrt():
    lrs = run("inverse_sqrt")  # timescale defaults to the warmup steps
    check(lrs, {0: 0.0, 2: LR / 2, 4: LR, 9: LR / math.sqrt(9 / 4), 16: LR / 2, 22: LR / math.sqrt(22 / 4)})
    lrs = run("inverse_sqrt", {"timescale": 8})
    check(lrs, {4: LR, 12: LR / math.sqrt((12 + 4) / 8), 20: LR / math.sqrt(24 / 8)})
    opt = make_opt()
    sched = create_scheduler(opt, SimpleNamespace(lr_scheduler_type="inverse_sqrt"), 100)
    assert sched.lr_lambdas[0](0) == 1.0  # no warmup: timescale 10 000
    assert sched.lr_lambdas[0](30_000) == pytest.approx(1 / math.sqrt(4.0))


def test_f_loop_5_cosine_with_min_lr():
    min_lr = 0.01
    lrs = run("cosine_with_min_lr", {"min_lr": min_lr})
    rate = min_lr / LR
    check(
        lrs,
        {
            0: 0.0,
            2: LR / 2,
            4: LR,
            8: LR * (0.5 * (1 + math.cos(math.pi / 4)) * (1 - rate) + rate),
            12: LR * (0.5 * (1 - rate) + rate),
            20: min_lr,
        },
    )
    lrs = run("cosine_with_min_lr", {"min_lr_rate": 0.2})
    check(lrs, {2: LR / 2, 4: LR, 12: LR * (0.5 * 0.8 + 0.2), 20: LR * 0.2})
    with pytest.raises(ValueError, match="only one of min_lr or min_lr_rate"):
        run("cosine_with_min_lr", {"min_lr": 0.01, "min_lr_rate": 0.1})
    with pytest.raises(ValueError, match="needs min_lr or min_lr_rate"):
        run("cosine_with_min_lr")


def test_f_loop_5_cosine_warmup_with_min_lr():
    lrs = run("cosine_warmup_with_min_lr", {"min_lr_rate": 0.1})
    check(
        lrs,
        {
            0: LR * 1 / 4,
            2: LR * 3 / 4,
            3: LR,
            4: LR * (0.5 * (1 + math.cos(math.pi / 16)) * 0.9 + 0.1),
            11: LR * (0.5 * 0.9 + 0.1),
            19: LR * 0.1,
        },
    )
    lrs = run("cosine_warmup_with_min_lr", {"min_lr": 0.02, "warmup_lr_rate": 0.1})
    check(lrs, {0: LR * 0.1, 1: LR * (0.1 + 0.9 / 3), 3: LR, 19: 0.02})


def test_f_loop_5_warmup_stable_decay_phases():
    # warmup 2, decay 4 of 10 steps -> stable = 10 - 2 - 4 = 4 (steps 2..5), decay on steps 6..9
    kw = {"num_decay_steps": 4}
    lrs = run("warmup_stable_decay", kw, warmup_steps=2, n=10)
    check(
        lrs,
        {
            0: 0.0,
            1: LR / 2,
            2: LR,
            5: LR,
            6: LR,
            7: LR * 0.5 * (1 + math.cos(math.pi / 4)),
            8: LR / 2,
            9: LR * 0.5 * (1 + math.cos(3 * math.pi / 4)),
            10: 0.0,
            12: 0.0,
        },
    )
    kw = {"num_decay_steps": 4, "decay_type": "linear", "min_lr_ratio": 0.1}
    lrs = run("warmup_stable_decay", kw, warmup_steps=2, n=10)
    check(
        lrs,
        {
            0: LR * 0.1,
            1: LR * (0.5 * 0.9 + 0.1),
            3: LR,
            6: LR,
            7: LR * (0.75 * 0.9 + 0.1),
            9: LR * (0.25 * 0.9 + 0.1),
            10: LR * 0.1,
            12: LR * 0.1,
        },
    )
    kw = {"num_decay_steps": 4, "num_stable_steps": 2, "warmup_type": "cosine", "decay_type": "1-sqrt"}
    lrs = run("warmup_stable_decay", kw, warmup_steps=2, n=10)
    check(
        lrs,
        {
            1: LR * 0.5 * (1 - math.cos(math.pi / 2)),
            2: LR,
            3: LR,
            4: LR,
            5: LR * (1 - math.sqrt(0.25)),
            6: LR * (1 - math.sqrt(0.5)),
            8: 0.0,
            10: 0.0,
        },
    )
    kw = {"num_decay_steps": 4, "warmup_type": "1-sqrt"}
    check(
        run("warmup_stable_decay", kw, warmup_steps=4, n=12),
        {1: LR * (1 - math.sqrt(0.75)), 2: LR * (1 - math.sqrt(0.5)), 4: LR},
    )


def test_f_loop_5_warmup_stable_decay_errors():
    with pytest.raises(ValueError, match="num_decay_steps"):
        run("warmup_stable_decay")
    with pytest.raises(ValueError, match="Unknown decay_type 'exp'.*1-sqrt"):
        run("warmup_stable_decay", {"num_decay_steps": 2, "decay_type": "exp"})
    with pytest.raises(ValueError, match="exceed num_training_steps"):
        run("warmup_stable_decay", {"num_decay_steps": 20}, warmup_steps=4, n=10)


def test_f_loop_5_reduce_lr_on_plateau_is_metric_scheduler():
    opt = make_opt()
    args = SimpleNamespace(
        lr_scheduler_type="reduce_lr_on_plateau", lr_scheduler_kwargs={"patience": 0, "factor": 0.5}
    )
    sched = create_scheduler(opt, args, 100)
    assert isinstance(sched, ReduceLROnPlateau)
    assert is_metric_scheduler(sched)
    assert sched.patience == 0 and sched.factor == 0.5
    sched.step(1.0)
    assert opt.param_groups[0]["lr"] == LR
    sched.step(2.0)  # worse, patience 0 -> halve
    assert opt.param_groups[0]["lr"] == pytest.approx(LR / 2)
    linear = create_scheduler(make_opt(), SimpleNamespace(lr_scheduler_type="linear"), 10)
    assert isinstance(linear, LambdaLR) and not is_metric_scheduler(linear)
    assert "patience" in accepted_scheduler_kwargs("reduce_lr_on_plateau")


def test_f_loop_5_all_param_groups_scheduled():
    opt = make_opt(groups=2)
    sched = create_scheduler(opt, SimpleNamespace(lr_scheduler_type="linear", warmup_steps=2), 10)
    opt.step()
    sched.step()
    assert sched.get_last_lr() == [pytest.approx(LR / 2)] * 2


def test_f_loop_5_state_dict_roundtrip_resumes_schedule():
    args = SimpleNamespace(
        lr_scheduler_type="cosine", lr_scheduler_kwargs={"num_cycles": 0.5}, warmup_steps=3
    )
    opt_a = make_opt()
    a = create_scheduler(opt_a, args, 20)
    for _ in range(7):
        opt_a.step()
        a.step()
    opt_b = make_opt()
    b = create_scheduler(opt_b, args, 20)
    b.load_state_dict(a.state_dict())
    opt_b.load_state_dict(opt_a.state_dict())
    for _ in range(5):
        opt_a.step(), a.step(), opt_b.step(), b.step()
        assert a.get_last_lr() == b.get_last_lr()
    assert a.get_last_lr()[0] == pytest.approx(LR * 0.5 * (1 + math.cos(math.pi * 9 / 17)))


def test_f_loop_5_unknown_kwargs_named_with_accepted():
    with pytest.raises(TypeError, match=r"\['power'\].*'cosine'.*accepted: num_cycles"):
        run("cosine", {"power": 2})
    with pytest.raises(TypeError, match=r"accepted: none"):
        run("linear", {"num_cycles": 2})
    with pytest.raises(TypeError, match="warmup_steps / warmup_ratio"):
        run("linear", {"num_warmup_steps": 2})
    with pytest.raises(TypeError, match=r"\['bogus'\].*patience"):
        run("reduce_lr_on_plateau", {"bogus": 1})


def test_f_loop_5_unknown_name_did_you_mean():
    with pytest.raises(ValueError, match=r'Unknown lr_scheduler_type \'cosin\'\. Did you mean "cosine"\?'):
        run("cosin")


def test_f_loop_5_enum_name_and_json_kwargs():
    class SchedulerType(enum.Enum):
        POLYNOMIAL = "polynomial"

    lrs = run(SchedulerType.POLYNOMIAL, json.dumps({"power": 2.0, "lr_end": 0.0}))
    check(lrs, {12: LR * 0.25, 20: 0.0})
    with pytest.raises(ValueError, match="not valid JSON"):
        run("cosine", "{num_cycles: 1}")
    with pytest.raises(TypeError, match="JSON object"):
        run("cosine", "[1, 2]")
    check(run("cosine", ""), {12: LR / 2})


def test_f_loop_5_warmup_from_ratio_via_create_scheduler():
    lrs = run("linear", warmup_steps=0, warmup_ratio=0.2)  # ceil(0.2 * 20) = 4 warmup steps
    check(lrs, {2: LR / 2, 4: LR, 12: LR / 2})
    lrs = run("linear", warmup_steps=0.1)  # HF 5: warmup_steps < 1 is a ratio -> 2 steps
    check(lrs, {1: LR / 2, 2: LR, 11: LR / 2})


@pytest.mark.parametrize(
    "steps, ratio, n, expected",
    [
        (5, 0.0, 100, 5),
        (5, 0.5, 100, 5),  # warmup_steps overrides warmup_ratio
        (0, 0.1, 95, 10),  # ceil(9.5)
        (0, 0.0, 100, 0),
        (0.25, 0.0, 10, 3),  # ceil(2.5), HF 5 ratio semantics
        (7.0, 0.0, 10, 7),
    ],
)
def test_f_loop_5_get_warmup_steps(steps, ratio, n, expected):
    result = get_warmup_steps(SimpleNamespace(warmup_steps=steps, warmup_ratio=ratio), n)
    assert result == expected and type(result) is int


def test_f_loop_5_get_warmup_steps_errors_and_defaults():
    assert get_warmup_steps(SimpleNamespace(), 50) == 0
    with pytest.raises(ValueError, match="warmup_steps must be >= 0"):
        get_warmup_steps(SimpleNamespace(warmup_steps=-1), 10)
    with pytest.raises(ValueError, match=r"warmup_ratio must be in \[0, 1\]"):
        get_warmup_steps(SimpleNamespace(warmup_ratio=1.5), 10)
    with pytest.raises(ValueError, match="num_training_steps"):
        get_warmup_steps(SimpleNamespace(), -3)


def test_F_LOOP_5_given_scheduler_config_dict(tmp_path):
    """``Fit(optimizers=(opt, {"scheduler": ..., "interval": ...}))``: a scheduler config dict is read (its
    interval decides when it steps) and a key outside the config's keys is refused, naming the valid ones."""
    from helpers.models import Regression, regression_data

    from taskfit import Fit, FitArguments

    def fit_with(config_of):
        model = Regression()
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        args = FitArguments(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=4,
                            save_strategy="no", report_to=[], disable_tqdm=True)
        return opt, model, Fit(args, optimizers=(opt, config_of(opt)))

    opt, model, fit = fit_with(lambda o: {"scheduler": torch.optim.lr_scheduler.StepLR(o, 1, gamma=0.5),
                                          "interval": "step"})
    fit.fit(model, regression_data(16))
    assert opt.param_groups[0]["lr"] == pytest.approx(LR * 0.5 ** 4)
    with pytest.raises(ValueError, match=r"unknown keys \['bogus'\]; valid keys: \['scheduler', 'interval'"):
        _, model, fit = fit_with(lambda o: {"scheduler": torch.optim.lr_scheduler.StepLR(o, 1), "bogus": 1})
        fit.fit(model, regression_data(16))
