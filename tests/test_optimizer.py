"""AdamW's kernel choice (``optim.fused``): the fused kernel where supported, the same update."""
import pytest
import torch

from ibpo_lit.config import OptimConfig
from ibpo_lit.training.optimizer import use_fused_adamw


def _params(dtype=torch.float32):
    return [torch.nn.Parameter(torch.randn(4, 3, dtype=dtype)), torch.nn.Parameter(torch.randn(3, dtype=dtype))]


def test_auto_picks_fused_for_plain_cpu_tensors_and_respects_an_explicit_choice():
    assert OptimConfig().fused is None
    assert use_fused_adamw(_params(), None) is True
    assert use_fused_adamw(_params(), False) is False
    assert use_fused_adamw(_params(), True) is True


def test_auto_keeps_the_default_kernel_for_dtensor_shards():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    # A vLLM engine of this session may own the default group already: leave that one alone.
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29517", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        shard = torch.nn.Parameter(distribute_tensor(torch.randn(4, 3), mesh, [Replicate()]))
        assert use_fused_adamw([shard], None) is False
        assert use_fused_adamw([shard], True) is True  # asked for: torch decides
    finally:
        if created:
            dist.destroy_process_group()


def test_asking_for_fused_on_an_unsupported_dtype_is_a_clear_error():
    ints = [torch.zeros(3, dtype=torch.int64)]
    assert use_fused_adamw(ints, None) is False
    with pytest.raises(ValueError, match="optim.fused=true.*torch.int64 parameter on cpu"):
        use_fused_adamw(ints, True)


def test_fused_and_for_loop_kernels_take_the_same_steps():
    torch.manual_seed(0)
    a = _params()
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    opt_a = torch.optim.AdamW(a, lr=1e-2, weight_decay=0.1, fused=use_fused_adamw(a, None))
    opt_b = torch.optim.AdamW(b, lr=1e-2, weight_decay=0.1, foreach=False)
    for _ in range(5):
        grads = [torch.randn_like(p) for p in a]
        for p, q, g in zip(a, b, grads):
            p.grad, q.grad = g.clone(), g.clone()
        opt_a.step()
        opt_b.step()
    for p, q in zip(a, b):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5)
    assert not torch.equal(a[0], _params()[0])  # the steps moved the parameters
