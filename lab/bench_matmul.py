"""The dense matrix-multiply peak this device reaches: an n x n by n x n product in `dtype`, timed over rounds.

usage: python lab/bench_matmul.py [n=8192] [dtype=bf16] [rounds=10] [device=auto] [json=<file>]

MFU figures (docs/BENCHMARKS.md) divide a step's FLOPs per second by a peak; this is the measured one. Each round
times 10 products on random inputs after 3 warm-up products (CUDA: between two synchronisations). Prints one JSON
record, and with json=<file> writes it there: the device's name, n, dtype, every round's seconds and TFLOP/s (2 n^3
FLOPs a product), their median, and the provenance (command, commit, machine, versions: vit/records/provenance.py).
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
from records import measurement_record, script_command, write_record

from vit.cli.args import parse_args, run_script
from vit.errors import UsageError
from vit.runtime.device import resolve_device

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
PRODUCTS_PER_ROUND = 10


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str]) -> int:
    args = parse_args(argv, {"n": "8192", "dtype": "bf16", "rounds": "10", "device": "auto", "json": None})
    if args["dtype"] not in DTYPES:
        raise UsageError(f"dtype={args['dtype']!r} must be one of {', '.join(DTYPES)}")
    n, rounds = args.integer("n"), args.integer("rounds")  # a bad one: UsageError naming it
    device, dtype = resolve_device(args["device"]), DTYPES[args["dtype"]]
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    seconds = []
    for _ in range(rounds):
        sync(device)
        start = time.perf_counter()
        for _ in range(PRODUCTS_PER_ROUND):
            a @ b
        sync(device)
        seconds.append(time.perf_counter() - start)
    tflops = [2 * n**3 * PRODUCTS_PER_ROUND / s / 1e12 for s in seconds]
    values = {
        "device": device_name(device),
        "torch": torch.__version__,
        "n": n,
        "dtype": args["dtype"],
        "products_per_round": PRODUCTS_PER_ROUND,
        "seconds_rounds": seconds,
        "tflops_rounds": [round(t, 3) for t in tflops],
        "tflops_median": round(statistics.median(tflops), 3),
    }
    record = measurement_record("bench_matmul", values, script_command(__file__, argv))
    if args.get("json"):
        write_record(record, args["json"])
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, usage=__doc__))
