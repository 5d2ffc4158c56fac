"""``python -m mpicoll.model fit``'s parts: the rings it times inside nodes and between
them, and a fit under mpiexec (with ``MPICOLL_RANKS_PER_NODE`` the test command's runs
simulate several nodes: then the intra-node parameters are measured too)."""

from __future__ import annotations

import pytest

from mpicoll.model import predict
from mpicoll.model.fit import _pairs, fit


def test_pairs_inside_nodes_and_between_them():
    nodes = ((0, 1, 2), (3, 4, 5))
    assert _pairs(nodes, 0) == ((1, 2), (3, 3))
    assert _pairs(nodes, 4) == ((5, 3), (1, 1))
    uneven = ((0, 1, 2), (3,), (4, 5))  # only the first place of each node pairs across
    assert _pairs(uneven, 0) == ((1, 2), (3, 4))
    assert _pairs(uneven, 3) == (None, (4, 0))
    assert _pairs(uneven, 2) == ((0, 1), None)
    assert _pairs(((0, 1, 2, 3),), 1) == ((2, 0), None)  # one node: no ring between nodes
    assert _pairs(((0,), (1,)), 1) == (None, (0, 0))


def test_every_rank_pairs_with_a_rank_that_pairs_back():
    for nodes in (((0, 1), (2, 3), (4, 5)), ((0, 1, 2), (3,), (4, 5)), ((0,), (1, 2, 3))):
        ranks = [r for n in nodes for r in n]
        for which in (0, 1):
            for r in ranks:
                pair = _pairs(nodes, r)[which]
                if pair is not None:
                    assert _pairs(nodes, pair[0])[which][1] == r  # my right's left is me


@pytest.mark.mpi
def test_fit_measures_the_links_inside_and_between_nodes(world):
    params = fit(world, sizes=(1, 256, 1 << 16, 1 << 18), iters=2)
    assert params.alpha > 0 and params.beta > 0 and params.gamma > 0
    several = len(world.nodes) > 1 and any(len(n) > 1 for n in world.nodes)
    assert (params.alpha_intra is not None) == several
    assert (params.beta_intra is not None) == several


@pytest.mark.mpi
def test_the_fits_table_is_for_the_nodes_it_measured(world, tmp_path, capsys, monkeypatch):
    """``model fit`` prints its predictions for the layout it measured: with several
    nodes, both links (it printed one node's table, the link between nodes nowhere).
    A corrupt model file where auto reads it is what a fit replaces: it runs past it
    (its Communicator raised the file's ConfigError, as a traceback)."""
    from mpi4py import MPI

    from mpicoll.model.__main__ import main

    if world.size < 2:
        pytest.skip("fit runs at 2 ranks or more")
    corrupt = tmp_path / "corrupt-model.json"
    corrupt.write_text("{ not json")
    monkeypatch.setenv("MPICOLL_MODEL", str(corrupt))
    path = MPI.COMM_WORLD.bcast(str(tmp_path / "model.json"), root=0)
    assert main(["fit", "-o", path, "-n", "1"]) == 0
    if world.rank == 0:
        sizes = [len(ranks) for ranks in world.nodes]
        header = next(line for line in capsys.readouterr().out.splitlines()
                      if line.startswith("# predicted"))
        assert f"on {len(sizes)} node(s)" in header
        assert ("between nodes" in header) == (len(sizes) > 1)
        if len(set(sizes)) > 1:
            assert f"of {'+'.join(map(str, sizes))} ranks" in header


def test_the_model_file_auto_reads_keeps_the_intra_node_link():
    """auto reads the model through selection.parse_params: the inside-node alpha and
    beta (which make hierarchical worth it) reach it, and bad ones are refused."""
    import json

    import mpicoll
    import mpicoll.selection as selection

    text = json.dumps({"alpha": 2e-5, "beta": 1e-9, "gamma": 1e-10, "ranks": 4,
                       "alpha_intra": 5e-7, "beta_intra": 5e-11})
    params = selection.parse_params(text, "m.json")
    assert (params.alpha_intra, params.beta_intra) == (5e-7, 5e-11)
    assert selection.parse_params(text.replace("5e-07", "null"), "m.json").alpha_intra is None
    with pytest.raises(mpicoll.ConfigError, match="alpha_intra"):
        selection.parse_params(text.replace("5e-07", "-1"), "m.json")


def test_the_table_names_the_links_it_uses_and_spreads_ranks_over_nodes(capsys):
    from mpicoll.model import Params, table

    params = Params(alpha=2e-5, beta=1e-9, alpha_intra=5e-7, beta_intra=5e-11)
    one = table(params, 16, sizes=(8,), collectives=("barrier",))
    assert "on 1 node(s): inside a node alpha 0.50 us" in one and "between" not in one
    four = table(params, 16, sizes=(8,), collectives=("barrier",), nodes=4)
    assert "between nodes alpha 20.00 us" in four
    flat = lambda text, name: float(next(line.split()[-1] for line in text.splitlines()  # noqa: E731
                                         if line.split()[1:2] == [name]))
    assert flat(four, "dissemination") > flat(one, "dissemination")  # the slower link
    assert flat(four, "hierarchical") < flat(four, "dissemination")
    uneven = table(params, 3, sizes=(8,), collectives=("barrier",), nodes=[2, 1])
    assert "at 3 ranks on 2 node(s) of 2+1 ranks: between nodes" in uneven


def test_the_table_reads_model_files_as_auto_does(tmp_path, capsys):
    """``model table --params``: a beta or gamma of 0 (no limit) prints as such, never a
    ZeroDivisionError; a file auto's reader refuses (a negative alpha, a string) is a
    one-line error, never a table of negative times or a raw TypeError."""
    import json

    from mpicoll.model.__main__ import main

    free = tmp_path / "free.json"
    free.write_text(json.dumps({"alpha": 1e-6, "beta": 0, "gamma": 0}))
    assert main(["table", "--params", str(free), "-p", "4"]) == 0
    out = capsys.readouterr().out
    assert "beta unlimited" in out and "gamma unlimited" in out
    for alpha in (-1e-6, "x"):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({"alpha": alpha, "beta": 1e-10, "gamma": 1e-10}))
        with pytest.raises(SystemExit) as stop:
            main(["table", "--params", str(bad)])
        assert stop.value.code == 2
        assert "'alpha' must be a non-negative number" in capsys.readouterr().err


def test_fit_at_one_rank_is_refused_not_written(tmp_path, capsys):
    """At one rank every message goes to itself: the parameters would be a memory
    copy's, which auto would read at any rank count. Refused, nothing written."""
    from mpi4py import MPI

    from mpicoll.model.__main__ import main

    if MPI.COMM_WORLD.Get_size() != 1:
        pytest.skip("one rank")
    out = tmp_path / "model.json"
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "-o", str(out), "-n", "1"])
    assert exit_.value.code == 2 and "fit under mpiexec -n 2" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("nodes", [[3, 2], [5, -1], [2.5, 1.5], "22", [True, True, 1, 1], 5.0,
                                   [None, 4]])
def test_node_sizes_that_are_not_the_ranks_are_refused(nodes):
    # (before, [3, 2] for 4 ranks was priced as nodes of 3 and 2, and "22" as two of 2)
    with pytest.raises(ValueError, match="nodes: expected"):
        predict("all_reduce", "hierarchical", 1 << 20, 4, nodes=nodes)
    assert predict("all_reduce", "hierarchical", 1 << 20, 4, nodes=[3, 0, 1]) == \
        predict("all_reduce", "hierarchical", 1 << 20, 4, nodes=(1, 3))
