"""A small random-weight Llama-style model built from a config (nothing downloaded), and greedy decoding."""

from __future__ import annotations

import torch


def tiny_llama(seed: int = 0, dtype: torch.dtype = torch.float32, layers: int = 4, device: str = "cpu",
               hidden: int = 64, heads: int = 4, kv_heads: int = 2, vocab: int = 512):
    """Grouped-query attention (kv_heads < heads), deterministic weights for a seed."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=8192,
        rope_theta=10000.0, attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()
    return model


def prompt(n: int, seed: int, vocab: int = 512, device: str = "cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (1, n), generator=g).to(device)


def cache_kwarg(model) -> str:
    """transformers 5.x names the cache argument `cache`; earlier releases `past_key_values`."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@torch.no_grad()
def prefill(model, input_ids: torch.Tensor, cache=None, start: int = 0):
    """Logits of input_ids[:, start:] given a cache holding input_ids[:, :start]; returns (logits, cache)."""
    if cache is None:
        from kvstore.connectors.hf import _new_cache

        cache = _new_cache(model)
    out = model(input_ids[:, start:], use_cache=True, **{cache_kwarg(model): cache})
    return out.logits, cache  # the cache object is extended in place


@torch.no_grad()
def greedy(model, logits: torch.Tensor, cache, steps: int) -> list[int]:
    """Greedy tokens continuing from the last logits and the cache (which is extended)."""
    tokens = []
    nxt = logits[:, -1:].argmax(-1)
    name = cache_kwarg(model)
    for _ in range(steps):
        tokens.append(int(nxt))
        out = model(nxt, use_cache=True, **{name: cache})
        nxt = out.logits[:, -1:].argmax(-1)
    return tokens
