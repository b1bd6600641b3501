"""Training-step throughput of the project's models, optionally against timm side by side; with --e2e, a
real training run through the trainer and what its data path costs over the step alone; with --inference, the
inference latency and img/s (PyTorch eager, torch.compile, the ONNX export in onnxruntime, in float or INT8) at
batch 1 and a large batch, interleaved with timm's model of the same shape.

    python scripts/benchmark.py --models vit_tiny_cifar,vit_base --compile both --vs-timm --memory \\
        --json bench.json --md bench.md
    python scripts/benchmark.py --e2e --epochs 9 data=imagefolder data.root=<cifar10> data.img_size=32 \\
        data.patch_size=4 model=vit_tiny
    python scripts/benchmark.py --inference --models vit_tiny,vit_tiny_cifar --batches 1,64 \
        --runtimes eager,compiled,onnxruntime --vs-timm --device cpu --md inference.md
    python scripts/benchmark.py --inference --models vit_tiny_cifar,vit_small --batches 1,64 --device cpu \
        --runtimes eager,onnxruntime,onnxruntime-int8-dynamic,onnxruntime-int8-static

Prints a markdown table last; --json FILE writes the measurement record: the command, commit, machine and versions
(vit/engine/provenance.py) beside every case's per-round values (seconds and img/s of each timed round; --inference:
each round's mean call time; --e2e: each counted real/static epoch pair) and their medians. See
vit/analysis/benchmark.py (training steps; the models timed are
vit/analysis/bench_cases.py's), vit/analysis/step_profile.py (--profile), vit/analysis/e2e.py (--e2e) and
vit/analysis/inference.py (--inference) for the protocols, docs/BENCHMARKS.md for results.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from vit.analysis.bench_cases import CASES
from vit.analysis.benchmark import bench_case, measure_peak_memory, to_markdown, to_record
from vit.analysis.step_profile import profile_case, profile_markdown
from vit.cli.args import script_command
from vit.engine.provenance import measurement_record, write_record


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="vit_tiny_cifar", help=f"comma list of {', '.join(CASES)}")
    parser.add_argument("--batch", default=None, help="batch size, or a comma list matching --models")
    parser.add_argument("--compile", choices=["off", "on", "both"], default="off")
    parser.add_argument("--compile-mode", default="default", help="torch.compile mode of our model")
    parser.add_argument("--peer-compile-mode", default="default", help="torch.compile mode of the peer")
    parser.add_argument("--vs-timm", action="store_true", help="time timm's model of the same shape, interleaved")
    parser.add_argument("--memory", action="store_true", help="peak CUDA memory per side, in separate processes")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default 5; --inference: 15)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--min-round-s", type=float, default=0.5)
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda")
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        help="write the measurement record here: provenance (command, commit, machine, versions) and every round",
    )
    parser.add_argument("--md", type=Path, default=None, help="write the markdown table here")
    parser.add_argument(
        "--profile", type=Path, default=None, help="instead of timing: profile our model's step, markdown here"
    )
    parser.add_argument("--profile-steps", type=int, default=10)
    parser.add_argument(
        "--e2e", action="store_true", help="train through the trainer with the overrides given; real vs static epochs"
    )
    parser.add_argument("--epochs", type=int, default=9, help="--e2e: epochs (real and static alternate; >= 4)")
    parser.add_argument("--e2e-dir", type=Path, default=None, help="--e2e: run folder (default: a temporary one)")
    parser.add_argument("--inference", action="store_true", help="time inference (no grad) instead of training steps")
    parser.add_argument(
        "--batches", default=None, help="--inference: comma list of batch sizes (default 1,64 on CPU, 1,256 on CUDA)"
    )
    parser.add_argument(
        "--runtimes",
        default="eager,compiled,onnxruntime",
        help="--inference: comma list of eager, compiled, onnxruntime (the ONNX export; CPU only), "
        "onnxruntime-int8-dynamic, onnxruntime-int8-static (the export quantized as export.py quantize= does)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch (and onnxruntime) CPU threads")
    parser.add_argument(
        "--amp",
        choices=["auto", "bf16", "fp16", "none"],
        default="auto",
        help="our model's precision, as trainer.amp (auto: bf16 where the device has it natively and it pays)",
    )
    parser.add_argument(
        "--peer-amp", choices=["same", "auto", "bf16", "fp16", "none"], default="same", help="the peer's precision"
    )
    parser.add_argument("overrides", nargs="*", help="--e2e: trainer config overrides, as for train.py")
    return parser.parse_intermixed_args(argv)  # overrides before and after the flags alike


def run_e2e(args: argparse.Namespace) -> int:
    import tempfile

    from vit.analysis.e2e import e2e_markdown, end_to_end
    from vit.cli.train import check_group_choices, check_override_keys
    from vit.data import DataError
    from vit.engine.compose import compose
    from vit.engine.files import OutputError
    from vit.errors import ConfigError, UsageError
    from vit.train import run

    if args.epochs < 4:
        print(
            f"error: --epochs {args.epochs}: the end-to-end benchmark needs >= 4 (one real/static pair after warm-up)"
        )
        return 2
    defaults = [f"trainer.epochs={args.epochs}", "trainer.save_checkpoints=false", "trainer.attn_maps_every_n_epochs=0"]
    overrides = [*defaults, *args.overrides]  # the user's come last and win
    check_group_choices(overrides)
    check_override_keys(overrides)
    out = args.e2e_dir or Path(tempfile.mkdtemp(prefix="vit-e2e-"))
    try:
        result = end_to_end(compose(overrides), out, train=run)
    except (UsageError, ConfigError, DataError, OutputError) as err:  # bad settings: one line, as train.py says them
        print(f"error: {err}")
        return 2
    table = e2e_markdown(result, " ".join(args.overrides) or "defaults")
    if args.json:
        write_record(measurement_record("benchmark_e2e", result.to_dict(), args.command), args.json)
    if args.md:
        args.md.write_text(table + "\n")
    print(f"\nrun folder: {out}; device: {result.device}, torch {torch.__version__}")
    print(table)
    return 0


def run_inference(args: argparse.Namespace, names: list[str], device: torch.device) -> int:
    from vit.analysis.inference import ONNX_RUNTIMES, RUNTIMES, bench_inference, inference_markdown, inference_record

    runtimes = tuple(r for r in args.runtimes.split(",") if r)
    unknown = [r for r in runtimes if r not in RUNTIMES]
    if unknown:
        print(f"error: --runtimes {unknown[0]!r} is not a runtime; choose from {', '.join(RUNTIMES)}")
        return 2
    onnx = [r for r in runtimes if r in ONNX_RUNTIMES]
    if onnx:
        from vit.deploy.export import ExportError, require_export_extra

        try:
            require_export_extra()
        except ExportError as err:
            print(f"error: --runtimes {onnx[0]}: {str(err).replace('format=onnx ', '')}")
            return 2
    try:
        batches = [int(b) for b in (args.batches or ("1,64" if device.type == "cpu" else "1,256")).split(",")]
    except ValueError:
        batches = [0]
    if min(batches) < 1:
        print(f"error: --batches {args.batches!r} must be a comma list of positive integers")
        return 2
    results = []
    for name in names:
        for batch in batches:
            result = bench_inference(
                CASES[name],
                device,
                batch,
                runtimes=runtimes,
                vs_peer=args.vs_timm,
                rounds=args.rounds or 15,
                warmup=args.warmup,
                min_round_s=args.min_round_s,
                amps=(args.amp, args.peer_amp),
            )
            results.append(result)
            print(inference_markdown([result]).split("\n", 2)[-1], flush=True)
    table = inference_markdown(results)
    if args.json:
        write_record(inference_record(results, args.command), args.json)
    if args.md:
        args.md.write_text(table + "\n")
    print(f"\ndevice: {device}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(table)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.command = script_command(__file__, argv)  # what the JSON record names
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        return run(args)
    finally:
        torch.set_num_threads(threads)  # a caller in the same process (a test) keeps its own setting


def run(args: argparse.Namespace) -> int:
    if args.e2e:
        return run_e2e(args)
    if args.overrides:
        print(f"error: {args.overrides[0]!r}: config overrides only go with --e2e")
        return 2
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print(f"error: --models {unknown[0]!r} is not a benchmark case; choose from {', '.join(CASES)}")
        return 2
    batches = [int(b) for b in args.batch.split(",")] if args.batch else [None] * len(names)
    if len(batches) == 1 and len(names) > 1:
        batches *= len(names)
    if len(batches) != len(names):
        print(f"error: --batch has {len(batches)} values for {len(names)} models")
        return 2
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    if args.inference:
        return run_inference(args, names, device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    modes = {"off": [None], "on": [args.compile_mode], "both": [None, args.compile_mode]}[args.compile]

    if args.profile:
        return run_profile(args, names, batches, modes, device)
    return run_steps(args, names, batches, modes, device)


def run_profile(args: argparse.Namespace, names: list[str], batches: list, modes: list, device: torch.device) -> int:
    """--profile: where each case's training step spends its time, as markdown sections in --profile."""
    sections = []
    for name, batch in zip(names, batches, strict=True):
        for mode in modes:
            summary = profile_case(CASES[name], device, batch, mode, args.profile_steps, args.warmup)
            sections.append(profile_markdown(summary))
            print(sections[-1] + "\n", flush=True)
    args.profile.write_text("\n\n".join(sections) + "\n")
    return 0


def run_steps(args: argparse.Namespace, names: list[str], batches: list, modes: list, device: torch.device) -> int:
    """Training-step throughput of each case and compile mode (against timm's with --vs-timm), as a table."""
    results = []
    for name, batch in zip(names, batches, strict=True):
        case = CASES[name]
        for mode in modes:
            peer_mode = None if mode is None else args.peer_compile_mode
            result = bench_case(
                case,
                device,
                batch=batch,
                compile_mode=mode,
                peer_compile_mode=peer_mode,
                vs_peer=args.vs_timm,
                rounds=args.rounds or 5,
                warmup=args.warmup,
                min_round_s=args.min_round_s,
                amp=args.amp,
                peer_amp=args.peer_amp,
            )
            if args.memory and device.type == "cuda":
                for side in result.sides:
                    side_mode = mode if side.side == "ours" else peer_mode
                    side.peak_gib = measure_peak_memory(case, side.side, result.batch, side_mode)
            results.append(result)
            print(to_markdown([result]).splitlines()[-1], flush=True)

    table = to_markdown(results)
    if args.json:
        write_record(to_record(results, args.command), args.json)
    if args.md:
        args.md.write_text(table + "\n")
    print(
        f"\ndevice: {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}), "
        f"torch {torch.__version__}"
    )
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
