"""The diffusion runtime's API route: OpenAI's ``POST /v1/images/generations``.

``add_image_routes(kit)`` is the runtime table's ``api_routes`` for diffusion; the HTTP child
calls it with a ``launcher.workers.app.RouteKit``, so the route shares the text routes' server:
API key, body limit, JSON errors, metrics, disconnect handling and least-loaded routing over
the ``--dp-size`` replicas. Images come back as ``b64_json`` (``response_format: "url"`` is a
400 that names ``b64_json``: this server keeps no files). Bounds a client can break without the
pipeline are checked here (empty prompt, ``n``, steps, size format); what needs the pipeline
(a size that is not a multiple of its VAE factor) is checked by the worker, also as a 400.
"""

from __future__ import annotations

import base64
import re
import time
from typing import Literal

from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from launcher.workers import messages as m
from launcher.workers.client import SchedulerError

MAX_IMAGES = 10
MAX_STEPS = 1000
MAX_SIDE = 4096
MAX_SEED = (1 << 63) - 1 - MAX_IMAGES
_SIZE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")


class ImageGenerationRequest(BaseModel):
    """OpenAI ``POST /v1/images/generations`` plus the diffusion knobs SGLang accepts."""

    model_config = ConfigDict(extra="ignore")

    prompt: str = Field(description="what to draw")
    negative_prompt: str | None = Field(None, description="what to steer away from")
    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_IMAGES, description="how many images")
    size: str | None = Field(None, description="WIDTHxHEIGHT, e.g. 512x512 (or width and height)")
    width: int | None = Field(None, ge=1, le=MAX_SIDE)
    height: int | None = Field(None, ge=1, le=MAX_SIDE)
    num_inference_steps: int | None = Field(None, ge=1, le=MAX_STEPS)
    guidance_scale: float | None = Field(None, ge=0.0, le=100.0)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    response_format: str = Field("b64_json", description="only b64_json")
    output_format: Literal["png", "jpeg", "webp"] = "png"
    user: str | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("prompt must not be empty; send the text to draw")
        return value

    @field_validator("response_format")
    @classmethod
    def _format(cls, value: str) -> str:
        if value != "b64_json":
            raise ValueError(f"response_format {value!r} is not supported; use \"b64_json\" (this "
                             f"server returns images inline and keeps no files to link to)")
        return value

    @model_validator(mode="after")
    def _size(self):
        if self.size is not None:
            match = _SIZE.match(self.size)
            if not match:
                raise ValueError(f"size {self.size!r} is not WIDTHxHEIGHT; send e.g. \"512x512\"")
            width, height = int(match.group(1)), int(match.group(2))
            for name, value, given in (("width", width, self.width), ("height", height, self.height)):
                if given is not None and given != value:
                    raise ValueError(f"size {self.size!r} and {name} {given} disagree; send one of them")
                if not 1 <= value <= MAX_SIDE:
                    raise ValueError(f"size {self.size!r}: {name} must be between 1 and {MAX_SIDE}")
            self.width, self.height = width, height
        return self


def add_image_routes(kit) -> None:
    """Add ``POST /v1/images/generations`` to the HTTP child's app (see the module docstring)."""
    state, client, metrics = kit.state, kit.state.client, kit.state.metrics

    @kit.json_post("/v1/images/generations", ImageGenerationRequest,
                   "text-to-image generation (OpenAI shape; images as b64_json)")
    async def images(body: ImageGenerationRequest, receive) -> Response:
        kit.check_model(body.model)
        request = lambda rid: m.ImageRequest(  # noqa: E731
            rid, body.prompt, n=body.n, negative_prompt=body.negative_prompt, width=body.width,
            height=body.height, steps=body.num_inference_steps, guidance_scale=body.guidance_scale,
            seed=body.seed, output_format=body.output_format)
        reply = await kit.unless_disconnected(receive, client.one(request))
        if reply is None:
            return Response(status_code=499)
        if not isinstance(reply, m.Images):
            raise SchedulerError(500, f"the worker answered {type(reply).__name__} to an image request")
        metrics.observe_result(reply.batch_size, 0)
        from launcher.workers.app import json_response

        return json_response({
            "created": int(time.time()),
            "model": state.served_name,
            "data": [{"b64_json": base64.b64encode(blob).decode("ascii"), "seed": reply.seed + i}
                     for i, blob in enumerate(reply.images)],
            "output_format": body.output_format,
            "size": f"{reply.width}x{reply.height}",
            "num_inference_steps": reply.steps,
        })
