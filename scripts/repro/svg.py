"""Line plots as standalone SVG files, with no plotting library: a figure is a column of panels
sharing one x range, each with its series, a legend on the right and optional vertical markers.

A panel is a dict: ylabel, series (a list of dicts: label, x, y, and optionally color, dash
(an SVG stroke-dasharray), width, opacity), and optionally log (a log10 y axis), ylim (lo, hi) and
vlines (a list of (x, label, color)). A y value that is None, non-finite, or <= 0 on a log axis
breaks its line.
"""
import math

from .runs import is_finite

COLORS = ["#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"]

# Margins (left, right for the legend, top, bottom) and the gap between panels, in pixels.
LEFT, RIGHT, TOP, BOTTOM = 70, 230, 34, 36
PANEL_GAP = 38


def escape(s):
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def nice_ticks(lo, hi, n=5):
    """Ticks over lo..hi at the multiples of the smallest step of 1, 2, 2.5 or 5 times a power of ten
    that is at least (hi - lo) / n: at most n + 1 ticks."""
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=10 * mag)
    t = math.ceil(lo / step) * step
    ticks = []
    while t <= hi + 1e-9 * step:
        ticks.append(round(t, 12))
        if t + step == t:
            break  # a range below the resolution of t (a flat series): one tick, not an endless loop
        t += step
    return ticks


def format_tick(v):
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e4 or a < 1e-3:
        return f"{v:.0e}".replace("e+0", "e").replace("e-0", "e-")
    return f"{v:g}"


def _y_range(panel, x0, x1):
    """(lo, hi) of a panel's y axis: log10 exponents on a log axis, padded values otherwise."""
    log = panel.get("log", False)
    ys = [y for s in panel["series"] for x, y in zip(s["x"], s["y"])
          if x0 <= x <= x1 and is_finite(y) and (y > 0 or not log)]
    if panel.get("ylim"):
        lo, hi = panel["ylim"]
    elif ys:
        lo, hi = min(ys), max(ys)
    else:
        lo, hi = (1e-3, 1) if log else (0, 1)
    if log:
        lo, hi = math.floor(math.log10(max(lo, 1e-30))), math.ceil(math.log10(max(hi, 1e-30)))
        if hi <= lo:
            hi = lo + 1
    else:
        if hi == lo:
            lo, hi = lo - 0.5, hi + 0.5
        pad = 0.04 * (hi - lo)
        lo, hi = lo - pad, hi + pad
    return lo, hi


def _panel(out, panel, top, panel_h, x0, x1, pw):
    """Appends the SVG elements of one panel to out."""
    log = panel.get("log", False)
    lo, hi = _y_range(panel, x0, x1)

    def X(x):
        return LEFT + (x - x0) / (x1 - x0) * pw

    def Y(y):
        if log:
            y = math.log10(y)
        y = min(max(y, lo), hi)
        return top + panel_h - (y - lo) / (hi - lo) * panel_h

    out.append(f'<rect x="{LEFT}" y="{top}" width="{pw}" height="{panel_h}" fill="none" stroke="#444"/>')
    out.append(f'<text x="{LEFT + 4}" y="{top - 4}" font-weight="bold">{escape(panel["ylabel"])}</text>')
    y_ticks = [10.0 ** k for k in range(int(lo), int(hi) + 1)] if log else nice_ticks(lo, hi)
    for t in y_ticks:
        yy = Y(t)
        out.append(f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#ddd"/>')
        label = f"1e{int(round(math.log10(t)))}" if log else format_tick(t)
        out.append(f'<text x="{LEFT - 5}" y="{yy + 4:.1f}" text-anchor="end">{label}</text>')
    for t in nice_ticks(x0, x1, 8):
        xx = X(t)
        out.append(f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{top}" y2="{top + panel_h}" stroke="#eee"/>')
        out.append(f'<text x="{xx:.1f}" y="{top + panel_h + 13}" text-anchor="middle">{format_tick(t)}</text>')
    for (vx, vlabel, vcolor) in panel.get("vlines", []):
        if x0 <= vx <= x1:
            xx = X(vx)
            out.append(f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{top}" y2="{top + panel_h}" stroke="{vcolor}" stroke-dasharray="2,3"/>')
            out.append(f'<text x="{xx + 2:.1f}" y="{top + 11}" fill="{vcolor}" font-size="10">{escape(vlabel)}</text>')
    for si, s in enumerate(panel["series"]):
        color = s.get("color", COLORS[si % len(COLORS)])
        # Polylines of consecutive plottable points; a lone point is a dot.
        segments, current = [], []
        for x, y in zip(s["x"], s["y"]):
            if not (x0 <= x <= x1):
                continue
            if is_finite(y) and (y > 0 or not log):
                current.append(f"{X(x):.1f},{Y(y):.1f}")
            elif current:
                segments.append(current)
                current = []
        if current:
            segments.append(current)
        dash = f' stroke-dasharray="{s["dash"]}"' if s.get("dash") else ""
        opacity = s.get("opacity", 0.9)
        for seg in segments:
            if len(seg) == 1:
                cx, cy = seg[0].split(",")
                out.append(f'<circle cx="{cx}" cy="{cy}" r="1.5" fill="{color}"/>')
            else:
                out.append(f'<polyline fill="none" stroke="{color}" stroke-width="{s.get("width", 1.2)}" stroke-opacity="{opacity}"{dash} points="{" ".join(seg)}"/>')
        ly = top + 12 + si * 14
        lx = LEFT + pw + 10
        out.append(f'<line x1="{lx}" x2="{lx + 22}" y1="{ly - 4}" y2="{ly - 4}" stroke="{color}" stroke-width="2"{dash}/>')
        out.append(f'<text x="{lx + 27}" y="{ly}">{escape(s["label"])}</text>')


def render_figure(panels, xlim, title, xlabel="step", width=980, panel_h=210):
    """The SVG text of a figure: panels (see the module comment) over x in xlim = (x0, x1)."""
    height = TOP + len(panels) * (panel_h + PANEL_GAP) + BOTTOM
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{LEFT}" y="20" font-size="14" font-weight="bold">{escape(title)}</text>']
    x0, x1 = xlim
    pw = width - LEFT - RIGHT
    for pi, panel in enumerate(panels):
        top = TOP + pi * (panel_h + PANEL_GAP) + 8
        _panel(out, panel, top, panel_h, x0, x1, pw)
    out.append(f'<text x="{LEFT + pw / 2}" y="{height - 8}" text-anchor="middle">{escape(xlabel)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def svg_figure(path, panels, xlim, title, xlabel="step", width=980, panel_h=210):
    """Writes render_figure(...) to path."""
    with open(path, "w") as f:
        f.write(render_figure(panels, xlim, title, xlabel, width, panel_h))
