"""The reference MoE layer: routing, the dense-equivalent output, capacity and the balance loss."""

import pytest
import torch

from llmnote import ref


def experts(num=4, d=16, inter=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(num, d, generator=g),
        torch.randn(num, inter, d, generator=g) / 4,
        torch.randn(num, inter, d, generator=g) / 4,
        torch.randn(num, d, inter, generator=g) / 5,
    )


def test_output_is_the_gate_weighted_sum_of_the_chosen_experts():
    router, w_gate, w_up, w_down = experts()
    x = torch.randn(3, 5, 16)
    res = ref.moe_layer(x, router, w_gate, w_up, w_down, top_k=2)
    torch.testing.assert_close(res.weights.sum(-1), torch.ones(15))
    expected = torch.zeros(15, 16)
    for t, row in enumerate(x.reshape(15, 16)):
        for slot in range(2):
            e = int(res.experts[t, slot])
            h = torch.nn.functional.silu(w_gate[e] @ row) * (w_up[e] @ row)
            expected[t] += res.weights[t, slot] * (w_down[e] @ h)
    torch.testing.assert_close(res.out.reshape(15, 16), expected, atol=1e-5, rtol=1e-5)
    assert int(res.tokens_per_expert.sum()) == 30 and res.dropped == 0


def test_top1_with_all_experts_equal_is_the_dense_mlp():
    router, w_gate, w_up, w_down = experts(num=3)
    same = [w[:1].expand_as(w).contiguous() for w in (w_gate, w_up, w_down)]
    x = torch.randn(7, 16)
    dense = ref.silu_mul(x @ same[0][0].T, x @ same[1][0].T) @ same[2][0].T
    torch.testing.assert_close(ref.moe_layer(x, router, *same, top_k=1).out, dense, atol=1e-5, rtol=1e-5)


def test_capacity_drops_the_overflow_of_a_popular_expert():
    router, w_gate, w_up, w_down = experts(num=4)
    router = torch.zeros_like(router)
    router[0] = 10.0  # every token prefers expert 0
    x = torch.rand(40, 16) + 0.1
    res = ref.moe_layer(x, router, w_gate, w_up, w_down, top_k=1, capacity_factor=1.0)
    assert int(res.tokens_per_expert[0]) == 40
    assert res.dropped == 40 - 10  # capacity = ceil(1.0 * 40 * 1 / 4) = 10
    assert (res.out[10:] == 0).all() and (res.out[:10] != 0).any()  # first come, first served
    assert res.aux_loss > 3.5  # near its maximum E = 4 when one expert takes everything


def test_balance_loss_is_one_when_balanced():
    router = torch.eye(4, 16)
    x = torch.zeros(8, 16)
    x[torch.arange(8), torch.arange(8) % 4] = 50.0  # token t goes to expert t % 4
    _, w_gate, w_up, w_down = experts(num=4)
    res = ref.moe_layer(x, router, w_gate, w_up, w_down, top_k=1)
    assert res.tokens_per_expert.tolist() == [2, 2, 2, 2]
    torch.testing.assert_close(res.aux_loss, torch.tensor(1.0), atol=1e-3, rtol=0)


def test_bad_input():
    router, w_gate, w_up, w_down = experts()
    with pytest.raises(ValueError, match="top_k"):
        ref.moe_layer(torch.randn(2, 16), router, w_gate, w_up, w_down, top_k=5)
    with pytest.raises(ValueError, match="last dimension"):
        ref.moe_layer(torch.randn(2, 8), router, w_gate, w_up, w_down)
    with pytest.raises(ValueError, match="expert weights"):
        ref.moe_layer(torch.randn(2, 16), router, w_gate, w_up, w_down[:2])
