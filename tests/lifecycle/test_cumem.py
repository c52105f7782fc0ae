"""The cuMem allocator's host side (worker/cumem.py) over a fake driver: allocations recorded in
the pool they were made in, sleep releasing the physical memory and keeping the reservations,
wake mapping at the same addresses, frees and failures leaking nothing; and the choice between
keeping addresses and re-capturing (sleep.MemoryPools)."""

from __future__ import annotations

import gc
import logging
import weakref

import pytest
import torch

from pagedlm.worker import cumem, sleep
from pagedlm.worker.cumem import CuMemAllocator, CuMemError

GRANULE = 2 << 20


class FakeDriver:
    """Reservations, physical handles and mappings, as the driver would hold them."""

    def __init__(self) -> None:
        self.reserved: dict[int, int] = {}  # address -> size
        self.handles: dict[int, int] = {}  # handle -> size
        self.mapped: dict[int, int] = {}  # address -> handle
        self._next_address, self._next_handle = 1 << 40, 1
        self.fail_map = False

    def granularity(self, device: int) -> int:
        return GRANULE

    def reserve(self, size: int) -> int:
        assert size % GRANULE == 0
        address, self._next_address = self._next_address, self._next_address + size + GRANULE
        self.reserved[address] = size
        return address

    def create(self, size: int, device: int) -> int:
        handle, self._next_handle = self._next_handle, self._next_handle + 1
        self.handles[handle] = size
        return handle

    def map(self, ptr: int, size: int, handle: int, device: int) -> None:
        if self.fail_map:
            raise CuMemError("cuMemMap failed: CUresult 2 (out of memory)")
        assert self.reserved[ptr] == size == self.handles[handle] and ptr not in self.mapped
        self.mapped[ptr] = handle

    def unmap(self, ptr: int, size: int) -> None:
        assert self.reserved[ptr] == size
        del self.mapped[ptr]

    def release(self, handle: int) -> None:
        assert handle not in self.mapped.values()  # unmapped first
        del self.handles[handle]

    def address_free(self, ptr: int, size: int) -> None:
        assert ptr not in self.mapped and self.reserved[ptr] == size
        del self.reserved[ptr]


@pytest.fixture
def driver() -> FakeDriver:
    return FakeDriver()


@pytest.fixture
def allocator(driver: FakeDriver) -> CuMemAllocator:
    return CuMemAllocator(driver)


def allocate(allocator: CuMemAllocator, pool: cumem.CuMemPool, size: int) -> int:
    with allocator.use(pool):
        return allocator.allocate(size, device=0)


def test_sleep_releases_the_memory_and_wake_maps_it_at_the_same_addresses(
    allocator: CuMemAllocator, driver: FakeDriver
) -> None:
    weights = allocator.new_pool("weights", with_torch_pool=False)
    kv_cache = allocator.new_pool("kv_cache", with_torch_pool=False)
    small, large = allocate(allocator, weights, 1000), allocate(allocator, weights, 5 * GRANULE + 1)
    cache = allocate(allocator, kv_cache, 3 * GRANULE)
    assert weights.mapped_bytes == 7 * GRANULE and kv_cache.mapped_bytes == 3 * GRANULE
    assert set(weights.allocations) == {small, large} and set(kv_cache.allocations) == {cache}
    handles_before = dict(driver.mapped)

    weights.sleep()
    assert weights.asleep and weights.mapped_bytes == 0
    assert set(driver.mapped) == {cache}  # the other pool keeps its memory
    assert set(driver.handles) == {handles_before[cache]}  # the physical memory is released
    assert set(driver.reserved) == {small, large, cache}  # the addresses stay
    with pytest.raises(CuMemError, match="sleeping pool 'weights'"):
        allocate(allocator, weights, 10)

    weights.wake()
    assert not weights.asleep and weights.mapped_bytes == 7 * GRANULE
    assert set(driver.mapped) == {small, large, cache}
    assert driver.mapped[small] not in handles_before.values()  # new physical memory
    assert set(weights.allocations) == {small, large}


def test_free_releases_everything_awake_or_asleep(
    allocator: CuMemAllocator, driver: FakeDriver
) -> None:
    pool = allocator.new_pool("kv_cache", with_torch_pool=False)
    awake, asleep = allocate(allocator, pool, GRANULE), allocate(allocator, pool, GRANULE)
    allocator.free(awake)
    assert awake not in driver.reserved and awake not in driver.mapped
    pool.sleep()
    allocator.free(asleep)  # an engine shut down while asleep
    assert driver.reserved == driver.handles == driver.mapped == {}
    assert pool.allocations == {}


def test_the_allocator_keeps_no_pool_alive(allocator: CuMemAllocator, driver: FakeDriver) -> None:
    """A dropped runner's pools must go while their allocations live: the end of torch's MemPool
    is what hands its cached segments back (to free())."""
    pool = allocator.new_pool("weights", with_torch_pool=False)
    ptr = allocate(allocator, pool, GRANULE)
    dropped = weakref.ref(pool)
    del pool
    gc.collect()
    assert dropped() is None
    allocator.free(ptr)
    assert driver.reserved == driver.handles == {}


def test_a_failed_map_leaks_nothing_and_torch_sees_out_of_memory(
    allocator: CuMemAllocator, driver: FakeDriver, caplog: pytest.LogCaptureFixture
) -> None:
    pool = allocator.new_pool("weights", with_torch_pool=False)
    driver.fail_map = True
    with pytest.raises(CuMemError, match="cuMemMap"):
        allocate(allocator, pool, GRANULE)
    assert driver.reserved == driver.handles == {} and pool.allocations == {}
    with allocator.use(pool), caplog.at_level(logging.ERROR, logger="pagedlm"):
        assert allocator._torch_alloc(GRANULE, 0, 0) == 0  # torch raises its OOM on a null
    assert "cuMemMap failed" in caplog.text
    driver.fail_map = False
    pool.sleep()  # a pool whose wake failed half way wakes the rest later
    pool.wake()


def test_allocations_go_to_the_innermost_pool_only_inside_use(allocator: CuMemAllocator) -> None:
    outer = allocator.new_pool("weights", with_torch_pool=False)
    inner = allocator.new_pool("kv_cache", with_torch_pool=False)
    with allocator.use(outer):
        with allocator.use(inner):
            in_inner = allocator.allocate(10, 0)
        in_outer = allocator.allocate(10, 0)
    assert set(inner.allocations) == {in_inner} and set(outer.allocations) == {in_outer}
    with pytest.raises(CuMemError, match="outside"):
        allocator.allocate(10, 0)


def test_pools_only_with_sleep_mode_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_allocator() -> None:
        raise AssertionError("not asked")

    monkeypatch.setattr(cumem, "process_allocator", no_allocator)
    for enabled, device in ((False, "cuda"), (True, "cpu")):
        pools = sleep.MemoryPools.create(enabled, torch.device(device))
        assert not pools.keeps_addresses and not pools.asleep("weights")
        with pools.use("weights"):  # nothing to do
            pass


def test_fallback_to_recapture_is_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def choose() -> CuMemAllocator | None:
        cumem.process_allocator.cache_clear()
        with caplog.at_level(logging.INFO, logger="pagedlm"):
            return cumem.process_allocator()

    try:
        monkeypatch.setenv("PAGEDLM_SLEEP_KEEP_ADDRESSES", "0")
        assert choose() is None and "PAGEDLM_SLEEP_KEEP_ADDRESSES=0" in caplog.text
        monkeypatch.delenv("PAGEDLM_SLEEP_KEEP_ADDRESSES")
        monkeypatch.delattr(torch._C, "_cuda_customAllocator", raising=False)
        assert choose() is None and "torch._C._cuda_customAllocator" in caplog.text

        def no_library(library: str = "") -> None:
            raise OSError("libcuda.so.1: cannot open shared object file")

        monkeypatch.setattr(torch._C, "_cuda_customAllocator", lambda *a: None, raising=False)
        monkeypatch.setattr(cumem, "CudaDriver", no_library)
        assert choose() is None and "cannot open shared object" in caplog.text

        monkeypatch.setattr(cumem, "CudaDriver", FakeDriver)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        chosen = choose()
        assert isinstance(chosen, CuMemAllocator)
        # torch holds its callbacks' raw pointers for good: the allocator must outlive every
        # Python reference to it
        kept = weakref.ref(chosen)
        del chosen
        cumem.process_allocator.cache_clear()
        gc.collect()
        assert kept() is not None and kept() in cumem._IMMORTAL
        cumem._IMMORTAL.remove(kept())
    finally:
        cumem.process_allocator.cache_clear()
