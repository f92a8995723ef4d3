"""Recurrent encoder-decoders, the road to the Transformer, in the same harness as it.

`model.family = "rnn"` (configs/rnn_seq2seq.py, configs/rnn_attention.py) builds `RNNSeq2Seq`:
  - attention "none": Sutskever et al. (2014). The decoder starts from the encoder's final state
    and sees nothing else of the source (the fixed-length summary); `reverse_source` reads the
    source backwards, as they did.
  - attention "additive" (Bahdanau et al. 2015), "dot" or "general" (Luong et al. 2015's
    scores). The decoder of Bahdanau et al.: the previous state s_{t-1} scores every annotation,
    the context c_t joins the previous token at the input of step t, and the output is
    tanh(W_s s_t + W_c c_t + b) before the softmax. Only the score changes between the three,
    as Luong et al. compared them; no 1/sqrt(d) scale (the Transformer added it).

The model has the Transformer's interface: `__call__(inputs, targets)` -> teacher-forced
logits, and the search decodes it through `incremental_decoder`, whose cache is the recurrent
state (rows first, so tx.model.family_base.reorder_cache moves it with the beam). The frozen
architecture, `RNNConfig`, and its counts are tx.model.rnn_config's.

The cells (and their gate order) are tx.model.cells'. Shape letters: b rows, s source length,
t target length, m d_model (the embedding and hidden width), g gates, n hidden units (= m),
k the score's inner width (= m), L layers, V vocabulary. Every parameter carries logical axis
names (tx.model.layers' vocabulary), so the mesh rules shard it as they shard the Transformer.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from flax import linen as nn

from tx.model.cells import Cell, CellWeights, cell_step, project, run_layer
from tx.model.family_base import EncoderDecoder, reorder_cache, shift_right
from tx.model.layers import constrain
from tx.model.rnn_config import RNNConfig
from tx.tokens import PAD_ID

Array = jax.Array


def _cell(c: RNNConfig, name: str, d_context: int = 0) -> Cell:
    return Cell(
        c.cell,
        c.d_model,
        c.d_model,
        d_context,
        c.forget_bias,
        c.compute_dtype,
        c.weight_dtype,
        name=name,
    )


def _dense(module: nn.Module, name: str, shape, names, init=None):
    init = init or nn.initializers.variance_scaling(1.0, "fan_avg", "uniform")
    p = module.param(name, nn.with_logical_partitioning(init, names), shape, module.param_dtype)
    return jnp.asarray(p, module.dtype)


# ---------------------------------------------------------------------------------------------
# Attention over the annotations (the encoder's top-layer outputs).


class Memory(NamedTuple):
    """What the decoder reads of the source at every step (the same for a sentence's rows)."""

    annotations: Array  # [b, s, m] the encoder's top-layer output at each source position
    keys: Array  # [b, s, k]: U h_j (additive), W_a h_j (general), h_j (dot)
    mask: Array  # [b, s] bool, real source tokens


class AttentionWeights(NamedTuple):
    key: Array | None  # [m, m] additive: U; general: W_a
    query: Array | None  # [m, m] additive: W
    score: Array | None  # [m] additive: v


class Attention(nn.Module):
    """Score parameters: additive e_j = v . tanh(W s + U h_j); general e_j = s . W_a h_j;
    dot e_j = s . h_j (no parameters)."""

    kind: str
    d_model: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self) -> AttentionWeights:
        m = self.d_model
        if self.kind == "dot":
            return AttentionWeights(None, None, None)
        key = _dense(self, "key", (m, m), ("embed", "mlp"))
        if self.kind == "general":
            return AttentionWeights(key, None, None)
        query = _dense(self, "query", (m, m), ("embed", "mlp"))
        score = _dense(self, "score", (m,), ("mlp",), nn.initializers.normal(m**-0.5))
        return AttentionWeights(key, query, score)


def attention_memory(w: AttentionWeights, annotations: Array, mask: Array) -> Memory:
    """annotations [b, s, m], mask [b, s] -> Memory, the keys projected once per sentence."""
    if w.key is None:  # dot
        return Memory(annotations, annotations, mask)
    return Memory(annotations, jnp.einsum("bsm,mk->bsk", annotations, w.key), mask)


def attention_context(kind: str, w: AttentionWeights, memory: Memory, query: Array):
    """query: the decoder state [b, m] -> (context [b, m], weights [b, s] float32)."""
    if kind == "additive":
        hidden = jnp.tanh(memory.keys + jnp.einsum("bm,mk->bk", query, w.query)[:, None])
        scores = jnp.einsum("bsk,k->bs", hidden, w.score)
    else:
        scores = jnp.einsum("bsk,bk->bs", memory.keys, query)
    scores = scores.astype(jnp.promote_types(scores.dtype, jnp.float32))
    # As tx.model.attention.attention_weights: the most negative finite float, no NaN on empty rows.
    scores = jnp.where(memory.mask, scores, jnp.finfo(scores.dtype).min)
    weights = jax.nn.softmax(scores, axis=-1)
    context = jnp.einsum("bs,bsm->bm", weights.astype(memory.annotations.dtype), memory.annotations)
    return context, weights


# ---------------------------------------------------------------------------------------------
# Encoder and decoder.


def reverse_source(inputs: Array) -> Array:
    """Each row's tokens before its last real one in reverse order, the last (EOS) and the
    padding in place: [a b c EOS 0] -> [c b a EOS 0]. inputs: [b, s] int."""
    n = jnp.sum(inputs != PAD_ID, axis=1, keepdims=True)  # [b, 1]
    i = jnp.arange(inputs.shape[1])[None]
    return jnp.take_along_axis(inputs, jnp.where(i < n - 1, n - 2 - i, i), axis=1)


def _state_dict(hs: list[Array], cs: list[Array | None]) -> dict[str, Array]:
    """Per-layer [b, n] states -> {"hidden": [b, L, n], "cell": [b, L, n] (LSTM)}; rows first,
    so that a search can gather them like any cache."""
    state = {"hidden": jnp.stack(hs, axis=1)}
    if cs[0] is not None:
        state["cell"] = jnp.stack(cs, axis=1)
    return state


def _layers(state: dict[str, Array]) -> tuple[list[Array], list[Array | None]]:
    layers = state["hidden"].shape[1]
    hs = [state["hidden"][:, i] for i in range(layers)]
    cs = [state["cell"][:, i] for i in range(layers)] if "cell" in state else [None] * layers
    return hs, cs


class RNNEncoder(nn.Module):
    config: RNNConfig
    embed: nn.Module

    @nn.compact
    def __call__(self, inputs: Array, *, deterministic: bool) -> tuple[Array, dict]:
        """inputs [b, s] int -> (annotations [b, s, m], final state {"hidden", "cell"} [b, L, m]).

        Padding positions carry the state through unchanged, so the final state is the one
        after each row's last real token.
        """
        c = self.config
        mask = inputs != PAD_ID  # real tokens stay in front when the source is reversed
        if c.reverse_source:
            inputs = reverse_source(inputs)
        drop = nn.Dropout(c.dropout_rate)
        x = drop(self.embed(inputs), deterministic=deterministic)  # [b, s, m]
        hs, cs = [], []
        for layer in range(c.num_layers):
            w = _cell(c, f"layer_{layer}")()
            x, h, cell = run_layer(c.cell, w, project(w, x), mask)
            hs.append(h)
            cs.append(cell)
            if layer < c.num_layers - 1:
                x = drop(x, deterministic=deterministic)
        return constrain(x, ("batch", "length", "embed")), _state_dict(hs, cs)


class DecoderWeights(NamedTuple):
    cells: list[CellWeights]
    attention: AttentionWeights | None
    out_state: Array | None  # [m, m] W_s (attention only)
    out_context: Array | None  # [m, m] W_c
    out_bias: Array | None  # [m]


class RNNDecoder(nn.Module):
    config: RNNConfig
    embed: nn.Module
    output_embed: nn.Module | None  # None: tie the softmax to `embed`

    def setup(self):
        c = self.config
        self.dropout = nn.Dropout(c.dropout_rate)
        context = c.d_model if c.attention != "none" else 0
        self.cells = [_cell(c, f"layer_{i}", context if i == 0 else 0) for i in range(c.num_layers)]
        if c.attention != "none":
            self.attention = Attention(
                c.attention, c.d_model, c.compute_dtype, c.weight_dtype, name="attention"
            )
            self.output = _Output(c.d_model, c.compute_dtype, c.weight_dtype, name="output")

    def memory(self, annotations: Array, mask: Array) -> Memory:
        """The keys of the annotations, computed once per sentence."""
        if self.config.attention == "none":
            return Memory(annotations, annotations, mask)
        return attention_memory(self.attention(), annotations, mask)

    def __call__(
        self, memory: Memory, state: dict, decoder_inputs: Array, *, deterministic: bool
    ) -> tuple[Array, dict]:
        """decoder_inputs [b, t] (already shifted), state {"hidden", "cell"} [b, L, m] ->
        (logits [b, t, V] float32, the state after the last position).

        Teacher forcing (t = length of the targets) and one search step (t = 1) are this same
        computation: the step function below runs t times over the state.
        """
        c = self.config
        drop = self.dropout
        w = self._weights()
        x = drop(self.embed(decoder_inputs), deterministic=deterministic)  # [b, t, m]
        xp0 = project(w.cells[0], x)  # [b, t, g, n]
        masks = self._layer_dropout(decoder_inputs.shape, deterministic)  # [t, L-1, b, n] | None

        def step(carry, inputs):
            hs, cs = _layers(carry)
            xp0_t, keep = inputs
            hs, cs, context = _decoder_step(c, w, memory, xp0_t, hs, cs, keep=keep)
            return _state_dict(hs, cs), (hs[-1], context)

        state, (top, context) = jax.lax.scan(step, state, (xp0.swapaxes(0, 1), masks))
        out = top.swapaxes(0, 1)  # [b, t, n]
        if c.attention != "none":
            out = jnp.tanh(
                jnp.einsum("btn,nm->btm", out, w.out_state)
                + jnp.einsum("btk,km->btm", context.swapaxes(0, 1), w.out_context)
                + w.out_bias
            )
        out = drop(constrain(out, ("batch", "length", "embed")), deterministic=deterministic)
        head = self.output_embed if self.output_embed is not None else self.embed
        return constrain(head.attend(out), ("batch", "length", "vocab")), state

    def _weights(self) -> DecoderWeights:
        cells = [cell() for cell in self.cells]
        if self.config.attention == "none":
            return DecoderWeights(cells, None, None, None, None)
        return DecoderWeights(cells, self.attention(), *self.output())

    def _layer_dropout(self, shape, deterministic: bool):
        """Dropout masks between stacked layers, drawn outside the scan: [t, L-1, b, n]."""
        c = self.config
        if deterministic or c.dropout_rate == 0.0 or c.num_layers == 1:
            return None
        b, t = shape
        keep = jax.random.bernoulli(
            self.make_rng("dropout"), 1.0 - c.dropout_rate, (t, c.num_layers - 1, b, c.d_model)
        )
        return keep.astype(c.compute_dtype) / (1.0 - c.dropout_rate)


class _Output(nn.Module):
    """W_s [m, m], W_c [m, m], b [m] of tanh(W_s s_t + W_c c_t + b)."""

    d_model: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self):
        m = self.d_model
        return (
            _dense(self, "state", (m, m), ("mlp", "embed")),
            _dense(self, "context", (m, m), ("mlp", "embed")),
            _dense(self, "bias", (m,), ("embed",), nn.initializers.zeros),
        )


def _decoder_step(c: RNNConfig, w: DecoderWeights, memory: Memory, xp0, hs, cs, *, keep):
    """One target position through every layer.

    xp0: [b, g, n] the previous token's projection; hs, cs: per layer [b, n]; keep: dropout
    masks between layers [L-1, b, n] or None. Returns new hs, cs and the context [b, m] (the
    top state when there is no attention, unused).
    """
    context = hs[-1]
    if c.attention != "none":  # Bahdanau: the previous top state s_{t-1} is the query
        context, _ = attention_context(c.attention, w.attention, memory, hs[-1])
        xp0 = xp0 + jnp.einsum("bm,mgn->bgn", context, w.cells[0].context)
    new_h, new_c = [], []
    xp = xp0
    for layer, cell in enumerate(w.cells):
        if layer > 0:
            below = new_h[-1] if keep is None else new_h[-1] * keep[layer - 1]
            xp = project(cell, below)
        h, cl = cell_step(c.cell, cell, xp, hs[layer], cs[layer])
        new_h.append(h)
        new_c.append(cl)
    return new_h, new_c, context


# ---------------------------------------------------------------------------------------------
# The model.


class RNNSeq2Seq(EncoderDecoder):
    """Recurrent encoder-decoder with the Transformer's interface (see the module docstring)."""

    config: RNNConfig
    ENCODER: ClassVar[type] = RNNEncoder
    DECODER: ClassVar[type] = RNNDecoder

    def encode(self, inputs: Array, *, deterministic: bool = True) -> tuple[Memory, dict]:
        """inputs [b, s] int -> (Memory, the decoder's initial state = the encoder's final
        state {"hidden", "cell"} [b, L, m])."""
        annotations, state = self.encoder(inputs, deterministic=deterministic)
        return self.decoder.memory(annotations, inputs != PAD_ID), state

    def decode(
        self, memory: Memory, state: dict, decoder_inputs: Array, *, deterministic: bool = True
    ) -> tuple[Array, dict]:
        """decoder_inputs [b, t] (already shifted; [b, 1] for one search step) ->
        (logits [b, t, V] float32, the state after them)."""
        return self.decoder(memory, state, decoder_inputs, deterministic=deterministic)

    def __call__(
        self,
        inputs,
        targets,
        inputs_segments=None,
        targets_segments=None,
        inputs_positions=None,
        targets_positions=None,
        *,
        deterministic: bool = True,
    ) -> Array:
        """inputs [b, s], targets [b, t] int -> logits [b, t, V] float32 (teacher forcing)."""
        packed = (inputs_segments, targets_segments, inputs_positions, targets_positions)
        if any(x is not None for x in packed):
            raise ValueError("model.family='rnn' reads one pair per row: set data.pack=False")
        memory, state = self.encode(inputs, deterministic=deterministic)
        logits, _ = self.decode(memory, state, shift_right(targets), deterministic=deterministic)
        return logits


def incremental_decoder(model: RNNSeq2Seq, params, inputs: Array, width: int, max_len: int):
    """What a search needs to decode `inputs` [b, s] with `width` rows per sentence.

    Returns (tokens_to_logits, cache, reorder_cache) as the Transformer's
    (tx.model.transformer_decoding): the cache is the recurrent state {"hidden", "cell"}
    [b*width, L, m] (sentence-major), which does not grow with the output (`max_len` is not
    needed); the encoder's Memory is the same for a sentence's rows and is closed over, as the
    Transformer's encoder output is.
    """
    del max_len
    memory, state = model.apply({"params": params}, inputs, method=RNNSeq2Seq.encode)
    memory, state = jax.tree_util.tree_map(lambda x: jnp.repeat(x, width, axis=0), (memory, state))

    def tokens_to_logits(ids: Array, cache):
        logits, cache = model.apply(
            {"params": params}, memory, cache, ids, method=RNNSeq2Seq.decode
        )
        return logits[:, 0], cache

    return tokens_to_logits, state, reorder_cache
