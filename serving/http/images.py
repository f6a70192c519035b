"""The diffusion runtime's API route: OpenAI's ``POST /v1/images/generations``.

``add_image_routes(kit)`` is the runtime table's ``api_routes`` for diffusion; the HTTP child's
``create_app`` calls it with a ``serving.http.app.RouteKit`` and serves the ``Route`` it
returns like every other: API key, body limit, JSON errors naming the field (``param``),
metrics, ``/openapi.json``, disconnect handling and least-loaded routing over the ``--dp-size``
replicas. Images come back as ``b64_json`` (``response_format: "url"`` is a 400 that names
``b64_json``: this server keeps no files). Bounds a client can break without the pipeline are
checked here (an empty prompt, ``n``, steps, the size's form); what needs the pipeline (a size
that is not a multiple of its VAE factor, more steps than its scheduler has) is checked by the
worker, also as a 400 naming the field.

With ``stream: true`` the answer is server-sent events (``serving.http.streaming.event_stream``,
the mechanism text generation streams with), named after OpenAI's image streaming events; the
JSON answer is ``responses.ImagesResponse``:

- ``event: image_generation.progress`` after each denoising step, data
  ``{"type", "step", "total_steps", "created_at"}`` (``responses.ImageProgressEvent``; ``step``
  counts from 1 to ``total_steps``; one step advances all ``n`` images of the request, so there
  is one event per step);
- ``event: image_generation.completed`` for each image, data ``{"type", "index", "b64_json",
  "seed", "size", "output_format", "num_inference_steps", "created_at"}``
  (``responses.ImageCompletedEvent``);
- ``data: [DONE]``.

A failure once streaming is ``event: error`` with the usual ``{"error": {...}}`` before
``[DONE]``; one before the first step (a refused value) is a plain JSON 4xx.
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Iterator
from functools import partial
from typing import Annotated, Any

from starlette.responses import Response

from serving import wire
from serving.http.app import Route, RouteKit, error_response, json_response
from serving.http.asgi import Receive
from serving.http.responses import (
    COMPLETED,
    PROGRESS,
    ImageCompletedEvent,
    ImageData,
    ImageProgressEvent,
    ImagesResponse,
)
from serving.http.schemas import Body, BodyError, bound, doc
from serving.http.streaming import event_stream, sse

MAX_IMAGES = 10
MAX_STEPS = 1000
MAX_SIDE = 4096
MAX_GUIDANCE = 100.0
MAX_SEED = (1 << 63) - 1 - MAX_IMAGES
OUTPUT_FORMATS = ("png", "jpeg", "webp")
_SIZE = re.compile(r"^\s*([0-9]+)\s*[xX]\s*([0-9]+)\s*$", re.ASCII)  # ASCII digits only


class ImageGenerationRequest(Body, kw_only=True):
    """OpenAI ``POST /v1/images/generations`` plus the diffusion knobs SGLang accepts."""

    prompt: Annotated[str, doc("what to draw", minLength=1)]
    negative_prompt: Annotated[str | None, doc("what to steer away from")] = None
    model: Annotated[str | None, doc("must name the served model when given")] = None
    n: Annotated[int, doc("how many images", minimum=1, maximum=MAX_IMAGES)] = 1
    size: Annotated[str | None, doc("WIDTHxHEIGHT, e.g. 512x512 (or width and height)")] = None
    width: Annotated[int | None, doc("image width in pixels", minimum=1, maximum=MAX_SIDE)] = None
    height: Annotated[int | None, doc("image height in pixels", minimum=1, maximum=MAX_SIDE)] = None
    num_inference_steps: Annotated[
        int | None, doc("denoising steps", minimum=1, maximum=MAX_STEPS)
    ] = None
    guidance_scale: Annotated[
        float | None, doc("classifier-free guidance", minimum=0, maximum=MAX_GUIDANCE)
    ] = None
    seed: Annotated[
        int | None, doc("image i starts from the noise of seed + i", minimum=0, maximum=MAX_SEED)
    ] = None
    response_format: Annotated[str, doc("only b64_json", enum=["b64_json"])] = "b64_json"
    output_format: Annotated[str, doc("image encoding", enum=list(OUTPUT_FORMATS))] = "png"
    stream: Annotated[
        bool,
        doc(
            "answer with server-sent events: image_generation.progress after each denoising "
            "step, image_generation.completed for each image, then [DONE]"
        ),
    ] = False
    user: Annotated[str | None, doc("accepted and ignored")] = None

    def check(self, prefix: str = "") -> None:
        if not self.prompt.strip():
            raise BodyError("prompt must not be empty; send the text to draw", "prompt")
        if self.response_format != "b64_json":
            raise BodyError(
                f'response_format {self.response_format!r} is not supported; use "b64_json" '
                f"(this server returns images inline and keeps no files to link to)",
                "response_format",
            )
        if self.output_format not in OUTPUT_FORMATS:
            raise BodyError(
                f"output_format must be one of {', '.join(OUTPUT_FORMATS)}, not "
                f"{self.output_format!r}",
                "output_format",
            )
        bound(self.n, "n", 1, MAX_IMAGES)
        if self.num_inference_steps is not None:
            bound(self.num_inference_steps, "num_inference_steps", 1, MAX_STEPS)
        if self.guidance_scale is not None:
            bound(self.guidance_scale, "guidance_scale", 0.0, MAX_GUIDANCE)
        if self.seed is not None:
            bound(self.seed, "seed", 0, MAX_SEED)
        for name in ("width", "height"):
            value = getattr(self, name)
            if value is not None:
                bound(value, name, 1, MAX_SIDE)
        if self.size is not None:
            match = _SIZE.match(self.size)
            if not match:
                raise BodyError(
                    f'size {self.size!r} is not WIDTHxHEIGHT; send e.g. "512x512"', "size"
                )
            for name, value in (("width", int(match.group(1))), ("height", int(match.group(2)))):
                given = getattr(self, name)
                if given is not None and given != value:
                    raise BodyError(
                        f"size {self.size!r} and {name} {given} disagree; send one of them", "size"
                    )
                if not 1 <= value <= MAX_SIDE:
                    raise BodyError(
                        f"size {self.size!r}: {name} must be between 1 and {MAX_SIDE}", "size"
                    )
                setattr(self, name, value)


def image_events(reply: wire.ImageProgress | wire.Images, output_format: str) -> Iterator[bytes]:
    """The server-sent events of one answer to a streamed request (see the module docstring)."""
    created = int(time.time())
    if isinstance(reply, wire.ImageProgress):
        progress = ImageProgressEvent(
            step=reply.step, total_steps=reply.total_steps, created_at=created
        )
        yield sse(progress, PROGRESS)
        return
    for i, blob in enumerate(reply.images):
        image = ImageCompletedEvent(
            index=i,
            b64_json=base64.b64encode(blob).decode("ascii"),
            seed=reply.seed + i,
            size=f"{reply.width}x{reply.height}",
            output_format=output_format,
            num_inference_steps=reply.steps,
            created_at=created,
        )
        yield sse(image, COMPLETED)


async def generate_images(
    kit: RouteKit, body: ImageGenerationRequest, receive: Receive
) -> Response:
    """``POST /v1/images/generations``: ``ImagesResponse``, or with ``stream`` the events of
    ``image_events``."""
    refused = kit.wrong_model(body.model)
    if refused:
        return refused
    dispatcher, metrics = kit.state.dispatcher, kit.state.metrics

    def request(rid: str) -> wire.ImageRequest:
        return wire.ImageRequest(
            rid,
            body.prompt,
            n=body.n,
            negative_prompt=body.negative_prompt,
            width=body.width,
            height=body.height,
            steps=body.num_inference_steps,
            guidance_scale=body.guidance_scale,
            seed=body.seed,
            output_format=body.output_format,
            stream=body.stream,
        )

    if body.stream:

        def render(reply: wire.ImageProgress | wire.Images) -> Iterator[bytes]:
            if isinstance(reply, wire.Images):
                metrics.observe_result(reply.batch_size, 0)
            return image_events(reply, body.output_format)

        return await event_stream(dispatcher.call(request), render, receive, "error")
    reply: wire.Images | None = await kit.unless_disconnected(receive, dispatcher.one(request))
    if reply is None:
        return error_response(499, "the client went away")
    metrics.observe_result(reply.batch_size, 0)
    return json_response(
        ImagesResponse(
            created=int(time.time()),
            model=kit.state.served_name,
            data=[
                ImageData(b64_json=base64.b64encode(blob).decode("ascii"), seed=reply.seed + i)
                for i, blob in enumerate(reply.images)
            ],
            output_format=body.output_format,
            size=f"{reply.width}x{reply.height}",
            num_inference_steps=reply.steps,
        )
    )


def add_image_routes(kit: RouteKit) -> list[Route[Any]]:
    """The diffusion runtime's routes for the HTTP child's app (see the module docstring)."""
    return [
        Route(
            "POST",
            "/v1/images/generations",
            partial(generate_images, kit),
            "text-to-image generation (OpenAI shape; images as b64_json; stream with "
            "server-sent events)",
            ImageGenerationRequest,
            events=f"`event: {PROGRESS}` after each denoising step, data {{type, step, "
            f"total_steps, created_at}} (step counts from 1; one step advances every image of "
            f"the request); `event: {COMPLETED}` for each image, data {{type, index, b64_json, "
            f"seed, size, output_format, num_inference_steps, created_at}}; then "
            f"`data: [DONE]`. A failure once streaming is `event: error` with "
            f'{{"error": {{...}}}} before [DONE].',
            response=ImagesResponse,
            stream=(ImageProgressEvent, ImageCompletedEvent),
            kind="image",
        )
    ]
