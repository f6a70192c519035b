"""The smallest request of each kind of model, and whether an answer to it is one: how the HTTP
child checks that a replica serves (a reload's probe of a joining replica, ``/health_generate``)."""

from __future__ import annotations

from serving import wire
from serving.http.dispatcher import MakeRequest

PROBE_TEXT = "reload probe"
PROBED_KINDS = ("embedding", "generation", "image")  # the kinds that have a probe request


def probe_request(kind: str | None, purpose: str = PROBE_TEXT) -> MakeRequest:
    """The smallest request of a model of ``kind``: one vector, one greedy token, one denoising
    step; a ping for a kind the HTTP child has no request of. ``purpose`` is its text (and its
    fairness group), so that a scheduler's log tells a probe from a user's request."""
    if kind == "embedding":
        return lambda rid: wire.EmbedRequest(rid, [purpose])
    if kind == "generation":
        params = wire.SamplingParams(max_new_tokens=1, temperature=0.0, ignore_eos=True)
        return lambda rid: wire.GenerateRequest(rid, purpose, params, group=purpose)
    if kind == "image":
        return lambda rid: wire.ImageRequest(rid, purpose, steps=1)
    return wire.Ping


def probe_problem(reply: object) -> str | None:
    """What is wrong with a probe's answer (None: it is one)."""
    if isinstance(reply, wire.Embeddings):
        return None if reply.dim > 0 and reply.vectors else "it answered an empty embedding"
    if isinstance(reply, wire.Generated):
        return None
    if isinstance(reply, wire.Images):
        return None if reply.images else "it answered no image"
    return f"it answered {type(reply).__name__}, not a result"
