"""The demo device: the host CPU under another name. Device operations come from the built-in
CPU device; the identity (``OOT``) comes from each runtime's platform class."""

from platforms.builtin.cpu import CpuDevice


class DemoDeviceMixin(CpuDevice):
    device_name = "demo"
    device_type = "cpu"  # a real torch device type: tensors land on the CPU

    def get_device_name(self, device_id: int = 0) -> str:
        return f"Demo accelerator (CPU underneath: {super().get_device_name(device_id)})"

    def get_device_uuid(self, device_id: int = 0) -> str:
        return "demo-" + super().get_device_uuid(device_id)
