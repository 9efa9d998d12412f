"""Compression operators against their definitions: QSGD unbiased within its variance, top-k
with error feedback against a NumPy loop, the identity exact, and every bit count by hand."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pfedwn_jax.engine.compression import Identity, Quantize, TopK, make_compressor

S = 3


def _tree(seed: int = 0) -> dict[str, jax.Array]:
    """Three slots of a 17-parameter model: `a` [S, 3, 4] and `b` [S, 5]."""
    rng = np.random.default_rng(seed)
    return {
        "a": jnp.asarray(rng.normal(size=(S, 3, 4)), jnp.float32),
        "b": jnp.asarray(rng.normal(size=(S, 5)) * 3.0, jnp.float32),
    }


def _rows(tree) -> np.ndarray:
    """Each slot's parameters in one row, leaves in tree order (`a` then `b`): [S, 17]."""
    return np.concatenate([np.asarray(x).reshape(S, -1) for x in jax.tree.leaves(tree)], 1)


def test_identity_is_exact_and_counts_32_bits_per_parameter():
    tree = _tree()
    out = jax.jit(Identity().apply)(tree, (), jax.random.key(0))
    np.testing.assert_array_equal(_rows(out.received), _rows(tree))
    np.testing.assert_array_equal(out.bits, [17 * 32] * S)
    assert Identity(value_bits=16).bits(tree) == 17 * 16


def test_quantize_bits_by_hand():
    # 4 bits a value (1 sign + 3 level bits) over 17 values, one 32-bit norm for each of 2 leaves
    assert Quantize(bits_per_value=4).bits(_tree()) == 4 * 17 + 32 * 2
    assert Quantize(bits_per_value=2, norm_bits=16).bits(_tree()) == 2 * 17 + 16 * 2
    out = Quantize(bits_per_value=4).apply(_tree(), (), jax.random.key(0))
    np.testing.assert_array_equal(out.bits, [4 * 17 + 64] * S)


@pytest.mark.parametrize("bits", [2, 4])
def test_quantize_is_on_its_grid_unbiased_and_within_its_variance_bound(bits):
    tree, levels, draws = _tree(1), 2 ** (bits - 1) - 1, 4000
    op = Quantize(bits_per_value=bits)
    keys = jax.random.split(jax.random.key(7), draws)
    samples = jax.jit(jax.vmap(lambda k: op.apply(tree, (), k).received))(keys)
    for name, v in tree.items():
        v = np.asarray(v, np.float64).reshape(S, -1)
        q = np.asarray(samples[name], np.float64).reshape(draws, S, -1)
        norm = np.linalg.norm(v, axis=1, keepdims=True)
        # every value is sign(v) * norm * l / s for an integer level 0 <= l <= s
        level = np.abs(q) * levels / norm
        np.testing.assert_allclose(level, np.round(level), atol=1e-4)
        assert level.max() <= levels + 1e-4
        assert np.all((np.sign(q) == np.sign(v)) | (q == 0))
        # exact per-coordinate variance: (norm / s)^2 p (1 - p), p the remainder of s|v|/norm
        frac = np.abs(v) * levels / norm - np.floor(np.abs(v) * levels / norm)
        var = (norm / levels) ** 2 * frac * (1 - frac)
        np.testing.assert_array_less(np.abs(q.mean(0) - v), 5 * np.sqrt(var / draws) + 1e-5)
        # E||Q(v) - v||^2 matches the exact variance and stays under QSGD's bound
        mse = ((q - v) ** 2).sum(-1).mean(0)
        np.testing.assert_allclose(mse, var.sum(-1), rtol=0.1)
        d = v.shape[1]
        bound = min(d / levels**2, np.sqrt(d) / levels) * (norm[:, 0] ** 2)
        assert np.all(mse <= bound * 1.05)


def test_quantize_keeps_a_zero_bucket_zero():
    tree = {"w": jnp.zeros((S, 4)).at[1, 2].set(-2.0)}
    out = Quantize(bits_per_value=3).apply(tree, (), jax.random.key(0))
    np.testing.assert_array_equal(out.received["w"][0], 0.0)
    # a one-hot row is on the grid (|v_i| s / ||v|| = s): sent exactly
    np.testing.assert_array_equal(out.received["w"][1], [0.0, 0.0, -2.0, 0.0])


def _topk_reference(inputs: list[np.ndarray], k: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Top-k with error feedback, one slot and one step at a time (Stich et al., 2018, Alg. 1)."""
    memory = np.zeros_like(inputs[0])
    sent_steps = []
    for x in inputs:
        sent = np.zeros_like(x)
        for s in range(x.shape[0]):
            p = x[s] + memory[s]
            top = np.argsort(-np.abs(p), kind="stable")[:k]
            sent[s, top] = p[top]
            memory[s] = p - sent[s]
        sent_steps.append(sent)
    return sent_steps, memory


def test_topk_sends_exactly_k_values_and_carries_the_rest():
    op, steps = TopK(k=4), [_tree(seed) for seed in range(5)]
    apply = jax.jit(op.apply)
    state, received = op.init(steps[0]), []
    for t, tree in enumerate(steps):
        out = apply(tree, state, jax.random.key(t))
        rows = _rows(out.received)
        assert np.all((rows != 0).sum(1) == 4)  # exactly k values per slot
        # nothing lost: what was sent plus the new memory is the input plus the old memory
        np.testing.assert_allclose(
            rows + _rows(out.state), _rows(tree) + _rows(state), rtol=1e-6, atol=1e-6
        )
        state = out.state
        received.append(rows)
    ref_sent, ref_memory = _topk_reference([_rows(t) for t in steps], k=4)
    np.testing.assert_allclose(np.stack(received), np.stack(ref_sent), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(_rows(state), ref_memory, rtol=1e-6, atol=1e-6)


def test_topk_without_error_feedback_sends_the_inputs_k_largest():
    op, tree = TopK(k=4, error_feedback=False), _tree(2)
    out = jax.jit(op.apply)(tree, op.init(tree), jax.random.key(0))
    assert out.state == ()
    ref, _ = _topk_reference([_rows(tree)], k=4)  # one step from zero memory
    np.testing.assert_allclose(_rows(out.received), ref[0], rtol=1e-6)


def test_topk_bits_count_values_and_indices():
    # 17 parameters: a 5-bit index (ceil(log2 17)) and a 32-bit value for each of k = 3
    assert TopK(k=3).bits(_tree()) == 3 * (32 + 5)
    assert TopK(k=17, value_bits=16).bits(_tree()) == 17 * (16 + 5)
    out = TopK(k=3).apply(_tree(), TopK(k=3).init(_tree()), jax.random.key(0))
    np.testing.assert_array_equal(out.bits, [3 * 37] * S)
    with pytest.raises(ValueError, match="k"):
        TopK(k=18).bits(_tree())


def test_operators_vmap_over_runs():
    trees = jax.tree.map(lambda *x: jnp.stack(x), _tree(0), _tree(1))  # two runs
    for op in (Identity(), Quantize(bits_per_value=3), TopK(k=2)):
        state = jax.vmap(op.init)(trees)
        keys = jax.random.split(jax.random.key(0), 2)
        out = jax.jit(jax.vmap(op.apply))(trees, state, keys)
        one = op.apply(_tree(1), op.init(_tree(1)), keys[1])
        np.testing.assert_allclose(
            _rows(jax.tree.map(lambda x: x[1], out.received)), _rows(one.received), rtol=1e-6
        )
        assert out.bits.shape == (2, S)


def test_make_compressor_names_the_allowed_operators():
    assert make_compressor("topk", k=2) == TopK(k=2)
    assert make_compressor("none") == Identity()
    with pytest.raises(ValueError, match=r"compression must be one of \['none', 'qsgd', 'topk'\]"):
        make_compressor("zip")
    with pytest.raises(ValueError, match="bits_per_value"):
        Quantize(bits_per_value=1).bits(_tree())
