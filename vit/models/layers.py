"""The pieces a ViT is stacked from: patch embeddings, MLP, stochastic depth, the pre-norm encoder block, and the
loop that runs a stack of blocks (with gradient checkpointing or without).

Parameter names follow timm (`patch_embed.proj`, `mlp.fc1`, `norm1`, `ls1.gamma`, ...) so state dicts load
in both directions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn
from torch.utils.checkpoint import checkpoint

from vit.models.attention import Attention, LocalitySelfAttention


def check_rate(name: str, value: float) -> None:
    """Dropout-like rates live in [0, 1): 1 would drop everything."""
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name}={value} must be in [0, 1)")


def to_2tuple(value: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"expected an int or a pair, got {value!r}")
        return int(value[0]), int(value[1])
    return int(value), int(value)


class PatchGrid(nn.Module):
    """What every patch embedding shares: the checked image and patch sizes, the (H / p, W / p) grid of patches
    the ViT sizes its position table by (`grid_size`, `num_patches`), and the check of an input image."""

    def __init__(self, img_size: int | tuple[int, int], patch_size: int | tuple[int, int], in_chans: int) -> None:
        super().__init__()
        self.img_size = to_2tuple(img_size)
        self.patch_size = to_2tuple(patch_size)
        if min(self.img_size) <= 0 or min(self.patch_size) <= 0:
            raise ValueError(f"img_size={img_size} and patch_size={patch_size} must be positive")
        if any(i % p for i, p in zip(self.img_size, self.patch_size, strict=True)):
            raise ValueError(
                f"img_size={img_size} is not divisible by patch_size={patch_size}: "
                f"choose a patch size that divides the image size"
            )
        if in_chans <= 0:
            raise ValueError(f"in_chans={in_chans} must be positive")
        self.in_chans = in_chans
        self.grid_size = (self.img_size[0] // self.patch_size[0], self.img_size[1] // self.patch_size[1])
        self.num_patches = self.grid_size[0] * self.grid_size[1]

    # Any input whose sides are multiples of the patch size, not only `img_size` (the ViT resamples its position
    # table to the input's grid): set by `ViTConfig(dynamic_img_size=True)`, e.g. for progressive resizing.
    dynamic_img_size: bool = False

    def check_input(self, x: torch.Tensor) -> None:
        if self.dynamic_img_size and x.ndim == 4 and x.shape[1] == self.in_chans:
            if x.shape[-2] % self.patch_size[0] == 0 and x.shape[-1] % self.patch_size[1] == 0 and x.shape[-1] > 0:
                return
            raise ValueError(
                f"input of shape {tuple(x.shape)} does not match the model: its height and width must be positive "
                f"multiples of the patch size {self.patch_size}"
            )
        if x.ndim != 4 or x.shape[1] != self.in_chans or tuple(x.shape[-2:]) != self.img_size:
            raise ValueError(
                f"input of shape {tuple(x.shape)} does not match the model: expected "
                f"(batch, in_chans={self.in_chans}, {self.img_size[0]}, {self.img_size[1]})"
            )

    def halvings(self, kind: str) -> int:
        """How many stride-2 stages take the image to the patch grid, log2(p), for a convolutional tokenizer
        (`patch_embed=<kind>`): a ValueError naming it where the patch size is not a square power of two."""
        p = self.patch_size[0]
        if self.patch_size[1] != p or p < 2 or p & (p - 1):
            raise ValueError(
                f"patch_embed={kind} needs a square power-of-two patch size (2, 4, 8, ...), not {self.patch_size}"
            )
        return p.bit_length() - 1

    def input_grid(self, x: torch.Tensor) -> tuple[int, int]:
        """The (rows, columns) of patches an input image of this size is cut into."""
        return x.shape[-2] // self.patch_size[0], x.shape[-1] // self.patch_size[1]


class PatchEmbed(PatchGrid):
    """Cut the image into non-overlapping p x p patches and project each to `embed_dim`.

    A Conv2d with kernel = stride = p is exactly a Linear applied to every flattened patch, done in one op.
    (B, C, H, W) -> (B, N, embed_dim) with N = (H / p) * (W / p). `bias=False` leaves out the projection's bias.
    """

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int | tuple[int, int] = 16,
        in_chans: int = 3,
        embed_dim: int = 768,
        bias: bool = True,
    ) -> None:
        super().__init__(img_size, patch_size, in_chans)
        # bias=False: CLIP's patch projection, which a LayerNorm (`norm_pre`) follows, has none.
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=self.patch_size, stride=self.patch_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        x = self.proj(x)  # (B, embed_dim, H/p, W/p)
        return x.flatten(2).transpose(1, 2)  # (B, N, embed_dim), patches in row-major order

    def embed_patches(self, patches: torch.Tensor, interpolation: str = "bicubic") -> torch.Tensor:
        """Patches cut already (a NaFlex batch, vit/naflex.py), (B, N, p_h * p_w * C_in), each flattened
        as (row, column, channel) as timm's NaFlex loader cuts them -> (B, N, embed_dim). The same projection as
        `forward`: the Conv2d's kernel (embed_dim, C_in, p_h, p_w) read as a Linear over that flattening.

        Patches of another size come unflattened, (B, N, q_h, q_w, C_in) (random patch sizes): the kernel is
        resampled to q_h x q_w first with timm's `resample_patch_embed` (FlexiViT's pseudo-inverse resize, through
        `interpolation`), as timm's NaFlexVit does with its patch interpolator; gradients reach the kernel."""
        ph, pw = self.patch_size
        weight = self.proj.weight  # (embed_dim, C_in, p_h, p_w)
        if patches.ndim == 5 and patches.shape[-1] == self.in_chans:
            size = (int(patches.shape[2]), int(patches.shape[3]))
            if size != (ph, pw):
                from timm.layers import resample_patch_embed

                weight = resample_patch_embed(weight, list(size), interpolation=interpolation, antialias=True)
            patches = patches.flatten(2)  # (B, N, q_h * q_w * C_in): row, column, channel
        elif patches.ndim != 3 or patches.shape[-1] != ph * pw * self.in_chans:
            raise ValueError(
                f"patches of shape {tuple(patches.shape)} do not match the model: expected (batch, tokens, "
                f"{ph} * {pw} * {self.in_chans} = {ph * pw * self.in_chans}), or (batch, tokens, rows, columns, "
                f"{self.in_chans})"
            )
        weight = weight.permute(0, 2, 3, 1).flatten(1)  # (embed_dim, p_h * p_w * C_in): row, column, channel
        return F.linear(patches, weight, self.proj.bias)


class ShiftedPatchEmbed(PatchGrid):
    """Shifted Patch Tokenization (SPT, Lee, Lee & Song 2021): each patch also sees a strip of its neighbours.

    The image is stacked with four copies of itself shifted diagonally by half a patch, s = p // 2, with zeros
    where a copy runs past the border; the 5·C-channel stack is cut into p x p patches, and every flattened
    patch is LayerNorm'ed and projected to `embed_dim`. For ViT-Ti/4 on CIFAR (C=3, p=4, 32 px, N=64):

        x                              (B, 3, 32, 32)
        stack [x, lu, ru, lb, rb]      (B, 15, 32, 32)      lu[c, i, j] = x[c, i - s, j - s], ru: x[c, i - s, j + s],
                                                            lb: x[c, i + s, j - s], rb: x[c, i + s, j + s]; 0 outside
        cut into patches, flatten      (B, 64, 240)         each patch flattened as (p_row, p_col, channel)
        norm (LayerNorm over 240)      (B, 64, 240)
        proj (Linear 240 -> C)         (B, 64, embed_dim)

    The copies are named (and ordered) as in the authors' code: "lu" holds, at every pixel, the pixel s rows up
    and s columns left. Same `img_size`, `patch_size`, `grid_size`, `num_patches` as `PatchEmbed`; parameters
    `norm` and `proj` (a Linear, not timm's Conv2d, so timm's patch weights do not load into it).
    """

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int | tuple[int, int] = 16,
        in_chans: int = 3,
        embed_dim: int = 768,
    ) -> None:
        super().__init__(img_size, patch_size, in_chans)
        if min(self.patch_size) < 2:
            raise ValueError(
                f"patch_embed='spt' needs patch_size >= 2 (it shifts by patch_size // 2), got patch_size={patch_size}"
            )
        self.shift = (self.patch_size[0] // 2, self.patch_size[1] // 2)
        patch_dim = 5 * in_chans * self.patch_size[0] * self.patch_size[1]
        self.norm = nn.LayerNorm(patch_dim)  # PyTorch's eps 1e-5, as the authors' code
        self.proj = nn.Linear(patch_dim, embed_dim)

    def shifted_stack(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, 5C, H, W): [x, lu, ru, lb, rb], each copy shifted by (±s_h, ±s_w), zero-filled."""
        sh, sw = self.shift
        height, width = x.shape[-2:]
        padded = F.pad(x, (sw, sw, sh, sh))  # (B, C, H + 2·sh, W + 2·sw); padded[i + sh, j + sw] = x[i, j]
        # The copy that holds x[i + dy, j + dx] at (i, j) is the H x W window of `padded` at (sh + dy, sw + dx).
        offsets = ((-sh, -sw), (-sh, sw), (sh, -sw), (sh, sw))  # lu, ru, lb, rb
        copies = [padded[:, :, sh + dy : sh + dy + height, sw + dx : sw + dx + width] for dy, dx in offsets]
        return torch.cat([x, *copies], dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        x = self.shifted_stack(x)  # (B, 5C, H, W)
        ph, pw = self.patch_size
        x = rearrange(x, "b c (gh ph) (gw pw) -> b (gh gw) (ph pw c)", ph=ph, pw=pw)  # (B, N, p·p·5C), row-major
        return self.proj(self.norm(x))  # (B, N, embed_dim)


class OverlappingPatchEmbed(PatchGrid):
    """T2T-style soft split as a ViT tokeniser: each token sees a (2p - 1) x (2p - 1) window centred on its p x p
    patch, overlapping each neighbour's by p - 1 pixels, instead of the patch alone.

    The first soft split of T2T-ViT (Yuan et al. 2021) is an unfold with kernel 7, stride 4, padding 2; here the
    same window for any patch size (kernel 2p - 1, stride p, padding p // 2, so the grid stays (H / p, W / p)),
    projected by a Conv2d (an unfold followed by a Linear, in one op) and LayerNorm'ed as the token transformer
    that follows T2T's unfold would. For CIFAR's ViT/4 (32 px, N = 64):

        x                                  (B, 3, 32, 32)
        proj: Conv2d k=7, s=4, p=2         (B, C, 8, 8)        each output sees 7 x 7 pixels, 3 shared per side
        flatten, norm                      (B, 64, C)

    Same `grid_size` and `num_patches` as `PatchEmbed`, so the position table and the encoder are unchanged; the
    projection has (2p - 1)^2 / p^2 (3.1x at p = 4) the weights of the plain one, and timm's patch weights do not
    load into it.
    """

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int | tuple[int, int] = 16,
        in_chans: int = 3,
        embed_dim: int = 768,
    ) -> None:
        super().__init__(img_size, patch_size, in_chans)
        kernel = tuple(2 * p - 1 for p in self.patch_size)
        padding = tuple(p // 2 for p in self.patch_size)
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=kernel, stride=self.patch_size, padding=padding)
        self.norm = nn.LayerNorm(embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        x = self.proj(x)  # (B, embed_dim, H/p, W/p)
        return self.norm(x.flatten(2).transpose(1, 2))  # (B, N, embed_dim), patches in row-major order


class ConvStemEmbed(PatchGrid):
    """A convolutional stem as the tokeniser ("Early Convolutions Help Transformers See Better", Xiao et al.
    2021): log2(p) 3 x 3 convolutions of stride 2, each followed by BatchNorm and ReLU, then a 1 x 1 convolution
    to the embedding width, instead of one p x p patch projection. The channels double up to the width:
    C / 2^(k-1), ..., C / 2, C for k = log2(p) convolutions. Built from timm's `ConvStem`. For CIFAR's ViT/4
    (32 px, C = 128):

        x                                        (B, 3, 32, 32)
        stem.0: Conv 3x3 s2, BN, ReLU            (B, 64, 16, 16)
        stem.1: Conv 3x3 s2, BN, ReLU            (B, 128, 8, 8)
        stem.2: Conv 1x1 (with bias)             (B, 128, 8, 8)
        flatten                                  (B, 64, 128)

    Every token sees a 7 x 7 window through overlapping 3 x 3 convolutions, with the locality and translation
    prior of a small convolutional network, which makes a ViT train faster on small data. Same `grid_size` and
    `num_patches` as `PatchEmbed`; the patch size must be a power of two (2, 4, 8, 16, ...)."""

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int | tuple[int, int] = 16,
        in_chans: int = 3,
        embed_dim: int = 768,
    ) -> None:
        from timm.models.vision_transformer_hybrid import ConvStem

        super().__init__(img_size, patch_size, in_chans)
        convs = self.halvings("conv")  # log2(p) stride-2 convolutions
        channels = tuple(max(1, embed_dim // 2 ** (convs - 1 - i)) for i in range(convs)) + (embed_dim,)
        self.stem = ConvStem(
            in_chans=in_chans,
            depth=convs + 1,
            channels=channels,
            kernel_size=(3,) * convs + (1,),
            stride=(2,) * convs + (1,),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        x = self.stem(x)  # (B, embed_dim, H/p, W/p)
        return x.flatten(2).transpose(1, 2)  # (B, N, embed_dim), patches in row-major order


class ConvPoolEmbed(PatchGrid):
    """The convolutional tokenizer of the Compact Convolutional Transformer (CCT, Hassani et al. 2021, "Escaping
    the Big Data Paradigm with Compact Transformers"): log2(p) stages of a 3 x 3 convolution of stride 1 (no bias),
    ReLU and a 3 x 3 max-pool of stride 2, instead of one p x p patch projection. The stages in between are 64
    channels wide (CCT's `in_planes`), the last is the embedding width. For CIFAR's ViT/4 (32 px, C = 96), CCT's
    two-stage tokenizer ("3x2"):

        x                                        (B, 3, 32, 32)
        stages.0: Conv 3x3 s1, ReLU, MaxPool 3x3 s2 p1    (B, 64, 16, 16)
        stages.1: Conv 3x3 s1, ReLU, MaxPool 3x3 s2 p1    (B, 96, 8, 8)
        flatten                                  (B, 64, 96)

    Unlike the strided stem (`ConvStemEmbed`), every convolution runs at its stage's full resolution before the
    pooling halves it: the first at 32 x 32, so it costs more than the strided stem (for a CIFAR image at C = 96,
    3 x 9 x 64 x 32^2 + 64 x 9 x 96 x 16^2 = 15.9 M multiply-adds against the stem's 3.6 M: the recipe's model
    counts 0.049 GMACs instead of 0.037) and sees finer detail; no BatchNorm. Same `grid_size` and
    `num_patches` as `PatchEmbed` (a patch size of 2 gives CCT's one-stage "3x1" tokenizer); the patch size must be
    a power of two. The convolutions are initialised as CCT's (Kaiming normal, fan in)."""

    hidden_channels = 64  # CCT's width between the stages (`in_planes`)

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int | tuple[int, int] = 16,
        in_chans: int = 3,
        embed_dim: int = 768,
    ) -> None:
        super().__init__(img_size, patch_size, in_chans)
        stages = self.halvings("cct")  # log2(p) halvings by the pools
        widths = [in_chans] + [self.hidden_channels] * (stages - 1) + [embed_dim]
        self.stages = nn.Sequential(
            *[
                nn.Sequential(
                    nn.Conv2d(c_in, c_out, kernel_size=3, stride=1, padding=1, bias=False),
                    nn.ReLU(inplace=True),
                    nn.MaxPool2d(kernel_size=3, stride=2, padding=1),
                )
                for c_in, c_out in zip(widths[:-1], widths[1:], strict=True)
            ]
        )
        for stage in self.stages:
            nn.init.kaiming_normal_(stage[0].weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        x = self.stages(x)  # (B, embed_dim, H/p, W/p)
        return x.flatten(2).transpose(1, 2)  # (B, N, embed_dim), patches in row-major order


class QuickGELU(nn.Module):
    """x * sigmoid(1.702 x): the sigmoid approximation of GELU that OpenAI's CLIP was trained with (timm's
    `quick_gelu`). Close to GELU but not equal (up to ~0.02 apart), so CLIP's weights need it to compute what they
    were trained to."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


def gelu_tanh() -> nn.Module:
    """GELU's tanh approximation (SigLIP's, timm's `GELUTanh`): the same numbers as `F.gelu(x, approximate="tanh")`."""
    return nn.GELU(approximate="tanh")


ACTIVATIONS = {"gelu": nn.GELU, "quick_gelu": QuickGELU, "gelu_tanh": gelu_tanh}


def inner_norm(width: int, norm_eps: float | None) -> nn.Module:
    """The LayerNorm inside an MLP, over its hidden width before fc2 (NormFormer's, EVA-02's `scale_mlp`), or
    nothing when `norm_eps` is None."""
    return nn.Identity() if norm_eps is None else nn.LayerNorm(width, eps=norm_eps)


class Mlp(nn.Module):
    """Token-wise feed-forward: fc1 -> act -> dropout -> [norm] -> fc2 -> dropout. (B, N, C) -> (B, N, out).

    `act` is "gelu" or "quick_gelu" (`QuickGELU`, CLIP's); `norm_eps` adds a LayerNorm over the hidden width
    before fc2 (`norm`, timm's name), None leaves it out.
    """

    def __init__(
        self,
        in_features: int,
        hidden_features: int | None = None,
        out_features: int | None = None,
        drop: float = 0.0,
        act: str = "gelu",
        norm_eps: float | None = None,
    ) -> None:
        super().__init__()
        hidden_features = hidden_features or in_features
        out_features = out_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = ACTIVATIONS[act]()
        self.drop1 = nn.Dropout(drop)
        self.norm = inner_norm(hidden_features, norm_eps)
        self.fc2 = nn.Linear(hidden_features, out_features)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.norm(self.drop1(self.act(self.fc1(x))))))


class QuickGeluMlp(Mlp):
    """`Mlp` with CLIP's activation (`QuickGELU`); the same parameters."""

    def __init__(self, in_features: int, hidden_features: int | None = None, **kwargs) -> None:
        super().__init__(in_features, hidden_features, act="quick_gelu", **kwargs)


class GeluTanhMlp(Mlp):
    """`Mlp` with GELU's tanh approximation (SigLIP 2's NaFlex models); the same parameters."""

    def __init__(self, in_features: int, hidden_features: int | None = None, **kwargs) -> None:
        super().__init__(in_features, hidden_features, act="gelu_tanh", **kwargs)


class SwiGLU(nn.Module):
    """The gated MLP of recent ViTs (Shazeer 2020; DINOv2, EVA-02): fc1 -> split in two halves a, b ->
    SiLU(a) * b -> dropout -> [norm] -> fc2 -> dropout. (B, N, C) -> (B, N, out).

    `hidden_features` is fc1's width, both halves together (timm's `SwiGLUPacked`, whose state dict loads
    as is): the gated width is half of it. Parameters ~ 1.5 * hidden_features * C against 2 * hidden * C for
    `Mlp`, so hidden_features = 4/3 x `Mlp`'s hidden matches its size (mlp_ratio 5.33 for 4: DINOv2's choice).
    `norm_eps` adds a LayerNorm over the gated width (EVA-02 B and L, timm's `SwiGLU` with `norm`); timm's split
    layout of that MLP (`fc1_g`, `fc1_x`) is [gate | value] of this fc1 (vit/weights/read.py converts it).
    """

    def __init__(
        self,
        in_features: int,
        hidden_features: int | None = None,
        out_features: int | None = None,
        drop: float = 0.0,
        norm_eps: float | None = None,
    ) -> None:
        super().__init__()
        hidden_features = hidden_features or in_features
        out_features = out_features or in_features
        if hidden_features % 2:
            raise ValueError(
                f"mlp=swiglu needs an even fc1 width (it is split into gate and value), not {hidden_features}: "
                f"choose mlp_ratio so that embed_dim * mlp_ratio is even"
            )
        self.fc1 = nn.Linear(in_features, hidden_features)  # [gate | value], each hidden_features / 2
        self.act = nn.SiLU()
        self.drop1 = nn.Dropout(drop)
        self.norm = inner_norm(hidden_features // 2, norm_eps)
        self.fc2 = nn.Linear(hidden_features // 2, out_features)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, value = self.fc1(x).chunk(2, dim=-1)  # (B, N, hidden / 2) each
        return self.drop2(self.fc2(self.norm(self.drop1(self.act(gate) * value))))


# The MLP kinds, by their `mlp` setting: each takes (in_features, hidden_features, drop=, norm_eps=).
MLPS = {"gelu": Mlp, "quick_gelu": QuickGeluMlp, "gelu_tanh": GeluTanhMlp, "swiglu": SwiGLU}


class DropPath(nn.Module):
    """Stochastic depth: drop the whole residual branch of a sample with probability `drop_prob`.

    Kept branches are scaled by 1 / (1 - p) so the expected value is unchanged; identity at eval and at p=0.
    """

    def __init__(self, drop_prob: float = 0.0) -> None:
        super().__init__()
        check_rate("drop_path", drop_prob)
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.drop_prob == 0.0 or not self.training:
            return x
        keep_prob = 1.0 - self.drop_prob
        # One Bernoulli draw per sample, broadcast over every other dim: (B, 1, 1, ...).
        mask_shape = (x.shape[0],) + (1,) * (x.ndim - 1)
        keep = x.new_empty(mask_shape).bernoulli_(keep_prob)
        return x * keep / keep_prob

    def extra_repr(self) -> str:
        return f"drop_prob={self.drop_prob:.3f}"


class LayerScale(nn.Module):
    """Per-channel learnable scale of a residual branch (CaiT), started small so deep stacks train."""

    def __init__(self, dim: int, init_values: float = 1e-5) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), float(init_values)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class Block(nn.Module):
    """Pre-norm transformer encoder block, (B, N, dim) -> (B, N, dim):

        x = x + drop_path(ls1(attn(norm1(x))))
        x = x + drop_path(ls2(mlp(norm2(x))))

    `proj_drop` is the dropout after the attention's output projection and inside the MLP (timm's name);
    `norm_eps` is 1e-6 in timm's ViTs and 1e-5 (PyTorch's default) in the official T2T-ViT code;
    `init_values` switches on LayerScale (None: off, as in plain ViT); `lsa` makes the attention
    `LocalitySelfAttention`; `qk_norm` normalises q and k per head (`Attention`); `mlp` is "gelu" (`Mlp`),
    "quick_gelu" (`Mlp` with CLIP's `QuickGELU`) or "swiglu" (`SwiGLU`, `mlp_ratio` then sizes fc1, both halves);
    `mlp_norm` adds a LayerNorm inside the MLP (EVA-02's); `k_bias=False` leaves the keys without the bias the
    queries and values have (EVA-02's). `forward(x, rope)` hands a rotary position table to the
    attention (vit/models/rope.py), laid out in half order with `rope_half` (DINOv3's).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = False,
        qk_scale: float | None = None,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        init_values: float | None = None,
        attn_backend: str = "auto",
        norm_eps: float = 1e-6,
        lsa: bool = False,
        qk_norm: bool = False,
        mlp: str = "gelu",
        mlp_norm: bool = False,
        rope_half: bool = False,
        k_bias: bool = True,
    ) -> None:
        super().__init__()
        if mlp_ratio <= 0:
            raise ValueError(f"mlp_ratio={mlp_ratio} must be > 0")
        if mlp not in MLPS:
            raise ValueError(f"mlp={mlp!r} must be one of {tuple(MLPS)}")
        check_rate("drop_rate", proj_drop)
        attention = LocalitySelfAttention if lsa else Attention
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = attention(
            dim,
            num_heads=num_heads,
            qkv_bias=qkv_bias,
            qk_scale=qk_scale,
            attn_drop=attn_drop,
            proj_drop=proj_drop,
            attn_backend=attn_backend,
            qk_norm=qk_norm,
            norm_eps=norm_eps,
            rope_half=rope_half,
            k_bias=k_bias,
        )
        self.ls1 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        mlp_norm_eps = norm_eps if mlp_norm else None
        self.mlp = MLPS[mlp](dim, hidden_features=int(dim * mlp_ratio), drop=proj_drop, norm_eps=mlp_norm_eps)
        self.ls2 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path2 = DropPath(drop_path)

    def forward(
        self, x: torch.Tensor, rope: torch.Tensor | None = None, attn_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), attn_mask=attn_mask, rope=rope)))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


def run_blocks(
    blocks: nn.Module,
    x: torch.Tensor,
    checkpointed: bool,
    ropes: list[torch.Tensor | None] | None = None,
    attn_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """`x` through each module of `blocks` in turn. `checkpointed`: gradient checkpointing, each module's
    activations are dropped after its forward and recomputed in the backward pass, so only the (B, N, C) input of
    every block stays in memory, at the cost of one more forward pass of the blocks. Non-reentrant checkpointing
    (`use_reentrant=False`) restores the RNG state for the recomputation, so dropout and drop-path draw the same
    masks both times. `ropes`: one rotary position table per block (or None), handed to each block's attention;
    `attn_mask`: the same mask for every block's attention (NaFlex batches: padding is no key, vit/models/naflex.py)."""
    for i, block in enumerate(blocks):
        args = (x,) if ropes is None or ropes[i] is None else (x, ropes[i])
        kwargs = {} if attn_mask is None else {"attn_mask": attn_mask}
        x = checkpoint(block, *args, use_reentrant=False, **kwargs) if checkpointed else block(*args, **kwargs)
    return x


class AttentionPool(nn.Module):
    """Multihead attention pooling (MAP; SigLIP's head, timm's `AttentionPoolLatent`): one learned query attends
    over the tokens, and a residual MLP refines what it read. (B, N, C) -> (B, C).

    For SigLIP B/16 at 224 px (C = 768, 12 heads of 64, N = 196 image tokens):

        latent -> q = self.q(latent)             (B, 1, C) -> (B, heads, 1, head_dim)     the query, learned
        k, v = self.kv(x)                        (B, N, 2C) -> (B, heads, N, head_dim) each
        softmax(q kᵀ / sqrt(head_dim)) v         (B, heads, 1, head_dim)
        merge heads, proj                        (B, 1, C)
        y = y + mlp(norm(y))                     (B, 1, C)      GELU MLP of width mlp_ratio * C
        the query's token                        (B, C)

    Parameter names are timm's (`latent`, `q`, `kv`, `proj`, `norm`, `mlp.fc1`, `mlp.fc2`), so its weights load.
    """

    def __init__(
        self, dim: int, num_heads: int, mlp_ratio: float = 4.0, norm_eps: float = 1e-6, act: str = "gelu"
    ) -> None:
        super().__init__()
        if num_heads <= 0 or dim % num_heads:
            raise ValueError(f"num_heads={num_heads} must be a positive divisor of embed_dim={dim}")
        self.num_heads = num_heads
        self.latent = nn.Parameter(torch.zeros(1, 1, dim))  # the query token (1, 1, C); init_weights draws it
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)  # [k | v], each split into heads
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act=act)  # act: "gelu"; SigLIP 2's NaFlex heads "gelu_tanh"

    def init_weights(self) -> None:
        """timm's: the query trunc-normal with std C^-0.5, cut at 2 std (the Linears get the model's init)."""
        std = self.latent.shape[-1] ** -0.5
        nn.init.trunc_normal_(self.latent, std=std, a=-2 * std, b=2 * std)

    def forward(self, x: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, N, C) -> (B, C); `valid` (B, N) bool: the tokens the query may read (a NaFlex batch's padding
        is not), None: all."""
        batch = x.shape[0]
        q = self.q(self.latent.expand(batch, -1, -1))  # (B, 1, C)
        q = rearrange(q, "b l (h d) -> b h l d", h=self.num_heads)  # (B, heads, 1, head_dim)
        k, v = rearrange(self.kv(x), "b n (two h d) -> two b h n d", two=2, h=self.num_heads)  # (B, heads, N, d)
        mask = None if valid is None else valid[:, None, None, :]  # (B, 1, 1, N): True = may attend
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, heads, 1, head_dim): the query's read
        out = self.proj(rearrange(out, "b h l d -> b l (h d)"))  # (B, 1, C)
        out = out + self.mlp(self.norm(out))
        return out[:, 0]  # (B, C)
