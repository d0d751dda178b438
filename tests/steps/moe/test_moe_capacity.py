"""The rank capacity of the expert-parallel dispatch (issue 22 item 2), on 2 gloo processes:
every token routed to one rank's experts. Unbounded, that rank takes 2N rows (one rank can take
P*N); bounded at 1.25x the mean, it takes at most ceil(1.25 N), the rest is dropped and counted,
tokens whose slots were all kept come out as they would dropless, and a bound the routing does
not reach changes no bit."""

import math
import os
import sys

import torch

from kits.capkit import skewed_moe  # noqa: E402

from steps.moe.config import PRESETS  # noqa: E402
from steps.train.launch import spawn  # noqa: E402


def test_all_tokens_to_one_expert_group_stay_within_the_bound_and_drops_are_counted(tmp_path):
    spawn(skewed_moe, (str(tmp_path), (0.0, 1.25, 10.0)), 2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    N = 2 * 24 * PRESETS["tiny"].top_k  # slots a rank sends
    free, bound, loose = (0.0, 1.25, 10.0)
    # dropless: rank 0 takes every slot of both ranks, rank 1 none
    assert [r[free]["received"] for r in ranks] == [2 * N, 0]
    assert all(r[free]["dropped"] == 0 and r[free]["routed"] == 0 for r in ranks)  # counted only when bounded
    # bounded: within ceil(1.25 N) rows, the rest dropped, counted by the senders
    cap = math.ceil(1.25 * N)
    assert N < ranks[0][bound]["received"] <= cap and ranks[1][bound]["received"] == 0
    assert [r[bound]["routed"] for r in ranks] == [N, N]
    dropped = sum(r[bound]["dropped"] for r in ranks)
    assert dropped == 2 * N - ranks[0][bound]["received"] and dropped >= 2 * N - cap
    for r in ranks:
        y, ref = r[bound]["y"].flatten(0, 1), r[free]["y"].flatten(0, 1)
        same = (y == ref).all(-1)
        assert 0 < same.sum() < len(same)  # the first tokens keep their experts, the last lose some
        # the drops are the last tokens of each expert's group: a token that lost one comes after
        # every token that lost none
        assert not same[int(torch.nonzero(~same)[0]):].all()
        assert torch.isfinite(r[bound]["dx"]).all()
    # a bound the routing never reaches: bitwise the dropless result, gradients included
    for r in ranks:
        assert r[loose]["received"] == r[free]["received"] and r[loose]["dropped"] == 0
        assert torch.equal(r[loose]["y"], r[free]["y"]) and torch.equal(r[loose]["dx"], r[free]["dx"])
