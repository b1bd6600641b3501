"""NaFlex batches (vit/models/naflex_tokens.py): images of their own shapes, cut into patches on their own grids and
packed with padding. Our ViT given timm's NaFlexVit weights computes timm's logits and gradients on the same batch
(sequence lengths and aspect ratios of several kinds, the gap, aspect-preserving gap, factorized aspect-preserving
gap, map and SigLIP 2 variants);
padding changes nothing; a NaFlex batch and the image tensor of the same images give the same logits."""

import pytest
import timm
import torch
from safetensors.torch import save_file

from vit.deploy.export import NaFlexInputs
from vit.models import create_model
from vit.models.foundation import timm_architecture
from vit.models.vit import VisionTransformer, ViTConfig
from vit.naflex import naflex_inputs, pack, patchify
from vit.weights.read import load_pretrained, read_weights
from vit.weights.timm_names import timm_keys_to_ours

# The five kinds of NaFlexVit head and position table: average pooling over the patches (4 registers), the same with
# the table resampled aspect-preserving, the same with NaViT's factorized row and column tables, attention pooling
# (1 register), SigLIP 2's (attention pooling, tanh GELU, a bilinearly resampled table). Each at 1 block and 64
# wide, as timm builds the family at any size.
FAMILIES = [
    "naflexvit_base_patch16_gap",
    "naflexvit_base_patch16_par_gap",
    "naflexvit_base_patch16_parfac_gap",
    "naflexvit_base_patch16_map",
    "naflexvit_base_patch16_siglip",
]
SMALL = dict(depth=1, embed_dim=64, num_heads=2)
# (height, width) in pixels at patch 16: a square of the table's own 16 x 16 grid, a wide and a tall image, and
# small ones, so that one batch holds 3 sequence lengths and 3 aspect ratios beside the table's own.
SHAPES = [(256, 256), (48, 112), (96, 32), (64, 64), (16, 16)]


def images(shapes=SHAPES, seed=2) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(3, h, w, generator=generator) for h, w in shapes]


def timm_and_ours(name: str, path, **timm_kwargs) -> tuple[torch.nn.Module, torch.nn.Module]:
    """timm's model, every parameter moved off its init, saved to a file; ours built from the name and read from it.
    The position table is moved as far as the tokens are wide (std 1, not timm's 0.02): at its init, how it is
    resampled to each image's grid (bicubic or bilinear, aspect-preserving or not) hardly shows in the logits; the
    attention's projections too (std 0.3), so that its rotary positions show."""
    torch.manual_seed(0)
    theirs = timm.create_model(name, pretrained=False, num_classes=7, **SMALL, **timm_kwargs)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for key, param in theirs.named_parameters():
            scale = 1.0 if key.startswith("embeds.pos_embed") else 0.3 if ".attn.qkv." in key else 0.02
            param.add_(scale * torch.randn(param.shape, generator=generator))
    save_file({k: v.contiguous() for k, v in theirs.state_dict().items()}, str(path))
    arch = timm_architecture(name, **SMALL, **timm_kwargs)
    ours = VisionTransformer(ViTConfig(**arch.settings, num_classes=7))
    load_pretrained(ours, read_weights(f"timm:{name}", file=str(path)))  # strict, after the reader's layout
    return theirs.eval(), ours.eval()


def assert_same_gradients(ours, out, theirs, ref) -> None:
    """The gradients of sum(logits^2) through both models, every parameter within 1e-5 (relative past 1)."""
    out.square().sum().backward()
    ref.square().sum().backward()
    their_grads = timm_keys_to_ours({k: p.grad for k, p in theirs.named_parameters()})
    for key, param in ours.named_parameters():
        reference = their_grads[key]
        assert ((param.grad - reference).abs().max() / max(1.0, reference.abs().max())).item() <= 1e-5, key


@pytest.mark.parametrize("name", FAMILIES)
def test_our_naflex_forward_and_gradients_are_timms(name, tmp_path):
    theirs, ours = timm_and_ours(name, tmp_path / "weights.safetensors")
    batch = pack(images(), (16, 16))  # 256 tokens long: the square image's; the others padded
    assert batch["patch_valid"].sum(dim=1).tolist() == [256, 21, 12, 16, 1]
    out, ref = ours(batch), theirs(dict(batch))
    assert out.shape == ref.shape == (len(SHAPES), 7)
    assert (out - ref).abs().max().item() <= 1e-5
    assert_same_gradients(ours, out, theirs, ref)


# timm's RoPE ViTs built as a NaFlexVit (`use_naflex=True`, the Eva models' NaFlex form): axial, mixed and DINOv3
# rotary positions, each image's rotation that of its own grid.
ROTARY = ["vit_small_patch16_rope_224", "vit_small_patch16_rope_mixed_224", "vit_small_patch16_dinov3"]


@pytest.mark.parametrize("name", ROTARY)
def test_naflex_rotary_positions_are_timms(name, tmp_path):
    theirs, ours = timm_and_ours(name, tmp_path / "weights.safetensors", use_naflex=True)
    assert type(theirs).__name__ == "NaFlexVit" and theirs.rope is not None
    batch = pack(images(), (16, 16))
    out, ref = ours(batch), theirs(dict(batch))
    assert (out - ref).abs().max().item() <= 1e-5
    with torch.no_grad():  # the positions show: each grid read transposed gives other logits
        transposed = ours({**batch, "patch_coord": batch["patch_coord"].flip(-1)})
    assert (transposed - ref)[1:3].abs().max().item() > 1e-3  # the wide and the tall image
    assert_same_gradients(ours, out, theirs, ref)


@pytest.mark.parametrize("name", FAMILIES)
def test_an_image_tensor_of_another_shape_gives_timms_logits(name, tmp_path):
    """The same models on an ordinary batch of 64 x 96 px images (a 4 x 6 grid, not the table's 16 x 16): timm
    cuts and projects it as patches, ours with the Conv2d; the table resampled alike."""
    theirs, ours = timm_and_ours(name, tmp_path / "weights.safetensors")
    pictures = torch.randn(2, 3, 64, 96, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert (ours(pictures) - theirs(pictures)).abs().max().item() <= 1e-5


@pytest.mark.parametrize("name", ["naflexvit_base_patch16_gap", "naflexvit_base_patch16_map"])
def test_padding_changes_nothing(name, tmp_path):
    """Each image alone (no padding) and packed beside a longer one (padded to its length) give the same logits."""
    _, ours = timm_and_ours(name, tmp_path / "weights.safetensors")
    pictures = images()
    with torch.no_grad():
        together = ours(pack(pictures, (16, 16), seq_len=300))
        alone = torch.cat([ours(pack([picture], (16, 16))) for picture in pictures])
    assert (together - alone).abs().max().item() <= 1e-5


@pytest.mark.parametrize("pos_embed", ["learned", "rope_mixed", "rope", "factorized"])
def test_a_naflex_batch_computes_what_the_image_tensor_computes(pos_embed):
    """Square images of the model's size, and of another size with a dynamic image size: the same logits as a
    tensor and as a NaFlex batch, for a learned table (with a cls token's row), rotary positions and a factorized
    pair (the image's tokens only)."""
    torch.manual_seed(0)
    model = create_model(
        "vit_tiny",
        img_size=32,
        patch_size=4,
        depth=2,
        num_classes=5,
        pos_embed=pos_embed,
        dynamic_img_size=True,
        no_embed_class=pos_embed == "factorized",
    ).eval()
    for side in (32, 24):
        pictures = torch.randn(3, 3, side, side)
        with torch.no_grad():
            expected, got = model(pictures), model(pack(list(pictures), (4, 4)))
        assert (expected - got).abs().max().item() <= 1e-5, side


def test_factorized_tables_read_at_another_grid_compute_what_the_forward_resamples(tmp_path):
    """timm's factorized model (16 x 16 tables) read into one of 7 x 7 patches (each table resampled once, on
    loading), and ours fixed at that size with set_input_size, compute what the 16 x 16 model computes on 112 px
    images, where its forward resamples the tables; an ordinary table would not give the same numbers."""
    name = "naflexvit_base_patch16_parfac_gap"
    theirs, ours = timm_and_ours(name, tmp_path / "weights.safetensors")
    settings = {**timm_architecture(name, **SMALL).settings, "img_size": 112, "dynamic_img_size": False}
    smaller = VisionTransformer(ViTConfig(**settings, num_classes=7)).eval()
    load_pretrained(smaller, read_weights(f"timm:{name}", file=str(tmp_path / "weights.safetensors")))
    assert smaller.pos_embed_y.shape == smaller.pos_embed_x.shape == (1, 7, 64)
    fixed = VisionTransformer(ViTConfig(**{**settings, "img_size": 256}, num_classes=7)).eval()
    fixed.load_state_dict(ours.state_dict())
    fixed.set_input_size(112)
    pictures = torch.randn(2, 3, 112, 112, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = theirs(pictures)
        for model in (smaller, fixed):
            assert (model(pictures) - expected).abs().max().item() <= 1e-5


def test_patches_are_cut_as_the_convolution_reads_them():
    """patchify's (row, column, channel) flattening through `embed_patches` is the patch Conv2d's output."""
    torch.manual_seed(0)
    model = create_model("vit_tiny", img_size=32, patch_size=4, depth=1, num_classes=0)
    picture = torch.randn(3, 32, 32)
    patches, grid = patchify(picture, (4, 4))
    assert grid == (8, 8) and patches.shape == (64, 48)
    with torch.no_grad():
        expected = model.patch_embed(picture[None])[0]  # (64, 192)
        got = model.patch_embed.embed_patches(patches[None])[0]
    assert (expected - got).abs().max().item() <= 1e-5


def test_bad_batches_and_images_are_named():
    with pytest.raises(ValueError, match="missing: patch_valid"):
        naflex_inputs({"patches": torch.zeros(1, 4, 48), "patch_coord": torch.zeros(1, 4, 2)})
    with pytest.raises(ValueError, match="patch_coord of shape"):
        naflex_inputs(
            {"patches": torch.zeros(1, 4, 48), "patch_coord": torch.zeros(1, 3, 2), "patch_valid": torch.ones(1, 4)}
        )
    with pytest.raises(ValueError, match="at least one valid patch"):
        naflex_inputs(
            {"patches": torch.zeros(1, 4, 48), "patch_coord": torch.zeros(1, 4, 2), "patch_valid": torch.zeros(1, 4)}
        )
    with pytest.raises(ValueError, match="30 x 32 px is not a whole number of 4 x 4 patches"):
        patchify(torch.zeros(3, 30, 32), (4, 4))
    with pytest.raises(ValueError, match="does not fit seq_len=16"):
        pack([torch.zeros(3, 32, 32)], (4, 4), seq_len=16)
    conv_stem = create_model("vit_tiny", img_size=32, patch_size=4, depth=1, num_classes=2, patch_embed="conv")
    with pytest.raises(ValueError, match="need the standard patch embedding"):
        conv_stem(pack([torch.zeros(3, 32, 32)], (4, 4)))


@pytest.mark.slow  # the trainer builds timm's whole architecture: ViT-B, 86 M parameters, a 350 MB file
def test_a_naflex_family_fine_tunes_from_its_timm_name_through_the_trainer(tmp_path):
    """`model.pretrained=timm:naflexvit_base_patch16_siglip` with a file: timm's architecture (a bilinear table over
    the patches only, tanh GELU, attention pooling), one step on 32 px images at patch 4 (table and kernel
    resampled), and the checkpoint builds the same model again for the tools."""
    from trainer_utils import QUICK_SYNTHETIC, compose_config

    from vit.deploy.loaded_model import build_model
    from vit.train import run
    from vit.weights.read import load_checkpoint

    name = "naflexvit_base_patch16_siglip"
    torch.manual_seed(0)
    theirs = timm.create_model(name, pretrained=False, num_classes=0)
    save_file({k: v.contiguous() for k, v in theirs.state_dict().items()}, str(tmp_path / "weights.safetensors"))
    overrides = [f"model.pretrained=timm:{name}", f"model.pretrained_file={tmp_path / 'weights.safetensors'}"]
    overrides += [*QUICK_SYNTHETIC, "trainer.device=cpu", "trainer.attn_maps_every_n_epochs=0", "trainer.ema=false"]
    overrides += ["data.img_size=32", "data.patch_size=4", "trainer.epochs=1", "trainer.limit_train_batches=1"]
    overrides += ["trainer.limit_val_batches=1", "data.batch_size=4"]
    run(compose_config(overrides), output_dir=tmp_path / "run")
    checkpoint = tmp_path / "run" / "checkpoints" / "last.pt"
    rebuilt = build_model(read_weights(checkpoint), str(checkpoint)).model
    assert rebuilt.config.pos_embed_interp == "bilinear" and rebuilt.config.mlp == "gelu_tanh"
    assert rebuilt.pos_embed.shape == (1, 64, 768) and rebuilt.cls_token is None
    trained = load_checkpoint(checkpoint)["model"]
    for key, value in rebuilt.state_dict().items():
        assert torch.equal(value, trained[key].float()), key


@pytest.mark.parametrize("mode", ["bicubic", "bilinear"])
@pytest.mark.parametrize("ar_preserving", [False, True])
def test_the_per_token_resampling_a_trace_uses_is_the_tables(mode, ar_preserving):
    """`resampled_rows_at` (the weights of F.interpolate's antialiased kernel written out, each token's row from
    tensors) gives `resample_pos_embed`'s rows, shrinking, stretching and at the table's own grid; and
    `factorized_rows_at` gives `factorized_table`'s."""
    from vit.models.pos_embed import factorized_rows_at, factorized_table, resample_pos_embed, resampled_rows_at

    generator = torch.Generator().manual_seed(0)
    table = torch.randn(1, 7 * 9, 5, generator=generator)  # a 7 x 9 table of 5 channels, no prefix rows
    rows, columns = torch.randn(1, 7, 5, generator=generator), torch.randn(1, 9, 5, generator=generator)
    for grid in [(7, 9), (1, 1), (3, 4), (7, 2), (12, 5), (16, 16), (2, 20)]:
        y, x = (t.reshape(1, -1) for t in torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij"))
        height, width = torch.tensor([[grid[0]]]), torch.tensor([[grid[1]]])
        side = torch.maximum(height, width)
        lengths = (side, side) if ar_preserving and grid != (7, 9) else (height, width)
        expected = resample_pos_embed(table, grid, 0, (7, 9), mode, ar_preserving)
        got = resampled_rows_at(table[0], (7, 9), lengths, y, x, mode)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
        expected = factorized_table(rows, columns, grid, ar_preserving and grid != (7, 9))
        torch.testing.assert_close(factorized_rows_at(rows, columns, lengths, y, x), expected, atol=1e-5, rtol=0)


TRACED = {
    "learned bicubic": dict(pos_embed="learned"),
    "learned bilinear, aspect-preserving, average pooling": dict(
        pos_embed="learned", pos_embed_interp="bilinear", pos_embed_ar_preserving=True, global_pool="avg"
    ),
    "factorized, aspect-preserving": dict(
        pos_embed="factorized", no_embed_class=True, pos_embed_ar_preserving=True, reg_tokens=2
    ),
    "axial rope": dict(pos_embed="rope"),
    "mixed rope, sequence pooling": dict(pos_embed="rope_mixed", class_token=False, global_pool="seq"),
    "dinov3 rope": dict(pos_embed="rope_dinov3"),
    "eva-02 (a table and rope on a reference grid)": dict(pos_embed="learned_rope", rope_ref_grid=6),
}


@pytest.mark.parametrize("variant", list(TRACED))
def test_a_traced_naflex_forward_computes_the_eager_logits_at_grids_it_was_not_traced_on(variant):
    """A NaFlex model traced on one batch (what vit-export writes) computes the eager model's logits on batches of
    other grids and lengths: its grids come from the coordinates inside the graph, not from the example."""
    torch.manual_seed(0)
    kwargs = dict(img_size=32, patch_size=4, depth=1, embed_dim=32, num_heads=2, num_classes=3, **TRACED[variant])
    model = create_model("vit_tiny", **kwargs).eval()
    with torch.no_grad():  # move every parameter off its init so positions matter
        for param in model.parameters():
            param.add_(0.5 * torch.randn_like(param))
    generator = torch.Generator().manual_seed(1)

    def batch(shapes):
        batched = pack([torch.randn(3, h, w, generator=generator) for h, w in shapes], (4, 4), seq_len=64)
        return tuple(batched[key] for key in ("patches", "patch_coord", "patch_valid"))

    eager = NaFlexInputs(model)  # the three tensors in, as vit-export traces it
    with torch.no_grad():
        traced = torch.jit.trace(eager, batch([(32, 32), (16, 24)]), check_trace=False)
        for shapes in ([(12, 20), (28, 8), (32, 32)], [(4, 4), (40, 16)], [(24, 24)]):
            inputs = batch(shapes)
            torch.testing.assert_close(traced(*inputs), eager(*inputs), atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", ["naflexvit_base_patch16_gap", "naflexvit_base_patch16_siglip"])
def test_patches_of_another_size_give_timms_logits_through_its_patch_interpolator(name, tmp_path):
    """Random patch sizes: NaFlex batches cut in 8 px and 24 px patches (unflattened, (B, N, p, p, 3), timm's form)
    through our 16 px model, whose kernel is resampled to them (FlexiViT's pseudo-inverse resize, bicubic or, for
    SigLIP 2, bilinear), give the logits and gradients of timm's NaFlexVit with its patch interpolator."""
    plain, ours = timm_and_ours(name, tmp_path / "weights.safetensors")
    theirs = timm.create_model(name, pretrained=False, num_classes=7, enable_patch_interpolator=True, **SMALL)
    theirs.load_state_dict(plain.state_dict())
    theirs.eval()
    shapes = {8: [(64, 64), (48, 112), (96, 32)], 24: [(96, 96), (48, 120), (24, 24)]}
    for side, sizes in shapes.items():
        batch = pack(images(sizes, seed=side), (side, side), flat=False)
        assert batch["patches"].shape[2:] == (side, side, 3)
        out, ref = ours(batch), theirs(dict(batch))
        assert (out - ref).abs().max().item() <= 1e-5, side
    ours.zero_grad()
    theirs.zero_grad()
    assert_same_gradients(ours, out, theirs, ref)
