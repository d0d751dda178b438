"""The mixture's sampler run backwards: from a token span of one dataset to the global sequences
that read it, in closed form.

`MixtureSampler.locate(i)` maps global sequence i -> (stage k, block j, slot) -> the dataset's
n-th draw -> window `feistel(n mod N)` of epoch `n // N`. Every arrow has an inverse that costs
at most one block: a window w is drawn as draw `e*N + feistel^-1(w)` in epoch e (if the
mixture draws that many); draw n lies in the stage whose draws-before bracket it, and in the
block whose cumulative quota brackets it (the quotas are floors of m x weight at block
boundaries, non-decreasing in m and within a few blocks of r / (block x weight): a binary search
near there); inside the block it is the r-th slot labelled with the dataset. So a document costs
O(windows x epochs x block_size), never a scan of the batches: at the 535B budget (4.6e9
sequences in 2.2M blocks) that is a handful of quota evaluations and one shuffled block per window
and epoch.

The forward arithmetic is the sampler's own (its quota, block and stage functions are called,
not copied), and every index found is checked with `locate` before it is returned.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from steps.data.mixture import MixtureSampler, feistel_inverse  # noqa: F401  (feistel_inverse: re-exported)


@dataclass(frozen=True)
class Read:
    """One global sequence that reads a window of a dataset."""

    index: int  # global sequence index in the mixture
    window: int  # the dataset's seq_len window it reads
    epoch: int
    draw: int  # the dataset's n-th draw, across stages


class MixtureInverse:
    """Global sequences that read a dataset's tokens, by the sampler's arithmetic backwards."""

    def __init__(self, sampler: MixtureSampler) -> None:
        self.sampler = sampler
        s = sampler
        self.draws = np.array([int(s.manifest["draws"][n]) if "draws" in s.manifest else -1 for n in s.names],
                              dtype=np.int64)
        stages = len(s.stages)
        # draws of each dataset before each stage, and in all: stage k holds draws [base[k], base[k+1])
        base = [s._stage_base(k) for k in range(stages)] + [s.draws_before(stages, 0)]
        self.base = np.stack(base)
        if (self.draws < 0).any():
            self.draws = self.base[-1].copy()

    def windows(self, name: str, start: int, end: int) -> range:
        """The windows of dataset `name` that hold any of its tokens [start, end) (windows past the
        dataset's last whole window are never drawn)."""
        d = self._index(name)
        L, N = self.sampler.seq_len, int(self.sampler.windows[d])
        if end <= start:
            return range(0)
        return range(start // L, min((end - 1) // L + 1, N))

    def reads(self, name: str, start: int, end: int) -> list[Read]:
        """Every global sequence that reads any of dataset `name`'s tokens [start, end), in order."""
        d = self._index(name)
        N = int(self.sampler.windows[d])
        out = []
        for w in self.windows(name, start, end):
            for epoch in range(-(-int(self.draws[d]) // N) if N else 0):
                draw = epoch * N + feistel_inverse(w, N, (self.sampler.seed, d, epoch))
                if draw < self.draws[d]:
                    out.append(Read(self.index_of(d, draw), w, epoch, draw))
        return sorted(out, key=lambda r: r.index)

    def index_of(self, d: int, draw: int) -> int:
        """The global sequence of dataset d's `draw`-th draw, checked against the sampler's
        `locate`."""
        s = self.sampler
        k = int(np.searchsorted(self.base[1:, d], draw, side="right"))
        if k >= len(s.stages):
            raise IndexError(f"draw {draw} of dataset {s.names[d]!r}: the mixture draws only {int(self.base[-1, d])}")
        r = draw - int(self.base[k, d])
        j = self._block_of(k, d, r)
        labels, _ranks, _ = s._block(k, j)
        slots = np.flatnonzero(labels == d)
        slot = int(slots[r - int(s._cumulative_at_block(k, j)[d])])
        index = int(s.stages[k]["start"]) + j * s.block + slot
        loc = s.locate(index)
        if loc.dataset != s.names[d] or loc.draw != draw:  # the forward arithmetic disagrees: never guess
            raise AssertionError(f"inverse of draw {draw} of {s.names[d]!r} gave sequence {index}, which reads "
                                 f"draw {loc.draw} of {loc.dataset!r}")
        return index

    def _block_of(self, k: int, d: int, r: int) -> int:
        """The block of stage k that holds dataset d's r-th draw of the stage: the last block whose
        cumulative quota of d is <= r. The quotas are floors of m x w (the absorber's within the
        number of datasets of it), so r / (block x w) is within a few blocks of the answer: a
        binary search there, checked, and over the whole stage only if the check fails."""
        s = self.sampler
        last = s._blocks(k) - 1

        def cum(j: int) -> int:
            return int(s._cumulative_at_block(k, j)[d])

        w = float(s._w[k][d]) * s.block
        if last and w > 0:
            guess, slack = int(r / w), int(len(s.names) / w) + 2
            lo, hi = max(0, guess - slack), min(last, guess + slack)
            j = self._search(cum, r, lo, hi)
            if cum(j) <= r and (j == last or cum(j + 1) > r):
                return j
        return self._search(cum, r, 0, last)

    @staticmethod
    def _search(cum, r: int, lo: int, hi: int) -> int:
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if cum(mid) <= r:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _index(self, name: str) -> int:
        try:
            return self.sampler.names.index(name)
        except ValueError:
            raise KeyError(f"the mixture has no dataset {name!r} (it has {', '.join(self.sampler.names)})") from None
