"""Tracing (Communicator(trace=True), MPICOLL_TRACE), python -m mpicoll.trace, and the
data-flow diagrams of python -m mpicoll.viz."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

import mpicoll
from mpicoll import tracefile, tracing, viz
from mpicoll.local import run_local

PNG = b"\x89PNG\r\n\x1a\n"


def _ring_sends_are_the_textbook_ring(events, p, rank, nbytes):
    sends = [e for e in events if e["kind"] == "send" and e["collective"] == "all_reduce"]
    assert len(sends) == 2 * (p - 1)  # p - 1 of reduce-scatter, p - 1 of all-gather
    assert [e["step"] for e in sends] == list(range(2 * (p - 1)))
    receives = [e for e in events if e["kind"] == "recv" and e["collective"] == "all_reduce"]
    assert len(receives) == 2 * (p - 1)
    if p > 1:
        assert {e["peer"] for e in sends} == {(rank + 1) % p}
        assert {e["peer"] for e in receives} == {(rank - 1) % p}
        assert {e["bytes"] for e in sends} <= {nbytes // p // 4 * 4, -(-nbytes // p // 4) * 4}
    reductions = [e for e in events if e["kind"] == "reduce"]
    assert len(reductions) == p - 1
    assert all(e["algorithm"] == "ring" and e["end"] >= e["start"] for e in events)
    calls = [e for e in events if e["kind"] == "call"]
    assert len(calls) == 1 and calls[0]["nbytes"] == nbytes


def test_traced_ring_all_reduce_at_four_local_ranks():
    def body(comm):
        x = np.arange(400, dtype=np.float32)
        comm.all_reduce(x, algorithm="ring")
        return comm.trace_events()

    for rank, events in enumerate(run_local(4, body, trace=True)):
        _ring_sends_are_the_textbook_ring(events, 4, rank, 1600)


def test_chunks_of_the_ring_follow_the_textbook():
    steps = viz.flow("all_reduce", "ring", 4)
    assert len(steps) == 6 and all(len(messages) == 4 for messages in steps)
    for k, messages in enumerate(steps):
        for sender, receiver, chunk, nbytes in messages:
            assert receiver == (sender + 1) % 4 and nbytes == 16
            assert chunk == (sender - 1 - k) % 4  # chunk r - 1 starts the ring at rank r


def test_chunks_staged_in_the_workspace_follow_the_textbook():
    """Partial sums that an algorithm keeps in its workspace (ring reduce_scatter's pair
    of buffers, recursive halving's window) carry the chunk the data came as: ring's
    reduce-scatter is the same steps as ring all_reduce's first phase, and recursive
    halving at rank r sends the half of its window it does not keep, then a quarter."""
    ring = viz.flow("reduce_scatter", "ring", 4)
    assert ring == viz.flow("all_reduce", "ring", 4)[:3]
    for k, messages in enumerate(viz.flow("reduce_scatter", "recursive_halving", 8)):
        half = 8 >> (k + 1)  # chunks sent at step k+1: the other half of the window
        for sender, receiver, chunk, nbytes in messages:
            assert receiver == sender ^ half and nbytes == 16 * half
            window = sender & ~(2 * half - 1)  # the window's first chunk at this step
            assert chunk == window + (half if sender & half == 0 else 0), (k, sender, chunk)
    flow = viz.trace_flow("all_reduce", "rabenseifner", 8)
    assert flow.owner_note() == "then rank r holds chunk r reduced"


@pytest.mark.parametrize("algorithm", ["linear", "binomial", "knomial", "bine"])
def test_viz_draws_a_scatters_rows_not_its_header_packet(algorithm):
    """The header packet (shape and dtype, broadcast first) is mpicoll's, not the
    algorithm's: scatter was drawn with two more steps of 1024-byte messages."""
    steps = viz.flow("scatter", algorithm, 4)
    assert all(nbytes <= 3 * 16 for messages in steps for *_, nbytes in messages), steps
    assert sum(len(messages) for messages in steps) <= 3 if algorithm == "linear" else True


def test_trace_roles_keep_the_header_and_agreements_apart_from_the_algorithm():
    """A binomial broadcast of 4000 B on 2 ranks is one step of 4000 B (the summary said
    2 steps and 5024 B: the 1 KiB header packet counted as the algorithm's, chunk 0), and
    a compressed ring all_reduce's wire agreement is no step of the ring's."""
    def body(comm):
        comm.broadcast(np.arange(1000, dtype=np.float32) if comm.rank == 0 else None, 0,
                       algorithm="binomial")
        comm.all_reduce(np.ones(500, np.float32), algorithm="ring", compress="bf16")
        comm.broadcast(np.ones(4, np.float32) if comm.rank == 0 else None, 0,
                       algorithm="binomial")  # (small: the packet carries the data)
        return comm.trace_events()

    events = [e for rank in run_local(2, body, trace=True) for e in rank]
    roles = {(e["call"], e.get("role")) for e in events if e["kind"] in ("send", "recv")}
    assert (1, "header") in roles and (2, "control") in roles, roles
    header = [e for e in events if e.get("role") == "header"]
    assert all(e["chunk"] is None for e in header)
    rows = {r["call"]: r for r in tracefile.summarize(events)}
    assert (rows[1]["steps"], rows[1]["bytes_sent"]) == (1, 4000), rows[1]
    assert (rows[2]["steps"], rows[2]["bytes_sent"]) == (2, 2 * 2 * 250 * 2), rows[2]
    assert rows[3]["steps"] == 1 and rows[3]["bytes_sent"] > 0  # (the packet's, shown)


def test_tree_rounds_and_ascii():
    steps = viz.flow("broadcast", "binomial", 8)
    assert [len(m) for m in steps] == [1, 2, 4]  # a binomial tree doubles each round
    text = viz.ascii_diagram("broadcast", "binomial", 8, steps)
    assert "3 step(s)" in text and text.count("\nstep") == 3


def test_viz_labels_the_ring_phases_and_says_how_chunks_are_numbered(capsys):
    traced = viz.trace_flow("all_reduce", "ring", 4)
    assert traced.reduces == [True] * 3 + [False] * 3
    phases = traced.phases("all_reduce", "ring")
    assert phases == [("reduce-scatter", 1, 3), ("all-gather", 4, 6)]
    assert viz.main(["all_reduce", "--algorithm", "ring", "-n", "4", "--ascii"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert "chunk c = the c-th of p equal parts of a rank's buffer, from 0" in text[0]
    assert text[1] == "reduce-scatter, steps 1-3, then rank r holds chunk r reduced"
    assert text[5] == "all-gather, steps 4-6" and text[6].startswith("step  4:")
    fig = viz.diagram("all_reduce", "ring", 4, traced.steps, phases, traced.owner_note())
    shown = [t.get_text() for t in fig.axes[0].texts]
    assert "reduce-scatter, steps 1-3\nthen rank r holds chunk r reduced" in shown
    assert "all-gather, steps 4-6" in shown
    assert "from 0" in fig.axes[0].get_title()
    # one-phase algorithms get no labels
    assert viz.trace_flow("broadcast", "binomial", 4).phases("broadcast", "binomial") == []


def _extent(artist, renderer):
    box = artist.get_window_extent(renderer)
    return box.x0, box.x1, box.y0, box.y1


def _overlap(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1] and a[2] < b[3] and b[2] < a[3]


def test_timeline_labels_fit_and_the_legend_is_outside(tmp_path):
    """Each call's label lies inside its own span (shortened or left out where it would
    not fit), no two labels overlap, and the legend sits outside the axes' bars."""
    def body(comm):
        x = np.ones(3000)
        for algorithm in ("ring", "recursive_doubling", "rabenseifner"):
            comm.all_reduce(x, algorithm=algorithm)
        comm.all_gather(np.ones(3), algorithm="ring")
        comm.barrier()
        return comm.trace_events()

    events = [e for rank in run_local(4, body, trace=True) for e in rank]
    fig = tracefile.timeline(events)
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    labels = [t for t in ax.texts if t.get_text()]
    assert labels, "no call is labelled"
    boxes = [_extent(t, renderer) for t in labels]
    assert not any(_overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    origin = min(e["start"] for e in events)
    for text, box in zip(labels, boxes, strict=True):
        x, y = text.get_position()
        span = [e for e in events if e["kind"] == "call" and e["rank"] == round(y)
                and abs((e["start"] + e["end"]) / 2 - origin - x / 1e6) < 1e-9]
        assert len(span) == 1, text.get_text()
        left, right = ax.transData.transform([((span[0]["start"] - origin) * 1e6, 0),
                                              ((span[0]["end"] - origin) * 1e6, 0)])[:, 0]
        assert left <= box[0] and box[1] <= right, text.get_text()
        assert span[0]["algorithm"] in text.get_text()
    legend = fig.legends[0]
    assert not _overlap(_extent(legend, renderer), _extent(ax, renderer))
    path = tmp_path / "timeline.png"
    tracefile.draw(events, str(path))
    assert path.read_bytes().startswith(PNG)


def test_viz_cli_png_and_refusals(tmp_path):
    out = tmp_path / "ring.png"
    assert viz.main(["all_reduce", "--algorithm", "ring", "-n", "3", "-o", str(out)]) == 0
    assert out.read_bytes().startswith(PNG) and out.stat().st_size > 5000
    with pytest.raises(SystemExit):
        viz.main(["all_reduce", "--algorithm", "no_such", "-n", "3", "--ascii"])
    with pytest.raises(SystemExit):  # (each rank a thread: 500 would run for minutes)
        viz.main(["all_reduce", "--algorithm", "ring", "-n", str(viz.MAX_RANKS + 1), "--ascii"])


def test_viz_says_a_bad_setting_in_one_line(monkeypatch, capsys):
    """A malformed setting in the environment (the Communicators viz makes read it) is
    the command's one-line error and status 2, as the benchmark's, not a traceback."""
    monkeypatch.setenv("MPICOLL_RANKS_PER_NODE", "x")
    with pytest.raises(SystemExit) as exit_:
        viz.main(["all_reduce", "--algorithm", "ring", "-n", "4", "--ascii"])
    assert exit_.value.code == 2 and "MPICOLL_RANKS_PER_NODE" in capsys.readouterr().err


def test_chrome_trace_has_what_perfetto_needs(tmp_path):
    events = run_local(3, lambda comm: (comm.all_reduce(np.ones(30), algorithm="ring"),
                                        comm.trace_events())[1], trace=True)
    merged = [e for rank in events for e in rank]
    trace = tracing.chrome_trace(merged, 3)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))
    loaded = json.loads(path.read_text())["traceEvents"]
    complete = [e for e in loaded if e["ph"] == "X"]
    assert complete and all({"name", "ph", "ts", "dur", "pid", "tid"} <= set(e) for e in complete)
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in complete)
    names = {(e["pid"], e["args"]["name"]) for e in loaded if e["ph"] == "M"
             and e["name"] == "process_name"}
    assert names == {(r, f"rank {r}") for r in range(3)}
    rows = tracefile.summarize(tracefile.load(str(path)))
    assert len(rows) == 1 and rows[0]["steps"] == 4 and rows[0]["ranks"] == 3
    assert rows[0]["bytes_sent"] == 3 * 4 * 80 and rows[0]["model_us"] > 0


def test_untraced_communicator_has_no_wrappers():
    def body(comm):
        assert comm._tracer is None and type(comm.transport).__name__ == "LocalTransport"
        with pytest.raises(mpicoll.InvalidArgumentError, match="trace=True"):
            comm.trace_events()

    run_local(2, body)


@pytest.mark.mpi
def test_mpi_trace_written_merged_and_read(tmp_path_factory):
    from mpi4py import MPI

    path = MPI.COMM_WORLD.bcast(str(tmp_path_factory.mktemp("trace") / "t.json"))
    comm = mpicoll.Communicator(trace=True)
    x = np.arange(400, dtype=np.float32)
    comm.all_reduce(x, algorithm="ring")
    comm.broadcast(x if comm.rank == 0 else None, algorithm="binomial")
    _ring_sends_are_the_textbook_ring(
        [e for e in comm.trace_events() if e["call"] == 1], comm.size, comm.rank, 1600)
    comm.write_trace(path)
    if comm.rank == 0:
        events = tracefile.load(path)
        assert {e["rank"] for e in events} == set(range(comm.size))
        rows = tracefile.summarize(events)
        assert [r["collective"] for r in rows] == ["all_reduce", "broadcast"]
        assert rows[0]["steps"] == 2 * (comm.size - 1)
        # clocks aligned: every rank's ring call overlaps rank 0's
        calls = [e for e in events if e["kind"] == "call" and e["call"] == 1]
        assert max(e["start"] for e in calls) <= min(e["end"] for e in calls) or comm.size == 1
        out = os.path.join(os.path.dirname(path), "timeline.png")
        done = subprocess.run([sys.executable, "-m", "mpicoll.trace", "draw", path, "-o", out],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        with open(out, "rb") as f:
            assert f.read(8) == PNG
        done = subprocess.run([sys.executable, "-m", "mpicoll.trace", "summary", path],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "all_reduce" in done.stdout and "ring" in done.stdout
        # the model column from the fitted file auto reads (MPICOLL_MODEL), named
        fitted = os.path.join(os.path.dirname(path), "model.json")
        for text, status in (('{"alpha": 1e-3, "beta": 1e-9, "gamma": 1e-9}', 0),
                             ('{"alpha": -1}', 2)):
            with open(fitted, "w") as f:
                f.write(text)
            done = subprocess.run([sys.executable, "-m", "mpicoll.trace", "summary", path],
                                  capture_output=True, text=True, timeout=120,
                                  env={**os.environ, "MPICOLL_MODEL": fitted})
            assert done.returncode == status, done.stderr
            assert (f"(model: {fitted})" in done.stdout) if status == 0 else \
                ("'alpha' must be a non-negative number" in done.stderr)
    comm.free()


def _run_traced(tmp_path, ranks: int, body: str, trace: Any,
                timeout: float | None = None) -> subprocess.CompletedProcess:
    """``body`` (after numpy and mpicoll's imports) run at ``ranks`` ranks under
    MPICOLL_TRACE=``trace`` (and MPICOLL_TIMEOUT=``timeout`` where given): what it did."""
    from test_examples import MPIEXEC, mpiexec

    if MPIEXEC is None:
        pytest.skip("no mpiexec next to Python or on PATH")
    script = tmp_path / "traced.py"
    script.write_text("import numpy as np, mpicoll\n" + body)
    given = {"MPICOLL_TRACE": str(trace), **({"MPICOLL_TIMEOUT": str(timeout)} if timeout else {})}
    saved = {name: os.environ.get(name) for name in given}
    os.environ.update(given)
    try:
        return mpiexec(ranks, "-m", "mpi4py", str(script), timeout=120)
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


def _traced_job(tmp_path, ranks: int, body: str):
    """``_run_traced`` under MPICOLL_TRACE=tmp_path/trace.json, which it returns; the job
    must succeed."""
    path = tmp_path / "trace.json"
    done = _run_traced(tmp_path, ranks, body, path)
    assert done.returncode == 0, done.stderr
    return path


def test_a_long_jobs_trace_keeps_whole_calls_up_to_its_records_and_counts_the_rest(
        monkeypatch):
    """A rank keeps at most MAX_RECORDS records: the calls that begin past them are
    counted, not traced, and each traced call is whole (its call, every message)."""
    from mpicoll.observe import tracing as recording

    monkeypatch.setattr(recording, "MAX_RECORDS", 30)

    def body(comm):
        for _ in range(10):
            comm.all_reduce(np.ones(30), algorithm="ring")
        return comm.trace_events(), comm._tracer.untraced

    for events, untraced in run_local(3, body, trace=True):
        calls = [e["call"] for e in events if e["kind"] == "call"]
        assert calls == list(range(1, len(calls) + 1)) and untraced == 10 - len(calls) > 0
        for call in calls:  # whole: the ring's 2(p-1) sends and receives each
            assert sum(e["kind"] == "send" and e["call"] == call for e in events) == 4
            assert sum(e["kind"] == "recv" and e["call"] == call for e in events) == 4
        assert len(events) - len([e for e in events if e["call"] == calls[-1]]) < 30


def test_a_merged_trace_says_which_calls_each_rank_left_untraced(tmp_path):
    path = _traced_job(tmp_path, 2, (
        "from mpicoll.observe import tracing\n"
        "tracing.MAX_RECORDS = 20\n"
        "comm = mpicoll.Communicator()\n"
        "for _ in range(8):\n"
        "    comm.all_reduce(np.ones(8), algorithm='ring')\n"
        "comm.free()\n"))
    with open(path) as f:
        about = json.load(f)["otherData"]
    assert about["max_records"] == 20 and set(about["untraced_calls"]) == {"0", "1"}
    assert all(0 < n < 8 for n in about["untraced_calls"].values())
    done = subprocess.run([sys.executable, "-m", "mpicoll.trace", "summary", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "# not traced: the calls past each rank's first 20 " \
        "records (rank 0: " in done.stdout, done.stdout + done.stderr


def test_mpicoll_trace_variable_writes_one_file_per_communicator(tmp_path):
    from test_examples import MPIEXEC

    if MPIEXEC is None:
        pytest.skip("no mpiexec")
    path = _traced_job(tmp_path, 3, "c = mpicoll.Communicator()\n"
                       "c.all_reduce(np.ones(30), algorithm='ring')\n"
                       "mpicoll.Communicator().all_gather(np.ones(3), algorithm='ring')\n")
    first = tracefile.summarize(tracefile.load(str(path)))
    second = tracefile.summarize(tracefile.load(str(tmp_path / "trace.2.json")))
    assert [(r["collective"], r["algorithm"], r["ranks"], r["steps"]) for r in first] == \
        [("all_reduce", "ring", 3, 4)]
    assert [(r["collective"], r["steps"]) for r in second] == [("all_gather", 2)]


def test_viz_draws_node_boundaries_and_the_messages_that_cross_them(capsys, tmp_path):
    import os

    from mpicoll import viz

    before = os.environ.get("MPICOLL_RANKS_PER_NODE")
    assert viz.main(["all_reduce", "--algorithm", "hierarchical", "-n", "6",
                     "--ranks-per-node", "3", "--ascii"]) == 0
    out = capsys.readouterr().out
    assert "node 0: ranks 0-2 | node 1: ranks 3-5" in out
    crossing = [m for line in out.splitlines() if line.startswith("step")
                for m in line.split(":", 1)[1].split("  ") if "=>" in m]
    # only the leaders (ranks 0 and 3) talk across the nodes, and nothing inside a node
    # is drawn as crossing
    assert crossing and all(m.strip().split("=>")[0] in ("0", "3") for m in crossing)
    assert os.environ.get("MPICOLL_RANKS_PER_NODE") == before  # put back
    traced = viz.trace_flow("all_reduce", "ring", 4, ranks_per_node=2)
    flat, nodes = traced.steps, traced.nodes
    assert nodes == (0, 0, 1, 1)
    assert any(nodes[s] != nodes[d] for step in flat for s, d, _, _ in step)
    # the environment's MPICOLL_RANKS_PER_NODE, where --ranks-per-node is not given: the
    # traced run's nodes are what the diagram draws
    os.environ["MPICOLL_RANKS_PER_NODE"] = "2"
    try:
        assert viz.trace_flow("all_reduce", "hierarchical", 4).nodes == (0, 0, 1, 1)
        assert viz.main(["all_reduce", "--algorithm", "hierarchical", "-n", "4", "--ascii"]) == 0
    finally:
        if before is None:
            os.environ.pop("MPICOLL_RANKS_PER_NODE", None)
        else:
            os.environ["MPICOLL_RANKS_PER_NODE"] = before
    assert "nodes: node 0: ranks 0-1 | node 1: ranks 2-3" in capsys.readouterr().out
    assert viz.main(["all_reduce", "--algorithm", "ring", "-n", "4", "--ranks-per-node", "2",
                     "-o", str(tmp_path / "ring.png")]) == 0
    assert (tmp_path / "ring.png").read_bytes().startswith(b"\x89PNG")


def test_reading_a_missing_or_foreign_file_is_one_line(tmp_path, capsys):
    from mpicoll.trace import main

    foreign = tmp_path / "tuning.json"
    foreign.write_text('{"mpicoll_tuning": 1}')
    odd = []  # JSON lists of events that no trace of mpicoll's holds
    for i, text in enumerate(('[{"kind": "call"}]', '[{"call": 1, "kind": "send"}]',
                              '[{"call": 1, "kind": "call", "rank": 0, "start": null, '
                              '"end": null}]')):
        odd.append(tmp_path / f"odd{i}.json")
        odd[-1].write_text(text)
    for path in (str(tmp_path / "none.json"), str(foreign), *map(str, odd)):
        for command in (["summary", path], ["draw", path, "-o", str(tmp_path / "t.png")]):
            assert main(command) == 2
            captured = capsys.readouterr()
            assert captured.err.count("\n") == 1 and path in captured.err and not captured.out
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    (dumps / "rank-0.json").write_text("{,")
    assert main(["hang", str(dumps)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_communicators_given_trace_files_of_their_own_keep_their_names(tmp_path):
    """trace=a.json then trace=b.json in one process: a.json and b.json (the .2, .3
    numbering is for communicators traced to the same file), and a second communicator
    traced to a.json gets a.2.json."""
    from mpi4py import MPI

    paths = [tmp_path / "a.json", tmp_path / "b.json", tmp_path / "a.json"]
    for path in paths:
        comm = mpicoll.Communicator(MPI.COMM_SELF, trace=str(path))
        comm.all_reduce(np.ones(4), algorithm="ring")
        comm.free()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.2.json", "a.json", "b.json"]


def test_the_drawing_clis_refuse_an_output_they_cannot_write_clearly(tmp_path, capsys):
    """viz and trace draw, -o: an extension matplotlib writes no file of is the user's
    error naming -o (not a raw traceback, not "not a trace" of the input); a place that
    refuses the file (/proc's), the same, before anything is drawn; a name without an extension is written and
    said as savefig writes it (name.png)."""
    from mpicoll import trace as trace_cli

    base = ["all_reduce", "--algorithm", "ring", "-n", "3"]
    with pytest.raises(SystemExit) as exit_:
        viz.main([*base, "-o", str(tmp_path / "x.txt")])
    assert exit_.value.code == 2 and "matplotlib writes no .txt file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:  # (a place that refuses the file: before
        viz.main([*base, "-o", "/proc/x.png"])  # anything is drawn, as the bench's -o)
    assert exit_.value.code == 2 and "cannot write /proc/x.png" in capsys.readouterr().err
    assert viz.main([*base, "-o", str(tmp_path / "diagram")]) == 0
    assert f"wrote {tmp_path / 'diagram.png'}" in capsys.readouterr().out
    assert (tmp_path / "diagram.png").read_bytes()[:8] == PNG

    comm = mpicoll.Communicator(trace=True)
    comm.all_reduce(np.ones(8), algorithm="ring")
    path = str(tmp_path / "t.json")
    comm.write_trace(path)
    comm.free()
    assert trace_cli.main(["draw", path, "-o", str(tmp_path / "t.txt")]) == 2
    err = capsys.readouterr().err
    assert "-o" in err and "matplotlib writes no .txt file" in err and "not a trace" not in err
    assert trace_cli.main(["draw", path, "-o", str(tmp_path / "timeline")]) == 0
    assert (tmp_path / "timeline.png").read_bytes()[:8] == PNG


def test_async_calls_plan_starts_and_dups_are_traced_as_their_parent(tmp_path):
    """Under a trace file, what runs on the progress thread (async_op=True, plan starts,
    on a duplicate) and a dup() are traced too, each duplicate to the next file (they
    were on untraced duplicates: in no file)."""
    from test_examples import MPIEXEC

    if MPIEXEC is None:
        pytest.skip("no mpiexec")
    _traced_job(tmp_path, 2, "c = mpicoll.Communicator()\n"
                "x = np.arange(100.0)\n"
                "plan = c.all_reduce_init(x, algorithm='ring')\n"
                "plan.start(); plan.wait()\n"
                "c.all_gather(x, algorithm='ring', async_op=True).wait()\n"
                "c.all_reduce(x, algorithm='recursive_doubling')\n"
                "d = c.dup()\n"
                "d.broadcast(x, algorithm='binomial')\n"
                "d.free(); c.free()\n")
    rows = {name: [(r["collective"], r["algorithm"]) for r in
                   tracefile.summarize(tracefile.load(str(tmp_path / name)))]
            for name in ("trace.json", "trace.2.json", "trace.3.json")}
    assert rows["trace.json"] == [("all_reduce", "recursive_doubling")]
    assert rows["trace.2.json"] == [("all_reduce", "ring"), ("all_gather", "ring")]
    assert rows["trace.3.json"] == [("broadcast", "binomial")]


def test_a_trace_written_at_exit_waits_for_the_progress_threads_calls(tmp_path):
    """A traced communicator made after another's progress thread, exiting with async
    calls still queued: its at-exit trace merge (a collective) first lets the progress
    threads finish, instead of being refused on this rank while their thread holds the
    communicator (the file was lost, and at several ranks the job could hang)."""
    script = tmp_path / "late.py"
    script.write_text(
        "import numpy as np, mpicoll\n"
        f"a = mpicoll.Communicator(trace={str(tmp_path / 'a.json')!r})\n"
        "a.start_progress()\n"
        f"b = mpicoll.Communicator(trace={str(tmp_path / 'b.json')!r})\n"
        "x = np.ones(1 << 12)\n"
        "works = [b.all_reduce(x, async_op=True) for _ in range(300)]\n")
    done = subprocess.run([sys.executable, "-m", "mpi4py", str(script)], capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "MPICOLL_TIMEOUT": "60"})
    assert done.returncode == 0, done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr
    assert (tmp_path / "b.json").exists()


def test_traced_progress_threads_of_several_communicators_end_in_one_order_at_exit(tmp_path):
    """Traced communicators, each with a progress thread (its duplicate traced too), on
    3 ranks, and the job ends without freeing them: at exit every rank frees the
    duplicates (each a collective: its trace's merge) in their agreed exit order, not
    in the order of a set of them (which differs per rank: the merges waited for each
    other until the watchdog ended the job)."""
    done = _run_traced(
        tmp_path, 3,
        "comm = mpicoll.Communicator()\n"
        "subs = [comm, comm.dup(), comm.split(comm.rank % 2), comm.new_group([0, 2])]\n"
        "for c in subs:\n"
        "    if c is not None:\n"
        "        c.all_reduce(np.ones(4), async_op=True).wait()\n", tmp_path / "t.json", 10)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "t.json").exists()


def test_a_trace_that_cannot_be_written_at_exit_is_one_line_not_a_traceback(tmp_path):
    """Rank 0 cannot write the trace at exit (its folder went): every rank says in one
    line that the trace is lost, no 'Exception ignored in atexit' traceback."""
    folder = tmp_path / "gone"
    folder.mkdir()
    done = _run_traced(
        tmp_path, 2,
        "import shutil\n"
        "c = mpicoll.Communicator()\n"
        "c.all_reduce(np.ones(4))\n"
        "c.barrier()\n"
        f"shutil.rmtree({str(folder)!r}) if c.rank == 0 else None\n", folder / "t.json", 10)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, \
        done.stderr[-3000:]
    assert "is lost at exit" in done.stderr, done.stderr[-3000:]


def test_progress_threads_made_at_once_by_threads_end_in_one_order_at_exit(tmp_path):
    """One dup per thread, each thread's first async call making its progress thread (a
    traced duplicate) at once, in another order on each rank (a delay that differs per
    rank): at exit the duplicates are freed (each a collective: its trace's merge) in
    their agreed order, not the order each rank made them in, and the job ends."""
    done = _run_traced(
        tmp_path, 3,
        "import threading, time\n"
        "comm = mpicoll.Communicator()\n"
        "dups = [comm.dup() for _ in range(4)]\n"
        "def work(i, d):\n"
        "    time.sleep(0.2 * ((i + comm.rank) % 4))\n"
        "    d.all_reduce(np.ones(4), async_op=True).wait()\n"
        "threads = [threading.Thread(target=work, args=(i, d)) for i, d in enumerate(dups)]\n"
        "[t.start() for t in threads]\n"
        "[t.join() for t in threads]\n", tmp_path / "t.json", 10)
    assert done.returncode == 0, done.stderr[-3000:]


def test_trace_files_merge_at_exit_in_their_communicators_agreed_order(monkeypatch):
    """At exit the trace files never merged are merged in their Communicators' exit key
    order (agreed on every rank of each), not atexit's reverse order of making them."""
    merged = []

    class File:
        def __init__(self, key):
            self.key = key

        def at_exit(self):
            merged.append(self.key)

    monkeypatch.setattr(tracing, "_UNMERGED", [File((1, 7, 3)), File((0, 5, 9)),
                                                File((0, 5, 2)), File((2, 1, 0))])
    tracing.merge_at_exit()
    assert merged == [(0, 5, 2), (0, 5, 9), (1, 7, 3), (2, 1, 0)]


def test_every_communicators_exit_key_is_agreed_and_its_own():
    """A Communicator's exit key (its place in what every rank does at exit) is the same
    on every rank of it, and no two Communicators a rank holds share one, whichever
    thread-rank made them first."""
    def body(comm):
        import time

        time.sleep(0.05 * (comm.size - comm.rank))  # (the ranks make them in other orders)
        made = [comm, comm.dup(), comm.split(comm.rank % 2), comm.dup()]
        keys = [c._exit_key for c in made]
        assert len(set(keys)) == len(keys)
        return keys

    keys = run_local(3, body, timeout=20)
    assert keys[0][0] == keys[1][0] == keys[2][0] and keys[0][1] == keys[1][1] == keys[2][1]
    assert keys[0][2] == keys[2][2] != keys[1][2]  # (a split's: ranks 0 and 2 share one)


@pytest.mark.parametrize("event, said", [
    ({"ph": "X", "ts": 0, "dur": 5, "pid": 0, "tid": 0}, "an event lacks 'args'"),
    ({"ph": "X", "ts": 0, "dur": "5", "pid": 0, "tid": 0, "args": {}},
     "an event's field is not what mpicoll writes"),
    ({"ph": "X", "ts": 0, "dur": 5, "pid": 0, "tid": 0, "args": 5},
     "an event's field is not what mpicoll writes"),
])
def test_a_trace_event_missing_or_of_another_type_is_said_as_such(tmp_path, event, said):
    """A trace event that lacks a field, or has one of another type, is refused naming
    which (the second was said as 'an event lacks unsupported operand type(s)...')."""
    from mpicoll.observe import tracefile

    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [event]}))
    with pytest.raises(ValueError, match=said):
        tracefile.load(str(path))


def test_trace_hang_names_a_dump_that_is_none_and_reads_the_others(tmp_path, capsys):
    """A rank's dump that is not one (garbage, a rank killed while writing it, JSON of
    another shape) is named on its own line and left out; it ended the whole report with
    a traceback naming no file."""
    from mpicoll import trace as trace_cli

    (tmp_path / "rank-1.json").write_text("garbage")
    (tmp_path / "rank-2.json").write_text("[]")
    (tmp_path / "rank-3.json").write_text("{}")
    assert trace_cli.main(["hang", str(tmp_path)]) == 2  # (no dump left to read)
    err = capsys.readouterr().err
    for rank in (1, 2, 3):
        assert f"rank-{rank}.json: not a dump mpicoll wrote" in err, err
    assert "Traceback" not in err


def test_a_traced_communicator_keeps_few_timed_ops_of_ops_made_per_call():
    """Traced, every op's applications are timed through a timed copy of it: a user's Op
    made per call (the README says that is fine) no longer keeps every one alive with
    the tracer (the copies grew by one a call), only the most recent few."""
    def add(a, b, out):
        np.add(a, b, out=out)

    def body(comm):
        for _ in range(200):
            comm.all_reduce(np.ones(4), mpicoll.Op(add), algorithm="ring")
        return len(comm._tracer._timed_ops)

    kept = run_local(2, body, trace=True)
    assert all(k < 200 for k in kept), kept  # (one a call: 200)
    from mpicoll.observe.tracing import TIMED_OPS

    assert kept == [TIMED_OPS] * 2
