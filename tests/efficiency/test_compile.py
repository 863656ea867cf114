"""F-MEM-2: torch_compile / torch_compile_backend / torch_compile_mode."""

from __future__ import annotations

import pytest
import torch

from _tasks import TokenModel, args, token_data
from taskfit import Fit

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


class LoggingInForward(TokenModel):
    """Logs from inside the compiled forward (a graph break) as well as from training_step."""

    def forward(self, ids):
        out = super().forward(ids)
        if self.training:
            self.log("inside_forward", out.detach().abs().mean())
        return out


def _run(tmp_path, module_cls=TokenModel, **kw):
    module = module_cls()
    fit = Fit(args(tmp_path, max_steps=4, **kw))
    fit.fit(module, token_data())
    return fit, module


def test_f_mem_2_compile_same_loss_as_eager_keys_and_logging(tmp_path):
    """F-MEM-2: the compiled run (aot_eager backend: real dynamo + AOT autograd, no C++ build) gives the eager
    losses within 1e-5, logging from inside the compiled forward works, state-dict keys have no ``_orig_mod``,
    and the module is compiled once (a second fit does not compile again)."""
    _, eager = _run(tmp_path, LoggingInForward)
    fit, compiled = _run(tmp_path, LoggingInForward, torch_compile=True, torch_compile_backend="aot_eager")
    assert compiled.losses == pytest.approx(eager.losses, rel=1e-5)
    assert getattr(compiled, "_taskfit_compiled") == {"backend": "aot_eager"}
    assert compiled._compiled_call_impl is not None
    assert all("_orig_mod" not in k for k in fit.strategy.model_state_dict(compiled))
    logged = [h for h in fit.state.log_history if "inside_forward" in h]
    assert len(logged) == 4 and all(h["inside_forward"] > 0 for h in logged)
    first = compiled._compiled_call_impl
    fit.fit(compiled, token_data())
    assert compiled._compiled_call_impl is first


def test_f_mem_2_compile_targets_children_when_no_forward(tmp_path):
    """F-MEM-2: a TaskModule without its own forward gets its parameter-holding children compiled."""
    from torch import nn

    from taskfit import TaskModule
    from taskfit.efficiency.compile import compile_targets

    # kept local: the test is about a module with no forward and two children
    class NoForward(TaskModule):
        def __init__(self):
            super().__init__()
            self.net, self.act = nn.Linear(2, 2), nn.ReLU()

    m = NoForward()
    assert compile_targets(m) == [m.net]


def test_f_mem_2_bad_backend_or_mode_fails_before_work(tmp_path):
    """F-MEM-2: an unknown backend or mode is refused at Fit(...) with the valid choices."""
    with pytest.raises(ValueError, match=r"Unknown torch_compile_backend 'inductr'\. Did you mean \"inductor\""):
        Fit(args(tmp_path, torch_compile_backend="inductr"))
    with pytest.raises(ValueError, match=r"Unknown torch_compile_mode 'fast'.*max-autotune"):
        Fit(args(tmp_path, torch_compile=True, torch_compile_mode="fast"))


@pytest.mark.slow
def test_f_mem_2_inductor_same_loss_as_eager_cpu(tmp_path):
    """F-MEM-2: the default inductor backend (C++ code generation on CPU) matches eager within 1e-4."""
    _, eager = _run(tmp_path)
    _, compiled = _run(tmp_path, torch_compile=True)
    assert compiled.losses == pytest.approx(eager.losses, rel=1e-4)


@pytest.mark.cuda
@CUDA
def test_f_mem_2_cuda_inductor_same_loss_as_eager(tmp_path):
    """F-MEM-2 on CUDA: inductor (Triton kernels) matches eager within 1e-4 through a CUDA strategy."""
    from taskfit.accelerators import CPUAccelerator
    from taskfit.precision import Precision
    from taskfit.strategies.single_device import SingleDeviceStrategy

    losses = []
    for compile_ in (False, True):
        module = TokenModel()
        strategy = SingleDeviceStrategy(accelerator=CPUAccelerator(), device=torch.device("cuda", 0),
                                        precision=Precision())
        Fit(args(tmp_path, max_steps=4, torch_compile=compile_), strategy=strategy).fit(module, token_data())
        assert module.head.weight.is_cuda
        losses.append(module.losses)
    assert losses[1] == pytest.approx(losses[0], rel=1e-4)
