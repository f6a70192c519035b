"""Weight quantization schemes: what ``--quantization`` and ``--torchao-config`` ask for, and
what the platform makes of it.

Names are SGLang's: ``--torchao-config int8wo`` (int8 weight-only, a scale per output channel)
and ``--torchao-config int4wo-<group>`` (int4 weight-only, a scale and a zero point per group of
``<group>`` input values, group 32, 64, 128 or 256); ``--quantization gguf`` serves a GGUF file's
quantized tensors as the file stores them, which a GGUF ``--model-path`` does by default. Other
``--quantization`` methods SGLang knows (``fp8``, ``awq``, ...) are refused by name.

The platform decides (``resolve``): a scheme outside its ``supported_quantization`` (when that
list is not empty) is refused, and ``get_quantization_config(scheme)`` may refuse it (raise),
substitute another (return a scheme name), accept it (return None or a config object) or say
nothing (the contract's default raises ``NotImplementedError``: the scheme is used as asked).
The launcher calls ``resolve`` before any worker starts (a refusal is exit 2, ``QuantizationError``
naming what is supported); every scheduler calls it again on its own platform instance.

Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# The weight-only schemes the SRT runtime implements (``int4wo`` stands for every group size).
IMPLEMENTED = ("int8wo", "int4wo", "gguf")
INT4_GROUPS = (32, 64, 128, 256)
# SGLang's --torchao-config values this runtime does not implement (refused by name).
_TORCHAO_OTHERS = ("int8dq", "fp8wo", "fp8dq-per_tensor", "fp8dq-per_row")
_INT4 = re.compile(r"^int4wo-(\d+)$")


class QuantizationError(ValueError):
    """A scheme that cannot be served; the message names it, why, and what is supported."""


@dataclass(frozen=True)
class Scheme:
    """One weight scheme: ``method`` ``int8wo``, ``int4wo`` (with ``group_size``) or ``gguf``."""

    method: str
    group_size: int | None = None

    @property
    def name(self) -> str:
        """``int8wo``, ``int4wo-128``, ``gguf``: the name the flags and the platform use."""
        return f"int4wo-{self.group_size}" if self.method == "int4wo" else self.method


@dataclass(frozen=True)
class Resolved:
    """What a launch serves: ``scheme`` (None: weights at ``--dtype``), what was ``asked``, and
    ``note`` (the platform's substitution, or why an implicit scheme was dropped; "" if none);
    ``config``: what the platform's ``get_quantization_config`` returned, when an object."""

    scheme: Scheme | None
    asked: str | None
    note: str = ""
    config: Any = None


def parse(name: str, flag: str = "--torchao-config") -> Scheme:
    """The ``Scheme`` a name stands for, or ``QuantizationError`` naming the supported ones."""
    text = name.strip().lower()
    if text in ("int8wo", "gguf"):
        return Scheme(text)
    match = _INT4.match(text)
    if match:
        group = int(match.group(1))
        if group not in INT4_GROUPS:
            raise QuantizationError(
                f"{flag} {name}: int4 weight-only needs a group size of "
                f"{', '.join(map(str, INT4_GROUPS))}; pass int4wo-128, for example"
            )
        return Scheme("int4wo", group)
    unknown = "is not implemented by this runtime" if _known(text) else "is not a scheme"
    raise QuantizationError(
        f"{flag} {name!r} {unknown}; the supported weight schemes are {supported_text()}"
    )


def _known(text: str) -> bool:
    return text in _TORCHAO_OTHERS or text.startswith(("fp8", "awq", "gptq", "w8a8", "int4wo"))


def supported_text(platform_list: list[str] | tuple[str, ...] | None = None) -> str:
    """The schemes as the flags spell them (limited to ``platform_list`` when it is not empty)."""
    spelled = {
        "int8wo": "--torchao-config int8wo",
        "int4wo": f"--torchao-config int4wo-<group> (group {'/'.join(map(str, INT4_GROUPS))})",
        "gguf": "--quantization gguf (a GGUF file's own tensors, the default for a .gguf path)",
    }
    names = [m for m in IMPLEMENTED if not platform_list or m in _methods(platform_list)]
    return "; ".join(spelled[m] for m in names) or "none"


def _methods(names: list[str] | tuple[str, ...]) -> set[str]:
    return {str(n).lower().partition("-")[0] for n in names}


def asked_scheme(quantization: str | None, torchao_config: str | None) -> str | None:
    """The scheme the flags ask for, as a name, or None (both flags given is an error)."""
    if quantization and torchao_config:
        raise QuantizationError(
            f"--quantization {quantization} and --torchao-config {torchao_config} both name the "
            f"weights' scheme; pass one of them"
        )
    if torchao_config:
        return parse(torchao_config).name
    if quantization:
        if quantization.strip().lower() in ("torchao",):
            raise QuantizationError(
                "--quantization torchao needs the scheme: pass --torchao-config int8wo or "
                "--torchao-config int4wo-128 instead"
            )
        return parse(quantization, "--quantization").name
    return None


def resolve(
    platform: Any,
    quantization: str | None,
    torchao_config: str | None,
    *,
    gguf_file: bool = False,
) -> Resolved:
    """The scheme served on ``platform`` for these flags (``gguf_file``: the model is a GGUF file,
    served at its own precision unless the flags say otherwise). ``QuantizationError`` when the
    flags name a scheme the runtime or the platform refuses; an implicit GGUF scheme the platform
    refuses is dropped (the file's tensors dequantised to ``--dtype``), with a ``note``."""
    asked = asked_scheme(quantization, torchao_config)
    if asked == "gguf" and not gguf_file:
        raise QuantizationError(
            "--quantization gguf serves a GGUF file's own tensors, but --model-path is not a "
            ".gguf file; drop --quantization, or use --torchao-config int8wo / int4wo-128"
        )
    implicit = asked is None and gguf_file
    wanted = "gguf" if implicit else asked
    if wanted is None:
        return Resolved(None, None)
    try:
        scheme, note, config = _ask_platform(platform, parse(wanted))
    except QuantizationError as exc:
        if not implicit:
            raise
        return Resolved(None, None, f"the file's tensors are dequantised: {exc}")
    return Resolved(scheme, wanted, note, config)


def _ask_platform(platform: Any, scheme: Scheme) -> tuple[Scheme, str, Any]:
    who = platform.__class__.__qualname__  # the real class behind a lazy current_platform
    supported = list(getattr(platform, "supported_quantization", None) or [])
    if supported and scheme.method not in _methods(supported) and scheme.name not in supported:
        raise QuantizationError(
            f"the platform {who} does not support quantization {scheme.name!r} (its "
            f"supported_quantization: {', '.join(map(str, supported))}); use "
            f"{supported_text(supported)}, or drop the flag to serve the weights at --dtype"
        )
    try:
        answer = platform.get_quantization_config(scheme.name)
    except NotImplementedError:
        return scheme, "", None
    except Exception as exc:  # noqa: BLE001 - the platform's refusal, in its words
        raise QuantizationError(
            f"the platform {who} refuses quantization {scheme.name!r}: {exc}; use "
            f"{supported_text(supported)} where the platform allows it, or drop the flag to "
            f"serve the weights at --dtype"
        ) from exc
    if isinstance(answer, str) and answer.strip().lower() != scheme.name:
        try:
            other = parse(answer)
        except QuantizationError as exc:
            raise QuantizationError(
                f"the platform {who} substitutes {answer!r} for quantization {scheme.name!r}, "
                f"which this runtime cannot serve ({exc}); report it to the platform's "
                f"maintainers, or drop the flag"
            ) from exc
        return other, f"{other.name} (the platform {who} substituted it for {scheme.name})", None
    return scheme, "", None if isinstance(answer, str) else answer
