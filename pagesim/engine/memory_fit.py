"""What memory a command may still take, so that a size it is about to allocate is refused first.

A command that allocates what a flag or a model asks for (a KV cache, a model's weights, a
dataset's token arrays) checks the size here before allocating, and refuses it with both sizes
and the flag that made it, instead of failing inside torch or numpy ("Unable to allocate 16.0
GiB", "DefaultCPUAllocator: can't allocate memory") or being killed by the kernel.

``require_host(need, what)`` refuses a size over what is available; ``sized_by(flags)`` names the
flags in a ``MemoryError`` that gets through anyway. ``host_available()`` is the least of what
bounds this process (``None`` where nothing can be
read, as off Linux):

- the machine's ``MemAvailable`` (``/proc/meminfo``: free memory plus what the kernel can reclaim);
- its container's memory limit (cgroup v2 ``memory.max``, v1 ``memory.limit_in_bytes``) less what
  the container uses, its reclaimable page cache (inactive files) not counted, as ``docker stats``
  counts it;
- the address-space limit (``ulimit -v``, ``RLIMIT_AS``) less this process's address space
  (``VmSize``).

Each with its name, for the message. The figures are a moment's: another process may take memory
between the check and the allocation, so a check passed is no promise (the allocation's own error
stays handled), but a refusal is certain.
"""

from __future__ import annotations

import contextlib
import resource
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

GiB = 1 << 30
UNLIMITED = 1 << 60  # a cgroup limit at or above this is "max" (v1 writes 2^63 rounded to a page)
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True, slots=True)
class Available:
    bytes: int
    where: str  # e.g. "available in RAM", "left under the container's memory limit"


def gib(num_bytes: float) -> str:
    """``12.34 GiB``, or ``0.004 GiB`` for what is under a hundredth of one."""
    value = num_bytes / GiB
    return f"{value:.2f} GiB" if value >= 0.01 or value == 0 else f"{value:.3g} GiB"


def host_available() -> Available | None:
    """The least of the bounds above that can be read (None: none can)."""
    bounds = [b for b in (_mem_available(), _cgroup_available(), _address_space_available()) if b is not None]
    return min(bounds, key=lambda b: b.bytes) if bounds else None


def require_host(need_bytes: int, what: str, hint: str = "") -> None:
    """Refuse ``need_bytes`` of host memory for ``what`` (e.g. "--random-input-len 2097152 x
    --num-prompts 1000: 2,097,152,000 prompt tokens") when more than is available."""
    have = host_available()
    if have is not None and need_bytes > have.bytes:
        raise ValueError(f"{what} would take {gib(need_bytes)} but {gib(have.bytes)} is {have.where}"
                         + (f" ({hint})" if hint else ""))


@contextlib.contextmanager
def sized_by(flags: str) -> Iterator[None]:
    """A ``MemoryError`` inside (an allocation the check before it let through: a moment's figures,
    an estimate) is one ``ValueError`` naming the ``flags`` that sized it."""
    try:
        yield
    except MemoryError as exc:
        raise ValueError(f"{flags}: {memory_error_words(exc)}") from None


def memory_error_words(exc: MemoryError) -> str:
    """A ``MemoryError``'s message: its own first line where it has one (numpy's names the size it
    asked for; pagesim's, what it was building); else, for Python's bare one, the sizes known
    here: what this process held at most and what is available."""
    said = str(exc).strip().splitlines()
    if said:
        return said[0]
    peak, have = _peak_rss_bytes(), host_available()
    sizes = [f"this process held {gib(peak)} at most" if peak else None,
             f"{gib(have.bytes)} is {have.where}" if have is not None else None]
    sizes = [s for s in sizes if s]
    return "not enough memory for what was asked" + (f" ({'; '.join(sizes)})" if sizes else "")


# ------------------------------------------------------------------ the bounds
def _mem_available() -> Available | None:
    value = _meminfo_kib("MemAvailable")
    return None if value is None else Available(value * 1024, "available in RAM")


def _meminfo_kib(key: str) -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_available() -> Available | None:
    """The limit of this process's memory cgroup less its usage (reclaimable page cache left out)."""
    for folder, limit_name, usage_name, inactive_key in (
            (_cgroup_folder("", CGROUP_ROOT), "memory.max", "memory.current", "inactive_file"),  # v2
            (_cgroup_folder("memory", CGROUP_ROOT / "memory"), "memory.limit_in_bytes", "memory.usage_in_bytes",
             "total_inactive_file")):  # v1
        limit, usage = _read_int(folder / limit_name), _read_int(folder / usage_name)
        if limit is None or usage is None or limit >= UNLIMITED:
            continue
        inactive = _stat_value(folder / "memory.stat", inactive_key) or 0
        return Available(max(0, limit - max(0, usage - inactive)), "left under the container's memory limit")
    return None


def _cgroup_folder(controller: str, mount: Path) -> Path:
    """This process's cgroup folder under ``mount`` (``/proc/self/cgroup``: ``0::/path`` for v2,
    ``N:memory:/path`` for v1), or ``mount`` itself (a container's own namespace shows its root)."""
    try:
        for line in Path("/proc/self/cgroup").read_text(encoding="ascii", errors="replace").splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers.split(",") == [controller] or (controller and controller in controllers.split(",")):
                folder = mount / path.lstrip("/")
                return folder if folder.is_dir() else mount
    except (OSError, ValueError):
        pass
    return mount


def _address_space_available() -> Available | None:
    """``ulimit -v`` less this process's address space: what one more mapping may add."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (OSError, ValueError, AttributeError):
        return None
    size_kib = _status_kib("VmSize")
    if soft == resource.RLIM_INFINITY or size_kib is None:
        return None
    return Available(max(0, soft - size_kib * 1024), "left under the address-space limit (ulimit -v)")


def _peak_rss_bytes() -> int | None:
    kib = _status_kib("VmHWM")
    return None if kib is None else kib * 1024


def _status_kib(key: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text(encoding="ascii", errors="replace").splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    if text == "max":
        return UNLIMITED
    try:
        return int(text)
    except ValueError:
        return None


def _stat_value(path: Path, key: str) -> int | None:
    try:
        for line in path.read_text(encoding="ascii").splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError, UnicodeDecodeError):
        pass
    return None
