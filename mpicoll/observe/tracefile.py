"""Reading a trace file that mpicoll wrote: its events, a summary per call, a timeline.

A tool above the runtime (``python -m mpicoll.trace summary|draw`` uses it); recording
the trace is ``mpicoll.observe.tracing``'s.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import numpy as np

from .. import model
from .tracing import algorithm_messages


def load(path: str, about: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The message, reduction and call events of a trace file, times in seconds;
    ``about``, where given, filled with what the file says of itself (its ranks, and
    ``untraced_calls``: each rank's calls past the records a rank keeps, not traced).

    Raises:
        ValueError: the file cannot be read, or is not a trace mpicoll wrote (says which).
    """
    try:
        with open(path) as f:
            trace = json.load(f)
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError(f"{path}: not a trace mpicoll wrote (no traceEvents list)")
    if about is not None and isinstance(trace.get("otherData"), dict):
        about.update(trace["otherData"])
    events = []
    try:
        for e in trace["traceEvents"]:
            if e.get("ph") != "X":
                continue
            events.append({**e["args"], "rank": e["pid"], "track": e["tid"],
                           "start": e["ts"] / 1e6, "end": (e["ts"] + e["dur"]) / 1e6})
    except KeyError as exc:
        raise ValueError(f"{path}: not a trace mpicoll wrote (an event lacks {exc})") from None
    except (AttributeError, TypeError) as exc:  # (a field of another type: "dur": "5")
        raise ValueError(f"{path}: not a trace mpicoll wrote (an event's field is not what "
                         f"mpicoll writes: {exc})") from None
    return events


# ---- reading a trace: the summary and the timeline ----------------------------------------


def _covered(spans: list[tuple[float, float]]) -> float:
    """The time covered by some span (overlapping messages counted once)."""
    total, reach = 0.0, -np.inf
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def summarize(events: list[dict[str, Any]],
              params: model.Params | None = None) -> list[dict[str, Any]]:
    """Per collective call: ranks, most messages sent by one rank, bytes sent in all,
    the critical path (first start to last end over the ranks), and on the slowest rank
    the time in messages and in reductions; with the cost model's prediction (``params``:
    the fitted parameters, else the defaults; one node)."""

    calls: dict[int, list[dict]] = defaultdict(list)
    for e in events:
        calls[e["call"]].append(e)
    rows = []
    for call, mine in sorted(calls.items()):
        spans = [e for e in mine if e["kind"] == "call"]
        ranks = sorted({e["rank"] for e in spans})
        # the algorithm's messages (not the header packet's, unless it carried the data;
        # never mpicoll's agreements: see observe.tracing's roles)
        sends = [e for e in algorithm_messages(mine) if e["kind"] == "send"]
        per_rank_sends = defaultdict(int)
        for e in sends:
            per_rank_sends[e["rank"]] += 1
        slowest = max(spans, key=lambda e: e["end"] - e["start"])
        reduce_time = sum(e["end"] - e["start"] for e in mine
                          if e["kind"] == "reduce" and e["rank"] == slowest["rank"])
        message_time = _covered([(e["start"], e["end"]) for e in mine
                                 if e["kind"] in ("send", "recv") and e["rank"] == slowest["rank"]])
        p = len(ranks)
        try:
            predicted = model.predict(slowest["collective"], slowest["algorithm"],
                                      int(slowest.get("nbytes", 0)), p, params) * 1e6
        except Exception:  # noqa: BLE001 - an algorithm the model has no line for
            predicted = float("nan")
        rows.append({
            "call": call, "collective": slowest["collective"], "algorithm": slowest["algorithm"],
            "ranks": p, "steps": max(per_rank_sends.values(), default=0),
            "bytes_sent": sum(e["bytes"] for e in sends),
            "critical_us": (max(e["end"] for e in spans) - min(e["start"] for e in spans)) * 1e6,
            "messages_us": message_time * 1e6, "reduce_us": reduce_time * 1e6,
            "model_us": predicted,
        })
    return rows


# the timeline's lanes inside a rank's row (y grows downward): the call's label on top,
# then sends, receives and reductions
_LANES = {"label": -0.34, "send": -0.12, "recv": 0.1, "reduce": 0.32}
_BAR = 0.19
_COLORS = {"send": "tab:blue", "recv": "tab:orange", "reduce": "tab:green"}


def _label_that_fits(text: Any, choices: list[str], room: float, renderer: Any) -> bool:
    """Give ``text`` the first of ``choices`` narrower than ``room`` pixels; False (and
    no text) when none is."""
    for choice in choices:
        text.set_text(choice)
        if text.get_window_extent(renderer).width <= room:
            return True
    text.set_text("")
    return False


def timeline(events: list[dict[str, Any]]) -> Any:
    """The per-rank timeline as a matplotlib Figure: each call a light span with its name
    on top (``collective algorithm``, or only the algorithm, where that fits in the span;
    none where neither does), its sends, receives and reductions as bars in three lanes
    below; the legend outside the axes, right of them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ranks = sorted({e["rank"] for e in events})
    origin = min(e["start"] for e in events)
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.75 * len(ranks)), layout="constrained")
    labels = []
    for e in events:
        x, width = (e["start"] - origin) * 1e6, max(e["end"] - e["start"], 1e-7) * 1e6
        y = e["rank"]
        if e["kind"] == "call":
            ax.broken_barh([(x, width)], (y - 0.47, 0.94), color="0.9", zorder=0)
            text = ax.text(x + width / 2, y + _LANES["label"], "", ha="center", va="center",
                           fontsize=6.5, clip_on=True)
            labels.append((text, x, width, [f"{e['collective']} {e['algorithm']}",
                                            str(e["algorithm"])]))
        else:
            ax.broken_barh([(x, width)], (y + _LANES[e["kind"]] - _BAR / 2, _BAR),
                           color=_COLORS[e["kind"]])
    ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
    ax.set_ylim(max(ranks) + 0.5, min(ranks) - 0.5)
    end = max((e["end"] - origin) * 1e6 for e in events)
    ax.set_xlim(-0.01 * end, 1.01 * end)
    ax.set_xlabel("time (us, rank 0's clock)")
    handles = [Patch(color="0.9", label="call (name on top\nwhere it fits)")]
    handles += [Patch(color=c, label=k) for k, c in _COLORS.items()]
    fig.legend(handles=handles, loc="outside right upper", fontsize=7)
    # the layout is fixed now: keep each call's label only where it fits in its span
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for text, x, width, choices in labels:
        left, right = ax.transData.transform([(x, 0), (x + width, 0)])[:, 0]
        _label_that_fits(text, choices, (right - left) - 4, renderer)
    return fig


def draw(events: list[dict[str, Any]], path: str) -> None:
    """A per-rank timeline PNG (see ``timeline``)."""
    import matplotlib.pyplot as plt

    fig = timeline(events)
    fig.savefig(path, dpi=110)
    plt.close(fig)
