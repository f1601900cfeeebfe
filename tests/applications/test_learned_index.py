"""The flow-based learned index: exact lookups (duplicates, absent keys), bounded windows, conflicts drop."""

import numpy as np
import pytest
import torch

from flowkit.applications.learned_index import (
    KeyFlow,
    LearnedIndex,
    check_keys,
    clustered_keys,
    conflicts,
    lognormal_keys,
    zipf_keys,
)


def _queries(keys, n, seed=0):
    rng = np.random.default_rng(seed)
    present = keys[rng.integers(0, keys.size, n)]
    between = rng.uniform(keys[0] - 1.0, keys[-1] + 1.0, n)
    return np.concatenate([present, between, keys[:3], keys[-3:], [keys[0] - 5.0, keys[-1] + 5.0]])


@pytest.mark.parametrize("generator", [lognormal_keys, zipf_keys, clustered_keys])
def test_raw_index_lookups_are_exact_and_present_keys_need_no_fallback(generator):
    keys = generator(20_000, seed=3)
    index = LearnedIndex(keys, slices=50)
    present = keys[np.random.default_rng(1).integers(0, keys.size, 5000)]
    np.testing.assert_array_equal(index.lookup(present), np.searchsorted(keys, present, side="left"))
    assert index.fallbacks == 0  # every present key lies in its window
    q = _queries(keys, 5000)
    np.testing.assert_array_equal(index.lookup(q), np.searchsorted(keys, q, side="left"))


def test_duplicates_return_the_first_occurrence_and_windows_hold_every_key():
    keys = np.repeat(np.array([1.0, 3.0, 3.5, 10.0, 11.0]), [3, 1, 4, 2, 5])
    index = LearnedIndex(keys, slices=3)
    np.testing.assert_array_equal(index.lookup(np.array([1.0, 3.5, 11.0, 3.2, 12.0])), [0, 4, 10, 4, 15])
    distinct, first = np.unique(keys, return_index=True)
    u = index.transform(distinct)
    leaf = index._leaf(u)
    guess = index._predict(u, leaf)
    assert ((guess - index.below[leaf] <= first) & (first <= guess + index.above[leaf])).all()


def test_unsorted_and_bad_keys_raise_or_sort():
    with pytest.raises(ValueError, match=r"sorted \(keys\[2\] < keys\[1\]\)"):
        LearnedIndex(np.array([1.0, 5.0, 2.0]))
    index = LearnedIndex(np.array([1.0, 5.0, 2.0]), sort=True)
    np.testing.assert_array_equal(index.keys, [1.0, 2.0, 5.0])
    with pytest.raises(ValueError, match="non-finite"):
        check_keys(np.array([1.0, np.nan]), "x")
    with pytest.raises(ValueError, match="1-D"):
        check_keys(np.zeros((2, 2)), "x")
    with pytest.raises(ValueError, match="non-finite"):
        index.lookup(np.array([np.inf]))
    with pytest.raises(ValueError, match="KeyFlow"):
        LearnedIndex(np.arange(5.0), flow=object())
    single = LearnedIndex(np.array([4.0, 4.0]))
    np.testing.assert_array_equal(single.lookup(np.array([3.0, 4.0, 5.0])), [0, 0, 2])


def test_conflicts_statistics():
    assert conflicts(np.array([0.0, 2.0, 5.0]), np.array([0, 1, 1])) == {
        "max": 4.0,
        "p99": pytest.approx(3.94),
        "mean": 5 / 3,
    }


def test_key_flow_is_monotone_and_saves(tmp_path):
    import flowkit

    torch.manual_seed(0)
    keys = lognormal_keys(5000)
    flow = KeyFlow(components=4, layers=1).fit_keys(keys, steps=30)
    u = flow.transform(np.linspace(keys[0], keys[-1], 2000))
    assert (np.diff(u) >= 0).all() and u.min() >= 0 and u.max() <= 1
    flowkit.io.save(flow, tmp_path / "flow")
    again = flowkit.io.load(tmp_path / "flow")
    np.testing.assert_array_equal(again.transform(keys[:100]), flow.transform(keys[:100]))


@pytest.mark.slow
@pytest.mark.parametrize("generator", [lognormal_keys, zipf_keys, clustered_keys])
def test_the_flow_lowers_the_conflicts_of_the_same_index(generator):
    keys = generator(200_000)
    torch.manual_seed(0)
    flow = KeyFlow().fit_keys(keys, steps=300)
    raw, learned = LearnedIndex(keys).conflicts(), LearnedIndex(keys, flow=flow).conflicts()
    assert learned["mean"] < 0.7 * raw["mean"]
    if generator is not clustered_keys:  # clustered keys: the narrowest cluster keeps the maximum (see the docs)
        assert learned["max"] < 0.5 * raw["max"]


@pytest.mark.slow
def test_with_more_components_than_clusters_the_maximum_conflict_drops_too():
    keys = clustered_keys(200_000)  # 20 clusters: 16 components per layer cannot resolve them all
    torch.manual_seed(0)
    flow = KeyFlow(components=128).fit_keys(keys, steps=600)
    raw, learned = LearnedIndex(keys).conflicts(), LearnedIndex(keys, flow=flow).conflicts()
    assert learned["max"] < raw["max"] and learned["mean"] < 0.5 * raw["mean"]


@pytest.mark.slow
def test_every_lookup_of_a_million_keys_is_exact():
    keys = zipf_keys(1_000_000, seed=5)  # duplicates included
    torch.manual_seed(0)
    index = LearnedIndex(keys, flow=KeyFlow().fit_keys(keys, steps=100))
    distinct, first = np.unique(keys, return_index=True)
    np.testing.assert_array_equal(index.lookup(distinct), first)
    every = index.lookup(keys)  # all 10^6 keys, each to its first occurrence
    np.testing.assert_array_equal(every, np.searchsorted(keys, keys, side="left"))
    assert index.fallbacks == 0
