"""WaitingOrder, the sorted waiting queue the preemptive policies keep across calls: after any
sequence of engine-like changes (admissions from anywhere, evictions to the front, arrivals at the
end, keys changed by rekey) its lists equal the queue sorted from scratch, and the on_change tally
matches the queue; the index of eviction keys finds the last request that may evict."""

import numpy as np
import pytest

from portbench.policies.vllm_priority import WaitingOrder


class FakeView:
    def __init__(self):
        self.waiting, self.running, self.refused = (), (), ()


def sorted_from_scratch(queue, key, ekey):
    ids = sorted(queue, key=lambda i: key[i])
    return ids, [int(key[i]) for i in ids], [int(ekey[i]) for i in ids]


@pytest.mark.parametrize("seed", range(12))
def test_incremental_order_equals_a_fresh_sort(seed):
    rng = np.random.default_rng(seed)
    n = 3000
    key = rng.permutation(10 * n)[:n].astype(np.int64)        # unique keys
    # an eviction rank: its own for most, one below it for some, never for others
    ekey = np.where(rng.random(n) < 0.6, key, key + rng.integers(1, 50, n))
    ekey[rng.random(n) < 0.2] = np.iinfo(np.int64).max
    keyf = lambda ids, _nw: key[ids]                          # noqa: E731
    ekeyf = lambda ids: ekey[ids]                             # noqa: E731
    tally = set()

    def on_change(gone, new):
        if gone is None:
            tally.clear()
        else:
            for i in gone:
                tally.remove(int(i))
        for i in new:
            assert int(i) not in tally
            tally.add(int(i))

    w = WaitingOrder(on_change=on_change)
    view = FakeView()
    waiting, running, arrived = [], [], 0
    for step in range(300):
        # the engine's side of one step: the last call's admissions (some refused), evictions to the
        # front, arrivals at the end
        admitted = [i for i in w.yielded if rng.random() < 0.8]
        refused = [i for i in w.yielded if i not in admitted]
        for i in admitted:
            waiting.remove(i)
            running.append(i)
        for i in w.evicted:
            running.remove(i)
            waiting.insert(0, i)
        if running and rng.random() < 0.2:                  # the engine evicts on its own
            i = running.pop(int(rng.integers(len(running))))
            waiting.insert(0, i)
        new_arrivals = list(range(arrived, min(n, arrived + int(rng.choice([0, 1, 2, 40])))))
        waiting.extend(new_arrivals)
        arrived += len(new_arrivals)
        running = [i for i in running if rng.random() > 0.1]   # completions
        view.waiting, view.running = tuple(waiting), tuple(running)
        view.refused = tuple((i, "kv") for i in refused)
        w.get(view, keyf, ekeyf)
        if waiting and rng.random() < 0.1:                  # some keys change (rekey)
            moved = rng.choice(waiting, size=min(len(waiting), int(rng.choice([1, 3, 50]))),
                               replace=False)
            key[moved] = rng.permutation(np.arange(10 * n, 11 * n))[:len(moved)] + 20 * n * (step + 1)
            w.rekey(moved, keyf, ekeyf)
        ids, keys, ekeys = sorted_from_scratch(waiting, key, ekey)
        assert w.ids == ids and w.keys == keys and w.ekeys == ekeys
        assert tally == set(waiting)
        for lowest in rng.choice(np.concatenate((key, ekey)), 5):   # the eviction walk's bound
            direct = [j for j, (k, e) in enumerate(zip(keys, ekeys)) if k < lowest and e < lowest]
            assert w.evictors_up_to(int(lowest)) == (direct[-1] + 1 if direct else 0)
        # the policy's side: propose a few admissions (from the front or anywhere) and evictions
        proposal = [i for i in w.ids[:int(rng.integers(0, 4))]]
        if w.ids and rng.random() < 0.3:
            proposal.append(w.ids[int(rng.integers(len(w.ids)))])
        w.yielded = list(dict.fromkeys(proposal))
        w.evicted = [i for i in running if rng.random() < 0.05]
