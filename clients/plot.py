"""The comparison plot: slots per arm, then mean TTFT, input throughput and hit rate per phase (bars: the
mean over seeds, whiskers: the sample std), every arm of the run side by side."""
from __future__ import annotations

import numpy as np


def plot_arms(path: str, arms: list[dict], title: str) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = list(arms[0]["summary"]["phases"])
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    ax = axes[0]
    ax.bar(range(len(arms)), [a["slots"] for a in arms], color=colors[:len(arms)])
    for i, a in enumerate(arms):
        ax.text(i, a["slots"], f"{a['slots']}", ha="center", va="bottom", fontsize=9)
    ax.set_xticks(range(len(arms)), [a["label"].replace(" + ", "\n+ ") for a in arms], fontsize=8)
    ax.set_title("checkpoint slots at the matched budget")
    width = 0.8 / len(arms)
    panels = (("ttft_mean_ms", "mean TTFT (ms) ↓", 1.0), ("input_tokens_per_s", "input tokens/s ↑", 1.0),
              ("hit_rate", "token hit rate, Eq. 9 (%) ↑", 100.0))
    for ax, (key, name, k) in zip(axes[1:], panels):
        x = np.arange(len(phases))
        for i, a in enumerate(arms):
            stats = [a["summary"]["phases"][p]["seeds"][key] for p in phases]
            ax.bar(x + (i - (len(arms) - 1) / 2) * width, [k * s["mean"] for s in stats], width,
                   yerr=[k * s["std"] for s in stats], capsize=2, label=a["label"], color=colors[i % len(colors)])
        ax.set_xticks(x, [p.replace(" (", "\n(") for p in phases], fontsize=8)
        ax.set_title(name)
        if key == "hit_rate":
            # hit rates of prefix-sharing prompts sit close together: zoom in, the bars start at the lowest
            low = min(k * a["summary"]["phases"][p]["seeds"][key]["mean"] for a in arms for p in phases)
            ax.set_ylim(max(0.0, low - 5), 100.5)
        ax.set_xlabel("phase (block size Q at an arm's capacity boundary)", fontsize=8)
    axes[1].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
