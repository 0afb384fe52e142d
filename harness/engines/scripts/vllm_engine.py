"""A real vLLM engine in its own virtualenv, driven by a test or benchmark process over JSON lines.

    <engine venv>/bin/python harness/engines/scripts/vllm_engine.py save-model DIR [FAMILY]  # a random-weight model
    <engine venv>/bin/python harness/engines/scripts/vllm_engine.py serve CONFIG_JSON   # then one request per line
    <engine venv>/bin/python harness/engines/scripts/vllm_engine.py model-identity '[[DIR, ENGINE_ARGS], ...]'

The CPU build of vLLM and the `vllm` interface wheel the other tests use install the same module, so the engine
lives in a virtualenv of its own (`.ci/install-vllm-engine.sh`) and the tests talk to it through this script:
an engine start costs ~15 s, so one process serves every test of a configuration. Requests (stdin) and replies
(stdout) are one JSON object a line; everything the engine itself prints goes to stderr. Requests:

    {"op": "generate", "prompts": [[ids...], ...], "max_tokens": 8, "abort": {"3": 2}, "pause_after": 2}
        -> {"outputs": [{"tokens": [...], "logprobs": [...], "ttft": s, "finished": reason}], "wall": s}
        (optional per prompt: `salts` [str | null, ...], each prompt's `cache_salt`; `kv_transfer_params`
        [{...} | null, ...], each request's `SamplingParams.extra_args["kv_transfer_params"]`)
        (`abort`: request index -> abort it after that many engine steps; `pause_after`: after that many
        steps reply {"paused": n} and wait for a line (any) before going on, so the test can act mid-run)
        (`loras` [{"name", "id", "path"} | null, ...]: each prompt's LoRA adapter (config `lora`: the
        largest rank); `embeds` [{"seed", "scale"} | null, ...]: the prompt given as random prompt embeddings of
        its length drawn from the seed instead of its token ids (config `prompt_embeds`); `images` [seed | null,
        ...]: each prompt's image, random pixels drawn from the seed (config `images`: images per prompt; the
        model's processor inserts the image's placeholder tokens))
    {"op": "reset_prefix_cache", "reset_connector": false} -> {"ok": true}   (vLLM forgets its own cached
        blocks; with `reset_connector`, the connector's `reset_cache()` too)
    {"op": "update_weights", "seed": n, "scale": s} -> {"ok": true}   (every weight += s * noise from the
        seed, in place in the workers through `LLM.collective_rpc`, as a trainer syncing weights)
    {"op": "chunk_parts"} -> {"parts": [{"kind": "full", "nbytes": n}, ...]}   (a chunk's bytes, group by group)
    {"op": "block_size"} -> {"block_size": n}   (the attention block in tokens: a hybrid model's, as vLLM sized it)
    {"op": "stats"} -> {"scheduler": {...}, "worker": {...}}   (the connector's counters, if it has them)
    {"op": "exit"}

The engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) unless the config says
`"multiprocess": true`: one process fewer to start and the connector's state is readable for `stats`. `"tp": 2`
runs two tensor-parallel workers in processes of their own (the scheduler's counters stay readable, the
workers' do not).
Prompts are token ids (no tokenizer); sampling is greedy with the sampled token's log-probability.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable


def save_model(directory: str, family: str = "dense", seed: int = 0, hidden: int = 128, layers: int = 4) -> None:
    """A small model of one family with random float32 weights (nothing downloaded): `dense` (Llama, head size
    32, which the CPU attention backend supports), `mla` (DeepSeek-V2-shaped: kv_lora_rank 512,
    qk_rope_head_dim 64), `sliding` (Gemma-3-shaped: sliding-window layers of window 64, then a full one) or
    `vlm` (`save_vlm`)."""
    import torch
    import transformers as tf

    if family == "vlm":
        save_vlm(directory, seed)
        return
    common = dict(vocab_size=512, hidden_size=hidden, intermediate_size=2 * hidden, max_position_embeddings=8192,
                  torch_dtype="float32")
    if family == "dense":
        model = tf.LlamaForCausalLM, tf.LlamaConfig(num_hidden_layers=layers, num_attention_heads=4,
                                                    num_key_value_heads=2, rope_theta=10000.0, **common)
    elif family == "mla":  # dense MLPs on every layer: the CPU build's MoE router wants expert groups
        model = tf.DeepseekV2ForCausalLM, tf.DeepseekV2Config(
            num_hidden_layers=layers - 1, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=512,
            q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=64, v_head_dim=64,
            moe_intermediate_size=hidden // 2, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
            first_k_dense_replace=layers, **common)
    elif family == "sliding":
        model = tf.Gemma3ForCausalLM, tf.Gemma3TextConfig(
            num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=64, sliding_window=64,
            layer_types=["sliding_attention"] * (layers - 1) + ["full_attention"], **common)
    elif family == "hybrid-mamba2":  # Granite 4 shaped: Mamba-2 and attention layers in turn, dense MLPs
        model = tf.GraniteMoeHybridForCausalLM, tf.GraniteMoeHybridConfig(
            num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
            layer_types=["mamba", "attention"] * (layers // 2), mamba_n_heads=8, mamba_d_head=hidden * 2 // 8,
            mamba_d_state=64, mamba_n_groups=1, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=256,
            num_local_experts=0, shared_intermediate_size=2 * hidden, position_embedding_type="rope",
            initializer_range=0.2, **common)  # weights this far from flat make the state move the outputs
        # (a state larger than 128 tokens of attention KV: vLLM makes the hybrid block 256 tokens)
    elif family == "hybrid-gdn":  # Qwen3-Next shaped: Gated DeltaNet and attention layers in turn, small MoE MLPs
        model = tf.Qwen3NextForCausalLM, tf.Qwen3NextConfig(
            num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=128,
            layer_types=["linear_attention", "full_attention"] * (layers // 2), linear_conv_kernel_dim=4,
            linear_key_head_dim=64, linear_value_head_dim=64, linear_num_key_heads=2, linear_num_value_heads=16,
            mlp_only_layers=[], num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
            shared_expert_intermediate_size=64, initializer_range=0.2, **common)
    elif family == "hybrid-falcon-h1":  # Falcon-H1 shaped: attention and Mamba-2 side by side in every layer
        model = tf.FalconH1ForCausalLM, tf.FalconH1Config(
            num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1, mamba_d_ssm=2 * hidden,
            mamba_n_heads=8, mamba_d_head=hidden * 2 // 8, mamba_d_state=64, mamba_n_groups=1, mamba_d_conv=4,
            mamba_expand=2, mamba_chunk_size=256, initializer_range=0.2, **common)
    elif family == "hybrid-nemotron-h":  # Nemotron-H shaped: Mamba-2, MLP and attention blocks, one a layer
        model = tf.NemotronHForCausalLM, tf.NemotronHConfig(
            layers_block_type=["mamba", "attention", "mlp", "mamba"][:layers], num_attention_heads=2,
            num_key_value_heads=1, head_dim=32, mamba_num_heads=8, mamba_head_dim=hidden * 2 // 8,
            ssm_state_size=64, n_groups=1, conv_kernel=4, expand=2, chunk_size=256, initializer_range=0.2,
            **common)
    elif family == "hybrid-zamba2":  # Zamba2 shaped: Mamba-2 layers, a shared attention block every few
        model = tf.Zamba2ForCausalLM, tf.Zamba2Config(
            num_hidden_layers=layers, layers_block_type=["mamba", "hybrid"] * (layers // 2), num_attention_heads=2,
            num_key_value_heads=2, n_mamba_heads=8, mamba_d_state=64, mamba_ngroups=1, mamba_d_conv=4,
            mamba_expand=2, chunk_size=256, num_mem_blocks=1, use_shared_attention_adapter=False,
            use_mem_rope=True, initializer_range=0.2, **common)
    elif family == "hybrid-lfm2":  # LFM2 shaped: gated short convolutions and attention layers in turn
        model = tf.Lfm2ForCausalLM, tf.Lfm2Config(
            num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1, conv_L_cache=3,
            layer_types=["conv", "full_attention"] * (layers // 2), initializer_range=0.2,
            conv_dim=hidden, block_dim=hidden, **common)   # the names vLLM's LFM2 reads (checkpoints carry them)
    elif family == "gemma4":  # Gemma 4 shaped: sliding and full layers in turn, the last two reusing the KV
        model = tf.Gemma4ForCausalLM, tf.Gemma4TextConfig(  # of the first two; small per-layer input embeddings
            num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=64,
            layer_types=["sliding_attention", "full_attention"] * (layers // 2), num_kv_shared_layers=layers // 2,
            vocab_size_per_layer_input=common["vocab_size"], hidden_size_per_layer_input=16,
            initializer_range=0.2, **common)
    else:
        raise SystemExit(f"unknown model family {family!r}: dense, mla, sliding, hybrid-mamba2, hybrid-gdn, "
                         "hybrid-falcon-h1, hybrid-nemotron-h, hybrid-zamba2, hybrid-lfm2, gemma4 or vlm")
    torch.manual_seed(seed)
    model[0](model[1]).to(torch.float32).save_pretrained(directory)


def save_vlm(directory: str, seed: int = 0) -> None:
    """A BLIP-2 shaped vision-language model with its processor and a word-level tokenizer: a ViT of 56x56 images in
    14-pixel patches, a Q-Former whose 32 query tokens the processor puts before the prompt as ``<image>`` (id
    4: enough of them that an image moves a prompt of a few hundred tokens' output clearly), and an OPT language
    model (vocabulary 512, hidden 128, 2 layers). Its modules and processor import no torchvision (which has no
    build for the CPU torch of the engine's virtualenv; vLLM's LLaVA, PaliGemma, Qwen-VL, Gemma 3 and Mistral 3
    paths import it)."""
    import torch
    import transformers as tf
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3, "<image>": 4, **{f"w{i}": i for i in range(5, 512)}}
    words = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = tf.PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>", bos_token="<s>",
                                           eos_token="</s>", pad_token="<pad>",
                                           extra_special_tokens={"image_token": "<image>"})
    images = tf.BlipImageProcessor(size={"height": 56, "width": 56})
    processor = tf.Blip2Processor(image_processor=images, tokenizer=tokenizer, num_query_tokens=32)
    vision = tf.Blip2VisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                  image_size=56, patch_size=14)
    qformer = tf.Blip2QFormerConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                    num_attention_heads=4, encoder_hidden_size=64, vocab_size=512)
    text = tf.OPTConfig(vocab_size=512, hidden_size=128, ffn_dim=256, num_hidden_layers=2, num_attention_heads=4,
                        word_embed_proj_dim=128, max_position_embeddings=2048, bos_token_id=1, eos_token_id=2,
                        pad_token_id=3, torch_dtype="float32")
    config = tf.Blip2Config(vision_config=vision.to_dict(), qformer_config=qformer.to_dict(),
                            text_config=text.to_dict(), num_query_tokens=32, image_token_index=4,
                            torch_dtype="float32")
    torch.manual_seed(seed)
    tf.Blip2ForConditionalGeneration(config).to(torch.float32).save_pretrained(directory)
    processor.save_pretrained(directory)


def image(seed: int) -> Any:
    """A 56x56 image of random pixels drawn from `seed`."""
    import numpy as np
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (56, 56, 3), dtype=np.uint8))


class Engine:
    def __init__(self, config: dict[str, Any]) -> None:
        from vllm import LLM

        kwargs: dict[str, Any] = dict(
            model=config["model"], skip_tokenizer_init=True, enforce_eager=True, dtype=config.get("dtype", "float32"),
            max_model_len=config.get("max_model_len", 8192), seed=0,
            enable_prefix_caching=config.get("prefix_caching", True),
            max_num_batched_tokens=config.get("max_num_batched_tokens", 4096),
            max_num_seqs=config.get("max_num_seqs", 64), disable_log_stats=True,
        )
        if config.get("num_blocks"):
            kwargs["num_gpu_blocks_override"] = int(config["num_blocks"])
        if config.get("connector") is not None:
            kwargs["kv_transfer_config"] = config["connector"]
        if config.get("attention_backend"):
            kwargs["attention_config"] = {"backend": config["attention_backend"]}
        if config.get("lora"):
            kwargs.update(enable_lora=True, max_lora_rank=int(config["lora"]), max_loras=2)
        if config.get("prompt_embeds"):
            kwargs["enable_prompt_embeds"] = True
        if config.get("images"):   # the model's processor makes the placeholders: it needs the tokenizer
            kwargs.update(limit_mm_per_prompt={"image": int(config["images"])}, skip_tokenizer_init=False,
                          max_model_len=2048)
        if int(config.get("tp", 1)) > 1:   # worker processes (vLLM's multiprocessing executor, gloo between them)
            kwargs.update(tensor_parallel_size=int(config["tp"]), distributed_executor_backend="mp")
        self.llm = LLM(**kwargs)
        self.engine = self.llm.llm_engine
        self._next_id = 0

    def generate(self, prompts: list[list[int]], max_tokens: int = 8, abort: dict[str, int] | None = None,
                 ignore_eos: bool = True, pause_after: int | None = None,
                 pause: Callable[[int], None] | None = None, salts: list[str | None] | None = None,
                 kv_transfer_params: list[dict[str, Any] | None] | None = None,
                 loras: list[dict[str, Any] | None] | None = None,
                 embeds: list[dict[str, Any] | None] | None = None,
                 images: list[int | None] | None = None) -> dict[str, Any]:
        from vllm import SamplingParams

        abort_at = {int(i): int(n) for i, n in (abort or {}).items()}
        ids, started = [], time.perf_counter()
        for i, prompt in enumerate(prompts):
            self._next_id += 1
            rid = f"r{self._next_id}"
            ids.append(rid)
            transfer = kv_transfer_params[i] if kv_transfer_params else None
            params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=0, detokenize=False,
                                    ignore_eos=ignore_eos,
                                    extra_args={"kv_transfer_params": transfer} if transfer else None)
            inputs: dict[str, Any] = {"prompt_token_ids": list(prompt)}
            embed = embeds[i] if embeds else None
            if embed is not None:
                inputs = {"prompt_embeds": self._embeddings(len(prompt), **embed)}
            pixels = images[i] if images else None
            if pixels is not None:
                inputs["multi_modal_data"] = {"image": image(pixels)}
            if salts and salts[i] is not None:
                inputs["cache_salt"] = salts[i]
            lora = None
            adapter = loras[i] if loras else None
            if adapter is not None:
                from vllm.lora.request import LoRARequest

                lora = LoRARequest(adapter["name"], int(adapter["id"]), adapter["path"])
            self.engine.add_request(rid, inputs, params, lora_request=lora)
        index = {rid: i for i, rid in enumerate(ids)}
        outputs: list[dict[str, Any]] = [{"tokens": [], "logprobs": [], "ttft": None, "finished": None}
                                         for _ in prompts]
        steps = 0
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                slot = outputs[index[out.request_id]]
                completion = out.outputs[0]
                if completion.token_ids and slot["ttft"] is None:
                    slot["ttft"] = time.perf_counter() - started
                slot["tokens"] = list(completion.token_ids)
                slot["logprobs"] = [lp[tok].logprob for tok, lp in zip(completion.token_ids, completion.logprobs or [])]
                if out.finished:
                    slot["finished"] = completion.finish_reason or "finished"
            steps += 1
            if pause_after is not None and steps == pause_after and pause is not None:
                pause(steps)
            for i, after in list(abort_at.items()):
                if steps >= after:
                    self.engine.abort_request([ids[i]])
                    outputs[i]["finished"] = outputs[i]["finished"] or "aborted"
                    del abort_at[i]
        wall = time.perf_counter() - started  # every request finished; saves may still be on their way
        self._drain()
        return {"outputs": outputs, "wall": wall, "drained": time.perf_counter() - started, "steps": steps}

    def _drain(self, timeout: float = 60.0) -> None:
        """Step until the scheduler holds no request (finished ones whose blocks wait for their saves), as a
        server's busy loop would."""
        core = getattr(self.engine.engine_core, "engine_core", None)
        deadline = time.monotonic() + timeout
        while core is not None and core.scheduler.has_requests() and time.monotonic() < deadline:
            self.engine.step()
            time.sleep(0.002)

    def _embeddings(self, length: int, seed: int, scale: float = 0.02) -> Any:
        import torch

        hidden = self.llm.llm_engine.model_config.get_hidden_size()
        return torch.randn(length, hidden, generator=torch.Generator().manual_seed(seed)) * scale

    def reset_prefix_cache(self, reset_connector: bool = False) -> dict[str, Any]:
        self._drain()
        return {"ok": bool(self.engine.reset_prefix_cache(reset_connector=reset_connector))}

    def update_weights(self, seed: int, scale: float = 0.05) -> dict[str, Any]:
        self._drain()
        self.llm.collective_rpc(_perturb_weights, args=(seed, scale))
        return {"ok": True}

    def chunk_keys(self, prompts: list[list[int]], salts: list[str | None] | None = None) -> dict[str, Any]:
        """The connector's chunk keys of each prompt (hex; `salts`: each prompt's cache salt), for tests that
        delete or look up chunks."""
        side = self.engine.engine_core.engine_core.scheduler.connector.scheduler_side
        salted = salts or [None] * len(prompts)
        return {"keys": [[k.hex() for k in side.plain_keys(side.stores[0], p, salt or "")]
                         for p, salt in zip(prompts, salted)], "namespace": side.session_namespace,
                "key_scheme": side.key_scheme}

    def chunk_parts(self) -> dict[str, Any]:
        """What a chunk holds, group after group in its bytes: each group's kind and byte count (tests that
        rewrite one part of stored chunks, e.g. a hybrid model's recurrent state)."""
        side = self.engine.engine_core.engine_core.scheduler.connector.scheduler_side
        g, t = side._geometry, side._chunk_tokens
        return {"parts": [{"kind": x.kind, "nbytes": len(x.layer_names) * x.page_bytes * (t // x.block_size)}
                          for x in g.groups]}

    def block_size(self) -> dict[str, Any]:
        """The attention block in tokens, as vLLM set it once the model's layers were built: for a hybrid model the
        block at which an attention page holds a state page, with or without prefix caching (in align mode every
        group's block, which the connector's `chunk_tokens` must equal; without it the state groups' block is the
        model length instead)."""
        return {"block_size": int(self.engine.engine_core.engine_core.vllm_config.cache_config.block_size)}

    def stats(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        try:
            scheduler = self.engine.engine_core.engine_core.scheduler
            found["scheduler"] = dict(getattr(scheduler.connector, "stats", {}) or {})
        except AttributeError:
            pass
        try:
            from vllm.distributed.kv_transfer import get_kv_transfer_group

            found["worker"] = dict(getattr(get_kv_transfer_group(), "stats", {}) or {})
        except Exception:  # noqa: BLE001 - no connector, or not in this process
            pass
        return found


def _perturb_weights(worker: Any, seed: int, scale: float) -> None:
    """In a worker: every floating-point weight += scale * standard noise from `seed` (in place)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in sorted(worker.model_runner.model.named_parameters()):
            if param.is_floating_point():
                param.add_(torch.randn(param.shape, generator=generator).to(param.dtype) * scale)


def model_identity(model: str, engine_args: dict[str, Any]) -> str:
    """The vLLM connector's model identity of `model` under `engine_args` (the engine-neutral one every engine
    computes, ``common/model_identity.py``; vLLM's own config, no engine)."""
    from vllm.engine.arg_utils import EngineArgs

    from kvstore.connectors.vllm.identity import model_identity as identity

    mode = engine_args.pop("fingerprint", "sampled")
    args = EngineArgs(model=model, skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
                      max_model_len=2048, **engine_args)
    return identity(args.create_engine_config(), mode)


def serve(config: dict[str, Any]) -> None:
    # Replies go to the original stdout; whatever vLLM and its libraries print goes to stderr.
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    if not config.get("multiprocess"):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    engine = Engine(config)
    replies.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        op = request.pop("op")
        if op == "exit":
            break
        if op == "generate":
            request["pause"] = lambda steps: (replies.write(json.dumps({"paused": steps}) + "\n"),
                                              sys.stdin.readline())
        try:
            reply = getattr(engine, op)(**request)
        except Exception as exc:  # noqa: BLE001 - reported to the test, which fails with it
            import traceback

            reply = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        replies.write(json.dumps(reply) + "\n")
    replies.close()
    os._exit(0)  # the engine's own shutdown can take seconds; the test is done with it


if __name__ == "__main__":
    if sys.argv[1] == "save-model":  # DIR [FAMILY [HIDDEN LAYERS [SEED]]]
        family, *numbers = sys.argv[3:7] or ["dense"]
        sizes: dict[str, Any] = dict(zip(("hidden", "layers", "seed"), map(int, numbers)))
        save_model(sys.argv[2], family, **sizes)
    elif sys.argv[1] == "serve":
        serve(json.loads(sys.argv[2]))
    elif sys.argv[1] == "model-identity":  # [[MODEL, ENGINE_ARGS], ...]: the connector's model identities, a line each
        for model, engine_args in json.loads(sys.argv[2]):   # one interpreter: vLLM's import costs seconds
            print("identity", model_identity(model, engine_args), flush=True)   # vLLM logs to stdout too
    else:
        raise SystemExit(f"unknown command {sys.argv[1]!r}: use save-model DIR or serve CONFIG_JSON")
