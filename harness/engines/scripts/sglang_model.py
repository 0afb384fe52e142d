"""Save a small random-weight model and a word-level tokenizer for a real SGLang engine (nothing downloaded).

Run with the engine virtualenv's python: ``python harness/engines/scripts/sglang_model.py DIRECTORY [dense]``.
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
    """`dense`: Llama (hidden 64, 2 layers, 4 heads of 16, 2 KV heads); `shared`: the Llama every engine runs
    (hidden 128, 4 layers, 4 heads of 32, 2 KV heads: vLLM's CPU attention takes head size 32, not 16). Random
    float32 weights fixed by ``seed``."""
    import torch
    import transformers as tf

    shapes = {"dense": (64, 2), "shared": (128, 4)}
    if family not in shapes:
        raise SystemExit(f"unknown model family {family!r}: dense or shared (SGLang's CPU path runs no MLA model)")
    hidden, layers = shapes[family]
    config = tf.LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden,
                            num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0,
                            max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, torch_dtype="float32")
    torch.manual_seed(seed)
    tf.LlamaForCausalLM(config).to(torch.float32).save_pretrained(directory)
    save_tokenizer(directory)
    with open(os.path.join(directory, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2}, f)


if __name__ == "__main__":
    save_model(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "dense")
