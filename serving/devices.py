"""The devices a scheduler rank sees on its node, asked of torch inside the worker (the
supervisor never imports torch): how many there are of a kind, and whether a rank's device is
among them; and what to say when the selected platform cannot run a model at all."""

from __future__ import annotations

from typing import TYPE_CHECKING

from serving.errors import ModelLoadError

if TYPE_CHECKING:
    import torch

    from platforms import SRTPlatform


def visible_devices(device_type: str) -> int | None:
    """How many ``device_type`` devices torch sees on this node; None for the CPU (and meta), or
    a kind torch has no count of."""
    import torch

    if device_type in ("cpu", "meta"):
        return None
    module = getattr(torch, device_type, None)
    count = getattr(module, "device_count", None)
    return None if count is None else int(count())


def check_device_visible(device: torch.device) -> None:
    """``ModelLoadError`` when ``device`` (an accelerator with an index) is not among the devices
    torch sees on this node, which happens when a node runs more ranks than it has devices."""
    if device.index is None:
        return
    visible = visible_devices(device.type)
    if visible is None:
        return
    if device.index >= visible:
        raise ModelLoadError(
            f"this rank would run on {device}, but torch sees {visible} {device.type} device(s) on this "
            f"node; each scheduler rank on a node takes its own device, so run at most {visible} rank(s) "
            f"per node (--dp-size x --tp-size / --nnodes), or make more devices visible "
            f"(CUDA_VISIBLE_DEVICES or your platform's equivalent)"
        )


def cannot_run_message(platform: SRTPlatform, exc: BaseException) -> str:
    """Why ``platform`` cannot run a model (it raised ``exc``, a ``NotImplementedError``), and the
    fix. A plugin platform won selection over the built-ins, so the fix is in the plugin: no
    variable that selection ignores while a plugin activates (``SGLANG_USE_CPU_ENGINE``) is
    suggested for it."""
    cls = platform.__class__  # the vendor's class, also through the current_platform proxy
    name = f"{cls.__module__}.{cls.__qualname__}"
    if platform.is_out_of_tree():
        return (
            f"the selected platform plugin {name} cannot run a model ({exc}); implement that method in "
            f"the plugin (sglang-launch check-platform lists every method a launch needs and fails "
            f"while one is missing), or turn the plugin off or uninstall it to use another platform"
        )
    return (
        f"the selected platform {name} cannot run a model ({exc}); on a machine without an "
        f"accelerator set SGLANG_USE_CPU_ENGINE=1 to serve on the CPU, otherwise install the platform "
        f"plugin for this hardware (sglang-launch plugins shows what is installed and why it did not "
        f"activate)"
    )
