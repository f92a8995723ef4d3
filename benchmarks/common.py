"""Helpers for the benchmark scripts: results are printed and saved as JSON."""

import datetime
import json
import os
import platform

import jax

RESULTS = os.path.join(os.path.dirname(__file__), "results")


def environment() -> dict:
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "devices": jax.device_count(),
        "device_kind": jax.devices()[0].device_kind,
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
    }


def save(name: str, result: dict) -> str:
    os.makedirs(RESULTS, exist_ok=True)
    result = {"benchmark": name, "environment": environment(), **result}
    path = os.path.join(RESULTS, f"{name}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))
    return path


def full_length_beam_search(model, params, inputs, steps: int):
    """Beam 4, alpha 0.6 through tx's own Decoder (tx.infer.decoders.decoder, as translate uses it),
    with EOS pushed down by 1e4 so that every hypothesis runs all `steps` steps (30 tokens +
    EOS for 31): decoding speed at a fixed length, as the Flax side of side_by_side is biased
    too. Call it inside jax.jit."""
    import jax.numpy as jnp

    from tx.infer.decoders import decoder
    from tx.infer.search import beam_search
    from tx.tokens import EOS_ID

    own = decoder(model, params, inputs, 4, steps)

    def forced(ids, cache):
        logits, cache = own.tokens_to_logits(ids, cache)
        return logits.at[:, EOS_ID].add(-1e4), cache

    max_lengths = jnp.full((inputs.shape[0],), steps - 1, jnp.int32)
    return beam_search(
        own._replace(tokens_to_logits=forced),
        max_lengths,
        beam_size=4,
        alpha=0.6,
        max_steps=steps,
    )
