"""The GPU tier: the device paths behind the project's GPU figures, run wherever a CUDA device is (marked `cuda`;
skipped with that reason elsewhere, see conftest.py). `lab/gpu_check.sh` runs this file first on a GPU machine.

Covered: a training run under bf16 (the GPU-resident loader, compiled blocks, fused AdamW), one under CUDA graphs
(compile_mode=reduce-overhead) and one under fp16 with the GradScaler; the batched augmentation drawing the same
images on the GPU as on the CPU; fused AdamW equal to the per-tensor loop; a compiled block equal to the eager one;
ONNX export of a model that lives on the GPU; vit-eval on CUDA equal to the CPU; a one-process NCCL group."""

from __future__ import annotations

import copy
import socket

import pytest
import torch
from trainer_utils import QUICK, compose_config

pytestmark = pytest.mark.cuda

CUDA = torch.device("cuda")


def gpu_run(tmp_path, name: str, overrides: list[str]) -> tuple[dict, dict]:
    from vit.train import run

    metrics = run(compose_config([*QUICK, "trainer.device=cuda", "trainer.epochs=3", *overrides]), tmp_path / name)
    state = torch.load(tmp_path / name / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)
    return metrics, state


def check_trained(metrics: dict) -> None:
    losses = [row["train_loss"] for row in metrics["history"]]
    assert all(torch.isfinite(torch.tensor(losses))), losses
    assert losses[-1] < losses[0], losses  # it learns, not only runs
    assert metrics["device"].startswith("cuda")
    assert metrics["final"]["val_top1"] is not None


def test_a_bf16_run_with_the_gpu_loader_compiled_blocks_and_fused_adamw(tmp_path):
    metrics, state = gpu_run(
        tmp_path,
        "bf16",
        ["trainer.amp=bf16", "data.loader=resident", "trainer.compile=true", "trainer.compile_scope=blocks"],
    )
    check_trained(metrics)
    assert metrics["precision"] == "bf16" and metrics["loader"] == "resident" and metrics["compiled"]
    assert state["scaler"] is None  # bf16 needs no loss scaling
    assert all(group["fused"] for group in state["optimizer"]["param_groups"])


def test_a_run_under_cuda_graphs_trains_and_evaluates(tmp_path):
    """`trainer.compile_mode=reduce-overhead` (CUDA graphs, against the launch cost of the GPU recipes' small steps):
    the whole model compiled, each step replays its recorded graphs, and nothing the loop keeps of a step (the loss
    it logs, the EMA, the evaluation's logits) is read after the next step has overwritten the graph's outputs."""
    overrides = ["trainer.amp=bf16", "data.loader=resident", "trainer.compile=true", "trainer.compile_scope=model"]
    metrics, _ = gpu_run(tmp_path, "graphs", [*overrides, "trainer.compile_mode=reduce-overhead", "trainer.ema=true"])
    check_trained(metrics)
    assert metrics["compiled"] and metrics["final"]["val_ema_top1"] is not None


def test_an_fp16_run_scales_its_loss(tmp_path):
    metrics, state = gpu_run(tmp_path, "fp16", ["trainer.amp=fp16", "data.loader=torch"])
    check_trained(metrics)
    assert metrics["precision"] == "fp16"
    assert state["scaler"] is not None and state["scaler"]["scale"] > 0  # the GradScaler ran and was saved


@pytest.mark.parametrize(
    "policy", [None, "trivial", "autoaug", "rand-m9-mstd0.5-inc1"], ids=["crop-flip", "trivial", "autoaug", "rand"]
)
def test_the_batched_augmentation_draws_the_same_images_on_the_gpu_as_on_the_cpu(policy):
    from vit.data.augment.batch import BatchAugment
    from vit.data.augment.spec import augment_settings

    spec = augment_settings({"crop": "pad", "pad": 4, "hflip": True, "auto_augment": policy, "re_prob": 0.0})
    images = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8)
    out = {}
    for device in ("cpu", "cuda"):
        augment = BatchAugment(spec, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25), 32, train=True)
        if hasattr(augment.policy, "pillow"):  # RandAugment: the same tensor kernels on both devices
            augment.policy.pillow, augment.policy.subsets = False, False
        generator = augment.generator(seed=3, epoch=1, rank=0, index=5)
        out[device] = augment(images.to(device), generator).cpu()
    level = (out["cuda"] - out["cpu"]).abs() * 0.25 * 255  # back to uint8 levels
    if policy is None:  # crop and flip only move pixels
        assert torch.equal(out["cuda"], out["cpu"])
    else:  # the same draws; the ops' float arithmetic may round a level differently on the two devices
        assert (level > 1.01).float().mean() < 1e-3, float((level > 1.01).float().mean())


def test_fused_adamw_equals_the_per_tensor_loop():
    from omegaconf import OmegaConf

    from vit.models import create_model
    from vit.train.optimizer import build_optimizer

    # No qkv bias: the key bias gets a gradient of rounding noise only, which Adam's normalisation magnifies.
    model = create_model(
        "vit_tiny", img_size=32, patch_size=4, num_classes=10, embed_dim=64, depth=2, num_heads=2, qkv_bias=False
    ).to(CUDA)
    reference = copy.deepcopy(model)
    optim_cfg = OmegaConf.create({"name": "adamw", "weight_decay": 0.05, "lr": 1e-3})
    fused = build_optimizer(model, optim_cfg, 1e-3, CUDA)
    assert all(group["fused"] for group in fused.param_groups)
    # The same groups (decay / no decay) as the fused optimizer, in the per-tensor loop.
    names = {id(p): n for n, p in model.named_parameters()}
    ref_params = dict(reference.named_parameters())
    looped = torch.optim.AdamW(
        [
            {"params": [ref_params[names[id(p)]] for p in group["params"]], "weight_decay": group["weight_decay"]}
            for group in fused.param_groups
        ],
        lr=1e-3,
        foreach=False,
        fused=False,
    )
    images, targets = torch.randn(16, 3, 32, 32, device=CUDA), torch.randint(0, 10, (16,), device=CUDA)
    for _ in range(5):  # one backward, its gradients given to both: the optimizers alone are compared
        fused.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(images), targets).backward()
        for p, q in zip(model.parameters(), reference.parameters(), strict=True):
            q.grad = p.grad.clone()
        fused.step()
        looped.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


def test_a_compiled_block_computes_what_the_eager_block_computes(monkeypatch):
    from vit.models import Block

    # Full fp32 matmuls on both sides (a trainer run earlier in the process allows TF32, whose rounding differs
    # between the eager and the compiled kernels by ~1e-4).
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    block = Block(dim=64, num_heads=4).to(CUDA)
    compiled = torch.compile(copy.deepcopy(block))
    x = torch.randn(4, 17, 64, device=CUDA, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    eager_out, compiled_out = block(x), compiled(x2)
    torch.testing.assert_close(compiled_out, eager_out, rtol=1e-4, atol=1e-5)
    eager_out.square().sum().backward()
    compiled_out.square().sum().backward()
    torch.testing.assert_close(x2.grad, x.grad, rtol=1e-4, atol=1e-4)


def test_onnx_export_of_a_model_on_the_gpu(tmp_path):
    pytest.importorskip("onnxruntime", reason="the export extra (onnx, onnxruntime) is not installed")
    from vit.deploy.export import export_model, run_onnx
    from vit.deploy.preprocessing import Preprocessing
    from vit.models import create_model

    model = create_model("vit_tiny", img_size=32, patch_size=4, num_classes=10, embed_dim=64, depth=2, num_heads=2)
    model = model.to(CUDA).eval()
    images = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        on_gpu = model(images.to(CUDA)).cpu()
    pre = Preprocessing(32, 32, "bilinear", (0.5,) * 3, (0.25,) * 3, "test")
    result = export_model(model, tmp_path / "m.onnx", "onnx", pre, None, images, batch=None)
    assert result.max_abs_diff <= 1e-4
    torch.testing.assert_close(torch.from_numpy(run_onnx(result.path, images)), on_gpu, rtol=1e-3, atol=1e-4)
    assert next(model.parameters()).device.type == "cuda"  # the caller's model is left where it was


def test_evaluate_on_cuda_gives_the_cpu_numbers(trained, tmp_path):
    from vit.cli.evaluate import evaluate_weights

    results = {d: evaluate_weights([f"checkpoint={trained}", f"device={d}", "amp=none"]) for d in ("cpu", "cuda")}
    assert results["cuda"]["count"] == results["cpu"]["count"] > 0
    assert results["cuda"]["top1"] == pytest.approx(results["cpu"]["top1"], abs=100 / results["cpu"]["count"])
    assert results["cuda"]["loss"] == pytest.approx(results["cpu"]["loss"], rel=1e-4)


def test_a_one_process_nccl_group_all_reduces(monkeypatch):
    import torch.distributed as dist

    from vit.runtime.distributed import Distributed, setup_distributed

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert not setup_distributed(CUDA).enabled  # one process: no group, every helper a no-op
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        assert dist.get_backend() == "nccl"
        tensor = torch.arange(4.0, device=CUDA)
        dist.all_reduce(tensor)
        torch.cuda.synchronize()
        assert tensor.tolist() == [0.0, 1.0, 2.0, 3.0]
    finally:
        Distributed(owns_group=True).close()  # our teardown destroys the group it owns
    assert not dist.is_initialized()
