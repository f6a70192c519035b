"""What a scheduler says of its node's devices (``serving.devices``), asked of torch: none to
count for the CPU, torch's own count for an accelerator kind (0 of them on a machine without
one), and a rank placed past the visible devices is refused naming the fix."""

from __future__ import annotations

import pytest
import torch

from serving.devices import check_device_visible, visible_devices
from serving.errors import ModelLoadError


def test_the_cpu_has_no_count_and_an_accelerator_kind_has_torchs():
    assert visible_devices("cpu") is None and visible_devices("meta") is None
    assert visible_devices("cuda") == torch.cuda.device_count()
    assert visible_devices("no-such-device") is None


@pytest.mark.skipif(torch.cuda.device_count() > 0, reason="needs a machine without CUDA devices")
def test_a_rank_past_the_visible_devices_is_refused_with_the_fix():
    check_device_visible(torch.device("cpu"))  # nothing to check
    with pytest.raises(ModelLoadError, match=r"cuda:0, but torch sees 0 cuda device\(s\)"):
        check_device_visible(torch.device("cuda", 0))
