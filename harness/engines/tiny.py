"""Small random-weight models of each family built from a config (nothing downloaded), and greedy decoding."""

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


def tiny_gemma3(seed: int = 0, dtype: torch.dtype = torch.float32, window: int = 64, device: str = "cpu",
                layer_types: tuple[str, ...] = ("sliding_attention",) * 3 + ("full_attention",)):
    """Gemma-3-shaped: sliding-window layers with one full-attention layer, a separate head_dim."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=len(layer_types),
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=window,
        layer_types=list(layer_types), max_position_embeddings=8192, attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return Gemma3ForCausalLM(config).to(device=device, dtype=dtype).eval()


def tiny_mistral(seed: int = 0, dtype: torch.dtype = torch.float32, window: int = 96, device: str = "cpu"):
    """Mistral-shaped: every layer a sliding window (no layer_types in its config)."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, sliding_window=window, max_position_embeddings=8192, attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return MistralForCausalLM(config).to(device=device, dtype=dtype).eval()


def tiny_deepseek(version: int = 2, seed: int = 0, dtype: torch.dtype = torch.float32, device: str = "cpu",
                  kv_lora_rank: int = 32, rope_dim: int = 16):
    """DeepSeek-V2/V3-shaped MLA (latent of kv_lora_rank plus a roped key), one dense then MoE layers."""
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM

    config_cls, model_cls = {2: (DeepseekV2Config, DeepseekV2ForCausalLM),
                             3: (DeepseekV3Config, DeepseekV3ForCausalLM)}[version]
    config = config_cls(
        vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=kv_lora_rank, q_lora_rank=None,
        qk_rope_head_dim=rope_dim, qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4,
        num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
        max_position_embeddings=8192, attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return model_cls(config).to(device=device, dtype=dtype).eval()


def tiny_granite_hybrid(seed: int = 0, dtype: torch.dtype = torch.float32, device: str = "cpu",
                        layer_types: tuple[str, ...] = ("linear_attention", "full_attention") * 2):
    """Granite-4-shaped (GraniteMoeHybrid): Mamba-2 layers (conv window and SSM state) between attention layers.
    `initializer_range` 0.2 (against 0.02) so that the recurrent state moves the outputs visibly."""
    from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM

    config = GraniteMoeHybridConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, shared_intermediate_size=128, num_local_experts=0,
        num_hidden_layers=len(layer_types), layer_types=list(layer_types), num_attention_heads=4,
        num_key_value_heads=2, mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=16,
        mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=64, position_embedding_type="rope",
        initializer_range=0.2, max_position_embeddings=8192, attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return GraniteMoeHybridForCausalLM(config).to(device=device, dtype=dtype).eval()


def tiny_lfm2(seed: int = 0, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """LFM2-shaped: gated short-convolution layers (a conv window, no SSM state) between attention layers."""
    from transformers import Lfm2Config, Lfm2ForCausalLM

    config = Lfm2Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, full_attn_idxs=[1, 3], initializer_range=0.2, max_position_embeddings=8192,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return Lfm2ForCausalLM(config).to(device=device, dtype=dtype).eval()


def tiny_falcon_h1(seed: int = 0, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """Falcon-H1-shaped: every layer attention and Mamba-2 side by side (one cache layer holds both)."""
    from transformers import FalconH1Config, FalconH1ForCausalLM

    config = FalconH1Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1, mamba_d_ssm=128,
        mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=64, initializer_range=0.2,
        max_position_embeddings=8192, attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return FalconH1ForCausalLM(config).to(device=device, dtype=dtype).eval()


def tiny_qwen3_next(seed: int = 0, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """Qwen3-Next-shaped: Gated DeltaNet layers (a conv window and a delta-rule state) between attention layers,
    MoE feed-forward blocks."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    config = Qwen3NextConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, layer_types=["linear_attention", "full_attention"] * 2,
        linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, decoder_sparse_step=1, initializer_range=0.2,
        max_position_embeddings=8192, attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return Qwen3NextForCausalLM(config).to(device=device, dtype=dtype).eval()


def tiny_nemotron_h(seed: int = 0, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """Nemotron-H-shaped: Mamba-2, attention and MLP blocks, each its own layer (the MLP caches nothing)."""
    from transformers import NemotronHConfig, NemotronHForCausalLM

    config = NemotronHConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, layers_block_type=["linear_attention", "full_attention", "mlp",
                                                                "linear_attention"],
        mamba_num_heads=8, mamba_head_dim=16, n_groups=1, ssm_state_size=16, conv_kernel=4, expand=2,
        chunk_size=64, initializer_range=0.2, max_position_embeddings=8192, attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return NemotronHForCausalLM(config).to(device=device, dtype=dtype).eval()


def tiny_zamba2(seed: int = 0, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """Zamba2-shaped: Mamba-2 layers, some of them ("hybrid") preceded by a shared attention block whose KV the
    layer's cache holds beside its state."""
    from transformers import Zamba2Config, Zamba2ForCausalLM

    config = Zamba2Config(
        vocab_size=512, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
        attention_head_dim=16, layers_block_type=["linear_attention", "hybrid", "linear_attention", "hybrid"],
        mamba_headdim=16, n_mamba_heads=8, mamba_ngroups=1, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
        chunk_size=64, num_mem_blocks=1, use_shared_attention_adapter=False, use_mem_rope=True,
        initializer_range=0.2, max_position_embeddings=8192, attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return Zamba2ForCausalLM(config).to(device=device, dtype=dtype).eval()


def tiny_bamba(seed: int = 0, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """Bamba-shaped: Mamba-2 layers with attention at two indices. transformers 5.25's Bamba numbers a forward
    pass's tokens from 0 unless it is given `position_ids`, so a prefill continued on a cache must pass them."""
    from transformers import BambaConfig, BambaForCausalLM

    config = BambaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, attn_layer_indices=[1, 3], mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1,
        mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=64, initializer_range=0.2,
        max_position_embeddings=8192, attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return BambaForCausalLM(config).to(device=device, dtype=dtype).eval()


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
        from kvstore.connectors.hf import new_cache

        cache = new_cache(model)
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
