"""The journal's copies of upload payloads: recycled memory that never changes a record."""

from __future__ import annotations

import numpy as np
import pytest

from atomr_accel import ReplayHarness, System
from atomr_accel.device._payloads import PayloadPool

HOSTS = ["thread", "process"]


@pytest.mark.parametrize("isolation", HOSTS)
def test_large_uploads_from_one_reused_array_replay_bit_for_bit(isolation: str) -> None:
    """The caller overwrites its array between uploads (64 KiB to 1 MiB, whole and partial),
    and every upload is summed into an accumulator, so a replay reproduces the accumulators
    only if every record kept what was uploaded, though the writer recycles the copies'
    memory."""
    rng = np.random.default_rng(11)
    with System.open("t") as system:
        dev = system.spawn_device(mock=True, isolation=isolation, journal=True)
        blas = dev.blas()
        sizes = [8192, 16384, 131072]  # f64: 64 KiB, 128 KiB, 1 MiB
        bufs = [dev.allocate_f64(n) for n in sizes]
        sums = [dev.allocate_f64(n) for n in sizes]
        scratch = np.empty(max(sizes))
        for round_ in range(12):
            for buf, total, n in zip(bufs, sums, sizes, strict=True):
                scratch[:] = rng.standard_normal(scratch.size)  # the same array every time
                if round_ % 3 == 2:  # a partial write at an offset
                    dev.copy_from_numpy(buf, scratch[: n // 2], offset=n // 4)
                else:
                    dev.copy_from_numpy(buf, scratch[:n])
                blas.axpy(n, 1.0, buf, total)
        expected = [dev.copy_to_numpy(buf) for buf in sums]
        fresh = system.spawn_device(mock=True)
        result = ReplayHarness.of(dev).replay(fresh)
        for total, want in zip(sums, expected, strict=True):
            np.testing.assert_array_equal(fresh.copy_to_numpy(result.ref(total)), want)


def test_the_pool_reuses_a_block_only_once_it_is_given_back() -> None:
    pool = PayloadPool(min_bytes=1024, keep_bytes=1 << 20)
    x = np.arange(3000, dtype=np.float32).reshape(30, 100)[:, ::2]  # strided source
    a = pool.copy(x)
    assert a.shape == x.shape and a.dtype == x.dtype and a.flags.c_contiguous
    np.testing.assert_array_equal(a, x)
    b = pool.copy(x)  # a is still lent: b must not share its memory
    assert not np.shares_memory(a, b)
    base_a = a.base
    pool.give_back(a)
    assert pool.kept_bytes == 8192  # 6000 bytes round up to the 8 KiB class
    c = pool.copy(x + 1)
    assert c.base is base_a and pool.kept_bytes == 0  # the block came back
    np.testing.assert_array_equal(c, x + 1)
    np.testing.assert_array_equal(b, x)  # the other copy is untouched
    pool.give_back(np.zeros(4))  # not one of its copies: ignored
    assert pool.kept_bytes == 0


def test_the_pool_keeps_at_most_its_bound_and_copies_small_payloads_plainly() -> None:
    pool = PayloadPool(min_bytes=4096, keep_bytes=16384)
    small = np.ones(100, np.uint8)
    s = pool.copy(small)
    assert s.base is None and not np.shares_memory(s, small)
    copies = [pool.copy(np.full(8192, i, np.uint8)) for i in range(4)]
    for copy in copies:
        pool.give_back(copy)
    assert pool.kept_bytes == 16384  # two 8 KiB blocks kept, two let go
    for i, copy in enumerate(copies):
        assert (copy == i).all()  # giving back never changes a copy's bytes
