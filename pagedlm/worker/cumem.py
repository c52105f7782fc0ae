"""Sleep mode that keeps virtual addresses: a CUDA virtual-memory allocator (as vLLM's cumem).

Each allocation torch asks of a pool (torch.cuda.MemPool with this allocator) is a reserved
range of virtual addresses with physical memory mapped into it (cuMemAddressReserve, cuMemCreate,
cuMemMap, cuMemSetAccess). A pool's sleep() unmaps and releases the physical memory of all its
allocations and keeps the reservations; wake() maps new physical memory at the same addresses.
Tensors, and the CUDA graphs that bind their addresses, stay valid across a sleep; their values
do not (the caller copies what it needs to host first, and back after the wake).

The driver API is reached through ctypes (no compiled extension), and torch calls the allocator
through two ctypes callbacks (torch._C._cuda_customAllocator takes raw function pointers). One
allocator serves the process; a runner owns a pool per tag ("weights", "kv_cache").
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

logger = logging.getLogger("pagedlm")

_LOCATION_DEVICE = 1  # CU_MEM_LOCATION_TYPE_DEVICE
_ALLOCATION_PINNED = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
_ACCESS_READ_WRITE = 3  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE
_GRANULARITY_RECOMMENDED = 1  # CU_MEM_ALLOC_GRANULARITY_RECOMMENDED


class CuMemError(RuntimeError):
    pass


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class _AllocationProp(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [
        ("type", ctypes.c_int),
        ("requestedHandleTypes", ctypes.c_int),
        ("location", _Location),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("allocFlags", _AllocFlags),
    ]


class _AccessDesc(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


class Driver(Protocol):
    """The driver calls the allocator makes (CudaDriver; a fake in the CPU tests)."""

    def granularity(self, device: int) -> int: ...
    def reserve(self, size: int) -> int: ...
    def create(self, size: int, device: int) -> int: ...
    def map(self, ptr: int, size: int, handle: int, device: int) -> None: ...
    def unmap(self, ptr: int, size: int) -> None: ...
    def release(self, handle: int) -> None: ...
    def address_free(self, ptr: int, size: int) -> None: ...


class CudaDriver:
    """libcuda's virtual-memory calls through ctypes; each raises CuMemError on a failure."""

    def __init__(self, library: str = "libcuda.so.1") -> None:
        self._lib = ctypes.CDLL(library)

    def _call(self, name: str, *args: Any) -> None:
        result = getattr(self._lib, name)(*args)
        if result != 0:
            message = ctypes.c_char_p()
            self._lib.cuGetErrorString(result, ctypes.byref(message))
            text = (message.value or b"unknown").decode()
            raise CuMemError(f"{name} failed: CUresult {result} ({text})")

    @staticmethod
    def _prop(device: int) -> _AllocationProp:
        prop = _AllocationProp()
        prop.type = _ALLOCATION_PINNED
        prop.location = _Location(_LOCATION_DEVICE, device)
        return prop

    def granularity(self, device: int) -> int:
        value = ctypes.c_size_t()
        prop = self._prop(device)
        self._call(
            "cuMemGetAllocationGranularity",
            ctypes.byref(value),
            ctypes.byref(prop),
            ctypes.c_int(_GRANULARITY_RECOMMENDED),
        )
        return value.value

    def reserve(self, size: int) -> int:
        ptr = ctypes.c_uint64()
        self._call(
            "cuMemAddressReserve",
            ctypes.byref(ptr),
            ctypes.c_size_t(size),
            ctypes.c_size_t(0),
            ctypes.c_uint64(0),
            ctypes.c_ulonglong(0),
        )
        return ptr.value

    def create(self, size: int, device: int) -> int:
        handle = ctypes.c_ulonglong()
        prop = self._prop(device)
        self._call(
            "cuMemCreate",
            ctypes.byref(handle),
            ctypes.c_size_t(size),
            ctypes.byref(prop),
            ctypes.c_ulonglong(0),
        )
        return handle.value

    def map(self, ptr: int, size: int, handle: int, device: int) -> None:
        self._call(
            "cuMemMap",
            ctypes.c_uint64(ptr),
            ctypes.c_size_t(size),
            ctypes.c_size_t(0),
            ctypes.c_ulonglong(handle),
            ctypes.c_ulonglong(0),
        )
        access = _AccessDesc(_Location(_LOCATION_DEVICE, device), _ACCESS_READ_WRITE)
        self._call(
            "cuMemSetAccess",
            ctypes.c_uint64(ptr),
            ctypes.c_size_t(size),
            ctypes.byref(access),
            ctypes.c_size_t(1),
        )

    def unmap(self, ptr: int, size: int) -> None:
        self._call("cuMemUnmap", ctypes.c_uint64(ptr), ctypes.c_size_t(size))

    def release(self, handle: int) -> None:
        self._call("cuMemRelease", ctypes.c_ulonglong(handle))

    def address_free(self, ptr: int, size: int) -> None:
        self._call("cuMemAddressFree", ctypes.c_uint64(ptr), ctypes.c_size_t(size))


@dataclass(slots=True)
class _Allocation:
    ptr: int
    size: int  # rounded up to the granularity
    device: int
    handle: int | None  # the physical memory mapped at ptr; None while its pool sleeps


@dataclass(eq=False)
class CuMemPool:
    """The allocations made for one tag of one runner; torch_pool is torch's MemPool over them."""

    tag: str
    allocator: CuMemAllocator
    torch_pool: Any = None  # torch.cuda.MemPool; None in the CPU tests
    allocations: dict[int, _Allocation] = field(default_factory=dict)  # by address
    asleep: bool = False

    @property
    def mapped_bytes(self) -> int:
        return sum(a.size for a in self.allocations.values() if a.handle is not None)

    def sleep(self) -> None:
        """Unmaps and releases every allocation's physical memory; the addresses stay reserved.
        The device must be idle over them (the caller synchronised)."""
        driver = self.allocator.driver
        for allocation in self.allocations.values():
            if allocation.handle is not None:
                driver.unmap(allocation.ptr, allocation.size)
                driver.release(allocation.handle)
                allocation.handle = None
        self.asleep = True

    def wake(self) -> None:
        """Maps new physical memory (uninitialised) at every allocation's address."""
        for allocation in self.allocations.values():
            if allocation.handle is None:
                self.allocator.map_new(allocation)
        self.asleep = False


# Every allocator torch was given, for the process's lifetime: torch calls the callbacks' raw
# pointers (from a MemPool's cached segments) as long as it runs, after the last Python reference
# to the allocator went (process_allocator.cache_clear, in the tests and the benchmark).
_IMMORTAL: list[CuMemAllocator] = []


class CuMemAllocator:
    """Serves torch's allocations inside `use(pool)` from the driver, records them in that pool,
    and frees them (physical memory if mapped, then the reservation) when torch hands them back."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        # by address, every live allocation's pool's records (not the pool: a CuMemPool keeps
        # its torch MemPool alive, whose end is what hands its cached segments back to free())
        self._owner: dict[int, dict[int, _Allocation]] = {}
        self._active = threading.local()  # .pool: the pool this thread allocates into
        self._granularity: dict[int, int] = {}  # by device
        self._torch_allocator: Any = None  # made on the first pool on CUDA
        self._callbacks: tuple[Any, Any] | None = None  # kept alive: torch holds raw pointers

    def new_pool(self, tag: str, with_torch_pool: bool = True) -> CuMemPool:
        torch_pool = None
        if with_torch_pool:
            import torch

            torch_pool = torch.cuda.MemPool(self.torch_allocator())
        return CuMemPool(tag, self, torch_pool)

    @contextlib.contextmanager
    def use(self, pool: CuMemPool) -> Iterator[None]:
        """torch's allocations on this thread inside go to `pool`."""
        previous = getattr(self._active, "pool", None)
        self._active.pool = pool
        try:
            if pool.torch_pool is None:
                yield
            else:
                import torch

                with torch.cuda.use_mem_pool(pool.torch_pool):
                    yield
        finally:
            self._active.pool = previous

    def allocate(self, size: int, device: int) -> int:
        pool = getattr(self._active, "pool", None)
        if pool is None:
            raise CuMemError("an allocation outside CuMemAllocator.use()")
        if pool.asleep:
            raise CuMemError(f"an allocation in the sleeping pool {pool.tag!r}")
        step = self._granularity.get(device) or self._granularity.setdefault(
            device, self.driver.granularity(device)
        )
        rounded = -(-size // step) * step
        ptr = self.driver.reserve(rounded)
        allocation = _Allocation(ptr, rounded, device, None)
        try:
            self.map_new(allocation)
        except CuMemError:
            self.driver.address_free(ptr, rounded)
            raise
        pool.allocations[ptr] = allocation
        self._owner[ptr] = pool.allocations
        return ptr

    def map_new(self, allocation: _Allocation) -> None:
        handle = self.driver.create(allocation.size, allocation.device)
        try:
            self.driver.map(allocation.ptr, allocation.size, handle, allocation.device)
        except CuMemError:
            self.driver.release(handle)
            raise
        allocation.handle = handle

    def free(self, ptr: int) -> None:
        allocation = self._owner.pop(ptr).pop(ptr)
        if allocation.handle is not None:
            self.driver.unmap(ptr, allocation.size)
            self.driver.release(allocation.handle)
        self.driver.address_free(ptr, allocation.size)

    def torch_allocator(self) -> Any:
        """torch's handle on this allocator (a _cuda_CUDAAllocator), made once."""
        if self._torch_allocator is None:
            import torch

            alloc_type = ctypes.CFUNCTYPE(
                ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p
            )
            free_type = ctypes.CFUNCTYPE(
                None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p
            )
            self._callbacks = (alloc_type(self._torch_alloc), free_type(self._torch_free))
            pointers = [ctypes.cast(c, ctypes.c_void_p).value for c in self._callbacks]
            self._torch_allocator = torch._C._cuda_customAllocator(*pointers)
            _IMMORTAL.append(self)
        return self._torch_allocator

    def _torch_alloc(self, size: int, device: int, _stream: int) -> int:
        """torch's alloc(size, device, stream) -> void*; 0 (torch's out of memory) on a failure:
        an exception cannot cross the C callback."""
        try:
            return self.allocate(size, device)
        except Exception as error:  # noqa: BLE001 - reported, then torch raises its OOM
            logger.error("cuMem allocation of %d bytes on device %d: %s", size, device, error)
            return 0

    def _torch_free(self, ptr: int, _size: int, _device: int, _stream: int) -> None:
        if sys.is_finalizing():  # torch's teardown at exit: the process's memory goes anyway
            return
        try:
            self.free(ptr)
        except Exception as error:  # noqa: BLE001 - nothing to raise into
            logger.error("cuMem free of %#x: %s", ptr or 0, error)


@functools.cache
def process_allocator() -> CuMemAllocator | None:
    """The process's allocator, or None (logged) where CUDA's virtual-memory API or torch's
    pluggable MemPool is not there: sleep mode then re-captures the CUDA graphs on wake."""
    import torch

    from pagedlm import envs

    if not envs.PAGEDLM_SLEEP_KEEP_ADDRESSES:
        logger.info("sleep mode: PAGEDLM_SLEEP_KEEP_ADDRESSES=0, graphs re-captured on wake")
        return None
    missing = [f"torch._C.{n}" for n in ("_cuda_customAllocator",) if not hasattr(torch._C, n)]
    missing += [
        f"torch.cuda.{n}" for n in ("MemPool", "use_mem_pool") if not hasattr(torch.cuda, n)
    ]
    if missing:
        logger.info("sleep mode: torch lacks %s, graphs re-captured on wake", ", ".join(missing))
        return None
    try:
        allocator = CuMemAllocator(CudaDriver())
        allocator.driver.granularity(torch.cuda.current_device())
        allocator.torch_allocator()
    except (OSError, AttributeError, CuMemError) as error:
        logger.info("sleep mode: no CUDA virtual-memory allocator (%s), graphs re-captured", error)
        return None
    return allocator
