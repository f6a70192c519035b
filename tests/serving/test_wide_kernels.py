"""The kernels of a wide step (many rows) on the CPU: the int4 and int8 AMX kernels
(``serving.srt.layers.quantization.amx``) and sibling linears merged into one product
(``serving.srt.layers.merged_linear``).

The AMX tests run the real kernel: this machine's CPU has AMX-BF16. On one without it they are
skipped with the reason ``amx.unavailable_reason()`` gives, which is also what a server there
does (it keeps PyTorch's kernels)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support.serving import build_tiny_llama

pytestmark = pytest.mark.e2e  # builds the kernel with the C compiler, loads models (seconds)

torch = pytest.importorskip("torch")

from launchspec.model_source import embedding_model_dir, resolve_model  # noqa: E402
from platforms.builtin.cpu import CpuSRTPlatform  # noqa: E402
from serving.srt.layers.quantization import amx, int4_from_float, int8_from_float  # noqa: E402
from serving.srt.model_runner import ModelRunner  # noqa: E402


def needs_amx() -> None:
    if amx.kernel() is None:
        pytest.skip(f"no AMX kernel here: {amx.unavailable_reason()}")


def int4_weight(out: int, inp: int, group: int) -> tuple:
    """Random int4 values with their scales and zeros, and the dense bfloat16 weight they are
    worth (one rounding of ``(q - 8) * scale + zero``, as the kernel computes it)."""
    q, scale, zero = int4_from_float(torch.randn(out, inp) * 0.05, group)
    scale, zero = scale.to(torch.bfloat16), zero.to(torch.bfloat16)
    expand = lambda t: t.float().repeat_interleave(group, dim=1)  # noqa: E731
    dense = ((q.float() - 8) * expand(scale) + expand(zero)).to(torch.bfloat16)
    return q, scale, zero, dense


@pytest.mark.parametrize("group", [32, 64])
def test_the_amx_kernel_computes_the_dense_product_of_the_int4_values(group):
    """For odd block counts (48 columns: three blocks of 16), every row count around a tile's 16
    rows, and a bias: the product equals the dense weight's to bfloat16's rounding."""
    needs_amx()
    q, scale, zero, dense = int4_weight(48, 128, group)
    packed, scale_and_zero = amx.int4_layout(q, scale, zero)
    bias = torch.randn(48, dtype=torch.bfloat16)
    for rows in (1, 5, 15, 16, 17, 33):
        x = torch.randn(rows, 128, dtype=torch.bfloat16)
        want = x.float() @ dense.float().t() + bias.float()
        got = amx.int4_mm(x, packed, scale_and_zero, bias, group).float()
        assert got.shape == (rows, 48)
        assert torch.allclose(got, want, rtol=2e-2, atol=2e-2), (rows, (got - want).abs().max())
        alone = amx.int4_mm(x, packed, scale_and_zero, None, group).float()
        assert torch.allclose(alone + bias.float(), got, rtol=2e-2, atol=2e-2)


def test_the_amx_kernel_computes_the_dense_product_of_the_int8_values():
    """int8 with a scale per output row (``--torchao-config int8wo``, a GGUF file's Q8_0)."""
    needs_amx()
    qweight, scales = int8_from_float(torch.randn(48, 96) * 0.05, torch.bfloat16)
    dense = (qweight.float() * scales.float()[:, None]).to(torch.bfloat16)
    packed, packed_scales = amx.int8_layout(qweight, scales)
    bias = torch.randn(48, dtype=torch.bfloat16)
    for rows in (1, 16, 17, 40):
        x = torch.randn(rows, 96, dtype=torch.bfloat16)
        want = x.float() @ dense.float().t() + bias.float()
        got = amx.int8_mm(x, packed, packed_scales, bias).float()
        assert torch.allclose(got, want, rtol=2e-2, atol=2e-2), (rows, (got - want).abs().max())


def test_setting_the_environment_variable_to_0_keeps_pytorchs_kernels():
    """``SGLANG_LAUNCH_NATIVE_KERNELS=0``: no C kernel, and the reason names the variable."""
    code = (
        "from serving.srt.layers.quantization import amx; "
        "from serving.srt.layers.attention import decode_kernel; "
        "print(amx.kernel() is None, amx.unavailable_reason()); "
        "print(decode_kernel.KERNEL.library() is None, decode_kernel.KERNEL.reason())"
    )
    env = {**os.environ, "SGLANG_LAUNCH_NATIVE_KERNELS": "0"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["True SGLANG_LAUNCH_NATIVE_KERNELS=0 is set"] * 2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama", embedding_model_dir())


def reference_linears(path) -> dict:
    """Each linear's weight as transformers loads it in bfloat16 (no packing, no merging)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    return {name: m.weight.detach() for name, m in model.named_modules() if hasattr(m, "weight")}


def test_merged_siblings_answer_each_call_with_the_product_of_its_own_input(tiny):
    """In bfloat16 (packed linears) q/k/v and gate/up of every layer share one product. Each
    member still returns its own product of the input it is given: the same object in
    succession (one computation), another input, or a member called twice."""
    served = ModelRunner(resolve_model(tiny), platform=CpuSRTPlatform(), dtype="bfloat16")
    weights = reference_linears(tiny)
    attn = served.model.get_submodule("model.layers.0.self_attn")
    assert attn.q_proj._merged is attn.k_proj._merged is attn.v_proj._merged
    mlp = served.model.get_submodule("model.layers.1.mlp")
    assert mlp.gate_proj._merged is mlp.up_proj._merged is not attn.q_proj._merged

    def want(name, x):
        return torch.nn.functional.linear(x.float(), weights[name].float())

    def close(got, expected):
        return torch.allclose(got.float(), expected, rtol=2e-2, atol=2e-2)

    x = torch.randn(1, 16, 64, dtype=torch.bfloat16)
    y = torch.randn(1, 16, 64, dtype=torch.bfloat16)
    p = "model.layers.0.self_attn."
    with torch.inference_mode():
        q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        assert q.shape == (1, 16, 64) and k.shape == v.shape == (1, 16, 32)
        assert close(q, want(p + "q_proj", x)) and close(k, want(p + "k_proj", x))
        assert close(v, want(p + "v_proj", x))
        assert close(attn.q_proj(x), want(p + "q_proj", x))  # a new round
        assert close(attn.k_proj(y), want(p + "k_proj", y))  # another input: its own product
        assert close(attn.k_proj(y), want(p + "k_proj", y))  # the same member twice
        assert close(attn.v_proj(x), want(p + "v_proj", x))  # back to the first input
        g = "model.layers.1.mlp."
        assert close(mlp.up_proj(y), want(g + "up_proj", y))
        assert close(mlp.gate_proj(y), want(g + "gate_proj", y))
