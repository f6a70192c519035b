"""How the HTTP child turns a chat's messages into the prompt text a generation model continues.

``ChatTemplate.load(model_path, override)`` loads the model directory's tokenizer once, at the
HTTP child's start-up or in a thread after a reload (``load_tokenizer``: local files only, and no
torch for a model with a ``tokenizer.json``), takes its chat template, or the Jinja template in the file ``--chat-template`` names
instead, and renders one conversation with it (``warm``) so that the template is compiled before
the first request. ``render(messages)``
is the model's prompt for the conversation with the assistant's turn opened (the template's
generation prompt). The rendered text holds the special tokens the template writes (a BOS token,
turn markers), so it goes to the scheduler with ``GenerateRequest.raw``: tokenised as it is, with
no special tokens added a second time.

A model without a template, and no ``--chat-template``, serves no chat: ``render`` raises
``BodyError`` (a 400) naming ``--chat-template``. So does a model whose tokenizer could not be
loaded here, naming why. A template that rejects the conversation (many refuse roles that do not
alternate) is a 400 with the template's own message.

Tools (``serving.http.tools``): ``renders_tools`` says whether the template reads the ``tools``
variable; ``render(..., tools=plan)`` hands it the request's tools, or, when it does not read
them, the fallback prompt. Earlier calls and tool results in the messages are rendered either
way (``tools.conversation``).
"""

from __future__ import annotations

import functools
import logging
import re
from pathlib import Path
from typing import Any

from serving.detokenize import TextDecoder
from serving.http.schemas import BodyError, ChatMessage
from serving.http.tool_parsers import FORMATS, infer_parser
from serving.http.tools import ToolPlan, conversation, with_fallback_prompt

log = logging.getLogger("sglang_launch.http")


class ChatTemplateError(RuntimeError):
    """``--chat-template`` names a file that is not a usable Jinja template (start-up fails)."""


class ChatTemplate:
    """The chat template of the served model: ``source`` says where it comes from (``model``,
    ``--chat-template PATH``; None: there is none, and ``reason`` says why)."""

    def __init__(
        self,
        tokenizer: Any,
        template: str | None,
        source: str | None,
        reason: str = "",
    ) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.source = source
        self.reason = reason
        # The decoder of streams the scheduler answers with token ids (``TextDecoder.identity``
        # names it in each streamed request); None when the tokenizer's decode is its own.
        self.decoder: TextDecoder | None = None

    @classmethod
    def load(
        cls, model_path: str, override: str | None = None, trust_remote_code: bool = False
    ) -> ChatTemplate:
        """The template of the model in ``model_path`` (``override``: the path of a Jinja file
        that replaces it). A tokenizer that cannot be loaded leaves no template, with the
        reason; an ``override`` that cannot be read or parsed raises ``ChatTemplateError``."""
        template = source = None
        if override:
            template = read_template(override)
            source = f"--chat-template {override}"
        try:
            tokenizer = load_tokenizer(model_path, trust_remote_code)
        except Exception as exc:  # noqa: BLE001 - chat is refused with the reason; others serve
            log.warning("no chat template: cannot load the tokenizer in %s: %s", model_path, exc)
            return cls(None, None, None, f"its tokenizer could not be loaded ({exc})")
        own = tokenizer.chat_template
        if isinstance(own, dict):  # named templates: the default one serves chat
            own = own.get("default")
        own = own if isinstance(own, str) else None
        if template is None and own:
            template, source = own, "model"
        reason = (
            ""
            if template
            else "it has no chat template (tokenizer_config.json or chat_template.jinja)"
        )
        chat = cls(tokenizer, template, source, reason)
        chat.warm()
        decoder = TextDecoder(tokenizer)
        chat.decoder = decoder if decoder.identity else None
        return chat

    def warm(self) -> None:
        """Render one conversation now, so that the first chat request finds the template
        compiled and the tokenizer's Jinja support imported (nothing to load on the event loop)."""
        if self.template is None:
            return
        try:
            self.render([ChatMessage(role="user", content="hello")], "")
        except BodyError:  # a template may refuse this conversation: it is compiled anyway
            pass

    @functools.cached_property
    def renders_tools(self) -> bool:
        """Whether the template reads the ``tools`` variable (a template that renders tools)."""
        if not self.template:
            return False
        try:
            import jinja2.meta
            import jinja2.sandbox

            env = jinja2.sandbox.ImmutableSandboxedEnvironment(
                extensions=["jinja2.ext.loopcontrols"]
            )
            return "tools" in jinja2.meta.find_undeclared_variables(env.parse(self.template))
        except Exception:  # noqa: BLE001 - a tag of transformers' own: read the text instead
            return re.search(r"\btools\b", self.template) is not None

    def tool_parser(self, configured: str | None) -> str:
        """The ``--tool-call-parser`` in effect: ``configured``, else the one the template's
        text names (``tool_parsers.infer_parser``)."""
        return configured or infer_parser(self.template)

    def render(
        self,
        messages: list[ChatMessage],
        served_name: str,
        tools: ToolPlan | None = None,
        parser: str | None = None,
    ) -> str:
        """The prompt text of ``messages`` with the assistant's turn opened (``tools``: the
        request's plan; ``parser``: ``--tool-call-parser``); ``BodyError`` when there is no
        template or the template refuses the conversation."""
        if self.tokenizer is None or self.template is None:
            raise BodyError(
                f"model {served_name!r} has no chat: {self.reason}; start the server with "
                f"--chat-template FILE (a Jinja chat template), or use /v1/completions",
                "messages",
            )
        fmt = FORMATS[self.tool_parser(parser)]
        conv = conversation(messages, self.renders_tools, fmt)
        extra: dict[str, Any] = {}
        if tools is not None and self.renders_tools:
            extra["tools"] = tools.template_tools()
        elif tools is not None:
            conv = with_fallback_prompt(conv, tools.fallback_prompt())
        try:
            text = self.tokenizer.apply_chat_template(
                conv,
                **extra,
                chat_template=self.template,
                add_generation_prompt=True,
                tokenize=False,
            )
        except Exception as exc:  # noqa: BLE001 - Jinja's errors and the template's own raise
            raise BodyError(
                f"the chat template ({self.source}) refused the messages: {exc}", "messages"
            ) from None
        if not isinstance(text, str):  # a batch of conversations is never sent
            raise TypeError(f"apply_chat_template gave {type(text).__name__}, not the text")
        return text

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` as the scheduler counts a ``raw`` prompt."""
        return len(self.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


def load_tokenizer(model_path: str, trust_remote_code: bool = False) -> Any:
    """The tokenizer of the model in ``model_path`` (local files only): its ``tokenizer.json``
    through transformers' fast tokenizer class, which needs no torch, else (no such file, or
    ``trust_remote_code``: the model may bring a class of its own) ``AutoTokenizer``, which
    imports torch. The HTTP child only renders and counts with it, which the fast class does as
    the model's own class does."""
    if not trust_remote_code and (Path(model_path) / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast

        try:
            return PreTrainedTokenizerFast.from_pretrained(model_path, local_files_only=True)
        except Exception as exc:  # noqa: BLE001 - the model's own class may still load it
            log.debug(
                "the fast tokenizer of %s did not load (%s): trying AutoTokenizer", model_path, exc
            )
    import transformers

    return transformers.AutoTokenizer.from_pretrained(
        model_path, local_files_only=True, trust_remote_code=trust_remote_code
    )


def read_template(path: str) -> str:
    """The text of the Jinja template at ``path``, parsed once; ``ChatTemplateError`` says why
    it cannot be used."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ChatTemplateError(
            f"--chat-template {path}: cannot read the file ({exc}); pass a readable Jinja file"
        ) from None
    import jinja2
    import jinja2.sandbox

    try:
        jinja2.sandbox.ImmutableSandboxedEnvironment().parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(
            f"--chat-template {path}: not a valid Jinja template (line {exc.lineno}: "
            f"{exc.message}); fix the template"
        ) from None
    if not text.strip():
        raise ChatTemplateError(f"--chat-template {path} is empty; pass a Jinja chat template")
    return text
