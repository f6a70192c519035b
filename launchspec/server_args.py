"""``ServerArgs``: the launcher's and the serving runtime's settings, and their wire payload.

One dataclass is the single description of every option: ``add_cli_args`` builds the command
line from its fields (flag ``--<field-name>``, type from the annotation, help and choices from
the field metadata), ``from_cli_args`` builds the instance back, ``__post_init__`` lets the
selected platform set its defaults (``apply_server_args_defaults``), and ``check_server_args``
reports every bad value at once, each with what to change. All four are hook targets, so plugins
can add options, change defaults, or relax checks; a REPLACE subclass that adds fields gets its
options on the command line and through the payload without further code.

``encode_server_args`` / ``decode_server_args`` turn an instance into the opaque, versioned
msgpack payload that ``bootstrap.ProcessSpec`` carries to the children (``bootstrap.payload``).

Import-light: standard library at module scope; platforms and msgspec are imported when used.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import re
import typing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bootstrap.payload import PayloadError, decode_payload, encode_payload
from launchspec.field_types import base_type, field_default, flag, type_problems
from launchspec.model_files import model_file_problems
from launchspec.model_source import model_path_as_path, resolve_model
from launchspec.runtimes import SERVING, serving_spec

if TYPE_CHECKING:
    from typing import Self

RUNTIMES = tuple(SERVING)
# Where children look the class up (``ProcessSpec.args_class``), after their hooks are applied, so
# a REPLACE of it applies there too.
ARGS_CLASS = "launchspec.server_args.ServerArgs"
# ``--restart-policy``: the names; ``launcher.supervisor.restarts`` is what they do.
NEVER, ON_FAILURE = "never", "on-failure"
RESTART_POLICIES = (NEVER, ON_FAILURE)
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
DTYPES = ("auto", "float32", "float16", "bfloat16")
LOAD_FORMATS = ("auto", "gguf")
# ``--grammar-backend``: SGLang's names; llguidance is accepted by name and refused (not served).
GRAMMAR_BACKENDS = ("xgrammar", "llguidance", "none")
# ``--tool-call-parser``: SGLang's names of the formats ``serving.http.tool_parsers`` reads.
TOOL_CALL_PARSERS = ("hermes", "llama3", "mistral", "qwen", "qwen25")

_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*)?$")


def _opt(default: Any, help: str, **meta: Any) -> Any:
    """A field with its command-line help (and optional ``choices``, ``metavar``)."""
    return field(default=default, metadata={"help": help, **meta})


class ServerArgsError(ValueError):
    """One or more bad settings; ``problems`` lists each with what to change."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid server arguments:\n{lines}")


@dataclass
class ServerArgs:
    """Every setting of one launch. See ``sglang-launch --help`` for each field's meaning."""

    # Model
    model_path: str | None = _opt(
        None,
        "local model directory, GGUF file, or embedded model name: SmolLM2-135M-Instruct (chat, "
        "the default) or all-MiniLM-L6-v2 (embeddings)",
        metavar="PATH",
    )
    tokenizer_path: str | None = _opt(
        None,
        "directory of the tokenizer to use instead of the model's own (default: the model "
        "directory's, or the tokenizer a GGUF file carries)",
        metavar="PATH",
    )
    load_format: str = _opt(
        "auto",
        "how --model-path is read: 'auto' (a directory with config.json, or a GGUF file, by its "
        "suffix or content), 'gguf' (it must be a GGUF file)",
        choices=LOAD_FORMATS,
    )
    served_model_name: str | None = _opt(
        None, "model name reported by the API (default: from the path)"
    )
    # HTTP
    host: str = _opt("127.0.0.1", "address the HTTP server binds (loopback unless you change it)")
    port: int = _opt(30000, "TCP port of the HTTP server")
    api_key: str | None = field(
        default=None,
        repr=False,
        metadata={
            "help": "require this key as 'Authorization: Bearer KEY' on API requests; other "
            "local users can read a command line, so prefer --api-key-file or the "
            "SGLANG_API_KEY environment variable"
        },
    )
    api_key_file: str | None = _opt(
        None,
        "read the API key from the first line of this file (recommended; or set SGLANG_API_KEY)",
        metavar="PATH",
    )
    # Parallelism and nodes
    tp_size: int = _opt(1, "tensor-parallel size (ranks per data-parallel group)")
    dp_size: int = _opt(1, "data-parallel size (number of tensor-parallel groups)")
    nnodes: int = _opt(1, "number of nodes in the launch")
    node_rank: int = _opt(0, "rank of this node, 0 .. nnodes-1 (node 0 runs the HTTP server)")
    dist_init_addr: str | None = _opt(
        None, "HOST:PORT of the torch.distributed rendezvous (required with --nnodes > 1)"
    )
    # Device and numerics
    device: str | None = _opt(None, "torch device type (default: the selected platform's)")
    dtype: str = _opt(
        "auto",
        "model dtype (auto: the platform's choice, bfloat16 on a CPU with AVX512-BF16)",
        choices=DTYPES,
    )
    quantization: str | None = _opt(
        None, "weight quantization method (SGLang's names; served here: gguf)"
    )
    torchao_config: str | None = _opt(
        None, "weight-only quantization, as SGLang's torchao names it: int8wo, int4wo-<group>"
    )
    wide_step_tokens: int = _opt(
        8,
        "a step of at least this many tokens multiplies a quantized layer through the AMX kernel "
        "(bfloat16, a CPU with AMX) or a dense copy kept beside it; 0: neither (docs/weights.md)",
    )
    attention_backend: str | None = _opt(None, "attention backend (default: the platform's)")
    seed: int = _opt(0, "random seed")
    # Process supervision
    log_level: str = _opt("info", "log level of the launcher and its workers", choices=LOG_LEVELS)
    startup_timeout: float = _opt(300.0, "seconds every worker has to become ready")
    stop_grace_period: float = _opt(
        10.0, "seconds workers get to exit after SIGTERM before they are killed"
    )
    watchdog_timeout: float = _opt(
        300.0,
        "seconds a ready worker may go without a heartbeat, or a scheduler's step may run, "
        "before it counts as hung: /health turns 503 and the replica restarts or the launch "
        "stops with the root cause (0: off; SGLang's default; keep it above the longest step a "
        "model can take, a first compiled step included)",
    )
    restart_policy: str | None = _opt(
        None,
        "what happens when a scheduler replica (all tp ranks of one dp group) dies after the "
        "server was ready: 'on-failure' restarts that replica while the others keep serving, "
        "'never' stops the launch with the root cause (default: on-failure with --dp-size > 1 "
        "on one node, else never)",
        choices=RESTART_POLICIES,
    )
    max_restarts: int = _opt(
        3,
        "restarts each replica gets over the launch's life under --restart-policy on-failure; "
        "one more failure takes the replica out of service while another serves, and stops "
        "the launch with the root cause when it was the last",
    )
    restart_backoff: float = _opt(
        0.5,
        "seconds before a replica's first restart; each further restart of it waits twice as "
        "long, at most 30 s",
    )
    reload_surge: int = _opt(
        1,
        "replicas started beside the old ones while `sglang-launch reload` (or SIGHUP) replaces "
        "them one at a time: 1 starts each new replica next to the one it replaces, which "
        "serves until the new one has answered a request; 0 stops each old replica first, for "
        "machines without room for two copies of the model (with --dp-size 1 the server then "
        "answers no request until the new replica is ready: they wait up to --request-timeout)",
    )
    runtime: str = _opt(
        "srt", "which runtime's platforms and plugins the workers use", choices=RUNTIMES
    )
    scheduler_target: str | None = _opt(
        None,
        "dotted path of the worker function started once per rank (default: the runtime's own, "
        "the text scheduler for srt, the image worker for diffusion)",
        metavar="MODULE.FUNC",
    )
    http_target: str = _opt(
        "serving.http.server.run_http_server",
        "dotted path of the HTTP worker function ('' for none: the schedulers are reached some "
        "other way, and the launch is ready when they are)",
        metavar="MODULE.FUNC",
    )
    # Serving runtime
    max_batch_size: int = _opt(
        32,
        "most requests batched into one forward pass of embeddings or images; generation "
        "batches continuously up to --max-running-requests sequences, which defaults to this",
    )
    batch_wait_ms: float = _opt(2.0, "milliseconds a batch waits to fill up")
    max_input_tokens: int | None = _opt(
        None,
        "longest prompt accepted, in tokens (default: what the model allows: for generation "
        "one token less than the smaller of --context-length and the KV pool, for embeddings "
        "the model's own input limit)",
    )
    context_length: int | None = _opt(
        None,
        "longest prompt plus completion of one generation request, in tokens (SGLang's "
        "meaning; default and upper bound: the model's max_position_embeddings)",
    )
    max_total_tokens: int | None = _opt(
        None,
        "tokens of KV cache that all running generation sequences hold together, the pool "
        "(SGLang's meaning), allocated once at start-up: a sequence is admitted when its "
        "uncached prompt tokens + max_new_tokens fit beside the running ones' (the prefix "
        "cache gives up its least recently used entries for it), else it waits in the queue "
        "(default: from the device memory the "
        "platform reports available after loading: 80%% on an accelerator, 25%% on the CPU "
        "shared by its ranks and at most 65536, divided by the model's KV bytes per token)",
    )
    chunked_prefill_size: int | None = _opt(
        None,
        "most prompt tokens one prefill step computes: a longer prompt is prefilled over "
        "several steps while the running sequences keep decoding (SGLang's meaning; default: "
        "2048 on an accelerator, 256 on the CPU; -1: no chunking)",
    )
    page_size: int = _opt(
        1,
        "tokens per page of the KV pool: the allocator hands out whole pages and the prefix "
        "cache matches whole pages (SGLang's meaning)",
    )
    disable_radix_cache: bool = _opt(
        False,
        "turn off the radix prefix cache: no request reuses the KV of an earlier prompt's prefix "
        "(SGLang's flag)",
    )
    max_running_requests: int | None = _opt(
        None,
        "most generation sequences running (decoding or prefilling) at once (SGLang's "
        "meaning; default: --max-batch-size)",
    )
    max_request_bytes: int = _opt(1048576, "largest HTTP request body accepted, in bytes")
    request_timeout: float = _opt(
        600.0,
        "seconds the server has to answer an HTTP request before it answers 504 (0: no limit)",
    )
    http_header_timeout: float = _opt(
        10.0,
        "seconds a client has to send a request's headers before it gets 408 and is disconnected",
    )
    http_body_timeout: float = _opt(
        30.0, "seconds a client has to send a request's body after its headers (408 and disconnect)"
    )
    max_connections: int = _opt(
        1024, "most concurrent HTTP connections and requests; one more gets 503"
    )
    trust_remote_code: bool = _opt(False, "allow model code shipped with the model directory")
    chat_template: str | None = _opt(
        None,
        "a Jinja chat template file that /v1/chat/completions renders messages with, instead of "
        "the model's own (tokenizer_config.json or chat_template.jinja)",
        metavar="FILE",
    )
    grammar_backend: str = _opt(
        "xgrammar",
        "what compiles the grammars of constrained requests (response_format, json_schema, "
        "regex, ebnf): xgrammar, or none to refuse them with a 400 (SGLang's flag)",
        choices=GRAMMAR_BACKENDS,
    )
    tool_call_parser: str | None = _opt(
        None,
        "the format of the tool calls /v1/chat/completions reads in the model's text (SGLang's "
        "names; default: the one the chat template writes, else qwen25)",
        choices=TOOL_CALL_PARSERS,
    )
    # Compiled and captured steps (both runtimes)
    enable_torch_compile: bool = _opt(
        False,
        "compile with torch.compile, the backend and options from the platform: a generation "
        "model's decode step (SGLang's flag; docs/performance.md), a diffusion model's denoiser",
    )
    torch_compile_max_bs: int = _opt(
        32,
        "generation: the most rows of a decode step that runs compiled under "
        "--enable-torch-compile; a larger step runs eager (SGLang's flag)",
    )
    disable_cuda_graph: bool = _opt(
        False,
        "generation: do not run the decode step through the platform's graph runner "
        "(get_graph_runner_cls(), used where support_cuda_graph() is true) (SGLang's flag)",
    )
    cuda_graph_max_bs: int | None = _opt(
        None,
        "generation: the most rows of a decode step the platform's graph runner captures "
        "(default 32) (SGLang's flag)",
    )
    # Diffusion runtime
    dit_layerwise_offload: bool | None = _opt(
        None,
        "keep the denoiser's weights on the host and move one block at a time to the device "
        "(default: the diffusion platform's enable_dit_layerwise_offload_by_default())",
    )
    max_pixel_steps: int = _opt(
        1 << 30,
        "diffusion: the most width x height x n x num_inference_steps one image request may ask "
        "for (more is a 400 naming this limit); bounds what one request costs its replica",
    )
    enable_cfg_parallel: bool = _opt(
        False,
        "diffusion: run each replica on two ranks that split classifier-free guidance (rank 0 "
        "computes the conditional, rank 1 the unconditional noise prediction of each step; "
        "the same images as one rank, within float rounding); the pipeline must use CFG",
    )

    def __post_init__(self) -> None:
        """Fill in the runtime's worker target and turn ``--model-path`` into a path where it
        names an embedded model or is absent (the embedded default's file) (platform and plugin code reads ``model_path`` as a path string,
        as in SGLang), then let the runtime's selected platform set its defaults (the spec's
        lifecycle hook)."""
        if self.runtime not in SERVING:
            return  # check_server_args names the bad runtime
        spec = serving_spec(self.runtime)
        if self.scheduler_target is None:
            self.scheduler_target = spec.worker_target
        if spec.model_check is resolve_model:
            # None (no package): check_server_args says what to install.
            self.model_path = model_path_as_path(self.model_path)
        platforms = importlib.import_module(spec.platform.platform_module)
        platforms.current_platform.apply_server_args_defaults(self)

    def restart_policy_in_effect(self) -> str:
        """``--restart-policy``, or its default when unset: ``on-failure`` with several
        replicas on one node (the others serve while one restarts), else ``never`` (a single
        replica's restart is an outage the orchestrator should see; a replica spread over
        nodes is not restarted)."""
        if self.restart_policy:
            return self.restart_policy
        return ON_FAILURE if self.dp_size > 1 and self.nnodes == 1 else NEVER

    def replica_ranks(self) -> int:
        """Scheduler ranks per data-parallel replica: ``--tp-size``, times two with
        ``--enable-cfg-parallel``. The launch has ``replica_ranks() * dp_size`` ranks in all."""
        return self.tp_size * (2 if self.enable_cfg_parallel else 1)

    # -- command line ----------------------------------------------------------------------------
    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Add one ``--flag`` per field of ``cls`` to ``parser`` (defaults are the field defaults)."""
        hints = typing.get_type_hints(cls)
        group = parser.add_argument_group("server arguments")
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            option = flag(f.name)
            kind, optional = base_type(hints.get(f.name, str))
            default = field_default(f)
            meta = f.metadata
            kwargs: dict[str, Any] = {
                "dest": f.name,
                "default": default,
                "help": meta.get("help", ""),
            }
            if kind is bool:
                kwargs["action"] = argparse.BooleanOptionalAction
            else:
                kwargs["type"] = kind if kind in (int, float, str) else str
                if "choices" in meta:
                    kwargs["choices"] = meta["choices"]
                if "metavar" in meta:
                    kwargs["metavar"] = meta["metavar"]
                if default is not None and "help" in meta:
                    kwargs["help"] = f"{meta['help']} (default: {default})"
            group.add_argument(option, **kwargs)
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> Self:
        """Build ``cls`` from a namespace parsed with ``add_cli_args`` (missing names keep defaults)."""
        names = [f.name for f in dataclasses.fields(cls) if f.init]
        return cls(**{n: getattr(args, n) for n in names if hasattr(args, n)})

    # -- validation ------------------------------------------------------------------------------
    def check_server_args(self) -> None:
        """Raise ``ServerArgsError`` listing every bad setting and what to change."""
        problems = type_problems(self)
        if problems:  # range checks on wrongly typed values would only add noise
            raise ServerArgsError(problems)

        def need(ok: bool, text: str) -> None:
            if not ok:
                problems.append(text)

        need(bool(self.host), "--host is empty; pass an address such as 127.0.0.1 or 0.0.0.0")
        need(1 <= self.port <= 65535, f"--port {self.port} is out of range; use 1..65535")
        for name in (
            "tp_size",
            "dp_size",
            "nnodes",
            "max_batch_size",
            "max_input_tokens",
            "max_request_bytes",
            "max_pixel_steps",
        ):
            value = getattr(self, name)
            if value is not None:
                need(value >= 1, f"{flag(name)} {value} must be at least 1")
        need(
            0 <= self.node_rank < max(self.nnodes, 1),
            f"--node-rank {self.node_rank} must be in 0..{max(self.nnodes, 1) - 1} (--nnodes {self.nnodes})",
        )
        from launchspec.rendezvous import RendezvousError, parse_dist_init_addr

        try:
            parse_dist_init_addr(self.dist_init_addr, self.nnodes)
        except RendezvousError as exc:
            problems.append(str(exc))
        world = self.replica_ranks() * self.dp_size
        if self.nnodes >= 1 and world >= 1:
            need(
                world % self.nnodes == 0,
                f"{_ranks_text(self)} = {world} ranks cannot be "
                f"split evenly over --nnodes {self.nnodes}; make the product a multiple of nnodes",
            )
        need(self.seed >= 0, f"--seed {self.seed} must be 0 or more")
        need(
            self.startup_timeout > 0,
            f"--startup-timeout {self.startup_timeout} must be more than 0 seconds",
        )
        for name in ("request_timeout", "http_header_timeout", "http_body_timeout"):
            value = getattr(self, name)
            need(value >= 0, f"{flag(name)} {value} must be 0 (no limit) or more seconds")
        need(
            self.max_connections >= 1,
            f"--max-connections {self.max_connections} must be at least 1",
        )
        need(
            self.watchdog_timeout >= 0,
            f"--watchdog-timeout {self.watchdog_timeout} must be 0 (off) or more seconds",
        )
        need(
            self.stop_grace_period >= 0,
            f"--stop-grace-period {self.stop_grace_period} must be 0 or more seconds",
        )
        need(
            self.restart_policy in (None, *RESTART_POLICIES),
            f"--restart-policy {self.restart_policy!r} is not one of {', '.join(RESTART_POLICIES)}",
        )
        need(
            not (self.restart_policy == ON_FAILURE and self.nnodes > 1),
            f"--restart-policy on-failure restarts replicas on one node only, not with --nnodes "
            f"{self.nnodes}; use --restart-policy never and let the orchestrator restart the nodes",
        )
        need(
            self.reload_surge in (0, 1),
            f"--reload-surge {self.reload_surge} must be 1 (a new replica starts beside the old "
            "one) or 0 (the old one stops first)",
        )
        need(self.max_restarts >= 0, f"--max-restarts {self.max_restarts} must be 0 or more")
        need(
            self.restart_backoff >= 0,
            f"--restart-backoff {self.restart_backoff} must be 0 or more seconds",
        )
        need(self.batch_wait_ms >= 0, f"--batch-wait-ms {self.batch_wait_ms} must be 0 or more")
        if self.chat_template is not None:
            need(
                os.path.isfile(self.chat_template) and os.access(self.chat_template, os.R_OK),
                f"--chat-template {self.chat_template!r} is not a readable file; pass the path "
                f"of a Jinja chat template",
            )
        if self.max_total_tokens is not None and self.max_input_tokens is not None:
            need(
                self.max_total_tokens >= self.max_input_tokens,
                f"--max-total-tokens {self.max_total_tokens} is below --max-input-tokens "
                f"{self.max_input_tokens}; raise it or lower --max-input-tokens (it is the KV "
                f"pool of all running sequences, SGLang's meaning; --context-length bounds one "
                f"request)",
            )
        if self.context_length is not None:
            need(
                self.context_length >= 2,
                f"--context-length {self.context_length} must be at least 2 (a prompt token "
                f"and a completion token)",
            )
        if self.chunked_prefill_size is not None:
            need(
                self.chunked_prefill_size >= 1 or self.chunked_prefill_size == -1,
                f"--chunked-prefill-size {self.chunked_prefill_size} must be at least 1, or -1 "
                f"for no chunking",
            )
        need(
            self.page_size >= 1,
            f"--page-size {self.page_size} must be at least 1 (tokens per page of the KV pool)",
        )
        if self.max_running_requests is not None:
            need(
                self.max_running_requests >= 1,
                f"--max-running-requests {self.max_running_requests} must be at least 1",
            )
        need(
            self.wide_step_tokens >= 0,
            f"--wide-step-tokens {self.wide_step_tokens} must be at least 1, or 0 for no dense "
            f"copy of a quantized weight",
        )
        need(
            self.torch_compile_max_bs >= 1,
            f"--torch-compile-max-bs {self.torch_compile_max_bs} must be at least 1",
        )
        if self.cuda_graph_max_bs is not None:
            need(
                self.cuda_graph_max_bs >= 1,
                f"--cuda-graph-max-bs {self.cuda_graph_max_bs} must be at least 1",
            )
        if self.tokenizer_path is not None:
            need(
                os.path.isdir(self.tokenizer_path),
                f"--tokenizer-path {self.tokenizer_path!r} "
                + ("is a file" if os.path.isfile(self.tokenizer_path) else "does not exist")
                + "; pass the folder that holds the tokenizer's files (tokenizer.json, "
                "tokenizer_config.json), or leave it out to use the model's own (a GGUF file's "
                "own tokenizer)",
            )
        need(
            self.grammar_backend != "llguidance",
            "--grammar-backend llguidance is not supported by this server (it has no llguidance "
            "backend); use xgrammar (the default) or none",
        )
        need(
            self.tool_call_parser in (None, *TOOL_CALL_PARSERS),
            f"--tool-call-parser {self.tool_call_parser!r} is not one of {', '.join(TOOL_CALL_PARSERS)}",
        )
        for name in ("dtype", "log_level", "runtime", "load_format", "grammar_backend"):
            choices = dataclasses.fields(self)[_index(self, name)].metadata.get("choices", ())
            value = getattr(self, name)
            need(value in choices, f"{flag(name)} {value!r} is not one of {', '.join(choices)}")
        for name in ("scheduler_target", "http_target"):
            value = getattr(self, name) or ""
            need(
                bool(_DOTTED.match(value)) or (name == "http_target" and value == ""),
                f"{flag(name)} {value!r} is not a dotted path; use package.module.function"
                + (" (or '' for no HTTP worker)" if name == "http_target" else ""),
            )
        spec = SERVING.get(self.runtime)
        if spec is not None and not spec.tensor_parallel and self.tp_size > 1:
            problems.append(
                f"--runtime {self.runtime} has no tensor parallelism, not --tp-size "
                f"{self.tp_size}; use --tp-size 1 and --dp-size for more replicas"
                + (
                    " (or --enable-cfg-parallel for two ranks per replica)"
                    if spec.cfg_parallel
                    else ""
                )
            )
        if spec is not None and self.enable_cfg_parallel:
            cfg_runtimes = [s.name for s in SERVING.values() if s.cfg_parallel]
            need(
                spec.cfg_parallel,
                f"--enable-cfg-parallel splits the classifier-free guidance of --runtime "
                f"{' or '.join(cfg_runtimes)}; --runtime {self.runtime} has none: drop the flag"
                + (" (--tp-size splits its models)" if spec.tensor_parallel else ""),
            )
            need(
                self.nnodes == 1,
                f"--enable-cfg-parallel keeps both ranks of a replica on one node, not --nnodes "
                f"{self.nnodes}; serve on one node (scale with --dp-size)",
            )
        if spec is not None and self.scheduler_target in (None, spec.worker_target):
            # The runtime's own worker needs its model on disk: say so now, before any worker
            # starts (the check is standard library only; another engine's target checks its own).
            try:
                source = spec.model_check(self.model_path, self.served_model_name)
            except ValueError as exc:
                problems.append(str(exc))
            else:
                problems.extend(model_file_problems(self, source))
                if spec.tensor_parallel:
                    # Facts of the model that decide whether the arguments can work (an encoder with
                    # --tp-size 2): from its config.json, so the launch stops before any worker starts.
                    from launchspec.model_config import read_model_facts, tp_problems

                    problems.extend(
                        tp_problems(read_model_facts(source.path), self.tp_size, self.dp_size)
                    )
        if problems:
            raise ServerArgsError(problems)


# -- payload ---------------------------------------------------------------------------------
def encode_server_args(args: ServerArgs) -> bytes:
    """The opaque payload of ``args`` for ``bootstrap.ProcessSpec.payload`` (versioned msgpack)."""
    return encode_payload(args)


def decode_server_args(data: bytes, cls: type[ServerArgs] | None = None) -> ServerArgs:
    """Rebuild the ServerArgs in ``data`` as ``cls`` (default: this module's ``ServerArgs``, looked
    up now, so a REPLACE hook applies). Raises ``PayloadError`` for a corrupt or mismatched
    payload, naming the cause."""
    target: type[ServerArgs] = cls if cls is not None else globals()["ServerArgs"]
    return decode_payload(data, target)


# -- helpers ---------------------------------------------------------------------------------
def _ranks_text(args: ServerArgs) -> str:
    """How the launch's rank count is made, as the flags say it."""
    cfg = " x 2 (--enable-cfg-parallel)" if args.enable_cfg_parallel else ""
    return f"--tp-size {args.tp_size}{cfg} x --dp-size {args.dp_size}"


def _index(obj: ServerArgs, name: str) -> int:
    return [f.name for f in dataclasses.fields(obj)].index(name)


__all__ = [
    "PayloadError",
    "ServerArgs",
    "ServerArgsError",
    "decode_server_args",
    "encode_server_args",
]
