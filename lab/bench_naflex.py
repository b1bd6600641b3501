"""What NaFlex batches cost: a ViT training step on NaFlex batches (patches, coordinates, valid mask: vit/naflex.py)
against the same images as square image tensors, batch by batch, on the CPU.

usage: python lab/bench_naflex.py [seq_lens=16,36,64] [batch_size=256] [width=96] [depth=6] [heads=2]
    [pos_embed=learned] [shapes=square|mixed] [threads=2] [rounds=5] [json=<file>]

The batches are those of a data.naflex run's token budget (vit/data/loading/naflex_loader.py): for each of `seq_lens`
one batch of batch_size x max(seq_lens) // seq_len random images of 32 px CIFAR resized to that many 4 px patches (16
tokens: 16 px, 36: 24 px, 64: 32 px). A round trains one step on each batch, first as NaFlex batches, then as image
tensors of the same sizes (the model's `dynamic_img_size`, the same tokens); both paths are the same model
(`create_model("vit_tiny", ...)` at the given width, depth, heads and `model.pos_embed`, MLP ratio 2), its own
copy each, with AdamW; the rounds alternate the two, after one untimed round. It prints each path's median img/s
over the rounds and their ratio (NaFlex / tensors; the goal: >= 0.9). json=<file> writes the measurement record
(every round, the medians, the provenance: vit/records/provenance.py).

`shapes=mixed`: each NaFlex batch holds images of mixed shapes instead, as from a folder of photographs: each
image's aspect ratio drawn log-uniform in [1/3, 3] and its grid the largest of at most seq_len patches with that
ratio (timm's `get_image_size_for_seq`), padded to seq_len and masked; the tensors stay square images of seq_len
tokens, so both paths run the same tokens a step and the NaFlex path pays for its padding and for one position
table (or rotary table) per grid.

    python lab/bench_naflex.py                     # the CIFAR recipe's width at its batch, 16 to 32 px
    python lab/bench_naflex.py pos_embed=rope_mixed
    python lab/bench_naflex.py shapes=mixed          # batches of mixed shapes, padded
"""

from __future__ import annotations

import copy
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from records import measurement_record, script_command, write_record

from vit.cli.args import parse_args, run_script
from vit.data.loading.naflex_loader import grid_for
from vit.errors import UsageError
from vit.models import create_model
from vit.naflex import pack, pack_batch

PATCH = 4
KNOWN = {"seq_lens": "16,36,64", "batch_size": "256", "width": "96", "depth": "6", "heads": "2"}
KNOWN |= {"pos_embed": "learned", "shapes": "square", "threads": "2", "rounds": "5", "json": None}


def read_seq_lens(parts: list[str]) -> list[int]:
    text = ",".join(parts)
    try:
        seq_lens = [int(part) for part in parts]
    except ValueError:
        raise UsageError(f"seq_lens={text!r} must be whole numbers (seq_lens=[16,36,64])") from None
    squares = [n for n in seq_lens if n < 1 or int(n**0.5) ** 2 != n]
    if not seq_lens or squares:
        raise UsageError(f"seq_lens={text!r}: each must be a square token count (16, 36, 64: a square grid)")
    return seq_lens


def batches(seq_lens: list[int], batch_size: int, mixed: bool = False) -> list[tuple[torch.Tensor, dict, torch.Tensor]]:
    """One batch a seq_len: (images (b, 3, s, s), the same as a NaFlex batch, targets (b,)), b by the budget;
    `mixed`: the NaFlex batch's images of mixed shapes (the module docstring), padded to seq_len."""
    generator = torch.Generator().manual_seed(0)
    out = []
    for seq_len in seq_lens:
        size, side = batch_size * max(seq_lens) // seq_len, int(seq_len**0.5) * PATCH
        images = torch.randn(size, 3, side, side, generator=generator)
        targets = torch.randint(0, 10, (size,), generator=generator)
        if not mixed:
            out.append((images, pack_batch(images, (PATCH, PATCH), seq_len), targets))
            continue
        ratios = torch.exp(torch.empty(size).uniform_(-math.log(3), math.log(3), generator=generator))
        shapes = [grid_for((1000, int(1000 * float(ratio))), PATCH, seq_len) for ratio in ratios]
        pictures = [torch.randn(3, h, w, generator=generator) for h, w in shapes]
        out.append((images, pack(pictures, (PATCH, PATCH), seq_len), targets))
    return out


def valid_share(data) -> float:
    """The share of the NaFlex batches' tokens that are image patches, not padding."""
    valid = sum(int(naflex["patch_valid"].sum()) for _, naflex, _ in data)
    return valid / sum(naflex["patch_valid"].numel() for _, naflex, _ in data)


def make_step(model: torch.nn.Module):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(inputs, targets) -> None:
        F.cross_entropy(model(inputs), targets).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def main(argv: list[str]) -> int:
    args = parse_args(argv, KNOWN, lists=("seq_lens",))
    seq_lens = read_seq_lens(args["seq_lens"])
    numbers = {key: args.integer(key) for key in ("batch_size", "width", "depth", "heads", "threads", "rounds")}
    if min(numbers.values()) < 1 or numbers["width"] % numbers["heads"]:
        raise UsageError("batch_size, width, depth, heads, threads and rounds must be >= 1; heads must divide width")
    torch.set_num_threads(numbers["threads"])
    torch.manual_seed(0)
    shape = dict(embed_dim=numbers["width"], depth=numbers["depth"], num_heads=numbers["heads"], mlp_ratio=2.0)
    model = create_model(
        "vit_tiny", img_size=32, patch_size=PATCH, num_classes=10, dynamic_img_size=True, pos_embed=args["pos_embed"],
        **shape,
    )  # fmt: skip
    steps = {"naflex": make_step(model), "tensors": make_step(copy.deepcopy(model))}
    if args["shapes"] not in ("square", "mixed"):
        raise UsageError(f"shapes={args['shapes']!r} must be square or mixed")
    data = batches(seq_lens, numbers["batch_size"], mixed=args["shapes"] == "mixed")
    images_a_round = sum(len(targets) for _, _, targets in data)
    speed: dict[str, list[float]] = {"naflex": [], "tensors": []}
    for round_index in range(numbers["rounds"] + 1):  # round 0: warm-up, not timed
        for path, step in steps.items():
            start = time.perf_counter()
            for images, naflex, targets in data:
                step(naflex if path == "naflex" else images, targets)
            if round_index:
                speed[path].append(images_a_round / (time.perf_counter() - start))
    medians = {path: statistics.median(values) for path, values in speed.items()}
    ratio = medians["naflex"] / medians["tensors"]
    print(f"{torch.get_num_threads()} threads; batches (images x tokens): "
          + ", ".join(f"{len(t)} x {n}" for (_, _, t), n in zip(data, seq_lens, strict=True)))  # fmt: skip
    print(f"valid tokens in the NaFlex batches: {valid_share(data):.1%}")
    print(f"NaFlex batches {medians['naflex']:.0f} img/s, image tensors {medians['tensors']:.0f} img/s: {ratio:.2f}x")
    if args["json"]:
        values = {"seq_lens": seq_lens, **numbers, "pos_embed": args["pos_embed"], "shapes": args["shapes"]}
        values |= {"images_a_round": images_a_round, "valid_token_share": valid_share(data)}
        values |= {"img_per_s_rounds": speed, "img_per_s": medians, "naflex_over_tensors": ratio}
        write_record(measurement_record("bench_naflex", values, script_command(__file__, argv)), args["json"])
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, usage=__doc__))
