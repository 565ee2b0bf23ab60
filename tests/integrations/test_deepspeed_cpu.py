"""DeepSpeed on the CPU all-reduces through gloo: its shared-memory kernel (a 200 s compile whose lock, left by
a stopped launch, hangs every later run) is marked unavailable, only when DS_ACCELERATOR=cpu."""

import pytest

from mrtpo.integrations.deepspeed_cpu import SHM_OP, use_gloo_allreduce_on_cpu

deepspeed = pytest.importorskip("deepspeed")


@pytest.fixture
def compatible():
    import deepspeed.ops

    ops = deepspeed.ops.__compatible_ops__
    before = dict(ops)
    yield ops
    ops.clear()
    ops.update(before)


def test_cpu_accelerator_marks_the_kernel_unavailable(compatible):
    compatible[SHM_OP] = True
    assert use_gloo_allreduce_on_cpu({"DS_ACCELERATOR": "cpu"}) is True
    assert compatible[SHM_OP] is False
    from deepspeed.comm.torch import build_shm_op

    assert build_shm_op() is None  # what DeepSpeed's TorchBackend calls: nothing to compile, gloo is used


@pytest.mark.parametrize(
    "env", [{}, {"DS_ACCELERATOR": "cuda"}, {"DS_ACCELERATOR": "cpu", "MRTPO_DEEPSPEED_SHM": "1"}]
)
def test_other_accelerators_and_the_opt_in_touch_nothing(compatible, env):
    compatible[SHM_OP] = True
    assert use_gloo_allreduce_on_cpu(env) is False
    assert compatible[SHM_OP] is True
