"""What an optimizer step costs on this machine: `optimizer.step()` alone over a recipe's model, for each optimizer
the trainer can build (timm's names, with this project's parameter groups), in interleaved rounds.

usage: python lab/bench_optimizer.py [experiment=cifar10_cpu]
    [optimizers=adamw:loop,adamw:foreach,adamw,lion,muon:timm,muon] [threads=<n>] [rounds=7] [steps=20] [device=cpu]
    [json=<file>] [model.<key>=<value> ...]

Each optimizer is built by vit/train/optimizer.py's `build_optimizer` from `optim=<name>` (configs/optim/<name>.yaml,
or `optim.name=<name>` on the AdamW config where no file exists), exactly as the trainer builds it: so `adamw` is
the fused AdamW the trainer runs. `adamw:loop` and `adamw:foreach` are torch's per-tensor loop and multi-tensor
(foreach) implementations of the same AdamW, for comparison; `muon` is the trainer's Muon (vit/train/muon.py: the
Newton-Schulz iterations batched by shape, in the precision native to the device), `muon:timm` timm's own class on
the same groups (one matrix at a time, in bf16), `muon:fp32` and `muon:bf16` the batched one in that precision.
Every parameter gets a fixed random gradient; after two warm-up steps each round times `steps` steps of every
optimizer in turn. Prints the median milliseconds per
step of each, and its ratio to the first; json=<file> writes the measurement record: every round's milliseconds
per step of every optimizer, the medians and ratios, and the provenance (command, commit, machine, versions:
vit/records/provenance.py). The trainer's whole step, for scale: lab/benchmark.py.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from records import measurement_record, script_command, write_record

from vit import CONFIG_DIR
from vit.cli.args import parse_args, run_script
from vit.config.compose import compose
from vit.errors import UsageError
from vit.tasks.build import build_model_from_config
from vit.train.optimizer import build_optimizer, scaled_lr

VARIANTS = {"loop": {"foreach": False, "fused": False}, "foreach": {"foreach": True, "fused": False}}
# Muon's: timm's own class (its per-matrix Newton-Schulz in bf16), and the trainer's batched one in a given precision
# (without a variant: the precision native to the device, vit/train/muon.py).
MUON_VARIANTS = ("timm", "fp32", "bf16")


def optimizer_config(experiment: str, spec: str, model_overrides: list[str]):
    name, _, variant = spec.partition(":")
    if variant and name == "muon":
        if variant not in MUON_VARIANTS:
            raise UsageError(f"optimizers: {spec!r}: muon's variants are {', '.join(MUON_VARIANTS)}")
        variant = ""
    if variant and (name not in ("adam", "adamw") or variant not in VARIANTS):
        raise UsageError(
            f"optimizers: {spec!r}: only adam and adamw have the variants {', '.join(VARIANTS)} (muon: "
            f"{', '.join(MUON_VARIANTS)})"
        )
    has_file = (CONFIG_DIR / "optim" / f"{name}.yaml").is_file()
    group = [f"optim={name}"] if has_file else ["optim=adamw", f"optim.name={name}"]
    kwargs = [f"+optim.kwargs.{key}={str(value).lower()}" for key, value in VARIANTS.get(variant, {}).items()]
    return compose([f"experiment={experiment}", *group, *kwargs, *model_overrides])


def muon_variant(spec: str, optimizer):
    """`muon:timm`: timm's Muon on the trainer's groups; `muon:fp32`, `muon:bf16`: the batched one in that precision."""
    from timm.optim import Muon

    variant = spec.partition(":")[2] if spec.startswith("muon:") else ""
    if variant == "timm":
        return Muon(optimizer.param_groups, **optimizer.defaults)
    if variant:
        optimizer.ns_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[variant]
    return optimizer


def main(argv: list[str]) -> int:
    args = parse_args(
        argv,
        {
            "experiment": "cifar10_cpu",
            "optimizers": "adamw:loop,adamw:foreach,adamw,lion,muon:timm,muon",
            "threads": None,
            "rounds": "7",
            "steps": "20",
            "device": "cpu",
            "json": None,
        },
        model_keys=True,
        lists=("optimizers",),
    )
    rounds, steps = args.integer("rounds"), args.integer("steps")
    if args.get("threads"):
        torch.set_num_threads(args.integer("threads"))
    device = torch.device(args["device"])
    specs = args["optimizers"]
    model_overrides = [edit.text for edit in args.model_edits]
    configs = {spec: optimizer_config(args["experiment"], spec, model_overrides) for spec in specs}
    first = next(iter(configs.values()))
    torch.manual_seed(0)
    model = build_model_from_config(first.model, num_classes=int(first.data.get("num_classes") or 10)).to(device)
    for param in model.parameters():
        param.grad = torch.randn_like(param) * 1e-3
    lr = scaled_lr(first.optim, int(first.data.batch_size))
    optimizers = {
        spec: muon_variant(spec, build_optimizer(model, cfg.optim, lr, device)) for spec, cfg in configs.items()
    }
    params = sum(p.numel() for p in model.parameters())
    tensors = len(list(model.parameters()))
    print(
        f"{args['experiment']}'s model: {params:,} parameters in {tensors} tensors; {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}, {device}"
    )
    for optimizer in optimizers.values():  # warm-up: state allocated, kernels chosen
        for _ in range(2):
            optimizer.step()
    times: dict[str, list[float]] = {spec: [] for spec in specs}
    for _ in range(rounds):
        for spec, optimizer in optimizers.items():
            start = time.perf_counter()
            for _ in range(steps):
                optimizer.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times[spec].append((time.perf_counter() - start) / steps * 1000)
    base = statistics.median(times[specs[0]])
    print(f"| optimizer | class | ms per step (median) | vs {specs[0]} |\n|---|---|---|---|")
    rows = []
    for spec in specs:
        ms = statistics.median(times[spec])
        print(f"| {spec} | {type(optimizers[spec]).__name__} | {ms:.2f} | {ms / base:.2f} |", flush=True)
        rows.append({"optimizer": spec, "class": type(optimizers[spec]).__name__, "ms_rounds": times[spec]})
        rows[-1] |= {"ms_median": ms, "vs_first": ms / base}
    if args["json"]:
        values = {"experiment": args["experiment"], "model": args.model, "params": params, "tensors": tensors}
        values |= {"device": str(device), "rounds": rounds, "steps": steps, "optimizers": rows}
        write_record(measurement_record("bench_optimizer", values, script_command(__file__, argv)), args["json"])
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, usage=__doc__))
