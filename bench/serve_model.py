"""A random-weight Llama and a word-level tokenizer in one directory, the model `vllm serve` loads for the bench.

    <engine venv>/bin/python bench/serve_model.py DIR [--hidden 1024 --layers 8 --heads 16 --kv-heads 4]

Nothing is downloaded: the weights come from a seeded `LlamaForCausalLM(config)` saved with `save_pretrained`
(float32, so outputs are deterministic and comparable across engines), and the tokenizer is a `tokenizers`
WordLevel vocabulary (`w3` ... `w<vocab-1>` and three special tokens) saved beside it as a fast tokenizer, so
the server and `vllm bench serve` both load it from the directory. Runs in the engine's virtualenv
(transformers and tokenizers come with vLLM).
"""

from __future__ import annotations

import argparse
import json
import os

SPECIALS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2: the rest of the vocabulary is plain words


def save_tokenizer(directory: str, vocab: int, digit_words: bool = False) -> None:
    """A WordLevel tokenizer of `vocab` ids (whitespace-split words) saved as a fast tokenizer.

    `digit_words`: ids 3..12 are the digits ``0``..``9`` and id 13 the word ``hi``, and digits are split off
    every word one by one, so that SGLang's benchmark client's Mooncake prompts (each hash id written as its
    digits, then ``hi`` 128 times) tokenize into distinct ids per hash id (the rest of the vocabulary as before).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {tok: i for i, tok in enumerate(SPECIALS)}
    extra = [*(str(d) for d in range(10)), "hi"] if digit_words else []
    words.update({w: len(SPECIALS) + i for i, w in enumerate(extra)})
    words.update({f"w{i}": i for i in range(len(words), vocab)})
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="<unk>"))
    tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                   pre_tokenizers.Digits(individual_digits=True)])
                         if digit_words else pre_tokenizers.WhitespaceSplit())
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   model_max_length=1 << 20)
    fast.save_pretrained(directory)


def save_model(directory: str, hidden: int, layers: int, heads: int, kv_heads: int, vocab: int,
               max_len: int, seed: int = 0) -> None:
    """The random-weight float32 Llama of this shape (MLP 2x hidden), seeded, saved with `save_pretrained`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=max_len, rope_theta=10000.0, bos_token_id=1, eos_token_id=2,
                         torch_dtype="float32")
    torch.manual_seed(seed)
    LlamaForCausalLM(config).to(torch.float32).save_pretrained(directory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--max-len", type=int, default=8192)
    parser.add_argument("--digit-words", action="store_true",
                        help="digits and `hi` as words (the prompts of SGLang's benchmark client on a Mooncake trace)")
    args = parser.parse_args()
    os.makedirs(args.directory, exist_ok=True)
    save_model(args.directory, args.hidden, args.layers, args.heads, args.kv_heads, args.vocab, args.max_len)
    save_tokenizer(args.directory, args.vocab, args.digit_words)
    print(json.dumps({"model": args.directory}))


if __name__ == "__main__":
    main()
