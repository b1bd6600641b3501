"""The shell commands of README.md and docs/*.md, as a user would type them, and how the tests run each one.

`documented_commands()` reads every ```bash block and every 4-space-indented block of the Markdown files and
returns the commands in them (backslash continuations joined, `python -c "..."` kept whole, comments dropped),
each with its file, line and the block it belongs to: the commands of one block run in order in one folder, as a
user runs them, so `train.py ... hydra.run.dir=runs/tiny` followed by `vit-average run=runs/tiny` works.

`verdict(command)` is the table: a command is run, with the placeholders of the docs (`<cifar10>`,
`/path/to/imagenet`, `outputs/<date>/<time>/...`) replaced by small local data and files and with tiny sizes
appended to every training (one epoch of two batches) and to the measurement scripts of TINY_SCRIPT_ARGS, or it
is skipped with the reason (a GPU, several machines, the network, a server that runs until stopped, a measurement
that the test named runs small: MEASURED_BY_TESTS). A command that matches no rule fails the test: a new command in
the docs must be given a rule here.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
ENV_PREFIX = r"([A-Z_]+=\S+ )*"  # OMP_NUM_THREADS=1 python ...
COMMAND_START = re.compile(
    ENV_PREFIX + r"(\.venv/bin/)?(python|torchrun|make|tensorboard|optuna-dashboard|srun|pip|vit-[a-z-]+)\b"
)
SHELL_LINE = re.compile(r"^([A-Z]+=|for |done\b|head=)")  # variables and loops the commands of a block use


@dataclass(frozen=True)
class Command:
    file: str  # relative to the repository
    line: int  # 1-based, where the command starts
    block: int  # commands with the same (file, block) run in order in one folder
    text: str  # continuations joined, comment removed

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}"


def _blocks(text: str):
    """(first line number, lines) of each ```bash block and each 4-space-indented block."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            lang = line[3:].strip()
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            if lang in ("bash", "sh", "shell"):
                yield i + 2, lines[i + 1 : j]
            i = j + 1
            continue
        if line.startswith("    ") and (i == 0 or not lines[i - 1].strip()):
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            yield i + 1, [x[4:] if x.startswith("    ") else x for x in lines[i:j]]
            i = j
            continue
        i += 1


def _strip_comment(line: str) -> str:
    """The line without a trailing `# comment` outside quotes."""
    quote = None
    for k, ch in enumerate(line):
        if ch in "'\"" and quote in (None, ch):
            quote = None if quote == ch else ch
        elif ch == "#" and quote is None and (k == 0 or line[k - 1].isspace()):
            return line[:k].rstrip()
    return line.rstrip()


def _statements(first_line: int, lines: list[str]):
    """(line number, statement) of a block: continuations joined, quotes spanning lines kept whole."""
    k = 0
    while k < len(lines):
        start, text = first_line + k, lines[k]
        while text.rstrip().endswith("\\") or text.count('"') % 2:
            if k + 1 >= len(lines):
                break
            k += 1
            if text.rstrip().endswith("\\"):
                text = text.rstrip()[:-1] + " " + lines[k].strip()
            else:  # inside a quoted python -c "..." program: its lines stay lines
                text = text + "\n" + lines[k]
        k += 1
        statement = _strip_comment(text.strip()) if text.count('"') % 2 == 0 else text.strip()
        if statement:
            yield start, statement


def documented_commands() -> list[Command]:
    commands = []
    for path in DOC_FILES:
        for block, (first, lines) in enumerate(_blocks(path.read_text())):
            for line, statement in _statements(first, lines):
                if COMMAND_START.match(statement) or SHELL_LINE.match(statement):
                    commands.append(Command(str(path.relative_to(REPO)), line, block, " ".join(statement.split(" "))))
    return commands


# --- the table ---------------------------------------------------------------------------------------------------

# (pattern, reason): a command matching one is not run, and the reason is the test's skip message.
SKIPPED = [
    (r"\bsrun\b|--nnodes|scontrol", "several machines (torchrun across nodes, Slurm)"),
    (r"--nproc_per_node=8", "8 GPUs"),
    (
        r"--device cuda|device=cuda|trainer\.compile=true",
        "a GPU: a measurement of the lent H100 (compiling: minutes on a CPU)",
    ),
    (
        r"\btimm:\S+\s+(model\.pretrained|distill\.teacher)_file=/path/to/",
        "a placeholder weights file of a base-size model; tests/models/test_foundation.py builds each family from "
        "such a file, tests/train/test_distill.py a teacher",
    ),  # fmt: skip
    (r"\btimm:", "the network: timm downloads the weights"),
    (r"experiment=(finetune\w*|linear_probe)\b", "the network: the experiment starts from timm's weights"),
    (r"\bdownload=(true|yes|1)\b", "the network: torchvision downloads CIFAR-10"),
    (r"data\.dataset_name=", "the network: the Hugging Face Hub"),
    (r"postgresql", "a PostgreSQL server"),
    (
        r"^make (train|test)\b",
        "make test is this suite; make train downloads CIFAR-10 and trains for 30 minutes (no GPU) or hours (GPU)",
    ),
    (r"^pip ", "the network: the package index"),
    (r"\$SLURM|^head=", "Slurm"),
    (r"hydra/launcher=submitit_slurm", "a SLURM cluster (submitit_local, its path here: tests/e2e/test_sweeps.py)"),
    (r"data\.path=/data/", "a Hugging Face dataset saved on the writer's disk"),
    (
        r"plot_recipes\.py <runs>|plot_recipes\.py recipes",
        "plots the recipe runs of docs/RESULTS.md (hours); tests/analysis/test_plot_recipes.py runs it on small runs",
    ),  # fmt: skip
]

# Measurement commands left to the test named, which runs the script small: TINY_SCRIPT_ARGS makes each of them tiny
# too, but a tiny run costs 7-17 s on the 2-core CI machine (torch and timm imported, models built) and the
# measurement commands get about 30 s of this test in all. The ones run here are those no other test runs as a
# whole: bench_shards.py, bench_cpu_setup.py (its train.py runs), benchmark.py's INT8 runtimes, bench_memory.py and
# bench_fsdp.py.
# Delete a line to run its commands here, tiny.
MEASURED_BY_TESTS = [
    (
        r"budget_outside\.py",
        "two budgeted trainings of a minute or more; tests/e2e/test_terminal.py runs the script small (one idle run "
        "of 15 s)",
    ),  # fmt: skip
    (
        r"benchmark\.py mode=inference(?!.*int8)",
        "tests/analysis/test_inference_bench.py runs it small (eager, onnxruntime; runtimes=compiled: minutes on a "
        "CPU)",
    ),  # fmt: skip
    (
        r"benchmark\.py (mode=e2e|models=)",
        "tests/analysis/test_benchmark.py runs it small (eager: compile= takes minutes here)",
    ),
    (r"bench_augment\.py", "tests/data/test_batched_policy.py runs it small"),
    (r"accuracy_map\.py", "tests/analysis/test_cpu_scripts.py runs it on a small run"),
    (
        r"photo_shapes_experiment\.py",
        "four train.py runs and eight evaluations (20 minutes); tests/analysis/test_cpu_scripts.py cuts a folder "
        "and runs the script small (slow tier)",
    ),
    (r"bench_cpu_loader\.py", "tests/data/test_augment.py runs it small"),
    (
        r"bench_cpu_bf16\.py|bench_optimizer\.py|cifar10_cpu_reference\.py",
        "tests/analysis/test_cpu_scripts.py runs it small",
    ),
    (
        r"distill_experiment\.py",
        "an hour in 10 train.py processes (4 at its smallest: a minute here); tests/train/test_distill.py runs the "
        "script "
        "with its runs answered from a table, and trains its parts",
    ),  # fmt: skip
    (
        r"transfer_experiment\.py",
        "an hour in 10 train.py processes (4 at its smallest: a minute here); tests/train/test_finetune.py runs the "
        "script "
        "with its runs answered from a table, and trains its parts",
    ),  # fmt: skip
]
SKIPPED += [(pattern, f"a measurement; {reason}") for pattern, reason in MEASURED_BY_TESTS]

# (pattern, arguments): a measurement script run as its doc says, with the arguments of every pattern it matches
# appended so that it measures a tiny case in seconds (its flags and keys given last win).
TINY_SCRIPT_ARGS = [
    (r"lab/bench_memory\.py", "model=vit_tiny img_size=32 batch_size=2 num_classes=10 repeats=1"),
    (r"lab/bench_fsdp\.py", "models=vit_tiny img_size=32 batch_size=2 steps=1 world_size=2"),
    # benchmark.py: the toy ViT (32 px, 2 blocks) against timm's, one round of one step or call, eager
    (r"lab/benchmark\.py (?!.*mode=(inference|e2e))", "models=toy batch=2 compile=off"),
    (r"lab/benchmark\.py mode=inference", "models=toy batches=1"),
    (r"lab/benchmark\.py mode=inference(?!.*runtimes=)", "runtimes=eager,onnxruntime"),  # compiled: minutes
    (r"lab/benchmark\.py (?!.*mode=e2e)", "rounds=1 warmup=0 min_round_s=0 threads=1"),
    (
        r"lab/benchmark\.py mode=e2e",
        "epochs=4 data.synthetic.num_train=32 data.synthetic.num_val=16 data.batch_size=16 model.depth=1",
    ),  # fmt: skip
    (r"lab/bench_augment\.py", "policies=autoaug batch=8 size=16 repeats=1 warmup=0 count_batches=1"),
    (r"lab/bench_cpu_loader\.py", "images=4 repeats=1 batch=2"),
    (r"lab/bench_shards\.py", "images=64 batch=32 workers=0 repeats=1"),
    (r"lab/bench_cpu_bf16\.py", "cases=32x16x320x2 rounds=1 threads=1"),  # 2 steps a round
    (r"lab/bench_matmul\.py", "n=64 rounds=1"),
    (r"lab/bench_layernorm\.py", "rows=64 widths=8 case=toy rounds=1 threads=1"),
    (r"lab/bench_attention\.py", "cases=16x8x2x4 rounds=1 threads=1"),
    (r"lab/bench_naflex\.py", "seq_lens=4,16 batch_size=4 width=16 depth=1 heads=2 rounds=1 threads=1"),
    (r"lab/bench_cpu_setup\.py", "rounds=1 batches=1 settings=memory-t1 warmup=false"),
    (r"/bench_optimizer\.py", "model.embed_dim=32 model.depth=1 model.num_heads=2 rounds=1 steps=1 threads=1"),
    (
        r"lab/cifar10_cpu_reference\.py",
        "budget_s=1 embed_dim=16 depth=1 num_heads=2 mlp_ratio=1 batch_size=64 workers=0 eval_every=2",
    ),  # fmt: skip
]

# (pattern, exit code): a command its doc says fails, and how.
EXPECTED_EXIT = [
    (r"data\.augment\.policy_impl=", 2),  # BENCHMARKS.md: "the key existed then; the command no longer runs as written"
]


def expected_exit(text: str) -> int:
    return next((code for pattern, code in EXPECTED_EXIT if re.search(pattern, text)), 0)


# Appended to every training: two epochs of two batches, one validation batch, on the CPU (an epoch-2 checkpoint
# is there for the commands that read a kept epoch), the model one block deep.
# One block deep: a ViT-B checkpoint with its optimizer state is then 0.1 GB, not 1.3 GB.
TINY_TRAIN = (
    "trainer.epochs=2 trainer.limit_train_batches=2 trainer.limit_val_batches=1 data.batch_size=8 data.num_workers=0 "
    "trainer.device=cpu trainer.attn_maps_every_n_epochs=0 model.depth=1"
)
# The CIFAR-10 stand-in: the tests' small JPEG tree in CIFAR-10's layout (vit_tiny's data config, data=cifar10,
# downloads torchvision's copy, which this machine cannot).
CIFAR_JPEG = "data/cifar10-jpeg.tar.gz"
CIFAR_AS_FOLDER = f"data=imagefolder data.root={CIFAR_JPEG} data.img_size=32 data.patch_size=4"
# Hydra's outputs/<date>/<time>: the newest run the block made itself (MAE pretraining, then its fine-tuning), else
# the workspace's trained run; filled in when the command runs.
NEWEST_RUN = "{run}/"
NEWEST_SWEEP = "$(ls -td multirun/*/*/ | head -1)"

# (pattern, replacement), in order: the docs' placeholders as the files and folders of the test's workspace.
SUBSTITUTIONS = [
    (r"\[the best trial's overrides below\]|<the lever's overrides>|<same overrides>|<overrides>", ""),
    (r"<([\w.-]+)\|[^>]*>", r"\1"),  # one of several values: the first
    (r"outputs/<date>/<time>/", NEWEST_RUN),
    (r"multirun/<date>/<time>", NEWEST_SWEEP),
    (r"<mae run>/", "{mae_run}/"),
    (r"<run>/", NEWEST_RUN),
    (r"<folder holding the nine runs>", "multirun"),
    (r"data\.root=(/path/to/\w+|/data/imagenet|\.\.\.|<[^>]*>|\.device/cifar10)", f"data.root={CIFAR_JPEG}"),
    (r"image=(<file or folder>|<folder>|photos/)", "image=images"),
    (r"image=a\.jpg,b\.png", "image=images/a.jpg,images/b.png"),
    (r"/path/to/vit_small\.safetensors", "{vit_small_file}"),
    (r"/path/to/resnet18\.safetensors", "{resnet18_file}"),
    (r"check_images=<n>", "check_images=8"),
    (r"max_drop=1\.0", "max_drop=100"),  # the tests' model is untrained: one of 8 images is 12.5 points
    (r"^(.*vit-export .*quantize=(?!.*max_drop=).*)$", r"\1 max_drop=100"),  # as above, the default 1 point
    (r"\[[^\] ]*=[^\] ]*<[^\]]*\]", ""),  # an optional key=<placeholder>: left out, the default taken
    (r"\[([\w.]+=[^\]|\s]+)\|[^\]]*\]", r"\1"),  # an optional key=a|b: given, the first value
    (r"\[([^\] ]*=[^\] ]*)\]", r"\1"),  # an optional key=value: given
    (r"batch=dynamic\|<n>", "batch=dynamic"),
    (r"/data/cifar10-shards", "data/cifar10-shards"),
    (r"samples_per_shard=\d+", "samples_per_shard=64"),  # 320 training images: 5 shards, 100 test images: 2
    (r"train-\{000000\.\.000009\}", "train-{000000..000004}"),
    (r"epoch_\d{4}\.pt", "epoch_0002.pt"),
    (r"data\.holdout=\d{3,}", "data.holdout=20"),
    (r"out=/tmp/", "out="),
    (r"work=/tmp/", "work="),
    (r" docs/results/", " {repo}/docs/results/"),  # the records a command reads: the repository's own
    (r"<runs>|<figures>", "runs"),
    (r"<lever>|<s>|<seed>", "0"),
    (r"<px>", "16"),  # an evaluation at each image size: the first
    (r"hydra\.run\.dir=proxy/0/seed0", "hydra.run.dir=proxy/lever/seed0"),
    (r" &$", ""),  # two searches on one study, here one after the other
]


def verdict(text: str) -> str | None:
    """The reason a command is not run here, or None."""
    return next((reason for pattern, reason in SKIPPED if re.search(pattern, text)), None)


def runnable(text: str, variables: dict[str, str], files: dict[str, str]) -> str:
    """The command as the test runs it: placeholders replaced, shell variables of its block expanded, tiny sizes
    appended to a training."""
    for name, value in variables.items():
        text = text.replace(f"${name}", value)
    if re.match(r"^(\.venv/bin/)?(tensorboard|optuna-dashboard) ", text):
        return re.sub(r"^(\.venv/bin/)?(tensorboard|optuna-dashboard) .*", rf"{files['bin']}/\2 --help", text)
    for pattern, replacement in SUBSTITUTIONS:
        text = re.sub(pattern, replacement, text)
    for key, value in files.items():
        text = text.replace(f"{{{key}}}", value)
    env = re.match(ENV_PREFIX, text).group(0)
    text = text[len(env) :]
    text = re.sub(r"^(\.venv/bin/)?python ", f"{files['python']} ", text)
    text = re.sub(r"^torchrun ", f"{files['python']} -m torch.distributed.run ", text)
    text = re.sub(r"^(\.venv/bin/)?(vit-[a-z-]+) ", rf"{files['bin']}/\2 ", text)  # the installed commands
    text = re.sub(r"(^|\s)(train\.py|scripts/|lab/)", rf"\1{files['repo']}/\2", text)
    text = env + text
    text += "".join(f" {args}" for pattern, args in TINY_SCRIPT_ARGS if re.search(pattern, text))
    if re.search(r"\btrain\.py\b", text):
        if "data=" not in text and "data.root=" not in text and "experiment=cifar10_cpu" not in text:
            text += " " + CIFAR_AS_FOLDER
        # the proxy and MAE experiments hold out 1,000 or 2,000 images; streamed shards have no holdout
        if "data.holdout=" not in text and "data=webdataset" not in text:
            text += " data.holdout=20"
        if "hparams_search=" in text:
            text += " hydra.sweeper.n_trials=2"
        text += " " + TINY_TRAIN
    return text


def expand_block(commands: list[Command]):
    """(command, its runnable text or None, skip reason or None) for the commands of one block, in order; shell
    assignments (`C="..."`) become variables, a `for x in a b; do` loop runs its body once with the first value, and
    `train.py ... key=value` is the block's previous training with key=value added."""
    variables: dict[str, str] = {}
    previous = ""  # the arguments of the block's last training: `train.py ... <key=value>` adds to them
    for command in commands:
        text = command.text
        if "train.py ... " in text:
            text = text.replace("train.py ... ", f"train.py {previous} ")
        elif "train.py " in text:
            previous = text.split("train.py ", 1)[1]
        assignment = re.match(r"^([A-Z]+)=(.*)$", text)
        loop = re.match(r"^for (\w+) in (\S+)", text)
        if assignment:
            variables[assignment.group(1)] = shlex.split(assignment.group(2))[0] if assignment.group(2) else ""
            continue
        if loop:
            variables[loop.group(1)] = loop.group(2)
            continue
        if text.startswith("done"):
            continue
        for name, value in variables.items():
            text = text.replace(f"${name}", value)
        yield command, text, verdict(text)
