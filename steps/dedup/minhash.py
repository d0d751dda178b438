"""MinHash signatures and LSH band keys, vectorized with numpy over whole batches of documents.

Shingles are word n-grams (default 5) of the normalized text: lower-cased, words are maximal
runs of ASCII letters and digits or of non-ASCII bytes (UTF-8), everything else separates. A
document with fewer than n words has one shingle, all its words; one with no words has none.

Hashing, all in uint64 arithmetic that wraps mod 2^64 on purpose:
- each word: a polynomial over its bytes, then the splitmix64 finalizer (`_mix`);
- each shingle: a polynomial over its n word hashes, finalized, keeping the top 32 bits (`x`);
- permutation p: h_p(x) = ((a_p * x + b_p) mod 2^64) >> 32 with random 64-bit a_p, b_p: the
  multiply-add-shift family, strongly universal for 32-bit keys (Dietzfelbinger 1996), so no
  128-bit product and no modulo are needed. The shift is monotone, so the minimum is taken
  before shifting.
A signature is the per-permutation minimum over a document's shingles (uint32). Documents
without shingles get all-ones signatures and `has_shingles` False; they take no part in LSH.

Band keys: each band of `rows` signature values is folded into one 64-bit key by chained
finalizer rounds (collisions between different bands ~2^-64 per pair).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

U64 = np.uint64
_M1, _M2 = U64(0xBF58476D1CE4E5B9), U64(0x94D049BB133111EB)
_BYTE_P = U64(0x100000001B3)  # FNV prime as the byte polynomial's base
_WORD_Q = U64(0x9E3779B97F4A7C15)  # golden-ratio constant as the shingle polynomial's base
_MAX_WORD = 256  # bytes of a word that count (longer words are cut)
CHUNK = 2048  # shingles per vectorized block: about CHUNK * num_perm * 8 bytes of scratch

# Word characters: ASCII letters/digits after lower-casing, and every byte of a multi-byte UTF-8 char.
_IS_WORD = np.zeros(256, dtype=bool)
_IS_WORD[[*range(ord("a"), ord("z") + 1), *range(ord("0"), ord("9") + 1), *range(128, 256)]] = True
_WORD_RE = re.compile(rb"[a-z0-9\x80-\xff]+")


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, elementwise (a bijection of uint64 that mixes all bits)."""
    x = x ^ (x >> U64(30))
    x = x * _M1
    x = x ^ (x >> U64(27))
    x = x * _M2
    return x ^ (x >> U64(31))


# P^0 .. P^(MAX-1), wrapping mod 2^64
_POW_P = np.concatenate([[U64(1)], np.cumprod(np.full(_MAX_WORD - 1, _BYTE_P, dtype=U64))]).astype(U64)


def words_of(text: str) -> list[bytes]:
    """The normalized words of a text (the pure-Python reference of the vectorized code)."""
    return _WORD_RE.findall(text.lower().encode("utf-8", "replace"))


def shingles_of(text: str, ngram: int = 5) -> set[bytes]:
    """A document's shingles as byte strings, for tests and for the datasketch comparison."""
    words = words_of(text)
    if not words:
        return set()
    if len(words) < ngram:
        return {b" ".join(words)}
    return {b" ".join(words[i:i + ngram]) for i in range(len(words) - ngram + 1)}


def shingle_hashes(texts: list[str], ngram: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """32-bit shingle hashes (as uint64) of a batch, and `offsets` (len(texts)+1) delimiting each
    document's shingles. Duplicated shingles are kept: the minimum does not care."""
    encoded = [t.lower().encode("utf-8", "replace") for t in texts]
    byte_arr = np.frombuffer(b"\n".join(encoded), dtype=np.uint8)
    # document of every byte: the separators "\n" between texts are non-word bytes
    doc_lens = np.fromiter(map(len, encoded), dtype=np.int64, count=len(texts))
    doc_starts = np.concatenate([[0], np.cumsum(doc_lens + 1)[:-1]])
    is_word = _IS_WORD[byte_arr]
    edges = np.diff(is_word.astype(np.int8), prepend=np.int8(0), append=np.int8(0))
    w_start = np.flatnonzero(edges == 1)
    w_end = np.flatnonzero(edges == -1)
    n_words = w_start.size
    if n_words == 0:
        return np.zeros(0, dtype=U64), np.zeros(len(texts) + 1, dtype=np.int64)
    # word hashes: polynomial over the bytes of each word, positions counted from the word start
    pos = np.arange(byte_arr.size, dtype=np.int64)
    word_bytes = np.flatnonzero(is_word)
    word_of_byte = np.cumsum(edges[:-1] == 1)[word_bytes] - 1
    offset_in_word = np.minimum(pos[word_bytes] - w_start[word_of_byte], _MAX_WORD - 1)
    terms = byte_arr[word_bytes].astype(U64) * _POW_P[offset_in_word]
    w_len = w_end - w_start
    first_byte = np.concatenate([[0], np.cumsum(w_len)[:-1]])
    w_hash = _mix(np.add.reduceat(terms, first_byte) + w_len.astype(U64))
    # which document each word belongs to, and each document's first word
    w_doc = np.searchsorted(doc_starts, w_start, side="right") - 1
    doc_first = np.searchsorted(w_doc, np.arange(len(texts)), side="left")
    doc_nwords = np.bincount(w_doc, minlength=len(texts))
    # shingle i starts at word i; its window is cut at the document's last word
    last_word = (doc_first + doc_nwords - 1)[w_doc]
    acc = np.zeros(n_words, dtype=U64)
    q = 1
    for k in range(ngram):
        idx = np.arange(k, n_words + k)
        ok = idx <= last_word
        acc += np.where(ok, w_hash[np.minimum(idx, n_words - 1)], U64(0)) * U64(q)
        q = q * int(_WORD_Q) % 2**64
    full = np.arange(n_words) + ngram - 1 <= last_word
    short_doc = doc_nwords[w_doc] < ngram
    keep = full | (short_doc & (np.arange(n_words) == doc_first[w_doc]))
    x = _mix(acc[keep]) >> U64(32)
    counts = np.bincount(w_doc[keep], minlength=len(texts))
    return x, np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


@dataclass(frozen=True)
class MinHasher:
    """Signatures of `num_perm` permutations over word `ngram` shingles, seeded."""

    num_perm: int = 112
    ngram: int = 5
    seed: int = 0

    def __post_init__(self) -> None:
        rng = np.random.Generator(np.random.PCG64(self.seed))
        object.__setattr__(self, "a", rng.integers(0, 2**64, self.num_perm, dtype=U64, endpoint=False) | U64(1))
        object.__setattr__(self, "b", rng.integers(0, 2**64, self.num_perm, dtype=U64, endpoint=False))

    def signatures(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(signatures uint32 [n, num_perm], has_shingles bool [n])."""
        x, offsets = shingle_hashes(texts, self.ngram)
        return self.signatures_from_hashes(x, offsets)

    def signatures_from_hashes(self, x: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = offsets.size - 1
        counts = np.diff(offsets)
        sig = np.full((n, self.num_perm), np.uint64(2**64 - 1), dtype=U64)
        docs = np.flatnonzero(counts)
        # Blocks of whole documents up to CHUNK shingles; a longer document is a block of its own,
        # folded in CHUNK-sized pieces.
        i = 0
        while i < docs.size:
            d0 = docs[i]
            j = i + 1
            while j < docs.size and offsets[docs[j] + 1] - offsets[d0] <= CHUNK:
                j += 1
            lo, hi = offsets[d0], offsets[docs[j - 1] + 1]
            if j - i == 1 and hi - lo > CHUNK:
                acc = sig[d0]
                for s in range(lo, hi, CHUNK):
                    np.minimum(acc, self._perm(x[s:min(s + CHUNK, hi)]).min(axis=0), out=acc)
            else:
                block = docs[i:j]
                sig[block] = np.minimum.reduceat(self._perm(x[lo:hi]), offsets[block] - lo, axis=0)
            i = j
        return (sig >> U64(32)).astype(np.uint32), counts > 0

    def _perm(self, x: np.ndarray) -> np.ndarray:
        out = np.multiply.outer(x, self.a)
        out += self.b
        return out


def band_keys(sig: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """uint64 [n, bands]: one key per band of `rows` consecutive signature values."""
    if bands * rows > sig.shape[1]:
        raise ValueError(f"{bands} bands x {rows} rows need {bands * rows} permutations, have {sig.shape[1]}")
    s = sig[:, :bands * rows].astype(U64).reshape(sig.shape[0], bands, rows)
    key = np.broadcast_to(_mix(np.arange(1, bands + 1, dtype=U64)), (sig.shape[0], bands)).copy()
    for r in range(rows):
        key = _mix(key ^ s[:, :, r])
    return key


def estimated_jaccard(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The fraction of equal signature values (rows of a and b)."""
    return (np.asarray(a) == np.asarray(b)).mean(axis=-1)


def candidate_probability(j: float, bands: int, rows: int) -> float:
    """The chance that a pair of Jaccard j shares at least one band: 1 - (1 - j^r)^b."""
    return 1.0 - (1.0 - j ** rows) ** bands
