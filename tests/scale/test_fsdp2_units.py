"""The FSDP2 shard plan's units (``ibpo_lit.scale.fsdp2.shard_model``) on 2 CPU processes (gloo).

The checks run once: the module fixture starts this file as a script under
``python -m torch.distributed.run --nproc_per_node 2`` (as tests/scale/fsdp2_checks.py is run by
test_fsdp2.py); each rank writes ``OUT_DIR/rank<r>.json`` (check name -> result) and the tests
compare. The models are the tiny Qwen3 of ``ibpo_lit.models.tiny`` (which ties its embeddings)
and the same model built with ``tie_word_embeddings=False``.

- units: an untied model's input embedding and LM head are FSDP2 units of their own and the
  root holds neither (only the final norm); a tied model keeps its one parameter in the root.
- no-grad forwards (the old-logprob pass, the weight-sync probe, CIW scoring): after one, no
  unit is left gathered, the root included (FSDP2 keeps the root gathered after every forward,
  waiting for a backward that a no-grad forward never has).
- numerics: loss and gradients of one forward + backward equal the unsharded model's (fp32),
  through the plain head and through the chunked log-prob head of ``training/logprobs.py``
  (whose replaced ``forward`` must still pass through the head unit's FSDP2 hooks).
- ``gathered_weights``: inside its block nothing reshards, not even after a no-grad forward.
"""
import json
import sys

import pytest

from fit_runs import HERE, two_process_results

ATOL = 1e-6  # fp32, the same kernels on both sides: only the gradient mean's rounding differs
SEED = 3


# ------------------------------------------------------------------------- the 2 processes
def _tiny(tied: bool):
    import torch
    from transformers import Qwen3ForCausalLM

    from ibpo_lit.models.tiny import tiny_config
    from ibpo_lit.scale.fsdp2 import fp32_rotary_buffers

    config = tiny_config("qwen3")
    config.tie_word_embeddings = tied
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = Qwen3ForCausalLM(config).to(torch.float32)
    fp32_rotary_buffers(model)
    return model


def _sharded(tied: bool, reshard_after_forward: bool = True):
    from ibpo_lit.scale.fsdp2 import FSDP2Plan, build_sharded

    plan = FSDP2Plan(mesh=_MESH, reshard_after_forward=reshard_after_forward)
    return build_sharded(lambda: _tiny(tied), lambda: _tiny(tied).state_dict(), plan)


def _units(model) -> dict[str, list[str]]:
    """FSDP unit (module name, ``<root>``) -> the parameter names its shards hold."""
    from ibpo_lit.scale.fsdp2 import fsdp_modules

    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    module_names = {id(m): n or "<root>" for n, m in model.named_modules()}
    out = {}
    for unit in fsdp_modules(model):
        params = [fp.sharded_param for g in unit._get_fsdp_state()._fsdp_param_groups for fp in g.fsdp_params]
        out[module_names[id(unit)]] = sorted(n for p in params for n in names.get(id(p), ["<unregistered>"]))
    return out


def _states(model) -> dict[str, str]:
    """FSDP unit -> ``sharded`` / ``unsharded`` / ``post-forward`` (FSDP2's ``_sharded_state``),
    and ``params`` -> whether every parameter the modules expose is a DTensor shard."""
    from torch.distributed.tensor import DTensor

    from ibpo_lit.scale.fsdp2 import fsdp_modules

    module_names = {id(m): n or "<root>" for n, m in model.named_modules()}
    out = {}
    for unit in fsdp_modules(model):
        for group in unit._get_fsdp_state()._fsdp_param_groups:
            state = "sharded" if group.is_sharded else "unsharded" if group.is_unsharded else "post-forward"
            out[module_names[id(unit)]] = state
    out["params"] = "dtensor" if all(isinstance(p, DTensor) for p in model.parameters()) else "plain"
    return out


def _all_sharded(states: dict[str, str]) -> bool:
    return all(v in ("sharded", "dtensor") for v in states.values())


def _all_unsharded(states: dict[str, str]) -> bool:
    return all(v in ("unsharded", "plain") for v in states.values())


def _inputs(rank: int):
    import torch

    generator = torch.Generator().manual_seed(100 + rank)
    return torch.randint(4, 100, (2, 9), generator=generator)


def _loss(model, ids, chunked: bool):
    """Mean next-token NLL of ``ids`` [B, T]: from the logits, or through the chunked log-prob
    head (``logprob_head``: the head's forward swapped, chunks of 5 positions recomputed in
    backward), as the trainer computes its log-probs."""
    import torch.nn.functional as F

    from ibpo_lit.training.logprobs import logprob_head

    if chunked:
        with logprob_head(model, ids[:, 1:], 1.0, chunk_tokens=5):
            return -model(input_ids=ids[:, :-1], use_cache=False).logits.mean()
    logits = model(input_ids=ids[:, :-1], use_cache=False).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _max_diff(a: dict, b: dict) -> float:
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    return max(float((a[n] - b[n]).abs().max()) for n in a)


def _reference_step(tied: bool, chunked: bool, world: int):
    """The unsharded model's losses on every rank's input and its gradients averaged over them
    (what FSDP2's reduce-scatter gives)."""
    model = _tiny(tied)
    losses = []
    for r in range(world):
        loss = _loss(model, _inputs(r), chunked) / world
        loss.backward()
        losses.append(float(loss.detach()) * world)
    return model, losses, {n: p.grad.clone() for n, p in model.named_parameters()}


def _sharded_step(model, rank: int, chunked: bool):
    model.zero_grad(set_to_none=True)
    loss = _loss(model, _inputs(rank), chunked)
    loss.backward()
    return float(loss), {n: _full(p.grad) for n, p in model.named_parameters()}


def _check_numerics(out: dict, rank: int, world: int) -> None:
    import torch

    for tied in (False, True):
        tag = "tied" if tied else "untied"
        for chunked in (False, True):
            model = _sharded(tied)
            reference, ref_losses, ref_grads = _reference_step(tied, chunked, world)
            # what the head's forward (the swapped one, when chunked) sees: registered after
            # FSDP2's pre-hook (prepended), so it runs after the head unit gathered its weight
            seen = []
            hook = model.lm_head.register_forward_pre_hook(lambda m, a: seen.append(type(m.weight).__name__))
            loss, grads = _sharded_step(model, rank, chunked)
            hook.remove()
            key = f"{tag}_{'chunked' if chunked else 'logits'}"
            out[f"{key}_head_weight_in_forward"] = seen
            out[f"{key}_units"] = _units(model)
            out[f"{key}_loss_diff"] = abs(loss - ref_losses[rank])
            out[f"{key}_grad_max_diff"] = _max_diff(grads, ref_grads)
            out[f"{key}_after_backward"] = _states(model)
        # it trains: one SGD step lands on the reference's weights, and a tie stays a tie
        torch.optim.SGD(model.parameters(), lr=0.5).step()
        torch.optim.SGD(reference.parameters(), lr=0.5).step()
        out[f"{tag}_step_max_diff"] = _max_diff({n: _full(p.detach()) for n, p in model.state_dict().items()},
                                                reference.state_dict())
        with torch.no_grad():
            _loss(model, _inputs(rank), chunked=True)
        out[f"{tag}_tie_kept"] = model.lm_head.weight is model.model.embed_tokens.weight


def _check_no_grad_forwards(out: dict, rank: int) -> None:
    import torch

    for tied in (False, True):
        for reshard in (True, False):
            model = _sharded(tied, reshard_after_forward=reshard)
            tag = f"{'tied' if tied else 'untied'}_reshard{int(reshard)}"
            with torch.no_grad():
                _loss(model, _inputs(rank), chunked=False)
            out[f"{tag}_after_no_grad"] = _states(model)
            with torch.no_grad():
                _loss(model, _inputs(rank), chunked=True)  # the old-logprob pass's path
            out[f"{tag}_after_no_grad_chunked"] = _states(model)
            loss = _loss(model, _inputs(rank), chunked=False)
            out[f"{tag}_after_grad_forward"] = _states(model)
            loss.backward()
            out[f"{tag}_after_backward"] = _states(model)

    # a no-grad forward between a forward and its backward changes no gradient
    model = _sharded(tied=False)
    _, expected = _sharded_step(model, rank, chunked=True)
    model.zero_grad(set_to_none=True)
    loss = _loss(model, _inputs(rank), chunked=True)
    with torch.no_grad():
        _loss(model, _inputs(1 - rank), chunked=True)
    out["interleaved_between"] = _states(model)
    loss.backward()
    out["interleaved_grad_max_diff"] = _max_diff({n: _full(p.grad) for n, p in model.named_parameters()}, expected)


def _check_gathered_weights(out: dict, rank: int) -> None:
    import torch

    from ibpo_lit.rollout.weights import SyncManifest, iter_full_weights
    from ibpo_lit.scale.fsdp2 import gathered_weights

    for tied in (False, True):
        tag = "tied" if tied else "untied"
        model = _sharded(tied)
        out[f"gathered_{tag}_units"] = sorted(_units(model))
        inside = []
        with torch.no_grad(), gathered_weights(model):
            inside.append(_states(model))
            for chunked in (False, True, False):
                _loss(model, _inputs(rank), chunked)
                inside.append(_states(model))
        out[f"gathered_{tag}_inside"] = inside
        out[f"gathered_{tag}_after"] = _states(model)
        # the weight sync's iteration: every tensor whole under its checkpoint name
        manifest = SyncManifest()
        sent = {n: t.clone() for n, t in iter_full_weights(model, manifest)}
        ref = dict(iter_full_weights(_tiny(tied)))
        out[f"weights_{tag}_names_equal"] = sorted(sent) == sorted(ref)
        out[f"weights_{tag}_max_diff"] = max(float((sent[n] - ref[n]).abs().max()) for n in ref)
        out[f"weights_{tag}_missing"] = manifest.missing()


def main(out_dir: str) -> None:
    from pathlib import Path

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    global _MESH
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    _MESH = init_device_mesh("cpu", (world,))
    out: dict = {}
    _check_numerics(out, rank, world)
    _check_no_grad_forwards(out, rank)
    _check_gathered_weights(out, rank)
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(out))
    dist.barrier()
    from rank_exit import end_processes  # tests/scale, on the workers' path

    end_processes()


# ------------------------------------------------------------------------------ the tests
@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return two_process_results(HERE / "test_fsdp2_units.py", tmp_path_factory.mktemp("fsdp2_units"))


LAYERS = {
    f"model.layers.{i}": sorted(f"model.layers.{i}.{p}" for p in (
        "input_layernorm.weight", "mlp.down_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
        "post_attention_layernorm.weight", "self_attn.k_norm.weight", "self_attn.k_proj.weight",
        "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.q_proj.weight", "self_attn.v_proj.weight"))
    for i in (0, 1)
}


@pytest.mark.slow
def test_untied_embedding_and_head_are_units_of_their_own_and_a_tie_stays_in_the_root(ranks):
    for rank in ranks:
        for path in ("logits", "chunked"):
            assert rank[f"untied_{path}_units"] == {
                "<root>": ["model.norm.weight"],  # neither the embedding nor the head
                "model.embed_tokens": ["model.embed_tokens.weight"],
                "lm_head": ["lm_head.weight"],
                **LAYERS,
            }
            # tied: one parameter, one unit (the root), known under both names
            assert rank[f"tied_{path}_units"] == {
                "<root>": ["lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"], **LAYERS}
        assert rank["tied_tie_kept"]  # after a backward, an optimizer step and a no-grad forward
        assert rank["tied_step_max_diff"] <= ATOL and rank["untied_step_max_diff"] <= ATOL


@pytest.mark.slow
def test_no_unit_stays_gathered_after_a_no_grad_forward(ranks):
    for rank in ranks:
        for tag in ("untied_reshard1", "untied_reshard0", "tied_reshard1", "tied_reshard0"):
            for after in ("after_no_grad", "after_no_grad_chunked", "after_backward"):
                states = rank[f"{tag}_{after}"]
                assert _all_sharded(states), (tag, after, states)
        # a forward with autograd still keeps the root gathered for its backward (FSDP2's own rule)
        assert rank["untied_reshard1_after_grad_forward"]["<root>"] == "unsharded"
        assert rank["untied_reshard1_after_grad_forward"]["lm_head"] == "sharded"
        assert _all_unsharded({k: v for k, v in rank["untied_reshard0_after_grad_forward"].items() if k != "params"})
        # a no-grad forward between a forward and its backward: resharded, then gathered again
        # by the backward, and the gradients are the same
        assert _all_sharded(rank["interleaved_between"])
        assert rank["interleaved_grad_max_diff"] <= ATOL


@pytest.mark.slow
def test_sharded_loss_and_gradients_equal_the_unsharded_model(ranks):
    for rank in ranks:
        for tag in ("untied", "tied"):
            assert "lm_head" in rank["untied_logits_units"]  # the plan under test
            for path in ("logits", "chunked"):  # the chunked head goes through the head unit's hooks
                assert rank[f"{tag}_{path}_head_weight_in_forward"] == ["Parameter"]  # gathered, not a DTensor
                assert rank[f"{tag}_{path}_loss_diff"] <= ATOL
                assert rank[f"{tag}_{path}_grad_max_diff"] <= ATOL
                assert _all_sharded(rank[f"{tag}_{path}_after_backward"])


@pytest.mark.slow
def test_gathered_weights_keeps_every_unit_gathered_inside_its_block(ranks):
    for rank in ranks:
        assert rank["gathered_untied_units"] == ["<root>", "lm_head", "model.embed_tokens", "model.layers.0",
                                                 "model.layers.1"]
        for tag in ("untied", "tied"):
            inside = rank[f"gathered_{tag}_inside"]
            assert len(inside) == 4 and all(_all_unsharded(s) for s in inside), inside
            assert _all_sharded(rank[f"gathered_{tag}_after"])
            # the weight sync's iteration (full_tensor per parameter) over the new units
            assert rank[f"weights_{tag}_names_equal"] and rank[f"weights_{tag}_max_diff"] == 0.0
            assert rank[f"weights_{tag}_missing"] == []


_MESH = None

if __name__ == "__main__":
    main(sys.argv[1])
