"""``phasemem demo``: a small GPT-like language model trained for a few steps under ``instrument()``,
sized so that the logits and their gradient are the step's largest tensors (why: docs/capture.md).
"""
from __future__ import annotations

import random

import numpy as np

from ..errors import PhasememError

# Per device: model width, layers, heads, batch, sequence length. CUDA gets a bigger model so
# the picture is not dominated by the allocator's rounding.
_SIZES = {
    "cpu": dict(d_model=128, n_layers=2, n_heads=4, batch=8, seq=128),
    "cuda": dict(d_model=512, n_layers=4, n_heads=8, batch=16, seq=256),
}
VOCAB = 8192


def _model_class():
    # torch is imported here, not at module level: `phasemem --help` must not pay for it.
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        """Pre-LN transformer block: causal self-attention, then a 4× MLP, each with a residual."""

        def __init__(self, d: int, heads: int):
            super().__init__()
            self.heads = heads
            self.ln1 = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.ln2 = nn.LayerNorm(d)
            self.fc = nn.Linear(d, 4 * d)
            self.out = nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
            q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class TinyGPT(nn.Module):
        """Token + position embedding, pre-LN blocks, final LayerNorm, untied LM head."""

        def __init__(self, vocab: int, d_model: int, n_layers: int, n_heads: int, seq: int):
            super().__init__()
            self.tok = nn.Embedding(vocab, d_model)
            self.pos = nn.Embedding(seq, d_model)
            self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
            self.ln = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, vocab, bias=False)

        def forward(self, idx):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.tok(idx) + self.pos(pos)
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln(x))

    return TinyGPT


def record(device: str | None = None, steps: int = 3) -> dict:
    """Train the demo model for ``steps`` steps under instrument() and return the snapshot.

    ``device``: ``"cpu"``, ``"cuda"`` or None (CUDA when available).

    Example:
        >>> report = phasemem.analyze(phasemem.capture.demo.record(steps=3))
        >>> report.phases["forward"].peak_bytes
    """
    # torch is imported here, not at module level: `phasemem --help` must not pay for it.
    import torch
    import torch.nn.functional as F

    from .instrument import Recording

    if steps < 1:
        raise PhasememError(f"steps={steps}: train at least one step")
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in _SIZES:
        raise PhasememError(f"device={device!r}: the demo runs on 'cpu' or 'cuda'")
    if device == "cuda" and not torch.cuda.is_available():
        raise PhasememError("device 'cuda' asked for, but this torch sees no CUDA GPU; use --device cpu")
    cfg = _SIZES[device]

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    model = _model_class()(VOCAB, cfg["d_model"], cfg["n_layers"], cfg["n_heads"], cfg["seq"]).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    gen = torch.Generator().manual_seed(1)
    # Next-token pairs from random token streams, built before recording: data loading is not the subject.
    batches = []
    for _ in range(steps):
        tokens = torch.randint(0, VOCAB, (cfg["batch"], cfg["seq"] + 1), generator=gen)
        batches.append((tokens[:, :-1].to(device), tokens[:, 1:].to(device)))

    with Recording(model, opt, device=device) as rec:
        for x, y in batches:
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return rec._need_snapshot()
