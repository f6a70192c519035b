"""``DiffGenerator``: offline image generation from a script, through the same workers.

``DiffGenerator.from_pretrained(model_path=..., **options)`` starts a diffusion launch with
``launcher.Launcher`` (the same supervisor, bootstrap and local ``spawn`` context as the CLI):
the workers and the HTTP child, bound to a free loopback port and guarded by a random API key
only this object knows. ``generate(...)`` sends OpenAI's images request there and returns PIL
images; a refused value raises ``ValueError`` with the server's message (the field and its
limit). ``close()`` (or leaving the ``with`` block) stops every process of the launch.

This module imports only the standard library; Pillow is imported by ``generate``. Scripts
follow the spec's layout: ``from launcher import DiffGenerator`` at module scope (a lazy name),
everything else under ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import base64
import io
import json
import secrets
import socket
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from PIL.Image import Image

    from launcher.embedded import Launcher


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class DiffGenerator:
    """A running diffusion launch that generates images for this process."""

    def __init__(self, launcher: Launcher, url: str, api_key: str) -> None:
        self.launcher = launcher
        self.url = url
        self._api_key = api_key

    @classmethod
    def from_pretrained(cls, model_path: str, **options: Any) -> DiffGenerator:
        """Start the workers for the diffusers pipeline directory ``model_path``; ``options`` are
        ``ServerArgs`` fields (``dp_size``, ``dtype``, ``enable_torch_compile``...). Returns once
        every worker is ready; raises ``LaunchError`` (with the root cause) if the launch fails."""
        from launcher.embedded import Launcher

        for reserved in ("runtime", "host", "api_key", "http_target"):
            if reserved in options:
                raise TypeError(
                    f"DiffGenerator.from_pretrained sets {reserved} itself; leave it out"
                )
        port = options.pop("port", None) or _free_port()
        api_key = secrets.token_urlsafe(24)
        launcher = Launcher(
            runtime="diffusion",
            model_path=str(model_path),
            host="127.0.0.1",
            port=port,
            api_key=api_key,
            **options,
        )
        launcher.start()
        return cls(launcher, f"http://127.0.0.1:{port}", api_key)

    def generate(
        self,
        prompt: str,
        *,
        negative_prompt: str | None = None,
        n: int = 1,
        width: int | None = None,
        height: int | None = None,
        num_inference_steps: int | None = None,
        guidance_scale: float | None = None,
        seed: int | None = None,
        timeout: float | None = None,
    ) -> list[Image]:
        """``n`` images (``PIL.Image.Image``) for ``prompt``; ``None`` leaves a value to the
        pipeline's default (a random seed for ``seed``). ``ValueError`` names a refused value."""
        from PIL import Image as PILImage

        body = {
            "prompt": prompt,
            "negative_prompt": negative_prompt,
            "n": n,
            "width": width,
            "height": height,
            "num_inference_steps": num_inference_steps,
            "guidance_scale": guidance_scale,
            "seed": seed,
            "output_format": "png",
        }
        request = urllib.request.Request(
            self.url + "/v1/images/generations",
            json.dumps({k: v for k, v in body.items() if v is not None}).encode(),
            {"Content-Type": "application/json", "Authorization": f"Bearer {self._api_key}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                data = json.load(response)
        except urllib.error.HTTPError as exc:
            try:
                message = json.load(exc)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = f"HTTP {exc.code}"
            if 400 <= exc.code < 500:
                raise ValueError(message) from None
            raise RuntimeError(f"image generation failed: {message}") from None
        images: list[Image] = []
        for item in data["data"]:
            image = PILImage.open(io.BytesIO(base64.b64decode(item["b64_json"])))
            image.load()
            images.append(image)
        return images

    def close(self) -> None:
        """Stop every process of the launch (idempotent)."""
        self.launcher.stop()

    def __enter__(self) -> DiffGenerator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
