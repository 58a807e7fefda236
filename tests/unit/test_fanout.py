"""Weight fan-out through a relay chain/tree over real gRPC servers on 127.0.0.1, each receiver in its own
thread with its own event loop: identical hash-verified state dicts everywhere, bf16 and adapter-only
bundles, a chunk corrupted at a relay rejected by its child, a dead child skipped (its children still
served) and caught up later by Fetch, and the benchmark's smoke mode.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import pytest
import torch

from decentralized_verl.errors import WireError
from decentralized_verl.transport.weights.route import (
    CHAIN_MAX_RECEIVERS,
    Hop,
    plan_chain,
    plan_route,
    plan_tree,
    route_from_json,
    route_to_json,
)

torch.set_num_threads(1)


# ------------------------------------------------------------------------------------------ pure


def test_plans_are_the_expected_shapes():
    assert plan_chain([]) == ()
    assert plan_chain(["a", "b", "c"]) == (Hop("a", (Hop("b", (Hop("c"),)),)),)
    tree = plan_tree(["a", "b", "c", "d", "e"], 2)
    # root -> a, b ; a -> c, d ; b -> e
    assert tree == (Hop("a", (Hop("c"), Hop("d"))), Hop("b", (Hop("e"),)))
    assert plan_tree(["a", "b", "c"], 1) == plan_chain(["a", "b", "c"])
    assert sorted(a for h in tree for a in h.addresses()) == ["a", "b", "c", "d", "e"]
    with pytest.raises(ValueError, match="fanout"):
        plan_tree(["a"], 0)


def test_runtime_route_is_a_chain_for_a_few_workers_and_a_binary_tree_for_many():
    few = [f"w{i}" for i in range(CHAIN_MAX_RECEIVERS)]
    assert plan_route(few) == plan_chain(few)
    many = [f"w{i}" for i in range(CHAIN_MAX_RECEIVERS + 1)]
    assert plan_route(many) == plan_tree(many, 2)
    assert plan_route([]) == ()


def test_route_json_round_trip_and_bad_routes():
    tree = plan_tree([f"127.0.0.1:{p}" for p in range(7)], 3)
    assert route_from_json(route_to_json(tree)) == tree
    for bad, where in [
        ("not json", "not valid JSON"),
        ('{"a": 1}', "list of hops"),
        ('[["", []]]', "non-empty address"),
        ('[["a", "b"]]', "children"),
        ('[["a", [["b"]]]]', "[0].children[0]"),
    ]:
        with pytest.raises(WireError, match=where.replace("[", r"\[").replace("]", r"\]")):
            route_from_json(bad)
