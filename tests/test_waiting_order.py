"""WaitingOrder, the sorted waiting queue the preemptive policies keep across calls: after any
sequence of changes logged as the engines log them (admissions from anywhere, evictions to the
front, arrivals at the end, a request leaving and coming back between two calls, keys changed by
rekey) its lists equal the queue sorted from scratch, and the on_change tally matches the queue; the
index of eviction keys finds the last request that may evict."""

import numpy as np
import pytest

from portbench.queue import WaitingOrder


class FakeEngine:
    """The queue side of an engine: its queue, its log of changes, and the view of both."""

    def __init__(self, n):
        self.waiting, self.queue_log, self.n_requests = [], [], n
        self._engine, self._queue_version = self, 0

    def join(self, i, front=False):
        self.waiting.insert(0, i) if front else self.waiting.append(i)
        self.queue_log.append(i)

    def leave(self, i):
        self.waiting.remove(i)
        self.queue_log.append(~i)

    def view(self):                      # what EngineView.refresh shows
        self._queue_version = len(self.queue_log)
        return self


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
    keyf = lambda ids: key[ids]                               # noqa: E731
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
    engine = FakeEngine(n)
    running, arrived, proposal, evictions = [], 0, [], []
    for step in range(300):
        # the engine's side: the last call's evictions to the front and admissions (some refused),
        # its own evictions, a request admitted and evicted again between two calls (its key may
        # change meanwhile), arrivals at the end, completions
        for i in evictions:
            running.remove(i)
            engine.join(i, front=True)
        if not evictions:
            for i in proposal:
                if rng.random() < 0.8:
                    engine.leave(i)
                    running.append(i)
        if running and rng.random() < 0.2:
            engine.join(running.pop(int(rng.integers(len(running)))), front=True)
        if engine.waiting and rng.random() < 0.1:
            i = engine.waiting[int(rng.integers(len(engine.waiting)))]
            engine.leave(i)
            key[i] = 10 ** 9 + step                            # served meanwhile: a new key
            engine.join(i, front=True)
        new_arrivals = list(range(arrived, min(n, arrived + int(rng.choice([0, 1, 2, 40])))))
        for i in new_arrivals:
            engine.join(i)
        if new_arrivals and rng.random() < 0.2:                # arrived and admitted between calls
            engine.leave(new_arrivals[-1])
            running.append(new_arrivals[-1])
        arrived += len(new_arrivals)
        running = [i for i in running if rng.random() > 0.1]   # completions
        waiting = engine.waiting
        keys_now = key if step % 2 else keyf                   # an array by id, or a function
        evict_now = None if seed % 4 == 3 else ekey if step % 3 else ekeyf    # some without
        w.get(engine.view(), keys_now, evict_now)
        if waiting and rng.random() < 0.1:                  # some keys change (rekey)
            moved = rng.choice(waiting, size=min(len(waiting), int(rng.choice([1, 3, 50]))),
                               replace=False)
            key[moved] = rng.permutation(np.arange(10 * n, 11 * n))[:len(moved)] + 20 * n * (step + 1)
            w.rekey(moved, keys_now, evict_now)
        ids, keys, ekeys = sorted_from_scratch(waiting, key, ekey)
        assert w.ids == ids and w.keys == keys and w.ekeys == (ekeys if evict_now is not None else None)
        assert tally == set(waiting)
        for lowest in rng.choice(np.concatenate((key, ekey)), 5 if evict_now is not None else 0):
            # the eviction walk's bound
            direct = [j for j, (k, e) in enumerate(zip(keys, ekeys)) if k < lowest and e < lowest]
            assert w.evictors_up_to(int(lowest)) == (direct[-1] + 1 if direct else 0)
        # the policy's side: propose a few admissions (from the front or anywhere) and evictions
        proposal = [i for i in w.ids[:int(rng.integers(0, 4))]]
        if w.ids and rng.random() < 0.3:
            proposal.append(w.ids[int(rng.integers(len(w.ids)))])
        proposal = list(dict.fromkeys(proposal))
        evictions = [i for i in running if rng.random() < 0.05]


def test_the_views_waiting_array_follows_any_queue_change():
    # The view brings its array of the waiting queue up to date from the engine's log of changes
    # where it can (departures from the front, joins at the back) and converts the list otherwise:
    # either way it is the queue as it stands, after any mix of changes.
    from portbench.engine.api import _follow_queue
    rng = np.random.default_rng(11)
    queue, arr, nxt = [], np.zeros(0, dtype=np.int64), 0
    for _ in range(3000):
        log = []
        for _ in range(int(rng.integers(0, 5))):
            op = rng.integers(0, 5)
            if op <= 1 or not queue:                       # an arrival at the back
                queue.append(nxt), log.append(nxt)
                nxt += 1
            elif op == 2:                                  # an admission from the front
                log.append(~queue.pop(0))
            elif op == 3:                                  # from anywhere
                log.append(~queue.pop(int(rng.integers(0, len(queue)))))
            else:                                          # a request back at the front
                i = int(rng.integers(0, nxt))
                if i not in queue:
                    queue.insert(0, i), log.append(i)
        arr = _follow_queue(arr, log, queue)
        assert arr.tolist() == queue
