"""The demo SRT platform."""

from demo_platform_plugin import _backend
from demo_platform_plugin.device import DemoDeviceMixin
from platforms import PlatformEnum
from platforms.interface import SRTPlatform


class DemoSRTPlatform(SRTPlatform, DemoDeviceMixin):
    _enum = PlatformEnum.OOT

    def get_default_attention_backend(self) -> str:
        return "torch_native"

    def get_dispatch_key_name(self) -> str:
        return "demo"

    def apply_server_args_defaults(self, server_args) -> None:
        """Use the torch-native attention backend unless the operator chose one."""
        if getattr(server_args, "attention_backend", "unset") is None:
            server_args.attention_backend = "torch_native"

    def init_backend(self) -> None:
        _backend.init_backend()
