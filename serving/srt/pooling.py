"""Sentence-embedding pooling, as the model directory itself declares it.

A sentence-transformers layout (``modules.json``) names a ``Pooling`` module whose
``config.json`` picks the mode (mean, CLS, max, mean-sqrt-len, last token), an optional
``Normalize`` module, and ``sentence_bert_config.json`` the maximum sequence length. A plain
Hugging Face encoder declares none of these: it gets mean pooling without normalisation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

_MODES = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_lasttoken": "last",
}


@dataclass(frozen=True)
class PoolingConfig:
    mode: str = "mean"
    normalize: bool = False
    max_seq_length: int | None = None
    declared_by: str = "default (no pooling declared)"


def read_pooling_config(model_dir: Path) -> PoolingConfig:
    """Read the pooling the model directory declares; errors name the file to fix."""
    modules_file = model_dir / "modules.json"
    if not modules_file.is_file():
        return PoolingConfig()
    try:
        modules = json.loads(modules_file.read_text())
    except ValueError as exc:
        raise ValueError(f"{modules_file} is not valid JSON ({exc}); fix or remove it") from exc
    mode, normalize = "mean", False
    for module in modules:
        kind = str(module.get("type", ""))
        if kind.endswith(".Pooling"):
            cfg_file = model_dir / module.get("path", "") / "config.json"
            if cfg_file.is_file():
                cfg = json.loads(cfg_file.read_text())
                chosen = [m for key, m in _MODES.items() if cfg.get(key)]
                if len(chosen) != 1:
                    raise ValueError(
                        f"{cfg_file} must enable exactly one pooling mode, it enables {chosen or 'none'}"
                    )
                mode = chosen[0]
        elif kind.endswith(".Normalize"):
            normalize = True
    max_len = None
    st_file = model_dir / "sentence_bert_config.json"
    if st_file.is_file():
        max_len = json.loads(st_file.read_text()).get("max_seq_length")
    return PoolingConfig(mode, normalize, max_len, f"{modules_file.name}")


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, config: PoolingConfig) -> torch.Tensor:
    """Reduce ``hidden`` (batch, seq, dim) to (batch, dim) over the unmasked tokens."""
    import torch

    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    if config.mode == "cls":
        out = hidden[:, 0]
    elif config.mode == "max":
        out = hidden.masked_fill(mask == 0, torch.finfo(hidden.dtype).min).max(dim=1).values
    elif config.mode == "last":
        # Right padding: the last real token sits at length - 1.
        last = attention_mask.sum(dim=1) - 1
        out = hidden[torch.arange(hidden.shape[0]), last]
    else:
        total = (hidden * mask).sum(dim=1)
        count = mask.sum(dim=1).clamp(min=1)
        out = total / (count.sqrt() if config.mode == "mean_sqrt_len" else count)
    if config.normalize:
        out = torch.nn.functional.normalize(out, p=2, dim=1)
    return out
