"""The road experiments' measuring instruments (tx/paper/road/): each against what it must find on
cases whose answer is known. The experiments themselves run with `python -m tx road NAME`."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tx.paper.road import digits, gradients, table1
from tx.tokens import EOS_ID, PAD_ID


def test_digit_lists_are_reversed_and_end_in_eos():
    src, tgt = digits.digit_lists(np.random.default_rng(0), 50, 3, 12)
    assert src.shape == tgt.shape == (50, 13)
    for s, t in zip(src, tgt, strict=True):
        n = int((s != PAD_ID).sum()) - 1
        assert 3 <= n <= 12 and s[n] == EOS_ID and t[n] == EOS_ID
        assert (s[:n] >= digits.FIRST_DIGIT).all() and (s[:n] < digits.VOCAB).all()
        np.testing.assert_array_equal(t[:n], s[:n][::-1])


@pytest.mark.parametrize("n", [8, 20, 40])
def test_path_lengths_follow_the_connectivity_of_each_layer(n):
    """Self-attention connects every pair in one layer; a causal convolution reaches k - 1
    more positions per layer, or 3^l more with dilation 3^l (all of [0, 3^L - 1] after L
    layers); restricted attention reaches r / 2 more per layer; an LSTM one per step."""
    k, r = table1.K, table1.R
    assert table1.path_length("self-attention", n) == 1
    assert table1.path_length("recurrent", n) == n
    assert table1.path_length("convolutional", n) == math.ceil((n - 1) / (k - 1))
    dilated = next(depth for depth in range(1, 10) if k**depth - 1 >= n - 1)
    assert table1.path_length("convolutional", n, dilated=True) == dilated
    assert table1.path_length("restricted self-attention", n) == math.ceil((n - 1) / (r // 2))


def test_sequential_steps_are_the_loop_lengths_of_the_program():
    for layer, expected in (("recurrent", 24), ("self-attention", 1), ("convolutional", 1)):
        init, apply = table1.BUILD[layer](16)
        params = init(jax.random.PRNGKey(0), 24)
        jaxpr = jax.make_jaxpr(apply)(params, jnp.zeros((1, 24, 16))).jaxpr
        assert table1.sequential_steps(jaxpr) == expected


@pytest.mark.parametrize("layer", ["self-attention", "convolutional", "restricted self-attention"])
def test_analytic_flops_are_what_xla_counts(layer):
    """Beside the products the equations count, XLA counts the element-wise work of attention
    (scale, mask, max, subtraction, exp, sum, division: <= 8 per weight; observed 5 and 6.4)
    and leaves out a causal convolution's products with its padding (k (k - 1) / 2 taps of
    2 d^2 FLOPs at the first positions; observed exactly that)."""
    n, d, k = 64, table1.D, table1.K
    cost = table1.measure_cost(layer, n, repeats=1, batch=1)
    keys = {"self-attention": n, "convolutional": 0, "restricted self-attention": 3 * table1.R}
    elementwise = 8 * table1.HEADS * n * keys[layer]
    padding = k * (k - 1) * d * d if layer == "convolutional" else 0
    assert -padding <= cost["xla_flops"] - cost["flops"] <= elementwise


def test_xla_counts_one_step_of_the_recurrent_layer():
    """XLA's cost analysis counts a loop body once: for the LSTM layer the input projection
    (8 n d^2) and one step's h U (8 d^2), plus element-wise work (<= 8 per gate value; observed
    85 d at n = 16). Hence the report's FLOPs come from the equations."""
    d, g = table1.D, 4
    for n in (16, 64):
        xla = table1.measure_cost("recurrent", n, repeats=1, batch=1)["xla_flops"]
        assert 0 <= xla - (8 * n * d * d + 8 * d * d) <= 8 * g * d * (n + 1)


def test_the_hand_product_of_step_jacobians_is_autograds_gradient():
    with jax.enable_x64(True):
        key = jax.random.PRNGKey(0)
        w = gradients.torch_start(key, "tanh", 0.0)
        xs = jax.random.normal(jax.random.PRNGKey(1), (gradients.STEPS, gradients.UNITS))
        hand = gradients.by_hand(w, xs)
        auto = np.asarray(gradients.gradient_norms("tanh", w, xs))
        # float64 evaluations of the same products in other orders: observed relative
        # difference <= 1.3e-15 over T = 1..50 (values from 4 down to 1e-16); the transposed
        # Jacobian (U instead of U^T) is off by 8.6% at T = 1. rtol 1e-9 is an allowance far
        # below that, not a derived bound.
        np.testing.assert_allclose(hand, auto, rtol=1e-9)


def test_forget_bias_opens_the_gate():
    with jax.enable_x64(True):
        xs = jax.random.normal(jax.random.PRNGKey(1), (10, gradients.UNITS))
        for shift, low, high in ((0.0, 0.4, 0.6), (3.0, 0.9, 0.99)):
            w = gradients.torch_start(jax.random.PRNGKey(0), "lstm", shift)
            _, forget = gradients.run_states("lstm", w, xs, jnp.zeros(gradients.UNITS))
            # sigmoid(3 + small) = 0.95; sigmoid(small) = 0.5 (the seed: 0.949 and 0.541)
            assert low < float(forget.mean()) < high


def test_road_command_names_the_experiments(capsys):
    from tx.__main__ import main

    assert main(["road", "nothing"]) == 2
    assert "digits, gradients, table1, length" in capsys.readouterr().err
