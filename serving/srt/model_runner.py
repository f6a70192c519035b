"""Load a Hugging Face model directory with ``transformers`` on the current platform, and run it.

Encoder models (BERT-like, including the sentence-transformers layout) serve embeddings, pooled
and normalised as the directory declares (``pooling``); causal LMs serve generation, batched
continuously over a KV pool allocated once at start-up (``engine``, ``mem_cache``; ``sampling``
picks tokens), within a context length per request; a generation model's attention runs over
the pool through transformers' attention interface (``layers.attention``). The model class is
transformers' auto class, or the one a plugin registered for the architecture (``models``). Every hardware decision
is a call of the platform contract: the device (``get_device``), the attention backend
(``get_default_attention_backend``), the KV pool and allocator classes
(``get_mha_kv_pool_cls``, ``get_paged_allocator_cls``), the no-grad context (``inference_mode``), seeding
(``seed_everything``), memory figures (``get_device_total_memory``, ``get_available_memory``,
``get_current_memory_usage``), ``synchronize``, ``empty_cache``, and for tensor parallelism the
backend of the group (``get_torch_distributed_backend_str``, used by the scheduler).

Errors: ``ModelLoadError`` at start-up (the message says which argument or file to change);
``InputError`` for one request's input (the scheduler turns it into a 400 for that client only).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from launchspec.model_config import is_causal_model
from launchspec.model_source import ModelSource
from platforms.device_mixin import placement
from serving.detokenize import TextDecoder
from serving.devices import cannot_run_message, check_device_visible
from serving.errors import InputError, ModelLoadError
from serving.srt.engine import GenerationBatch
from serving.srt.kv_pool import default_pool_tokens, kv_bytes_per_token
from serving.srt.layers.attention import choose_attention_backend
from serving.srt.layers.attention.hf_attention import (
    IMPLEMENTATION,
    UnsupportedAttention,
    layers_off_the_pool,
)
from serving.srt.layers.linear import can_pack, pack_linears
from serving.srt.limits import FALLBACK_INPUT_TOKENS, GenerationLimits
from serving.srt.mem_cache.kv_memory import build_kv_memory
from serving.srt.model_loader.weights import apply_scheme, resolve_dtype
from serving.srt.models import class_name, load_config, registered_class
from serving.srt.pooling import PoolingConfig, pool, read_pooling_config
from serving.srt.sampling import Sequence
from serving.threads import cpu_threads
from serving.wire import Pooling, SamplingParams, TextMemory, TextModel

if TYPE_CHECKING:
    import torch

    from platforms import SRTPlatform

log = logging.getLogger("sglang_launch.model_runner")

# Attention names transformers understands, and what the SGLang-style backend names a platform
# may report mean for a transformers model.
_HF_ATTENTION = {"eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention"}
_ATTENTION_ALIASES = {
    "torch_native": "sdpa",
    "torch": "sdpa",
    "native": "sdpa",
    "intel_amx": "sdpa",
    "triton": "sdpa",
    "flashinfer": "sdpa",
    "fa3": "flash_attention_3",
    "fa2": "flash_attention_2",
    "flash_attn": "flash_attention_2",
}


def attention_implementation(platform_backend: str | None, requested: str | None) -> str:
    """The transformers ``attn_implementation`` for ``--attention-backend`` or the platform's default."""
    name = (requested or platform_backend or "sdpa").lower()
    if name in _HF_ATTENTION:
        return name
    return _ATTENTION_ALIASES.get(name, "sdpa")


class ModelRunner:
    """One loaded model on one rank (SGLang's ``TpModelWorker``). ``kind`` is ``"embedding"``
    or ``"generation"``.

    With ``tp_size > 1`` the process must already be in its replica's ``torch.distributed``
    group; every rank then runs the same ``generate`` steps on the same batch (rank 0
    broadcasts what joins and leaves it).
    """

    graph_runner: Any = None  # runs the decode forwards it can (decode_runner); None: eager
    server_args: Any = None  # what decode_runner read (a vendor's graph runner may read it)

    def __init__(
        self,
        source: ModelSource,
        *,
        platform: SRTPlatform,
        local_rank: int = 0,
        tp_size: int = 1,
        device: str | None = None,
        dtype: str = "auto",
        attention_backend: str | None = None,
        seed: int = 0,
        max_input_tokens: int | None = None,
        context_length: int | None = None,
        max_total_tokens: int | None = None,
        chunked_prefill_size: int | None = None,
        max_batch_size: int = 32,
        trust_remote_code: bool = False,
        ranks_sharing: int = 1,
        tokenizer_path: str | None = None,
        page_size: int = 1,
        disable_radix_cache: bool = False,
        max_running_requests: int | None = None,
        quantization: str | None = None,
        torchao_config: str | None = None,
        wide_step_tokens: int = 8,
    ) -> None:
        """``max_input_tokens``: the longest prompt (default: what the model allows, ``limits``);
        ``context_length``: the longest prompt + completion (default and cap: the model's
        positions); ``max_total_tokens``: the KV pool of all running sequences (default: from
        the platform's memory figures, the memory shared by ``ranks_sharing`` ranks on the CPU);
        ``chunked_prefill_size``: tokens of one prefill forward (default: 2048 on an
        accelerator, 256 on the CPU; -1: no bound); ``tokenizer_path``: a tokenizer directory
        to use instead of the model's own (``--tokenizer-path``); ``page_size``,
        ``disable_radix_cache``, ``max_running_requests``, ``quantization``,
        ``torchao_config``: SGLang's options of those names (``model_loader.weights``);
        ``wide_step_tokens``: ``--wide-step-tokens`` (``model_loader.weights.apply_scheme``)."""
        import torch
        import transformers

        self.source = source
        self.platform = platform
        self.tp_size = tp_size
        self.max_batch_size = max(1, int(max_batch_size))
        started = time.monotonic()

        transformers.utils.logging.disable_progress_bar()
        try:
            platform.seed_everything(seed)
            self.device = torch.device(device) if device else placement(platform, local_rank)
            check_device_visible(self.device)
            platform_attention = platform.get_default_attention_backend()
        except NotImplementedError as exc:
            raise ModelLoadError(cannot_run_message(platform, exc)) from exc
        if source.gguf is not None and not source.gguf.prepared:
            raise ModelLoadError(
                f"the GGUF file {source.gguf.file} has no converted copy in the model cache "
                f"({source.path} is missing); start sglang-launch with it again, which converts "
                f"it before any worker starts, or run python -m launchspec.gguf_cache "
                f"{source.gguf.file}"
            )
        # A plugin's class for this architecture (ModelRegistry), else transformers' auto class.
        self.model_class: type[Any] | None = registered_class(source.path)
        config = load_config(source.path, trust_remote_code, self.model_class)
        self.architecture = (getattr(config, "architectures", None) or [type(config).__name__])[0]
        causal = is_causal_model(self.architecture, getattr(config, "auto_map", None))
        self.kind = "generation" if causal else "embedding"
        if tp_size > 1:
            self._check_tp_plan(config)

        self.dtype, self.dtype_reason = resolve_dtype(
            dtype, config, platform, self.device, self.kind
        )
        self._scheme = (quantization, torchao_config, int(wide_step_tokens))
        if self.kind == "generation":  # attention over the KV pool (``layers.attention``)
            self.attn_backend_class, self.attention_backend = choose_attention_backend(
                attention_backend, platform_attention
            )
            self.attn_implementation = IMPLEMENTATION
        else:
            self.attn_implementation = attention_implementation(
                platform_attention, attention_backend
            )
        tokenizer_dir = tokenizer_path or source.path
        try:
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(
                tokenizer_dir,
                config=config,  # read once, also where only a registered class knows its type
                local_files_only=True,
                trust_remote_code=trust_remote_code,
            )
        except Exception as exc:  # noqa: BLE001
            where = "--tokenizer-path" if tokenizer_path else "the model directory"
            raise ModelLoadError(
                f"cannot load the tokenizer in {tokenizer_dir}: {exc}; {where} needs the "
                f"tokenizer's files (tokenizer.json or vocab files)"
                + ("" if tokenizer_path else ", or pass --tokenizer-path DIR")
            ) from exc

        self.max_token_chars = _longest_token(self.tokenizer)
        self._decode = TextDecoder(self.tokenizer)
        self.model = self._load_model(transformers, torch, trust_remote_code)
        positions = getattr(config, "max_position_embeddings", None)
        self._token_texts: dict[int, str] = {}
        if self.kind == "embedding":
            self.pooling: PoolingConfig | None = read_pooling_config(source.path)
            caps = [max_input_tokens, positions, self.pooling.max_seq_length]
            self.max_input_tokens = min((c for c in caps if c), default=FALLBACK_INPUT_TOKENS)
            self.context_length = self.max_total_tokens = self.max_input_tokens
            self.dimensions = int(getattr(config, "hidden_size", 0))
        else:
            self.pooling = None
            self.kv_bytes_per_token = kv_bytes_per_token(config, self.dtype, tp_size)
            self.limits = GenerationLimits.of(
                positions,
                max_input_tokens=max_input_tokens,
                context_length=context_length,
                pool_tokens=max_total_tokens
                or default_pool_tokens(
                    platform, self.device, self.kv_bytes_per_token, ranks_sharing
                ),
                pool_given=bool(max_total_tokens),
            )
            self.max_input_tokens = self.limits.max_input_tokens
            self.context_length = self.limits.context_length
            self.max_total_tokens = self.limits.pool_tokens
            cpu = platform.is_cpu() or self.device.type == "cpu"
            chunk = chunked_prefill_size or (256 if cpu else 2048)
            self.chunk_tokens: int | None = chunk if chunk > 0 else None
            self.eos_ids = self._eos_ids(config)
            forward_args = inspect.signature(self.model.forward).parameters
            self._logits_to_keep = "logits_to_keep" in forward_args
            self.page_size = max(1, int(page_size))
            pool = self.max_total_tokens // self.page_size * self.page_size
            self.limits = dataclasses.replace(
                self.limits, pool_tokens=pool, page_size=self.page_size
            )
            self.radix_cache = not disable_radix_cache
            running = max_running_requests or self.max_batch_size
            self.memory = build_kv_memory(
                platform,
                config,
                size=self.max_total_tokens,
                page_size=self.page_size,
                dtype=self.dtype,
                device=self.device,
                tp_size=self.tp_size,
                running=running,
                context_length=self.context_length,
                radix_cache=self.radix_cache,
            )
            self.attn_backend = self.attn_backend_class(self.memory.token_to_kv_pool)
            # A 4-D mask tells transformers' mask functions to leave masking to attention.
            self._no_mask = torch.ones((1, 1, 1, 1), dtype=torch.bool, device=self.device)
        self.load_seconds = time.monotonic() - started

    # ---- loading ---------------------------------------------------------------------------

    def _check_tp_plan(self, config: Any) -> None:
        if self.kind != "generation":
            raise ModelLoadError(
                f"--tp-size {self.tp_size} needs a causal LM, but {self.source.path} is a "
                f"{self.architecture} encoder with no tensor-parallel plan; serve it with "
                f"--tp-size 1 and scale out with --dp-size N"
            )
        if not getattr(config, "base_model_tp_plan", None):
            raise ModelLoadError(
                f"architecture {self.architecture} has no tensor-parallel plan in transformers "
                f"(config.base_model_tp_plan is empty), so --tp-size {self.tp_size} cannot shard it; "
                f"serve it with --tp-size 1 and scale out with --dp-size N"
            )
        heads = getattr(config, "num_key_value_heads", None) or getattr(
            config, "num_attention_heads", 0
        )
        if heads and heads % self.tp_size:
            raise ModelLoadError(
                f"--tp-size {self.tp_size} does not divide the model's {heads} key/value heads; "
                f"pick a tp size that divides {heads}"
            )

    def _load_model(self, transformers: Any, torch: Any, trust_remote_code: bool) -> Any:
        auto = self.model_class or (
            transformers.AutoModelForCausalLM
            if self.kind == "generation"
            else transformers.AutoModel
        )
        kwargs = dict(dtype=self.dtype, local_files_only=True, trust_remote_code=trust_remote_code)
        if self.tp_size > 1:
            from transformers.distributed import DistributedConfig

            kwargs["distributed_config"] = DistributedConfig(tp_plan="auto", tp_size=self.tp_size)
        try:
            try:
                model = auto.from_pretrained(
                    self.source.path, attn_implementation=self.attn_implementation, **kwargs
                )
            except (ValueError, ImportError) as exc:
                if self.attn_implementation == "eager" or "attn" not in str(exc).lower():
                    raise
                log.warning(
                    "attention %r unavailable for %s (%s); using eager",
                    self.attn_implementation,
                    self.architecture,
                    exc,
                )
                self.attn_implementation = "eager"
                model = auto.from_pretrained(
                    self.source.path, attn_implementation="eager", **kwargs
                )
        except ModelLoadError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise ModelLoadError(
                f"cannot load {self.architecture} weights from {self.source.path}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if self.tp_size == 1:
            model = model.to(self.device)
        quantization, torchao_config, wide_step_tokens = self._scheme
        self.weights = apply_scheme(
            model,
            self.source,
            self.platform,
            quantization=quantization,
            torchao_config=torchao_config,
            dtype=self.dtype,
            tp_size=self.tp_size,
            wide_step_tokens=wide_step_tokens if self.kind == "generation" else 0,
        )
        if self.kind == "generation" and can_pack(self.device, self.dtype, self.tp_size):
            log.info("%d linear layers use oneDNN's prepacked weights", pack_linears(model))
        return model.eval()

    def _eos_ids(self, config: Any) -> set[int]:
        ids: set[int] = set()
        sources = [getattr(config, "eos_token_id", None), self.tokenizer.eos_token_id]
        gen = getattr(self.model, "generation_config", None)
        if gen is not None:
            sources.append(getattr(gen, "eos_token_id", None))
        for value in sources:
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(v for v in value if isinstance(v, int))
        return ids

    # ---- inputs ----------------------------------------------------------------------------

    def encode_embedding_input(self, text: str) -> list[int]:
        """Token ids of ``text`` (with special tokens), for ``embed_ids``; ``InputError`` if over
        the limit."""
        self.refuse_oversize(text, "input")
        # verbose=False: an over-long text is refused here, not warned about by the tokenizer.
        ids = self.tokenizer(text, add_special_tokens=True, verbose=False)["input_ids"]
        if len(ids) > self.max_input_tokens:
            raise InputError(
                f"input has {len(ids)} tokens, more than this model's limit of {self.max_input_tokens}; "
                f"shorten it or split it into several inputs",
                "input",
            )
        return list(ids)

    def refuse_oversize(self, text: str, what: str) -> None:
        """``InputError`` without tokenising when ``text`` certainly has more tokens than the limit.

        A token covers at most ``max_token_chars`` characters of the text (its longest vocabulary
        entry); whitespace and what normalisation may drop do not count, and a factor of
        ``_OVERSIZE_SLACK`` keeps the bound far from any text that could fit. Cheap: no tokeniser.
        """
        bound = _OVERSIZE_SLACK * self.max_input_tokens * self.max_token_chars
        if len(text) <= bound:
            return
        visible = len("".join(text.split()))
        if visible > bound:
            raise InputError(
                f"{what} has {len(text)} characters, far more than this model's limit of "
                f"{self.max_input_tokens} tokens can hold; shorten it or split it into several inputs",
                "input",
            )

    def count_embedding_tokens(self, text: str) -> int:
        """Tokens ``text`` takes (with special tokens); ``InputError`` if over the limit."""
        return len(self.encode_embedding_input(text))

    def encode_prompt(self, text: str, max_new_tokens: int, *, raw: bool = False) -> list[int]:
        """Prompt token ids; ``InputError`` if the prompt or prompt + completion is too long.
        ``raw``: the text is used as it is, without the tokenizer's special tokens (a chat
        template's rendering already holds them)."""
        self.refuse_oversize(text, "the prompt")
        ids = self.tokenizer(text, add_special_tokens=not raw, verbose=False)["input_ids"]
        if not ids:
            raise InputError("the prompt is empty after tokenisation; send some text", "input")
        self.limits.check(len(ids), max_new_tokens)
        return list(ids)

    # ---- running ---------------------------------------------------------------------------

    def embed(self, texts: list[str]) -> list[list[float]]:
        """One vector per text (truncated to ``max_input_tokens``), pooled and normalised as the
        model declares."""
        enc = self.tokenizer(texts, truncation=True, max_length=self.max_input_tokens)
        return self.embed_ids(enc["input_ids"])

    def embed_ids(self, inputs: list[list[int]]) -> list[list[float]]:
        """``embed`` of inputs already tokenised (``encode_embedding_input``), right-padded."""
        return self.embed_matrix(inputs).tolist()

    def embed_matrix(self, inputs: list[list[int]]) -> torch.Tensor:
        """``embed_ids`` as one float32 tensor on the CPU, a row per input (the scheduler sends its
        bytes: no Python float per value on the scheduler's side). SGLang's
        ``TpModelWorker.forward_batch_embedding``: the scheduler calls it once per embedding
        batch."""
        import torch

        pooling = self.pooling
        if pooling is None:
            raise InputError(
                f"model {self.source.served_name!r} serves {self.kind}, not embeddings", "model"
            )

        pad = self.tokenizer.pad_token_id or 0
        rows = []
        for start in range(0, len(inputs), self.max_batch_size):
            chunk = inputs[start : start + self.max_batch_size]
            width = max(len(ids) for ids in chunk)
            ids = torch.tensor([x + [pad] * (width - len(x)) for x in chunk], dtype=torch.long)
            mask = torch.tensor(
                [[1] * len(x) + [0] * (width - len(x)) for x in chunk], dtype=torch.long
            )
            enc = {"input_ids": ids.to(self.device), "attention_mask": mask.to(self.device)}
            if "token_type_ids" in self.tokenizer.model_input_names:
                enc["token_type_ids"] = torch.zeros_like(enc["input_ids"])
            with self.platform.inference_mode():
                hidden = self.model(**enc).last_hidden_state
                pooled = pool(hidden, enc["attention_mask"], pooling)
            self.platform.synchronize()
            rows.append(pooled.to(torch.float32).cpu())
        return rows[0] if len(rows) == 1 else torch.cat(rows)

    def forward_batch(
        self, input_ids: list[int], batch: Any, keep: list[int] | None
    ) -> torch.Tensor:
        """The model's logits after ``input_ids`` (one flat row, ``batch`` a ``ForwardBatch``
        whose attention writes and reads the KV pool), at the positions ``keep`` lists (None:
        all), as (positions, 1, vocab). SGLang's ``ModelRunner.forward``."""
        import torch

        batch.input_ids = torch.tensor(input_ids, dtype=torch.long, device=self.device)
        runner = self.graph_runner  # the decode step's runner (model_executor.decode_runner)
        if keep is None and runner is not None and runner.can_run(batch):
            logits: torch.Tensor = runner.replay(batch)
            return logits
        ids = batch.input_ids[None, :]
        kwargs: dict[str, Any] = {}
        if self._logits_to_keep:
            kwargs["logits_to_keep"] = (
                0 if keep is None else torch.tensor(keep, dtype=torch.long, device=self.device)
            )
        out = self.model(
            input_ids=ids,
            position_ids=batch.positions[None, :],
            attention_mask=self._no_mask,
            use_cache=False,
            forward_batch=batch,
            **kwargs,
        )
        logits = out.logits[0]
        if keep is not None and not self._logits_to_keep:
            logits = logits[keep]
        return logits[:, None, :]

    def new_batch(self, answers: bool = True) -> GenerationBatch:
        """An empty running batch on this model and its KV memory (``answers``: rank 0, which
        computes what only answers need)."""
        return GenerationBatch(
            forward=self.forward_batch,
            memory=self.memory,
            attn_backend=self.attn_backend,
            device=self.device,
            eos_ids=self.eos_ids,
            decode=self._decode,
            token_text=self.token_text,
            chunk_tokens=self.chunk_tokens,
            inference_mode=self.platform.inference_mode,
            answers=answers,
        )

    def generate(self, batch: GenerationBatch) -> list[Sequence]:
        """One step of the running ``batch`` (``GenerationBatch.step``: at most one prefill
        chunk, then one decode of every row); the sequences that got a token or finished in it.
        SGLang's ``TpModelWorker.forward_batch_generation``: every rank of a tensor-parallel
        replica calls it once per step, with the same batch."""
        return batch.step()

    def run_to_end(self, seqs: list[Sequence]) -> list[Sequence]:
        """Run ``seqs`` together to their ends, one ``generate`` step after another (all ranks of
        a tensor-parallel replica call it with the same sequences)."""
        batch = self.new_batch()
        batch.join(seqs)
        while len(batch):
            self.generate(batch)
        return seqs

    @property
    def decoder_identity(self) -> str:
        """``TextDecoder.identity`` of this model's tokenizer ("" when its decode is its own)."""
        return self._decode.identity

    def token_text(self, token_id: int) -> str:
        """The text of one token decoded alone."""
        text = self._token_texts.get(token_id)
        if text is None:
            text = str(self.tokenizer.decode([token_id]))
            self._token_texts[token_id] = text
        return text

    def warm_up(self) -> None:
        """Run one small batch through the model, then release what it cached. A generation
        model whose layers cannot run over the KV pool is refused here (``ModelLoadError``
        naming the layer type)."""
        if self.kind == "embedding":
            self.embed(["warm-up"])
        else:
            prompt = self.encode_prompt("warm-up", 2)
            params = SamplingParams(max_new_tokens=2, temperature=0.0, ignore_eos=True)
            try:
                self.run_to_end([Sequence("warm-up", prompt, params, seed=0)])
            except UnsupportedAttention as exc:
                raise ModelLoadError(self._unsupported(str(exc))) from exc
            missing = layers_off_the_pool(self.model)
            if missing:
                raise ModelLoadError(self._unsupported(missing))
            self.memory.reset()
            self.memory.prompt_tokens_total = self.memory.cached_tokens_total = 0
        self.platform.synchronize()
        self.platform.empty_cache()

    def _unsupported(self, what: str) -> str:
        return (
            f"{self.architecture} cannot run over this runtime's KV pool: {what}; the pool "
            f"holds causal (full or sliding-window) attention only. Serve a model of another "
            f"architecture, or with another engine (--scheduler-target)"
        )

    # ---- figures ---------------------------------------------------------------------------

    def memory_info(self) -> TextMemory:
        """Memory figures from the platform; a figure the platform cannot give is None."""
        index = self.device.index or 0
        platform = self.platform
        return TextMemory(
            _figure(lambda: platform.get_device_total_memory(index)),
            _figure(lambda: platform.get_available_memory(index)[0]),
            _figure(lambda: platform.get_current_memory_usage(self.device)),
        )

    def describe(self) -> TextModel:
        """What ``/get_server_info`` and the ready report show about the model."""
        pooling = self.pooling
        return TextModel(
            model_path=str(self.source.path),
            served_model_name=self.source.served_name,
            embedded_default=self.source.embedded_default,
            architecture=self.architecture,
            kind=self.kind,
            device=str(self.device),
            dtype=str(self.dtype).replace("torch.", ""),
            dtype_reason=self.dtype_reason,
            quantization=self.weights.quantization,
            weights=self.weights.summary,
            attention=self.attn_implementation,
            tp_size=self.tp_size,
            max_input_tokens=self.max_input_tokens,
            max_total_tokens=self.max_total_tokens,
            context_length=self.context_length,
            pooling=None
            if pooling is None
            else Pooling(pooling.mode, pooling.normalize, pooling.declared_by),
            load_seconds=round(self.load_seconds, 3),
            cpu_threads=cpu_threads(),
            model_class=class_name(type(self.model)),
        )


def _figure(call: Callable[[], float | int | None]) -> int | None:
    """A memory figure from the platform as an int, None where it cannot give one."""
    try:
        value = call()
    except (NotImplementedError, RuntimeError, AttributeError, TypeError, ValueError):
        return None
    return int(value) if value is not None else None


# How many times more characters than (limit x longest token) a text needs to be refused unread.
_OVERSIZE_SLACK = 4


def _longest_token(tokenizer: Any) -> int:
    """Characters in the longest entry of ``tokenizer``'s vocabulary (at least 1)."""
    try:
        vocab = tokenizer.get_vocab()
    except Exception:  # noqa: BLE001 - a tokenizer without a vocabulary: a generous guess
        return 64
    return max((len(token) for token in vocab), default=1) or 1
