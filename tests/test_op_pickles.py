"""A process host pickles an op it is sent again as the same object only once, and only
when nothing the op holds can change: an op holding a host array is pickled each time,
so a caller that changed the array between two sends gets results for what it holds
now."""

from __future__ import annotations

import pickle

import numpy as np

from atomr_accel import System
from atomr_accel.core._dtype import DType
from atomr_accel.core._fields import immutable
from atomr_accel.core._op import validated
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._blas import Scal
from atomr_accel.core.ops._graph import OpSequence
from atomr_accel.core.ops._topk import ScoreTopK
from atomr_accel.hosts._op_pickles import OpPickles, ReadOps


def test_a_sequence_holding_a_host_array_sent_again_sees_the_array_as_it_is_now() -> None:
    rng = np.random.default_rng(81)
    rows = rng.standard_normal((6, 4)).astype(np.float32)
    with System.open("t") as system:
        device = system.spawn_device(0, mock=True, isolation="process")
        matrix = device.allocate(rows.size, "f32")
        device.copy_from_numpy(matrix, rows.reshape(-1))
        queries = rng.standard_normal((2, 4)).astype(np.float32)
        sequence = validated(OpSequence((
            ScoreTopK(queries, matrix.ref, 6, 4, 3, None, None, 1.0), Scal(24, 1.0, matrix.ref))))
        for _ in range(3):  # the same object each time, as a trainer sends its steps' ops;
            (columns, scores), _ = device.run(sequence, checked=True)  # the queries change
            want = queries.astype(np.float64) @ rows.astype(np.float64).T
            np.testing.assert_array_equal(columns, np.argsort(-want, axis=1)[:, :3])
            np.testing.assert_allclose(scores, np.sort(want, axis=1)[:, ::-1][:, :3],
                                       rtol=1e-5)
            queries[...] = rng.standard_normal((2, 4)).astype(np.float32)


def test_only_ops_made_of_parts_that_cannot_change_are_kept() -> None:
    ref = GpuRef(0, 3, DType.F32, 8, 1, 7)
    fixed = OpSequence((Scal(8, 2.0, ref), Scal(8, 0.5, ref)))
    holding = OpSequence((ScoreTopK(np.ones((1, 2), np.float32), ref, 4, 2, 1, None, None,
                                    1.0),))
    assert immutable(fixed) and immutable((1, "a", None, ref))
    assert not immutable(holding) and not immutable([1]) and not immutable(np.ones(1))
    pickles = OpPickles()
    first = pickles.dumps(fixed, 4, None)
    assert pickles.dumps(fixed, 4, None) is first  # kept: pickled once
    assert pickles.dumps(fixed, 5, None) is not first  # another stream: pickled again
    assert pickle.loads(first) == (fixed, 4, None)
    array_op = holding.ops[0]
    assert isinstance(array_op, ScoreTopK)
    before = pickles.dumps(holding, 4, None)
    array_op.queries[...] = 5.0
    after = pickles.dumps(holding, 4, None)
    assert before != after
    assert np.all(pickle.loads(after)[0].ops[0].queries == 5.0)


def test_a_worker_reads_a_repeated_op_once_and_every_other_payload_each_time() -> None:
    ref = GpuRef(0, 3, DType.F32, 8, 1, 7)
    reads = ReadOps()
    payload = OpPickles().dumps(validated(Scal(8, 2.0, ref)), 4, None)
    first = reads(payload)
    assert first == (Scal(8, 2.0, ref), 4, None)
    assert reads(bytes(payload)) is first  # the same bytes: the op read before
    holding = pickle.dumps((ScoreTopK(np.ones((1, 2), np.float32), ref, 4, 2, 1, None, None,
                                      1.0), 4, None))
    assert reads(holding) is not reads(holding)  # an op holding an array: read each time
    other = reads(OpPickles().dumps(Scal(8, 3.0, ref), 4, None))
    assert other[0].alpha == 3.0 and reads(payload) is first


def test_a_worker_stops_keeping_a_kind_of_op_whose_payloads_keep_changing() -> None:
    from atomr_accel.core._hit_rate import HitRate

    ref = GpuRef(0, 3, DType.F32, 8, 1, 7)
    reads = ReadOps()
    for i in range(2 * HitRate.TRIAL + 1):
        reads(pickle.dumps((Scal(8, float(i), ref), 4, None)))
    payload = pickle.dumps((Scal(8, -1.0, ref), 4, None))
    assert reads(payload) is not reads(payload)  # resting: read each time
    assert reads(payload)[0] == Scal(8, -1.0, ref)
