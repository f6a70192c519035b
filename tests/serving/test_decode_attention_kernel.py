"""The decode attention's C kernel (``serving.srt.layers.attention.decode_kernel``): each row's
query heads attend to its own slots of the KV pool, read in place, as exact float32 attention
over the same values does (to bfloat16's rounding of the output).

It runs the real kernel: this machine's CPU has AVX-512 BF16. On one without it the test is
skipped with the reason the kernel gives, and the backend keeps PyTorch's path."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e  # builds the kernel with the C compiler (a second, once)

torch = pytest.importorskip("torch")

from serving.srt.layers.attention import decode_kernel  # noqa: E402


def exact(q, keys, values, slots, lengths, scale):
    rows, heads, _ = q.shape
    group = heads // keys.shape[1]
    out = []
    for r in range(rows):
        mine = slots[r, : int(lengths[r])]
        k, v = keys[mine].float(), values[mine].float()
        out.append(
            torch.stack(
                [
                    torch.softmax(q[r, h].float() @ k[:, h // group].T * scale, -1)
                    @ v[:, h // group]
                    for h in range(heads)
                ]
            )
        )
    return torch.stack(out)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "v_dim"), [(9, 3, 64, 64), (4, 4, 128, 128), (8, 2, 32, 64)]
)
def test_every_row_attends_to_its_own_slots_of_the_pool(heads, kv_heads, dim, v_dim):
    if decode_kernel.KERNEL.library() is None:
        pytest.skip(f"no decode attention kernel here: {decode_kernel.KERNEL.reason()}")
    torch.manual_seed(0)
    slots_in_pool, rows = 600, 5
    keys = torch.randn(slots_in_pool, kv_heads, dim, dtype=torch.bfloat16)
    values = torch.randn(slots_in_pool, kv_heads, v_dim, dtype=torch.bfloat16)
    lengths = torch.tensor([1, 15, 16, 17, 130])  # one key; around a 16-wide chunk; a long row
    width = int(lengths.max())
    slots = torch.zeros(rows, width, dtype=torch.int64)  # the dummy slot 0 past a row's end
    for r in range(rows):
        slots[r, : lengths[r]] = torch.randperm(slots_in_pool)[: lengths[r]]
    q = torch.randn(rows, heads, dim, dtype=torch.bfloat16)
    assert decode_kernel.fits(q, keys, values, window=-1)
    assert not decode_kernel.fits(q, keys, values, window=8)  # a sliding window: PyTorch's path
    assert not decode_kernel.fits(q.float(), keys.float(), values.float(), window=-1)
    scale = dim**-0.5
    got = decode_kernel.decode_attention(q, keys, values, slots, lengths, scale)
    assert got.shape == (rows, heads, v_dim) and got.dtype == torch.bfloat16
    want = exact(q, keys, values, slots, lengths, scale)
    assert torch.allclose(got.float(), want, rtol=1e-2, atol=1e-2), (got.float() - want).abs().max()
