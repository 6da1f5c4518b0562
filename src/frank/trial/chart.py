"""A trial's decision as a picture: each start's metric by arm, in the order the starts ran.

Drawn with pygal (a small pure-Python SVG charting library: axes, legend and labels in a
few lines, no plotting stack to install); its scripts are left out, so the file runs and
fetches nothing when opened, and its random chart id is replaced by one derived from the
trial's digest, so the same decision gives the same bytes.
"""

from __future__ import annotations

import re
from pathlib import Path

from frank.fsutil import write_atomic
from frank.trial.decide import Decision

ARM_NAMES = {"A": "A (current)", "B": "B (candidate)"}


def chart_path(trial_file: Path) -> Path:
    """The chart lives beside the trial and its results: ``trials/NAME.decision.svg``."""
    return trial_file.with_name(f"{trial_file.stem}.decision.svg")


def render_svg(decision: Decision) -> str:
    """The SVG text: a dot per start at its metric, one series per arm, each arm's mean as a
    line, the rule's verdict and p-value in the title."""
    import pygal
    from pygal.style import Style

    style = Style(background="white", plot_background="white", font_family="sans-serif",
                  colors=("#1f77b4", "#d62728", "#1f77b4", "#d62728"),
                  title_font_size=15, legend_font_size=12, label_font_size=11)
    o = decision.outcome
    chart = pygal.Line(
        style=style, js=[], width=720, height=420, dots_size=5, show_legend=True,
        legend_at_bottom=True, legend_at_bottom_columns=4, truncate_legend=-1,
        title=(f"trial {decision.trial}: {decision.verdict} "
               f"(p = {o.p_exact} = {o.p_value:.4g}, alpha {decision.alpha:g})"),
        x_title="start, in the sealed order",
        y_title=f"{decision.metric} ({decision.direction} is better)",
        print_values=False, allow_interruptions=True, show_x_guides=False)
    chart.x_labels = [str(start) for start, _, _ in decision.starts]
    means = {"A": decision.mean.a, "B": decision.mean.b}
    for arm in ("A", "B"):
        points = [value if a == arm else None for _, a, value in decision.starts]
        chart.add(ARM_NAMES[arm], points, stroke=False)
    for arm in ("A", "B"):
        mean = means[arm]
        if mean is not None:
            chart.add(f"mean {arm} {mean:.4g}", [mean] * len(decision.starts),
                      show_dots=False, stroke_style={"width": 1.5, "dasharray": "6, 4"})
    svg: str = chart.render(is_unicode=True)
    # pygal inlines its options as a script for its (left out) tooltips: nothing a static
    # picture needs, and a file attached to a review should run nothing
    svg = re.sub(r"<script\b[^>]*>.*?</script>", "", svg, flags=re.DOTALL)
    # pygal names its chart with a fresh uuid4; the trial's digest is as unique and stable
    stable = "trial-" + decision.digest.removeprefix("sha256:")[:32]
    return re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
                  stable, svg)


def write_chart(decision: Decision, trial_file: Path) -> Path:
    """Write the chart beside the trial (atomically) and say where."""
    path = chart_path(trial_file)
    write_atomic(path, render_svg(decision))
    return path
