"""The size of a generation replica's KV pool, and which waiting sequence is admitted next.

The pool (``--max-total-tokens``, SGLang's name and meaning) is the KV cache of every running
sequence and of the prefix cache together, in tokens (``serving.srt.mem_cache``). By default it
is a fraction of the device memory the platform reports available once the model is loaded
(``get_available_memory``, else ``get_device_total_memory``), divided by the model's KV bytes per
token; on the CPU that memory is shared by every rank of the node and the pool is capped.

Fairness: when more sequences wait than can be admitted, the one whose group (the HTTP request
it belongs to) has the fewest running sequences goes first, oldest first among equals; so one
request of many prompts delays a small request by at most the sequences it already runs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from serving.errors import ModelLoadError

if TYPE_CHECKING:
    import torch

    from platforms import SRTPlatform

# The share of the memory available after loading that the pool may take: an accelerator
# keeps the rest for activations; the CPU leaves the host room for everything else it runs.
ACCELERATOR_FRACTION = 0.8
CPU_FRACTION = 0.25
CPU_CAP_TOKENS = 65536


def kv_bytes_per_token(config: Any, dtype: torch.dtype, tp_size: int = 1) -> int:
    """Bytes of KV cache one token takes on one rank: keys and values of every layer, for the
    rank's share of the key/value heads."""
    import torch

    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    layers = int(getattr(text, "num_hidden_layers", 0) or 1)
    heads = int(getattr(text, "num_attention_heads", 0) or 1)
    kv_heads = int(getattr(text, "num_key_value_heads", 0) or heads)
    head_dim = (
        getattr(text, "head_dim", None) or int(getattr(text, "hidden_size", 0) or 64) // heads
    )
    local = max(1, kv_heads // max(tp_size, 1))
    size = torch.empty((), dtype=dtype).element_size()
    return max(1, 2 * layers * local * int(head_dim) * size)


def default_pool_tokens(
    platform: SRTPlatform, device: torch.device, bytes_per_token: int, ranks_sharing: int = 1
) -> int:
    """The pool size from the platform's memory figures (the module docstring)."""
    index = device.index or 0
    failures = (NotImplementedError, RuntimeError, AttributeError, TypeError, ValueError)
    try:
        available = int(platform.get_available_memory(index)[0])
    except failures:
        try:
            available = int(platform.get_device_total_memory(index))
        except failures as exc:
            raise ModelLoadError(
                f"cannot size the KV pool: platform {platform.__class__.__name__} reports no memory "
                f"figures ({type(exc).__name__}: {exc}); pass --max-total-tokens N (the tokens of "
                f"KV cache all running sequences may hold together)"
            ) from exc
    cpu = platform.is_cpu() or device.type == "cpu"
    share = CPU_FRACTION / max(ranks_sharing, 1) if cpu else ACCELERATOR_FRACTION
    tokens = int(available * share) // bytes_per_token
    return max(1, min(tokens, CPU_CAP_TOKENS) if cpu else tokens)


class Waiting(Protocol):
    """What admission reads of a waiting sequence."""

    @property
    def group(self) -> str: ...


W = TypeVar("W", bound=Waiting)


def admit_fairly(
    waiting: Sequence[W],
    running_groups: Iterable[str],
    *,
    room: int,
    reserve: Callable[[W], bool],
) -> list[W]:
    """Which of ``waiting`` (oldest first) to admit now, in order: at most ``room``, each the
    one whose group has the fewest running sequences (``running_groups``: the group of each
    running sequence; those admitted here count from then on), while ``reserve`` finds room
    for it (and takes it). Admission stops at the first that does not fit, so a large sequence
    is not passed over for ever."""
    running = Counter(running_groups)
    left = list(waiting)
    chosen: list[W] = []
    while left and len(chosen) < room:
        best = min(range(len(left)), key=lambda i: (running[left[i].group], i))
        item = left[best]
        if not reserve(item):
            break
        chosen.append(item)
        running[item.group] += 1
        del left[best]
    return chosen
