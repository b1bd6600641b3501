"""Figures of the analysis scripts, written as small PNGs (matplotlib, Agg backend). The trainer's own figures
(attention grid, confusion matrix) and `save` are in vit/tasks/figures.py."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from vit.tasks.figures import save  # noqa: E402


def sweep_figure(records, knobs: list[str], path: Path) -> Path:
    """Final val top-1 against the first swept knob; one line per combination of the other knobs.

    The knob's values are evenly spaced ticks, in numeric order when every value is a number (`qk_scale=null`
    sits at its head_dim ** -0.5), else in the order the runs give them (True before False, as swept). Several runs
    at one point (seeds) draw their mean with a bar from their min to their max. The y-axis starts at chance
    (100 / classes) when every run is above it, else at 0: an autoscaled axis made noise near chance read as a
    peak, so the title names the floor.
    """
    from vit.analysis.runs import knob_value

    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    main_knob, others = (knobs[0], knobs[1:]) if knobs else ("run", [])

    def raw(record) -> str:
        return record.overrides.get(main_knob, record.name) if main_knob != "run" else record.name

    labels: dict[str, str] = {}  # raw value -> tick label
    numbers: dict[str, float | None] = {}
    for record in records:
        value, number = raw(record), knob_value(record, main_knob)
        numbers[value] = number
        shown_as_number = number is not None and value.replace(".", "", 1).lstrip("-").isdigit()
        labels[value] = value if number is None or shown_as_number else f"{value}\n({number:.3g})"
    order = list(labels)  # first appearance
    if all(numbers[v] is not None for v in order):
        order.sort(key=lambda v: numbers[v])

    groups: dict[tuple, list] = {}
    for record in records:
        groups.setdefault(tuple(record.overrides.get(k, "-") for k in others), []).append(record)
    several = False  # some point holds more than one run (seeds)
    for key, group in groups.items():
        at: dict[int, list[float]] = {}
        for r in group:
            if r.final_top1 is not None:
                at.setdefault(order.index(raw(r)), []).append(r.final_top1)
        if at:
            xs = sorted(at)
            means = [sum(at[x]) / len(at[x]) for x in xs]
            below = [m - min(at[x]) for m, x in zip(means, xs, strict=True)]
            above = [max(at[x]) - m for m, x in zip(means, xs, strict=True)]
            label = ", ".join(f"{k}={v}" for k, v in zip(others, key, strict=True)) or None
            spread = (below, above) if any(len(v) > 1 for v in at.values()) else None
            several = several or spread is not None
            ax.errorbar(xs, means, yerr=spread, marker="o", capsize=3, label=label)
    finals = [r.final_top1 for r in records if r.final_top1 is not None]
    classes = {r.metrics.get("num_classes") for r in records} - {None}
    chance = 100.0 / classes.pop() if len(classes) == 1 else None
    floor = chance if chance is not None and finals and min(finals) > chance else 0.0
    top = max(finals, default=100.0)
    ax.set_ylim(floor, min(100.0, top + 0.1 * (top - floor) + 0.5))
    seeds = " (mean and min-max over seeds)" if several else ""
    ax.set_title(f"y-axis from {'chance, ' if floor else ''}{floor:g}%{seeds}", fontsize=9)
    ax.set_xticks(range(len(order)), [labels[v] for v in order])
    ax.set_xlabel(main_knob)
    ax.set_ylabel("final val top-1 (%)")
    ax.grid(alpha=0.3)
    if others:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return save(fig, path)


def screen_figure(settings: list[tuple[str, list[float]]], path: Path, xlabel: str = "final val top-1 (%)") -> Path:
    """A lever screen: one row per setting (label, its seeds' final top-1), each seed a dot and the mean a bar,
    with the first setting's mean (the baseline) as a dashed line, so each lever's gain reads against the seeds'
    spread. A label's overrides go one per line; "-" (no override) reads "baseline"."""
    labels = ["baseline" if label == "-" else label.replace(" ", "\n") for label, _ in settings]
    lines = sum(label.count("\n") + 1 for label in labels)
    fig, ax = plt.subplots(figsize=(9, 0.22 * lines + 0.25 * len(settings) + 1.0), dpi=100)
    for row, (_, values) in enumerate(settings):
        ax.scatter(values, [row] * len(values), s=18, color="tab:blue", alpha=0.7, zorder=3)
        if values:
            ax.plot([np.mean(values)] * 2, [row - 0.3, row + 0.3], color="black", linewidth=2, zorder=4)
    if settings and settings[0][1]:
        ax.axvline(np.mean(settings[0][1]), color="grey", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(settings)), labels, fontsize=7)
    ax.invert_yaxis()  # the baseline on top, in the table's order
    ax.set_xlabel(xlabel)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return save(fig, path)


def pos_embed_similarity_figure(panels: list[tuple[str, np.ndarray]], path: Path) -> Path:
    """The ViT paper's grid of grids: panel cell (i, j) shows the cosine similarity of position (i, j)'s
    embedding with every position. Each panel: (gh, gw, gh, gw) array."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 5), dpi=100, squeeze=False)
    for ax, (title, sim) in zip(axes[0], panels, strict=True):
        gh, gw = sim.shape[:2]
        # Tile the (gh*gw) small maps into one image with a 1-pixel gap between them.
        canvas = np.full((gh * (gh + 1), gw * (gw + 1)), np.nan)
        for i in range(gh):
            for j in range(gw):
                canvas[i * (gh + 1) : i * (gh + 1) + gh, j * (gw + 1) : j * (gw + 1) + gw] = sim[i, j]
        image = ax.imshow(canvas, cmap="viridis", vmin=-1, vmax=1)
        ax.set_title(title)
        ax.set_axis_off()
    fig.colorbar(image, ax=axes[0].tolist(), fraction=0.02, label="cosine similarity")
    return save(fig, path)


def macs_vs_size_figure(
    sizes, linear_macs, quadratic_macs, path: Path, title: str, crossover: float | None = None
) -> Path:
    """Multiply-adds (MACs) against image size, split into the terms linear in the token count and the N² attention
    term; `crossover` (px) marks where the N² term overtakes (default: the first sampled size where it does)."""
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    total = [a + b for a, b in zip(linear_macs, quadratic_macs, strict=True)]
    ax.plot(sizes, np.asarray(total) / 1e9, marker="o", label="total")
    ax.plot(sizes, np.asarray(linear_macs) / 1e9, marker=".", label="linear in N (projections, MLP, embed)")
    ax.plot(sizes, np.asarray(quadratic_macs) / 1e9, marker=".", label="N² (Q·Kᵀ and attn·V)")
    if crossover is None:
        pairs = zip(sizes, linear_macs, quadratic_macs, strict=True)
        crossover = next((s for s, a, b in pairs if b >= a), None)
    if crossover is not None:
        ax.axvline(crossover, color="grey", linestyle="--", label=f"N² term takes over at ~{crossover:.0f} px")
    ax.set_xlabel("image size (px)")
    ax.set_ylabel("GMACs per image (forward)")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save(fig, path)


def registers_figure(images, panels: list[tuple[str, np.ndarray, np.ndarray]], path: Path, note: str) -> Path:
    """Rows: images. For each model (name, attention (B, H, W), token norms (B, gh, gw)), two columns: its
    attention over the image (head mean, upsampled) and the norm of each image token after the last block, on
    the model's own colour scale, so a few high-norm tokens stand out as bright cells. images (B, 3, H, W) in
    [0, 1]; `note` goes under the figure."""
    batch = images.shape[0]
    cols = 1 + 2 * len(panels)
    fig, axes = plt.subplots(batch, cols, figsize=(1.7 * cols, 1.8 * batch + 0.4), dpi=100, squeeze=False)
    for b in range(batch):
        picture = images[b].permute(1, 2, 0).numpy()
        axes[b, 0].imshow(picture)
        for m, (name, attention, norms) in enumerate(panels):
            ax_attn, ax_norm = axes[b, 1 + 2 * m], axes[b, 2 + 2 * m]
            ax_attn.imshow(picture)
            ax_attn.imshow(attention[b], cmap="inferno", alpha=0.6)
            ax_norm.imshow(norms[b], cmap="viridis")
            if b == 0:
                ax_attn.set_title(f"{name}\nattention", fontsize=7)
                ax_norm.set_title(f"{name}\ntoken norms", fontsize=7)
        for ax in axes[b]:
            ax.set_axis_off()
    fig.tight_layout()
    fig.subplots_adjust(bottom=0.35 / fig.get_figheight())  # room for the note: about a third of an inch
    fig.text(0.5, 0.01, note, ha="center", fontsize=7, wrap=True)
    return save(fig, path)
