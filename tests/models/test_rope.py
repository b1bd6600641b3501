"""2D RoPE (vit/models/rope.py) against timm 1.0's RoPE ViTs: vit_small_patch16_rope_224 (axial) and
vit_small_patch16_rope_mixed_224 (mixed, learned frequencies)."""

import warnings

import pytest
import timm
import torch
from timm.layers.pos_embed_sincos import RotaryEmbeddingMixed, apply_rot_embed_cat, init_random_2d_freqs

from vit.models import rope
from vit.models.rope import apply_rope, axial_rope_table, mixed_rope_freqs, mixed_rope_table
from vit.models.rotary_positions import MixedRotary

GRIDS = [(14, 14), (8, 8), (6, 10)]
EMBED_DIM = 384


def _timm_rope(name: str, grid=None, num_heads: int = 6, depth: int = 1):
    """The rope module of a 1-block timm model: cached for `grid` (img_size = 16 * grid) or dynamic (grid=None)."""
    kwargs = dict(depth=depth, num_heads=num_heads, num_classes=0)
    if grid is None:
        kwargs["dynamic_img_size"] = True
    else:
        kwargs["img_size"] = (16 * grid[0], 16 * grid[1])
    return timm.create_model(name, **kwargs).rope


@pytest.mark.parametrize("num_heads", [6, 12])  # head_dim 64 and 32
def test_axial_table_equals_timm(num_heads):
    head_dim = EMBED_DIM // num_heads
    dynamic = _timm_rope("vit_small_patch16_rope_224", num_heads=num_heads)
    for grid in GRIDS:
        ours = axial_rope_table(grid, head_dim)
        assert ours.shape == (grid[0] * grid[1], 2 * head_dim) and ours.dtype == torch.float32
        cached = _timm_rope("vit_small_patch16_rope_224", grid, num_heads=num_heads).get_embed()
        torch.testing.assert_close(ours, cached, atol=1e-6, rtol=0)
        torch.testing.assert_close(ours, dynamic.get_embed(shape=grid), atol=1e-6, rtol=0)


def test_axial_table_layout():
    # Pairs 0 .. D/4-1 follow the column (x), pairs D/4 .. D/2-1 the row (y); angle = index / 100^(4i/D).
    rows, cols, head_dim = 6, 10, 32
    table = axial_rope_table((rows, cols), head_dim)
    sin = table[:, :head_dim].reshape(rows, cols, head_dim // 2, 2)
    assert torch.equal(sin[..., 0], sin[..., 1])  # both channels of a pair share the angle
    r, c = 4, 7
    mag = 1 / 100.0 ** (4 * torch.arange(head_dim // 4) / head_dim)
    torch.testing.assert_close(sin[r, c, : head_dim // 4, 0], torch.sin(c * mag))
    torch.testing.assert_close(sin[r, c, head_dim // 4 :, 0], torch.sin(r * mag))


def test_mixed_freqs_equal_timm_init_with_the_same_seed():
    # timm draws one torch.rand(depth, heads, 1) for the angles, so the same seed gives the same tensor.
    torch.manual_seed(3)
    ours = mixed_rope_freqs(64, 4, 6, 10.0)
    torch.manual_seed(3)
    ref = init_random_2d_freqs(64, 4, 6, temperature=10.0)
    assert ours.shape == (2, 4, 6, 32)
    assert torch.equal(ours, ref)
    # And the same as timm's module (the model itself draws other weights before its rope).
    torch.manual_seed(5)
    module = MixedRotary(64, 2, 6)
    torch.manual_seed(5)
    timm_rope = RotaryEmbeddingMixed(EMBED_DIM, depth=2, num_heads=6, temperature=10.0)
    assert torch.equal(module.freqs.data, timm_rope.freqs.data)


def test_mixed_freqs_init_statistics():
    head_dim, q = 32, 8
    freqs = mixed_rope_freqs(head_dim, 3, 5, temperature=10.0)  # (2, depth, heads, 16)
    norms = freqs.norm(dim=0)  # (depth, heads, D/2)
    mag = 1 / 10.0 ** (4 * torch.arange(q) / head_dim)
    torch.testing.assert_close(norms, torch.cat([mag, mag]).expand_as(norms))
    # Pair L + i is pair i turned by 90 degrees; directions differ between heads.
    unit = freqs / norms
    torch.testing.assert_close((unit[..., :q] * unit[..., q:]).sum(0), torch.zeros(3, 5, q), atol=1e-6, rtol=0)
    assert unit[:, 0, :, 0].T.unique(dim=0).shape[0] == 5


def test_mixed_table_equals_timm_for_the_same_freqs():
    timm_rope = _timm_rope("vit_small_patch16_rope_mixed_224", depth=3)
    holder = torch.nn.Module()
    holder.rope = MixedRotary(64, 3, 6)
    # timm's state dict key rope.freqs loads into an attribute `rope`.
    holder.load_state_dict({"rope.freqs": timm_rope.state_dict()["freqs"]})
    for grid in GRIDS:
        ours = holder.rope.grid_table(grid)
        assert ours.shape == (3, 6, grid[0] * grid[1], 128) and ours.dtype == torch.float32
        torch.testing.assert_close(ours, timm_rope.get_embed(shape=grid), atol=1e-6, rtol=0)
    cached = _timm_rope("vit_small_patch16_rope_mixed_224", (14, 14), depth=3)
    cached.load_state_dict(timm_rope.state_dict())
    torch.testing.assert_close(holder.rope.grid_table((14, 14)), cached.get_embed(), atol=1e-6, rtol=0)


def test_mixed_gradients_flow_into_freqs_and_match_timm():
    timm_rope = _timm_rope("vit_small_patch16_rope_mixed_224", depth=2)
    ours = MixedRotary(64, 2, 6)
    ours.load_state_dict(timm_rope.state_dict())
    x = torch.randn(2, 6, 6 * 10, 64)
    for apply, table in (
        (apply_rope, ours.grid_table((6, 10))),
        (apply_rot_embed_cat, timm_rope.get_embed(shape=(6, 10))),
    ):
        loss = sum((apply(x, table[i]) * x.flip(2)).sum() for i in range(2))  # every block contributes
        loss.backward()
    assert ours.freqs.grad is not None and torch.all(ours.freqs.grad != 0)
    torch.testing.assert_close(ours.freqs.grad, timm_rope.freqs.grad, atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_rope_equals_timm(dtype):
    grid, heads, head_dim = (6, 10), 6, 64
    x = torch.randn(2, heads, grid[0] * grid[1], head_dim).to(dtype)
    axial = axial_rope_table(grid, head_dim)  # (N, 2D)
    mixed = mixed_rope_table(mixed_rope_freqs(head_dim, 1, heads), grid)[0]  # (heads, N, 2D)
    for table in (axial, mixed):
        out = apply_rope(x, table)
        assert out.dtype == dtype and out.shape == x.shape
        torch.testing.assert_close(out, apply_rot_embed_cat(x, table), atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_complex_multiply_computes_the_real_form(monkeypatch, dtype):
    # Eager apply_rope turns each pair by one complex multiply; traced and compiled models take the real form.
    # Both give the same output and the same gradients, for q and k as attention slices them out of one qkv.
    grid, heads, head_dim = (4, 6), 3, 16
    qkv = torch.randn(2, grid[0] * grid[1], 3 * heads * head_dim).to(dtype).requires_grad_()
    freqs = mixed_rope_freqs(head_dim, 1, heads).requires_grad_()
    upstream = torch.randn(2, heads, grid[0] * grid[1], head_dim)

    def run(complex_ok: bool):
        monkeypatch.setattr(rope, "_complex_multiply_ok", lambda pairs: complex_ok and pairs.dtype == torch.float32)
        qkv.grad = freqs.grad = None
        q, k, _ = qkv.reshape(2, -1, 3, heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)  # strided views
        table = mixed_rope_table(freqs, grid)[0]
        out = apply_rope(q, table) * 2 + apply_rope(k, table)
        (out.float() * upstream).sum().backward()
        return out.detach(), qkv.grad, freqs.grad

    calls = []
    monkeypatch.setattr(torch, "view_as_complex", lambda x, f=torch.view_as_complex: calls.append(1) or f(x))
    fast, real = run(True), run(False)
    assert len(calls) == 2  # q and k took the complex multiply in the first run only
    assert torch.equal(fast[0], real[0]) and torch.equal(fast[1], real[1])
    torch.testing.assert_close(fast[2], real[2], atol=1e-5, rtol=1e-5)  # the table's gradient, summed in another order


def test_apply_rope_preserves_the_norm_of_each_pair():
    x = torch.randn(2, 6, 8 * 8, 32)
    for table in (axial_rope_table((8, 8), 32), mixed_rope_table(mixed_rope_freqs(32, 1, 6), (8, 8))[0]):
        out = apply_rope(x, table)
        torch.testing.assert_close(out.unflatten(-1, (-1, 2)).norm(dim=-1), x.unflatten(-1, (-1, 2)).norm(dim=-1))
        assert not torch.allclose(out, x)


def test_attention_logits_depend_only_on_the_offset():
    rows, cols, head_dim = 5, 7, 32
    q, k = torch.randn(head_dim), torch.randn(head_dim)
    n = rows * cols
    for table in (axial_rope_table((rows, cols), head_dim), mixed_rope_table(mixed_rope_freqs(32, 1, 1), (5, 7))[0]):
        rq = apply_rope(q.expand(1, 1, n, head_dim), table)[0, 0]  # same q at every position
        rk = apply_rope(k.expand(1, 1, n, head_dim), table)[0, 0]
        logits = (rq @ rk.T).reshape(rows, cols, rows, cols)
        # Shift both query and key by one row, or by one column: the logit does not change.
        torch.testing.assert_close(logits[1:, :, 1:, :], logits[:-1, :, :-1, :], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(logits[:, 1:, :, 1:], logits[:, :-1, :, :-1], atol=1e-4, rtol=1e-4)
        assert not torch.allclose(logits[0, 0, 0, 0], logits[0, 0, 2, 3])


def test_head_dim_not_divisible_by_four_is_rejected():
    with pytest.raises(ValueError, match="divisible by 4"):
        axial_rope_table((4, 4), 30)
    with pytest.raises(ValueError, match="divisible by 4"):
        MixedRotary(30, 1, 1)


def test_onnx_export_matches_pytorch(tmp_path):
    # repeat_interleave in the tables made the TorchScript exporter lose the rank and export wrong numbers.
    onnxruntime = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")

    class Rotate(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rope = MixedRotary(32, 2, 3)

        def forward(self, x):
            return apply_rope(x, self.rope.grid_table((6, 10))[1]) + apply_rope(x, axial_rope_table((6, 10), 32))

    model = Rotate().eval()
    path = tmp_path / "rope.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (torch.randn(2, 3, 60, 32),),
            str(path),
            input_names=["x"],
            dynamic_axes={"x": {0: "batch"}},
            opset_version=17,
            dynamo=False,
        )
    x = torch.randn(3, 3, 60, 32)
    out = onnxruntime.InferenceSession(str(path)).run(None, {"x": x.numpy()})[0]
    torch.testing.assert_close(torch.from_numpy(out), model(x).detach(), atol=1e-5, rtol=1e-5)
