"""Load balancing: the centred sign rule on the expert bias, its all-reduce, the aux and z losses."""
import pytest
import torch
import torch.distributed as dist

from steps.moe import balance
from steps.moe.balance import aux_balance_loss, update_expert_bias, z_loss
from steps.moe.model import PRESETS, MoE
from steps.moe.router import route_reference


class _Layer:
    def __init__(self, load):
        self.expert_load_E = torch.tensor(load, dtype=torch.float32)
        self.expert_bias_E = torch.zeros(len(load))


def test_sign_rule_is_centred():
    layer = _Layer([10.0, 0.0, 5.0, 5.0, 0.0])  # mean 4: one over, two under, two over
    violation = update_expert_bias([layer], rate=0.1)
    step = torch.tensor([-0.1, 0.1, -0.1, -0.1, 0.1])
    torch.testing.assert_close(layer.expert_bias_E, step - step.mean())
    assert abs(layer.expert_bias_E.sum()) < 1e-6
    torch.testing.assert_close(violation, torch.tensor([10 / 4 - 1]))
    assert layer.expert_load_E.sum() == 0  # cleared for the next step


def test_no_tokens_no_move():
    layer = _Layer([0.0] * 4)
    assert update_expert_bias([layer], rate=0.1).item() == 0
    assert layer.expert_bias_E.abs().sum() == 0


@pytest.mark.parametrize("score_func", ["sigmoid", "softmax"])
def test_bias_update_moves_toward_balance(score_func):
    """Logits skewed toward two experts; repeated updates even the load out."""
    gen = torch.Generator().manual_seed(0)
    skew_E = torch.zeros(16)
    skew_E[:2] = 2.0  # experts 0 and 1 win for almost every token
    logits_TE = torch.randn(512, 16, generator=gen) * 0.5 + skew_E
    layer = _Layer([0.0] * 16)
    rate = 0.02 if score_func == "sigmoid" else 0.005

    def violation():
        out = route_reference(logits_TE, layer.expert_bias_E, 2, score_func, True, 1.0)
        layer.expert_load_E += out.counts_E
        return update_expert_bias([layer], rate=rate).item()

    history = [violation() for _ in range(80)]
    assert history[0] > 5.0, history[0]
    assert max(history[-10:]) < 1.0, history
    assert abs(layer.expert_bias_E.mean()) < 1e-5


def test_model_accumulates_load_only_in_training():
    cfg = PRESETS["tiny"]
    moe = MoE(cfg)
    torch.nn.init.normal_(moe.router.weight, std=0.02)
    for p in (moe.w1_EFD, moe.w2_EDF, moe.w3_EFD):
        torch.nn.init.normal_(p, std=0.02)
    x = torch.randn(2, 5, cfg.dim)
    moe.eval()
    moe(x)
    assert moe.expert_load_E.sum() == 0
    moe.train()
    moe(x)
    moe(x)
    assert moe.expert_load_E.sum() == 2 * 10 * cfg.top_k


def test_loads_are_all_reduced_when_distributed(tmp_path, monkeypatch):
    """A one-rank gloo group; the all-reduce is wrapped to add a second rank's load, and the
    update must follow the summed load."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        other_rank = torch.tensor([[0.0, 0.0, 30.0, 0.0]])
        real_all_reduce = dist.all_reduce
        calls = []

        def all_reduce(tensor, **kwargs):
            calls.append(tensor.shape)
            real_all_reduce(tensor, **kwargs)
            tensor += other_rank

        monkeypatch.setattr(balance.dist, "all_reduce", all_reduce)
        layer = _Layer([10.0, 0.0, 0.0, 0.0])  # alone, expert 0 is the overloaded one
        update_expert_bias([layer], rate=1.0)
        assert calls == [torch.Size([1, 4])]
        assert layer.expert_bias_E[2] < layer.expert_bias_E[0] < 0 < layer.expert_bias_E[1]
    finally:
        dist.destroy_process_group()


def test_aux_loss_is_one_when_uniform_and_grows_with_imbalance():
    T, E, K = 64, 8, 2
    counts = torch.full((E,), T * K // E, dtype=torch.int32)
    sums = torch.full((E,), T / E)  # softmax scores average 1/E per expert
    assert aux_balance_loss(counts, sums, K).item() == pytest.approx(1.0)
    skewed_counts = torch.tensor([T, T] + [0] * (E - 2), dtype=torch.int32)
    skewed_sums = torch.tensor([T / 2, T / 2] + [0.0] * (E - 2))
    assert aux_balance_loss(skewed_counts, skewed_sums, K).item() == pytest.approx(E / 2)


def test_z_loss():
    lse = torch.tensor([1.0, -3.0])
    assert z_loss(lse).item() == pytest.approx(5.0)
