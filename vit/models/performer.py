"""The Performer-style token attention of T2T-ViT: softmax attention approximated in linear time.

softmax(q·kᵀ) is a Gaussian kernel up to row scaling, and a Gaussian kernel is an expectation over random
features (Choromanski et al. 2021, "FAVOR+"):

    exp(q·k) = E_w[ φ(q) · φ(k) ],   φ(x) = exp(w·x − |x|²/2) / sqrt(m),   w ~ N(0, I), m features

With a fixed (orthogonal, non-trainable) w of m rows, attention becomes

    y_t = Σ_s φ(q_t)·φ(k_s) v_s / Σ_s φ(q_t)·φ(k_s) = φ(q_t)·(Σ_s φ(k_s) v_sᵀ) / φ(q_t)·(Σ_s φ(k_s))

and the (N, N) matrix never exists: the cost is O(N·m·C) instead of O(N²·C). Like the token transformer,
it changes the token width (dim -> dim_out) and adds V as the skip connection. Names follow the official
T2T-ViT code (`kqv`, `proj`, `norm1`, `norm2`, `mlp.0`, `mlp.2`, `w`) so its checkpoints load.
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch import nn

from vit.models.norm import LayerNorm


class TokenPerformer(nn.Module):
    """(B, N, dim) -> (B, N, dim_out): LayerNorm -> performer attention (+V skip) -> LayerNorm -> MLP (+residual).

    Args:
        dim: input token width (e.g. 3·7·7 = 147 after the first soft split).
        dim_out: output token width (`token_dim`, 64 in the paper).
        kernel_ratio: m = dim_out · kernel_ratio random features.
        proj_drop: dropout after the attention projection and the MLP (0.1 in the official code).
    """

    def __init__(
        self, dim: int, dim_out: int, kernel_ratio: float = 0.5, proj_drop: float = 0.1, eps: float = 1e-8
    ) -> None:
        super().__init__()
        if not 0 < kernel_ratio:
            raise ValueError(f"kernel_ratio={kernel_ratio} must be > 0")
        self.dim, self.dim_out = dim, dim_out
        self.kqv = nn.Linear(dim, 3 * dim_out)
        self.proj_drop = nn.Dropout(proj_drop)
        self.proj = nn.Linear(dim_out, dim_out)
        self.norm1 = LayerNorm(dim)
        self.norm2 = LayerNorm(dim_out)
        self.mlp = nn.Sequential(
            nn.Linear(dim_out, dim_out), nn.GELU(), nn.Linear(dim_out, dim_out), nn.Dropout(proj_drop)
        )
        self.eps = eps
        self.m = int(dim_out * kernel_ratio)
        # Orthogonal rows scaled to the norm of Gaussian rows: lower variance than i.i.d. features.
        w = nn.init.orthogonal_(torch.empty(self.m, dim_out)) * math.sqrt(self.m)
        self.w = nn.Parameter(w, requires_grad=False)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Positive random features φ(x): (B, N, dim_out) -> (B, N, m), in fp32."""
        x = x.float()
        half_sq_norm = x.square().sum(dim=-1, keepdim=True) / 2  # (B, N, 1)
        return torch.exp(x @ self.w.float().t() - half_sq_norm) / math.sqrt(self.m)

    def kernel_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Linear-time attention, q, k, v (B, N, dim_out) -> fp32 (B, N, dim_out).

        Kept in fp32 even under autocast: w·k is several units in size, and bf16's 8-bit mantissa there, blown
        up by exp, costs 1-2% of the output (measured at N = 3136). It is O(N·m·dim_out), small beside `kqv`.
        """
        with fp32_context(q.device.type):
            phi_k, phi_q = self.features(k), self.features(q)  # (B, N, m)
            kv = torch.einsum("bnm,bne->bme", phi_k, v.float())  # Σ_s φ(k_s) v_sᵀ: (B, m, dim_out)
            normaliser = phi_q @ phi_k.sum(dim=1).unsqueeze(-1)  # φ(q_t)·Σ_s φ(k_s): (B, N, 1)
            return (phi_q @ kv) / (normaliser + self.eps)  # (B, N, dim_out)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, dim) -> (B, N, dim_out), linear in N."""
        k, q, v = self.kqv(x).split(self.dim_out, dim=-1)  # each (B, N, dim_out); the official order is k, q, v
        y = self.kernel_attention(q, k, v)
        return v + self.proj_drop(self.proj(y.to(v.dtype)))  # V is the skip connection: the width changed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))

    def macs(self, x: torch.Tensor, output: torch.Tensor) -> int:
        """Multiply-adds for `complexity`: projections, random features, the two linear-attention products, MLP."""
        tokens = x.shape[0] * x.shape[1]
        linear = tokens * (self.dim * 3 * self.dim_out + self.dim_out**2 + 2 * self.dim_out**2)
        random_features = 2 * tokens * self.m * self.dim_out  # φ(q), φ(k)
        attention = 2 * tokens * self.m * self.dim_out + tokens * self.m  # Σ φ(k) vᵀ, φ(q)·kv, normaliser
        return linear + random_features + attention


def fp32_context(device_type: str):
    """Autocast switched off where the device has autocast; a no-op elsewhere (the meta device, where
    scripts/complexity.py counts FLOPs without weights: torch.autocast refuses a device type it does not know)."""
    if torch.amp.is_autocast_available(device_type):
        return torch.autocast(device_type=device_type, enabled=False)
    return contextlib.nullcontext()
