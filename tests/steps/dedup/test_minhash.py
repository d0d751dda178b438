"""MinHash: vectorized shingles equal the reference, estimates track true Jaccard, band keys."""

import random

import numpy as np
import pytest

from steps.dedup.minhash import MinHasher, band_keys, candidate_probability, estimated_jaccard, shingle_hashes, \
    shingles_of

TEXTS = ["In the beginning God created the heaven and the earth.",
         "Hello, World! hello world -- HELLO? naïve café 東京 x1 y2",
         "one two three",  # fewer words than the n-gram: one shingle
         "",
         "   ...   ",
         "a b c d e f g h i j k l m n o p"]


def test_shingle_hashes_count_the_distinct_reference_shingles():
    x, offsets = shingle_hashes(TEXTS, ngram=5)
    assert offsets.tolist()[0] == 0 and len(offsets) == len(TEXTS) + 1
    for i, text in enumerate(TEXTS):
        ref = shingles_of(text, 5)
        got = x[offsets[i]:offsets[i + 1]]
        assert len(set(got.tolist())) == len(ref), text
        assert got.max(initial=0) < 2**32


def test_shingles_ignore_case_and_punctuation_and_batching():
    a = MinHasher().signatures(["Hello, World! this is a test of it"])[0]
    b = MinHasher().signatures(["hello world this is A TEST of it.", "unrelated words go here now ok"])[0][:1]
    assert np.array_equal(a, b)


def test_documents_without_words_have_no_shingles():
    sig, has = MinHasher(num_perm=16).signatures(TEXTS)
    assert has.tolist() == [True, True, True, False, False, True]
    assert (sig[3] == 2**32 - 1).all()


def test_long_documents_fold_in_chunks():
    rng = random.Random(0)
    long = " ".join(f"w{rng.randrange(10**6)}" for _ in range(9000))  # > CHUNK shingles
    hasher = MinHasher(num_perm=32)
    sig_batch = hasher.signatures(["short text here", long, "another short one"])[0]
    x, offsets = shingle_hashes([long])
    direct = ((np.multiply.outer(x, hasher.a) + hasher.b).min(axis=0) >> np.uint64(32)).astype(np.uint32)
    assert np.array_equal(sig_batch[1], direct)


@pytest.mark.parametrize("target", [0.3, 0.6, 0.9])
def test_estimate_tracks_true_jaccard(target):
    rng = random.Random(1)
    words = [f"w{rng.randrange(10**6)}" for _ in range(3000)]
    # replace a share of words: each replaced word breaks the 5 shingles around it
    keep = target ** 0.25
    other = [w if rng.random() < keep else f"x{rng.randrange(10**6)}" for w in words]
    a, b = " ".join(words), " ".join(other)
    sa, sb = shingles_of(a), shingles_of(b)
    true = len(sa & sb) / len(sa | sb)
    sig, _ = MinHasher(num_perm=512, seed=7).signatures([a, b])
    assert abs(estimated_jaccard(sig[0], sig[1]) - true) < 0.06


def test_band_keys_equal_exactly_when_bands_agree():
    sig = np.array([[1, 2, 3, 4], [1, 2, 9, 4], [1, 2, 3, 4]], dtype=np.uint32)
    keys = band_keys(sig, bands=2, rows=2)
    assert keys.shape == (3, 2)
    assert keys[0, 0] == keys[1, 0] and keys[0, 1] != keys[1, 1] and (keys[0] == keys[2]).all()
    assert keys[0, 0] != keys[0, 1]  # same values in different bands never collide by construction
    with pytest.raises(ValueError):
        band_keys(sig, bands=3, rows=2)


def test_candidate_probability_s_curve():
    assert candidate_probability(0.8, 14, 8) == pytest.approx(0.9236, abs=1e-3)
    assert candidate_probability(0.5, 14, 8) < 0.06
