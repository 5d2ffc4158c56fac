"""Read a trace that mpicoll wrote (``Communicator(trace=True)``, ``MPICOLL_TRACE``).

    python -m mpicoll.trace summary trace.json          # per call: steps, bytes, time
    python -m mpicoll.trace draw trace.json -o out.png  # a per-rank timeline
    python -m mpicoll.trace hang DIR                    # why a job timed out (see mpicoll.observe.hang)

The summary gives, per collective call: the ranks, the most messages one rank sent
(the algorithm's steps), the bytes sent in all, the critical path (first start to last
end over the ranks), on the slowest rank the time with a message in flight and the time
reducing, and the cost model's prediction for the call. See ``mpicoll.observe.tracing`` for what
is recorded and how clocks are aligned.
"""

from __future__ import annotations

import argparse
import os
import sys

from mpicoll.observe.tracefile import draw, load, summarize


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpicoll.trace",
                                     description="Read a trace written by mpicoll.")
    sub = parser.add_subparsers(dest="command", required=True)
    summary = sub.add_parser("summary", help="per call: steps, bytes, comm vs reduce, model")
    summary.add_argument("path")
    drawing = sub.add_parser("draw", help="a per-rank timeline PNG")
    drawing.add_argument("path")
    drawing.add_argument("-o", "--output", required=True)
    hang = sub.add_parser("hang", help="read MPICOLL_DUMP_DIR's flight recorders: what hung")
    hang.add_argument("path", help="the job's MPICOLL_DUMP_DIR")
    args = parser.parse_args(argv)
    try:
        return _command(parser, args)
    except (KeyError, IndexError, TypeError, ValueError, OSError) as exc:  # (JSON's too)
        print(f"{parser.prog}: {args.path}: not a trace (or hang dumps) as mpicoll writes "
              f"them: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


def _command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.command == "hang":
        from mpicoll.observe.hang import explain, load_dumps

        if not os.path.isdir(args.path):
            print(f"{parser.prog}: {args.path}: no such folder (MPICOLL_DUMP_DIR's)",
                  file=sys.stderr)
            return 2
        unread: list[str] = []
        dumps = load_dumps(args.path, unread)
        for problem in unread:  # (the others' dumps still tell what they can)
            print(f"{parser.prog}: {problem}", file=sys.stderr)
        print("\n".join(explain(dumps)))
        return 0 if dumps else 2
    about: dict = {}
    try:
        events = load(args.path, about)
    except ValueError as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 2
    if not events:
        print(f"{parser.prog}: {args.path} has no events", file=sys.stderr)
        return 2
    if args.command == "draw":
        from mpicoll.bench.report import figure_path

        output, problem = figure_path(args.output)
        if problem:
            print(f"{parser.prog}: -o {args.output}: {problem}", file=sys.stderr)
            return 2
        try:
            draw(events, output)
        except OSError as exc:  # (the output's, not the trace's: a place that refuses
            # the file only when written)
            print(f"{parser.prog}: -o {output}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        print(f"wrote {output}")
        return 0
    from mpicoll import model  # the fitted parameters, as auto reads them, else defaults
    from mpicoll.errors import ConfigError

    try:
        params = model.load_params() or model.Params()
    except ConfigError as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 2
    rows = summarize(events, params)  # (before any line: a file it cannot read prints none)
    print(f"{'call':>5} {'collective':>14} {'algorithm':>20} {'ranks':>5} {'steps':>5} "
          f"{'bytes sent':>12} {'critical(us)':>13} {'messages(us)':>13} {'reduce(us)':>11} "
          f"{'model(us)':>10}  (model: {params.source})")
    for row in rows:
        print(f"{row['call']:>5} {row['collective']:>14} {row['algorithm']:>20} "
              f"{row['ranks']:>5} {row['steps']:>5} {row['bytes_sent']:>12} "
              f"{row['critical_us']:>13.1f} {row['messages_us']:>13.1f} "
              f"{row['reduce_us']:>11.1f} {row['model_us']:>10.1f}")
    untraced = about.get("untraced_calls")
    if isinstance(untraced, dict) and untraced:
        print(f"# not traced: the calls past each rank's first {about.get('max_records')} "
              "records (" + ", ".join(f"rank {r}: {n}" for r, n in untraced.items()) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
