"""What the vLLM connector folds into a request's keys, on vLLM's own `Request` objects and extra-keys function:
multimodal inputs from the chunk their placeholder starts in, prompt embeddings per chunk, a LoRA adapter by its
files' contents; and the inputs it refuses."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from harness.servers import require_module

require_module("vllm", "vLLM's interface modules (the vllm wheel, without its engine)")

from harness.engines import vllm_env  # noqa: E402, F401 - names vLLM's device before vLLM is first imported
from vllm import SamplingParams  # noqa: E402
from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

import kvstore  # noqa: E402
from kvstore.connectors.common.keying import AdapterFingerprints, Unkeyable, WeightsEpoch  # noqa: E402
from kvstore.connectors.vllm.identity import RequestKeys, request_keys  # noqa: E402

CHUNK = 256
TOKENS = list(range(3, 3 + 4 * CHUNK))


def request(rid: str = "r", tokens: list[int] | None = TOKENS, mm: list[tuple[str, str, int, int]] = (),
            embeds: torch.Tensor | None = None, lora: LoRARequest | None = None) -> Request:
    features = [MultiModalFeatureSpec(data=None, modality=modality, identifier=ident,
                                      mm_position=PlaceholderRange(offset=offset, length=length))
                for modality, ident, offset, length in mm]
    return Request(rid, tokens, SamplingParams(max_tokens=1), None, prompt_embeds=embeds, mm_features=features or None,
                   lora_request=lora)


def keyed(req: Request, adapters: AdapterFingerprints | None = None) -> RequestKeys:
    return request_keys(req, CHUNK, 4, "model", WeightsEpoch(""), adapters or AdapterFingerprints())


def chain(keys: RequestKeys, tokens: list[int] = TOKENS) -> list[bytes]:
    return kvstore.chunk_keys("ns;" + keys.root, tokens, CHUNK, extras=keys.upto(4))


def test_an_image_changes_the_keys_from_the_chunk_its_placeholder_starts_in():
    plain = chain(keyed(request()))
    image = keyed(request(mm=[("image", "hash-1", 300, 100)]))   # tokens 300-399: chunk 1
    assert [bool(e) for e in image.extras] == [False, True, False, False]
    keys = chain(image)
    assert keys[0] == plain[0] and all(a != b for a, b in zip(keys[1:], plain[1:]))
    other = chain(keyed(request(mm=[("image", "hash-2", 300, 100)])))          # another image, same place
    moved = chain(keyed(request(mm=[("image", "hash-1", 310, 100)])))          # the same image further on
    assert other[0] == keys[0] and other[1] != keys[1] and moved[1] != keys[1]
    spanning = keyed(request(mm=[("video", "hash-3", 200, 400)]))                # tokens 200-599: chunks 0-2
    assert [bool(e) for e in spanning.extras] == [True, True, True, False]


def test_prompt_embeddings_key_every_chunk_by_their_values():
    g = torch.Generator().manual_seed(0)
    first = torch.randn(len(TOKENS), 16, generator=g)
    second = first.clone()
    second[700] += 1.0                                                          # one position of chunk 2
    a, b = keyed(request(tokens=None, embeds=first)), keyed(request(tokens=None, embeds=second))
    zeros = [0] * len(TOKENS)                                                   # vLLM's token ids of embeddings
    ka, kb = chain(a, zeros), chain(b, zeros)
    assert all(a.extras) and ka[:2] == kb[:2] and ka[2] != kb[2] and ka[3] != kb[3]
    assert ka[0] != kvstore.chunk_keys("ns;" + a.root, zeros, CHUNK)[0]         # never the keys of token ids 0


def adapter(directory: Path, seed: int) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    save_file({"base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight": torch.randn(8, 64, generator=g),
               "base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight": torch.randn(32, 8, generator=g)},
              str(directory / "adapter_model.safetensors"))
    (directory / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 16,
                                                               "target_modules": ["k_proj"]}))
    return str(directory)


def test_a_lora_adapter_is_keyed_by_its_files_contents(tmp_path):
    adapters = AdapterFingerprints()
    a = adapter(tmp_path / "a", seed=1)
    root_a = keyed(request(lora=LoRARequest("a", 1, a)), adapters).root
    copy = shutil.copytree(a, tmp_path / "copy")
    assert keyed(request(lora=LoRARequest("other-name", 2, str(copy))), adapters).root == root_a
    assert keyed(request(), adapters).root != root_a
    assert keyed(request(lora=LoRARequest("b", 3, adapter(tmp_path / "b", seed=2))), adapters).root != root_a
    adapter(tmp_path / "a", seed=3)                                             # rewritten at the same path
    assert keyed(request(lora=LoRARequest("a", 1, a)), adapters).root != root_a


def test_inputs_it_cannot_key_are_refused_by_kind(tmp_path):
    cases = {
        "modality": request(mm=[("pointcloud", "hash-1", 300, 100)]),
        "lora": request(lora=LoRARequest("gone", 1, str(tmp_path / "missing"))),
    }
    future = request()
    future.image_embeds_extra = torch.ones(3)       # a field a newer vLLM might add, set
    cases["field"] = future
    for kind, req in cases.items():
        with pytest.raises(Unkeyable) as refused:
            keyed(req)
        assert refused.value.kind == kind
    unset = request()
    unset.image_embeds_extra = None                 # ... and unset: nothing to key
    keyed(unset)
