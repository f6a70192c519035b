"""The demo diffusion platform (zero-argument constructible, its own runtime's ``OOT``)."""

from demo_platform_plugin import _backend
from demo_platform_plugin.device import DemoDeviceMixin
from platforms.diffusion import Platform, PlatformEnum


class DemoDiffusionPlatform(Platform, DemoDeviceMixin):
    _enum = PlatformEnum.OOT
    dispatch_key = "CPU"  # tensors live on the CPU, so direct torch.library kernels register there

    def get_dispatch_key_name(self) -> str:
        return "demo"

    def get_attn_backend_cls_str(self, selected_backend=None, head_size: int = 0, dtype=None) -> str:
        return "torch.nn.functional.scaled_dot_product_attention"

    def init_backend(self) -> None:
        _backend.init_backend()
