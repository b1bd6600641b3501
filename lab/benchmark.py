"""Training-step throughput of the project's models, optionally against timm side by side; with mode=e2e, a
real training run through the trainer and what its data path costs over the step alone; with mode=inference, the
inference latency and img/s (PyTorch eager, torch.compile, the ONNX export in onnxruntime, in float or INT8) at
batch 1 and a large batch, interleaved with timm's model of the same shape; with mode=profile, where a training
step spends its time.

usage: python lab/benchmark.py [mode=steps|inference|e2e|profile] [models=<case>,...] [device=auto|cpu|cuda]
           [vs_timm=true] [json=<path>] [md=<path>] [key=value ...]

    python lab/benchmark.py models=vit_tiny_cifar,vit_base compile=both vs_timm=true memory=true \\
        json=bench.json md=bench.md
    python lab/benchmark.py mode=e2e epochs=9 data=imagefolder data.root=<cifar10> data.img_size=32 \\
        data.patch_size=4 model=vit_tiny
    python lab/benchmark.py mode=inference models=vit_tiny,vit_tiny_cifar batches=1,64 \\
        runtimes=eager,compiled,onnxruntime vs_timm=true device=cpu md=inference.md
    python lab/benchmark.py mode=inference models=vit_tiny_cifar,vit_small batches=1,64 device=cpu \\
        runtimes=eager,onnxruntime,onnxruntime-int8-dynamic,onnxruntime-int8-static

Keys (default):
    mode (steps)            steps: training-step img/s; inference; e2e: a training run through the trainer, real
                            against static epochs; profile: our step's time by operator, markdown in md=
    models (vit_tiny_cifar) comma list of lab/bench_cases.py's cases
    batch                   batch size, or a comma list matching models (steps, profile)
    compile (off)           off | on | both: torch.compile our model (and the peer) with compile_mode
    compile_mode, peer_compile_mode (default)   torch.compile modes of ours and of the peer
    vs_timm (false)         time timm's model of the same shape, interleaved round by round (a lever's case:
                            our model without the lever, lab/bench_cases.py)
    memory (false)          steps on CUDA: peak memory per side, each in its own process
    rounds                  timed rounds (steps: 5, inference: 15)
    warmup (5), min_round_s (0.5)   untimed calls first; a round lasts at least this long
    device (auto)           auto | cpu | cuda
    threads                 torch (and onnxruntime) CPU threads: a count, or auto (trainer.threads=auto's rule)
    malloc (auto)           auto | reuse | system: glibc malloc's handling of freed blocks, as trainer.malloc
                            (auto: reuse on a CPU, the trainer's default); mode=e2e takes trainer.malloc=
    amp (auto), peer_amp (same)     precision of ours, as trainer.amp (auto | bf16 | fp16 | none; steps and
                            profile), and of the peer
    batches                 inference: comma list of batch sizes (1,64 on a CPU, 1,256 on CUDA)
    runtimes (eager,compiled,onnxruntime)   inference: comma list of eager, compiled, onnxruntime (the ONNX
                            export; CPU only), onnxruntime-int8-dynamic, onnxruntime-int8-static
    profile_steps (10)      profile: steps profiled
    epochs (9), e2e_dir     e2e: epochs (real and static alternate; >= 4), run folder (default: a temporary one)
    json, md                write the measurement record / the markdown table here
Any other key=value (`model=`, `data.root=`, `trainer.<key>=`, ...) is a trainer override, as for train.py, and
goes with mode=e2e only.

Prints a markdown table last; json=<path> writes the measurement record: the command, commit, machine and versions
(vit/records/provenance.py) beside every case's per-round values (seconds and img/s of each timed round; inference:
each round's mean call time; e2e: each counted real/static epoch pair) and their medians. See
lab/step_timing.py (training steps; the models timed are lab/bench_cases.py's),
lab/step_profile.py (profile), lab/e2e_timing.py (e2e) and lab/inference_timing.py (inference) for
the protocols, docs/BENCHMARKS.md for results.
"""

from __future__ import annotations

import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path

import torch
from bench_cases import CASES
from records import measurement_record, script_command, write_record
from step_profile import profile_case, profile_markdown
from step_timing import bench_case, measure_peak_memory, to_markdown, to_record

from vit.cli.args import parse_args, run_script
from vit.errors import UsageError
from vit.runtime.host_memory import set_malloc
from vit.settings.trainer import MallocMode
from vit.train.thread_fit import choose_threads

MODES = ("steps", "inference", "e2e", "profile")
COMPILE = ("off", "on", "both")
AMPS = ("auto", "bf16", "fp16", "none")
KNOWN = {
    "mode": "steps",
    "models": "vit_tiny_cifar",
    "batch": None,
    "compile": "off",
    "compile_mode": "default",
    "peer_compile_mode": "default",
    "vs_timm": "false",
    "memory": "false",
    "rounds": None,
    "warmup": "5",
    "min_round_s": "0.5",
    "device": "auto",
    "threads": None,
    "malloc": "auto",
    "amp": "auto",
    "peer_amp": "same",
    "batches": None,
    "runtimes": "eager,compiled,onnxruntime",
    "profile_steps": "10",
    "epochs": "9",
    "e2e_dir": None,
    "json": None,
    "md": None,
}


@dataclass
class Options:
    """The parsed arguments, typed."""

    mode: str
    models: list[str]
    batch: list[str] | None
    compile: str
    compile_mode: str
    peer_compile_mode: str
    vs_timm: bool
    memory: bool
    rounds: int | None
    warmup: int
    min_round_s: float
    device: str
    threads: int | str | None
    malloc: str
    amp: str
    peer_amp: str
    batches: list[str] | None
    runtimes: list[str]
    profile_steps: int
    epochs: int
    e2e_dir: Path | None
    json: Path | None
    md: Path | None
    overrides: list[str] = field(default_factory=list)
    command: list[str] = field(default_factory=list)


def choice(args, key: str, choices: tuple[str, ...]) -> str:
    value = args[key]
    if value not in choices:
        raise UsageError(f"{key}={value!r} must be one of {', '.join(choices)}")
    return value


def read_options(argv: list[str]) -> Options:
    """Our keys through the one parser; every other `key=value` (a group choice, a dotted key, +/~ edits) is a
    trainer override, kept for mode=e2e."""
    ours = [a for a in argv if a.partition("=")[0] in KNOWN or "=" not in a]
    overrides = [a for a in argv if a not in ours]
    args = parse_args(ours, KNOWN, lists=("models", "batch", "batches", "runtimes"))
    min_round_s = args.number("min_round_s", minimum=0)
    mode = choice(args, "mode", MODES)
    if overrides and mode != "e2e":
        raise UsageError(f"{overrides[0]!r}: config overrides only go with mode=e2e (known keys: {', '.join(KNOWN)})")
    options = Options(
        mode=mode,
        models=args["models"],
        batch=args["batch"],
        compile=choice(args, "compile", COMPILE),
        compile_mode=args["compile_mode"],
        peer_compile_mode=args["peer_compile_mode"],
        vs_timm=args.flag("vs_timm"),
        memory=args.flag("memory"),
        rounds=args.integer("rounds"),
        warmup=args.integer("warmup", minimum=0),
        min_round_s=min_round_s,
        device=choice(args, "device", ("auto", "cpu", "cuda")),
        threads="auto" if args.get("threads") == "auto" else args.integer("threads"),
        malloc=choice(args, "malloc", typing.get_args(MallocMode)),
        amp=choice(args, "amp", AMPS),
        peer_amp=choice(args, "peer_amp", ("same", *AMPS)),
        batches=args["batches"],
        runtimes=args["runtimes"],
        profile_steps=args.integer("profile_steps"),
        epochs=args.integer("epochs"),
        e2e_dir=Path(args["e2e_dir"]) if args["e2e_dir"] else None,
        json=Path(args["json"]) if args["json"] else None,
        md=Path(args["md"]) if args["md"] else None,
        overrides=overrides,
    )
    if mode == "profile" and options.md is None:
        raise UsageError("mode=profile writes its markdown to md=<path>, which is required")
    return options


def run_e2e(args: Options) -> int:
    import tempfile

    from e2e_timing import e2e_markdown, end_to_end

    from vit.cli.train import check_group_choices, check_override_keys
    from vit.config.compose import compose
    from vit.data import DataError
    from vit.errors import ConfigError
    from vit.records.files import OutputError
    from vit.train import run

    if args.epochs < 4:
        raise UsageError(
            f"epochs={args.epochs}: the end-to-end benchmark needs >= 4 (one real/static pair after warm-up)"
        )
    defaults = [f"trainer.epochs={args.epochs}", "trainer.save_checkpoints=false", "trainer.attn_maps_every_n_epochs=0"]
    overrides = [*defaults, *args.overrides]  # the user's come last and win
    check_group_choices(overrides)
    check_override_keys(overrides)
    out = args.e2e_dir or Path(tempfile.mkdtemp(prefix="vit-e2e-"))
    try:
        result = end_to_end(compose(overrides), out, train=run)
    except (ConfigError, DataError, OutputError) as err:  # bad settings: one line, as train.py says them
        raise UsageError(str(err)) from None
    table = e2e_markdown(result, " ".join(args.overrides) or "defaults")
    if args.json:
        write_record(measurement_record("benchmark_e2e", result.to_dict(), args.command), args.json)
    if args.md:
        args.md.write_text(table + "\n")
    print(f"\nrun folder: {out}; device: {result.device}, torch {torch.__version__}")
    print(table)
    return 0


def run_inference(args: Options, names: list[str], device: torch.device) -> int:
    from inference_timing import ONNX_RUNTIMES, RUNTIMES, bench_inference, inference_markdown, inference_record

    runtimes = tuple(args.runtimes)
    unknown = [r for r in runtimes if r not in RUNTIMES]
    if unknown:
        raise UsageError(f"runtimes={unknown[0]!r} is not a runtime; choose from {', '.join(RUNTIMES)}")
    onnx = [r for r in runtimes if r in ONNX_RUNTIMES]
    if onnx:
        from vit.deploy.export import ExportError, require_export_extra

        try:
            require_export_extra()
        except ExportError as err:
            raise UsageError(f"runtimes={onnx[0]}: {str(err).replace('format=onnx ', '')}") from None
    try:
        batches = [int(b) for b in (args.batches or (["1", "64"] if device.type == "cpu" else ["1", "256"]))]
    except ValueError:
        batches = [0]
    if min(batches) < 1:
        raise UsageError(f"batches={','.join(args.batches)!r} must be positive integers (batches=[1,64])")
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


def main(argv: list[str]) -> int:
    args = read_options(argv)
    args.command = script_command(__file__, argv)  # what the JSON record names
    threads = torch.get_num_threads()
    if args.threads == "auto":  # trainer.threads=auto's start rule: the CPUs other processes leave free
        count, why = choose_threads("auto", torch.device("cpu"))
        print(f"threads: {count} ({why})")
        torch.set_num_threads(count)
    elif args.threads:
        torch.set_num_threads(args.threads)
    try:
        return run(args)
    finally:
        torch.set_num_threads(threads)  # a caller in the same process (a test) keeps its own setting


def run(args: Options) -> int:
    if args.mode == "e2e":
        return run_e2e(args)
    names = args.models
    unknown = [n for n in names if n not in CASES]
    if unknown or not names:
        what = repr(unknown[0]) if unknown else "''"
        raise UsageError(f"models={what} is not a benchmark case; choose from {', '.join(CASES)}")
    try:
        batches = [int(b) for b in args.batch] if args.batch else [None] * len(names)
    except ValueError:
        raise UsageError(f"batch={','.join(args.batch)!r} must be an integer or a list of them") from None
    if len(batches) == 1 and len(names) > 1:
        batches *= len(names)
    if len(batches) != len(names):
        raise UsageError(f"batch={','.join(args.batch)} has {len(batches)} values for {len(names)} models")
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    malloc = set_malloc(args.malloc, device.type)  # the trainer's setting (trainer.malloc): the step a run takes
    if malloc is not None:
        print(malloc.text)
    if args.mode == "inference":
        return run_inference(args, names, device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    modes = {"off": [None], "on": [args.compile_mode], "both": [None, args.compile_mode]}[args.compile]

    if args.mode == "profile":
        return run_profile(args, names, batches, modes, device)
    return run_steps(args, names, batches, modes, device)


def run_profile(args: Options, names: list[str], batches: list, modes: list, device: torch.device) -> int:
    """mode=profile: where each case's training step spends its time, as markdown sections in md=."""
    sections = []
    for name, batch in zip(names, batches, strict=True):
        for mode in modes:
            summary = profile_case(CASES[name], device, batch, mode, args.profile_steps, args.warmup, amp=args.amp)
            sections.append(profile_markdown(summary))
            print(sections[-1] + "\n", flush=True)
    args.md.write_text("\n\n".join(sections) + "\n")
    return 0


def run_steps(args: Options, names: list[str], batches: list, modes: list, device: torch.device) -> int:
    """Training-step throughput of each case and compile mode (against timm's with vs_timm=true), as a table."""
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
    sys.exit(run_script(main, usage=__doc__))
