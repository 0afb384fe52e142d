"""Save a small random-weight model and a word-level tokenizer for a real SGLang engine (nothing downloaded).

Run with the engine virtualenv's python: ``python sglang_model.py DIRECTORY [dense|mla]``.
"""

from __future__ import annotations

import json
import os
import sys

VOCAB = 512
SPECIAL = ["<unk>", "<s>", "</s>"]   # ids 0, 1, 2: unknown, beginning and end of sequence


def save_tokenizer(directory: str) -> None:
    """A whitespace word-level tokenizer over ``VOCAB`` words: ``w3`` is id 3, up to ``w511``."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    vocab = {word: i for i, word in enumerate(SPECIAL)}
    vocab.update({f"w{i}": i for i in range(len(SPECIAL), VOCAB)})
    core = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(directory)


def save_model(directory: str, family: str = "dense", seed: int = 0) -> None:
    """`dense`: Llama (hidden 64, 2 layers, 4 heads of 16, 2 KV heads); `mla`: DeepSeek-V2-shaped (latent 32,
    rope 16, dense MLPs: SGLang's CPU MoE needs sgl-kernel). Random float32 weights, fixed by ``seed``."""
    import torch
    import transformers as tf

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, max_position_embeddings=4096,
                  bos_token_id=1, eos_token_id=2, torch_dtype="float32", num_hidden_layers=2)
    if family == "dense":
        cls, config = tf.LlamaForCausalLM, tf.LlamaConfig(num_attention_heads=4, num_key_value_heads=2,
                                                          rope_theta=10000.0, **common)
    elif family == "mla":
        cls, config = tf.DeepseekV2ForCausalLM, tf.DeepseekV2Config(
            num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=None,
            qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16, moe_intermediate_size=32,
            n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=2,
            # SGLang's CPU path runs DeepSeek attention with its YaRN rotary embedding only (as real DeepSeek
            # checkpoints configure it); factor 1 leaves positions unscaled
            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 1.0,
                             "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
                             "mscale": 1.0, "mscale_all_dim": 1.0},
            moe_layer_freq=1, scoring_func="softmax",   # DeepSeek-V2 fields SGLang reads, gone from transformers 5
            **common)
    else:
        raise SystemExit(f"unknown model family {family!r}: dense or mla")
    torch.manual_seed(seed)
    cls(config).to(torch.float32).save_pretrained(directory)
    save_tokenizer(directory)
    with open(os.path.join(directory, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2}, f)


if __name__ == "__main__":
    save_model(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "dense")
