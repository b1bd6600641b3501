"""Figures written as small PNGs (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def confusion_matrix_figure(matrix: np.ndarray, class_names: list[str], path: Path) -> Path:
    """Row-normalised confusion matrix (rows: true class, columns: predicted), with counts in the cells."""
    matrix = np.asarray(matrix)
    rates = matrix / np.clip(matrix.sum(axis=1, keepdims=True), 1, None)
    size = max(4.0, 0.45 * len(class_names) + 2)
    fig, ax = plt.subplots(figsize=(size, size * 0.9), dpi=100)
    image = ax.imshow(rates, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(len(class_names)), class_names, rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(len(class_names)), class_names, fontsize=8)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    if len(class_names) <= 20:
        for i in range(len(class_names)):
            for j in range(len(class_names)):
                colour = "white" if rates[i, j] > 0.5 else "black"
                ax.text(j, i, int(matrix[i, j]), ha="center", va="center", fontsize=7, color=colour)
    fig.colorbar(image, ax=ax, fraction=0.046)
    ax.set_title(f"top-1 {100 * np.trace(matrix) / max(matrix.sum(), 1):.2f}%")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def _as_number(value: str):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def sweep_figure(records, knobs: list[str], path: Path) -> Path:
    """Final val top-1 against the first swept knob; one line per combination of the other knobs."""
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    if not knobs:
        knobs = ["run"]
    main_knob, others = knobs[0], knobs[1:]
    groups: dict[tuple, list] = {}
    for record in records:
        key = tuple(record.overrides.get(k, "-") for k in others)
        groups.setdefault(key, []).append(record)
    values = [r.overrides.get(main_knob, r.path.name) for r in records]
    numeric = all(_as_number(v) is not None for v in values)
    order = sorted(set(values), key=lambda v: _as_number(v) if numeric else str(v))
    for key, group in groups.items():
        points = sorted(
            (order.index(r.overrides.get(main_knob, r.path.name)), r.final_top1)
            for r in group
            if r.final_top1 is not None
        )
        if points:
            xs, ys = zip(*points, strict=True)
            label = ", ".join(f"{k}={v}" for k, v in zip(others, key, strict=True)) or None
            ax.plot(xs, ys, marker="o", label=label)
    ax.set_xticks(range(len(order)), order)
    ax.set_xlabel(main_knob)
    ax.set_ylabel("final val top-1 (%)")
    ax.grid(alpha=0.3)
    if others:
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
