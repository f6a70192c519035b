"""The grammar backend of a text scheduler rank, and the grammar object of one sequence.

``create_grammar_backend(server_args, tokenizer, vocab_size, eos_token_ids)`` (SGLang's name and
arguments, a hook target) returns the backend that ``--grammar-backend`` names, or None for
``none``. A backend compiles the grammar of a request's ``SamplingParams`` (``grammar_key``:
``("json_schema" | "regex" | "ebnf", text)``) into a ``BaseGrammarObject`` per sequence:

- ``get_future_value(key)``: the compile runs in the backend's worker thread, never on the
  scheduler's step; the result (or the error) is cached by ``key``, so a grammar that many
  requests share compiles once. ``get_value(key)`` waits for it (a tensor-parallel follower,
  which must apply the same grammar as rank 0 at the step rank 0 admitted the sequence).
- A compile that fails raises ``GrammarError``, whose message names the problem; the request
  gets a 400.

A grammar object, each step of its sequence: ``apply_vocab_mask(logits)`` sets every token the
grammar does not allow next to ``-inf`` in the sequence's logits row (vocab,), before sampling,
greedy and log-probabilities; ``accept_token(token)`` advances it over the token picked;
``is_terminated()``: the grammar is complete and ended (its stop token accepted).

A plugin replaces or wraps the backend by hooking ``create_grammar_backend`` (its SGLang name
resolves here): a ``REPLACE`` returns any object with ``get_future_value`` and ``get_value``
whose grammar objects have the three methods above.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from launchspec.server_args import ServerArgs
    from serving.wire import SamplingParams

log = logging.getLogger("sglang_launch.grammar")

# The request fields that carry a grammar (SGLang's sampling_params names), in the order checked.
GRAMMAR_KINDS = ("json_schema", "regex", "ebnf")
# Compiled grammars (or their errors) a backend keeps, the least recently used dropped first.
CACHE_ENTRIES = 512

GrammarKey = tuple[str, str]


class GrammarError(ValueError):
    """A grammar that does not compile: the message names the field and the problem."""


def grammar_key(params: SamplingParams) -> GrammarKey | None:
    """``(kind, text)`` of the grammar ``params`` names, or None for an unconstrained request."""
    for kind in GRAMMAR_KINDS:
        text = getattr(params, kind)
        if text is not None:
            return kind, text
    return None


class BaseGrammarObject:
    """One sequence's position in its grammar (see the module docstring)."""

    def accept_token(self, token: int) -> None:
        raise NotImplementedError

    def apply_vocab_mask(self, logits: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def is_terminated(self) -> bool:
        raise NotImplementedError


class BaseGrammarBackend:
    """Compiles grammars in one worker thread and caches them by key; a subclass says how
    (``compile``, returning what ``new_grammar`` makes a sequence's grammar object of)."""

    name = "base"

    def __init__(self) -> None:
        self._cache: OrderedDict[GrammarKey, Future[Any]] = OrderedDict()
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="grammar-compile", initializer=_yield_to_steps
        )

    def compile(self, kind: str, text: str) -> Any:
        """The compiled form of grammar ``text`` of ``kind``; ``GrammarError`` when it fails."""
        raise NotImplementedError

    def new_grammar(self, compiled: Any) -> BaseGrammarObject:
        """A fresh grammar object (the start of the grammar) from a compiled grammar."""
        raise NotImplementedError

    def _compile(self, key: GrammarKey) -> Any:
        try:
            return self.compile(*key)
        except GrammarError:
            raise
        except Exception as exc:  # the backend's own error type: named, with its message
            raise GrammarError(f"{key[0]} does not compile: {_clean(exc)}") from None

    def get_future_value(self, key: GrammarKey) -> Future[Any]:
        """The compile of ``key``, started now in the worker thread unless cached; its result is
        passed to ``new_grammar`` once done."""
        with self._lock:
            future = self._cache.get(key)
            if future is not None:
                self._cache.move_to_end(key)
                return future
            future = self._executor.submit(self._compile, key)
            self._cache[key] = future
            while len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)
            return future

    def get_value(self, key: GrammarKey) -> BaseGrammarObject:
        """A grammar object for ``key``, waiting for its compile (``GrammarError`` if it fails)."""
        return self.new_grammar(self.get_future_value(key).result())

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _yield_to_steps() -> None:
    """Run the compile thread under Linux's ``SCHED_IDLE`` policy (a thread has its own): it
    takes the CPU time the step's threads leave, so on a machine whose cores the step uses a
    compile does not slow the running requests' steps (their threads wait for each other)."""
    try:
        os.sched_setscheduler(threading.get_native_id(), os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux, or not permitted: the default priority
        pass


def _clean(exc: BaseException) -> str:
    """A backend error's message without the C++ source position some backends prefix."""
    text = str(exc).strip()
    lines = [
        line.split(": ", 1)[1] if ".cc:" in line.split(": ", 1)[0] else line
        for line in text.splitlines()
        if line.strip()
    ]
    return " ".join(line.strip() for line in lines) or type(exc).__name__


def create_grammar_backend(
    server_args: ServerArgs,
    tokenizer: Any,
    vocab_size: int,
    eos_token_ids: set[int] | None = None,
) -> BaseGrammarBackend | None:
    """The backend ``--grammar-backend`` names for a model with this tokenizer, logits of
    ``vocab_size`` and these end-of-sequence tokens; None for ``none``. ``ImportError`` when
    the backend's package is not installed (the scheduler then answers constrained requests
    with a 400 naming it)."""
    name = server_args.grammar_backend
    if name == "none":
        return None
    if name != "xgrammar":
        raise ValueError(f"--grammar-backend {name!r} is not served; use xgrammar or none")
    from serving.srt.constrained.xgrammar_backend import XGrammarGrammarBackend

    return XGrammarGrammarBackend(tokenizer, vocab_size, sorted(eos_token_ids or ()))


def backend_for_rank(
    server_args: ServerArgs, tokenizer: Any, model_config: Any, eos_ids: set[int]
) -> tuple[BaseGrammarBackend | None, str]:
    """``(backend, refusal)`` of a generation rank: the backend ``create_grammar_backend`` makes
    for this model (None for ``--grammar-backend none`` or a backend that is not installed), and
    then the message a constrained request gets, which names the fix. A backend that cannot be
    made for this model (not installed, or its tokenizer unreadable to it) is logged and leaves
    the server serving everything else."""
    text_config = (
        model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    )
    vocab_size = int(text_config.vocab_size)
    try:
        backend = create_grammar_backend(server_args, tokenizer, vocab_size, eos_ids)
    except ImportError as exc:
        log.warning("constrained requests are refused: %s", exc)
        return None, (
            f"constrained decoding needs the {server_args.grammar_backend} package, which is not "
            f"installed here ({exc}); install it (pip install {server_args.grammar_backend}) "
            "and restart, or leave the grammar out"
        )
    except Exception as exc:  # noqa: BLE001 - e.g. a vocabulary the backend cannot read
        log.warning(
            "constrained requests are refused: %s cannot serve this model: %s",
            server_args.grammar_backend,
            exc,
        )
        return None, (
            f"--grammar-backend {server_args.grammar_backend} cannot constrain this model's "
            f"tokens ({type(exc).__name__}: {exc}); leave the grammar out"
        )
    if backend is None:
        return None, (
            f"this server runs with --grammar-backend {server_args.grammar_backend}, so it "
            "enforces no grammar; leave response_format, json_schema, regex and ebnf out, or "
            "restart it with --grammar-backend xgrammar"
        )
    return backend, ""
