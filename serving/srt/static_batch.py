"""Static batching: a batch of sequences decoded together until the longest one ends.

The text runtime batches generation continuously (``serving.srt.engine``). This loop remains
for two uses only: the benchmark's comparison with static batching (a scheduler started with
the private environment switch ``STATIC_SWITCH`` set to ``1`` batches this way), and models
whose KV cache the continuous batch cannot pad and join (``engine.UnsupportedCache``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from serving.srt.sampling import Sequence, select_token

if TYPE_CHECKING:
    from serving.srt.model_runner import ModelRunner

STATIC_SWITCH = "_SGLANG_LAUNCH_STATIC_BATCHING"


def static_batching_requested() -> bool:
    """Whether this process was started with the benchmark's static-batching switch."""
    return os.environ.get(STATIC_SWITCH, "") == "1"


def generate_static(
    runner: ModelRunner,
    seqs: list[Sequence],
    emit: Callable[[Sequence], None] | None = None,
    cancelled: Callable[[], Iterable[str]] | None = None,
) -> list[Sequence]:
    """Decode every sequence until it finishes; ``emit(seq)`` after each step a streaming
    sequence advanced and once when any sequence finishes. ``cancelled()`` (rank 0) names
    rids to stop, checked before each step; they finish with reason ``"abort"``. Every rank of
    a tensor-parallel replica calls it with the same sequences."""
    import torch

    decode = runner._decode
    batch = len(seqs)
    width = max(len(s.prompt_ids) for s in seqs)
    ids = torch.full((batch, width), runner.pad_id, dtype=torch.long)
    mask = torch.zeros((batch, width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s.prompt_ids) :] = torch.tensor(s.prompt_ids)
        mask[i, width - len(s.prompt_ids) :] = 1
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    device = runner.device
    ids, mask, positions = ids.to(device), mask.to(device), positions.to(device)
    cache = runner.new_cache()
    reported: set[int] = set()
    with runner.platform.inference_mode():
        step_input = ids
        while True:
            logits = runner.forward_logits(step_input, mask, positions, cache).float().cpu()
            stop_now = _cancel_flags(runner, seqs, cancelled)
            next_tokens = []
            for i, s in enumerate(seqs):
                if not s.finished:
                    if stop_now[i]:
                        s.finish_reason = "abort"
                    else:
                        row = s.apply_penalties(logits[i])
                        token = select_token(row, s.params, s.sampler())
                        s.note_logprob(row, token, runner.token_text)
                        s.advance(token, runner.eos_ids, decode)
                next_tokens.append(s.output_ids[-1] if s.output_ids else runner.pad_id)
                if emit is not None and i not in reported and (s.stream or s.finished):
                    emit(s)
                    if s.finished:
                        reported.add(i)
            if all(s.finished for s in seqs):
                break
            step_input = torch.tensor(next_tokens, dtype=torch.long, device=device)[:, None]
            mask = torch.cat([mask, torch.ones((batch, 1), dtype=mask.dtype, device=device)], 1)
            positions = positions[:, -1:] + 1
    runner.platform.synchronize()
    return seqs


def _cancel_flags(
    runner: ModelRunner, seqs: list[Sequence], cancelled: Callable[[], Iterable[str]] | None
) -> list[bool]:
    gone = set(cancelled()) if cancelled is not None else set()
    flags = [s.rid in gone for s in seqs]
    if runner.tp_size > 1:
        from serving.distributed import broadcast_flags

        flags = broadcast_flags(flags)
    return flags
