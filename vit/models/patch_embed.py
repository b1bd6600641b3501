"""The patch embeddings: an image (B, 3, H, W) to a token grid (B, N, C), and NaFlex patches to tokens. `PatchEmbed`
is ViT's one strided convolution (timm's names: proj); the others are the small-data variants (shifted patches,
overlapping patches, a convolutional stem, a convolution and pooling), each keeping `PatchGrid`'s grid arithmetic."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from vit.models.layers import to_2tuple
from vit.models.norm import LayerNorm


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
        self.norm = LayerNorm(patch_dim)  # PyTorch's eps 1e-5, as the authors' code
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
        self.norm = LayerNorm(embed_dim)

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
    `num_patches` as `PatchEmbed`; the patch size must be a power of two (2, 4, 8, 16, ...).

    `convs_per_stage` > 1 makes it a deeper convolutional tokenizer: each stride-2 convolution is followed by
    convs_per_stage - 1 more 3 x 3 convolutions of stride 1 (BN, ReLU) at that stage's resolution and width. With 2,
    for the ViT/4 above:

        stem.0: Conv 3x3 s2, BN, ReLU            (B, 64, 16, 16)
        stem.1: Conv 3x3 s1, BN, ReLU            (B, 64, 16, 16)
        stem.2: Conv 3x3 s2, BN, ReLU            (B, 128, 8, 8)
        stem.3: Conv 3x3 s1, BN, ReLU            (B, 128, 8, 8)
        stem.4: Conv 1x1 (with bias)             (B, 128, 8, 8)

    In this ViT/4 each added convolution costs 576 C^2 multiply-adds per CIFAR image (9 (C/2)^2 at each of the
    16 x 16 positions, or 9 C^2 at each of the 8 x 8), and every token sees a 19 x 19 window instead of 7 x 7.

    `whitening=True` asks the trainer to start the first convolution from the training images (`whiten`)."""

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int | tuple[int, int] = 16,
        in_chans: int = 3,
        embed_dim: int = 768,
        convs_per_stage: int = 1,
        whitening: bool = False,
    ) -> None:
        from timm.models.vision_transformer_hybrid import ConvStem

        super().__init__(img_size, patch_size, in_chans)
        stages = self.halvings("conv")  # log2(p) stages, each opened by a stride-2 convolution
        widths = [max(1, embed_dim // 2 ** (stages - 1 - i)) for i in range(stages)]
        convs = stages * convs_per_stage
        self.stem = ConvStem(
            in_chans=in_chans,
            depth=convs + 1,
            channels=tuple(w for w in widths for _ in range(convs_per_stage)) + (embed_dim,),
            kernel_size=(3,) * convs + (1,),
            stride=((2,) + (1,) * (convs_per_stage - 1)) * stages + (1,),
        )
        self.whitening = whitening

    @torch.no_grad()
    def whiten(self, images: torch.Tensor, eps: float = 5e-4, chunk: int = 256) -> int:
        """Patch whitening, airbench's initialisation of its first convolution (Jordan 2024), for the stem's first
        convolution (k x k kernel, c input channels, o output channels; d = c k^2 numbers a patch):

            patches  P: every k x k patch of `images`, stride 1       (M, d)   images (B, c, H, W), normalised
            moments  S = P^T P / M                                    (d, d)   not centred, as airbench's
            S = V diag(lambda) V^T, lambda descending                          torch.linalg.eigh
            filter i = V[:, i] / sqrt(lambda_i + eps)                          unit variance on these patches
            weight = [filter 1..n, -filter 1..n, the rest as it was]  (o, c, k, k), n = min(d, o // 2)

        Each filter's response to the patches is one whitened coordinate: the smooth directions (large lambda) and
        the edges and textures (small lambda) start at the same scale. The pair w, -w keeps both signs through the
        ReLU. For the 144-wide ViT/4: d = 27, o = 72, so 54 channels are whitened and 18 keep their random start.
        The filters then train like every other weight (airbench freezes its own). Returns 2 n, the channels set."""
        conv = self.stem[0].conv
        d = conv.weight[0].numel()
        moments = torch.zeros(d, d, dtype=torch.float64, device=conv.weight.device)
        count = 0
        for part in images.split(chunk):
            patches = F.unfold(part.to(conv.weight.device, torch.float32), conv.kernel_size)  # (b, d, L)
            patches = patches.transpose(1, 2).reshape(-1, d).double()  # (b L, d): (channel, row, column) order
            moments += patches.T @ patches
            count += len(patches)
        if count == 0:
            raise ValueError(f"whiten needs images of at least {tuple(conv.kernel_size)} pixels, got none")
        eigenvalues, eigenvectors = torch.linalg.eigh(moments / count)  # ascending
        n = min(d, conv.out_channels // 2)
        top = eigenvalues.flip(0)[:n], eigenvectors.flip(1)[:, :n]  # (n,), (d, n): the largest first
        filters = (top[1] / (top[0] + eps).sqrt()).T.reshape(n, *conv.weight.shape[1:])  # (n, c, k, k)
        conv.weight[:n] = filters.to(conv.weight.dtype)
        conv.weight[n : 2 * n] = -filters.to(conv.weight.dtype)
        return 2 * n

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
