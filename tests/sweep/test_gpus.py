"""GPU assignment for local sweeps, on fake device lists (no CUDA needed)."""
import pytest

from runner.sweep.gpus import SlotPool, cuda_visible_devices, detect_devices, make_slots, parse_visible_devices


def test_parse_visible_devices_follows_cuda_rules():
    assert parse_visible_devices(None) is None
    assert parse_visible_devices("") == []
    assert parse_visible_devices("0,2, 3") == ["0", "2", "3"]
    # CUDA ignores everything from the first invalid entry on
    assert parse_visible_devices("1,-1,2") == ["1"]
    assert parse_visible_devices("GPU-aa,GPU-bb") == ["GPU-aa", "GPU-bb"]


def test_detect_devices_prefers_the_visible_set_over_a_count():
    assert detect_devices({"CUDA_VISIBLE_DEVICES": "4,5"}, count=lambda: 8) == ["4", "5"]
    assert detect_devices({}, count=lambda: 3) == ["0", "1", "2"]
    assert detect_devices({"CUDA_VISIBLE_DEVICES": ""}, count=lambda: 8) == []


def test_one_gpu_per_cell_gives_disjoint_slots():
    slots = make_slots(["0", "1", "2", "3"], gpus_per_cell=1)
    assert slots == [("0",), ("1",), ("2",), ("3",)]


def test_multi_gpu_cells_leave_the_remainder_idle():
    slots = make_slots(["0", "1", "2", "3", "4"], gpus_per_cell=2)
    assert slots == [("0", "1"), ("2", "3")]
    assert [cuda_visible_devices(s) for s in slots] == ["0,1", "2,3"]


def test_cpu_only_uses_the_configured_parallelism():
    assert make_slots([], gpus_per_cell=1, cpu_parallelism=3) == [(), (), ()]
    assert make_slots(["0", "1"], gpus_per_cell=0, cpu_parallelism=2) == [(), ()]
    assert cuda_visible_devices(()) == ""


@pytest.mark.parametrize("kwargs", [dict(devices=["0"], gpus_per_cell=2),
                                    dict(devices=["0", "0"], gpus_per_cell=1),
                                    dict(devices=["0"], gpus_per_cell=-1),
                                    dict(devices=[], gpus_per_cell=1, cpu_parallelism=0)])
def test_impossible_requests_fail_loudly(kwargs):
    with pytest.raises(ValueError):
        make_slots(**kwargs)


def test_pool_never_shares_a_gpu_between_running_cells():
    """Replay a sweep of 9 cells with uneven durations on 3 fake GPUs: at every tick the running
    cells hold pairwise disjoint devices and never more than 3 run."""
    pool = SlotPool(make_slots(["0", "1", "2"], gpus_per_cell=1))
    durations = [3, 1, 2, 5, 1, 1, 4, 2, 3]
    pending = list(range(len(durations)))
    running: dict[int, tuple[int, int]] = {}  # slot idx -> (cell, ticks left)
    seen_devices = {}
    for _tick in range(100):
        for idx, (cell, left) in list(running.items()):
            if left == 1:
                pool.release(idx)
                del running[idx]
            else:
                running[idx] = (cell, left - 1)
        while pending and pool.has_free():
            cell = pending.pop(0)
            idx, slot = pool.acquire(cell)
            seen_devices[cell] = slot
            running[idx] = (cell, durations[cell])
        assert len(running) <= pool.capacity
        held = [seen_devices[c] for c, _ in running.values()]
        flat = [d for slot in held for d in slot]
        assert len(flat) == len(set(flat))
        if not pending and not running:
            break
    assert sorted(seen_devices) == list(range(9))
    assert {d for slot in seen_devices.values() for d in slot} == {"0", "1", "2"}


def test_pool_rejects_misuse():
    pool = SlotPool([("0",)])
    idx, slot = pool.acquire("a")
    assert slot == ("0",)
    with pytest.raises(RuntimeError):
        pool.acquire("b")
    pool.release(idx)
    with pytest.raises(KeyError):
        pool.release(idx)
