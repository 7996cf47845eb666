"""Resource limits of one sandbox: the kernel rlimits of its processes and the wall clock of a call."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

GIB = 1 << 30
MIB = 1 << 20


class SandboxLimits(BaseModel):
    """What a sandbox may consume; recorded with every trajectory so a result carries its conditions."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cpu_s: int = Field(
        default=10,
        ge=1,
        description=(
            "CPU seconds one sandbox process may use over its lifetime (RLIMIT_CPU); past it the kernel "
            "kills it, the call is reported as a crash, and the sandbox restarts on its next call."
        ),
    )
    memory_bytes: int = Field(
        default=GIB,
        ge=16 * MIB,
        description=(
            "Address space each sandbox process may map on top of the pre-imported interpreter it is "
            "forked from (RLIMIT_AS); a larger allocation raises MemoryError inside the tool."
        ),
    )
    processes: int = Field(
        default=32,
        ge=1,
        description=(
            "Processes and threads the sandbox may have at once, its main process included (RLIMIT_NPROC, "
            "which counts per uid: it bounds a sandbox only when the sandbox has a uid of its own)."
        ),
    )
    file_bytes: int = Field(
        default=64 * MIB, ge=0, description="Largest file a sandbox process may write (RLIMIT_FSIZE)."
    )
    tmp_bytes: int = Field(
        default=64 * MIB,
        ge=MIB,
        description=(
            "Bytes the sandbox's private /tmp, /var/tmp and /dev/shm may hold together (one tmpfs, so "
            "host memory beyond memory_bytes); they are private only when the pool runs as root."
        ),
    )
    work_bytes: int = Field(
        default=256 * MIB,
        ge=MIB,
        description=(
            "Bytes the episode's work directory may hold in all (a tmpfs of that size over it, so host "
            "memory; only when the pool runs as root, else each file is bounded by file_bytes alone)."
        ),
    )
    work_inodes: int = Field(
        default=16_384,
        ge=64,
        description="Files and directories the work directory may hold in all (that tmpfs's inode bound).",
    )
    open_files: int = Field(
        default=64, ge=8, description="File descriptors a sandbox process may hold at once (RLIMIT_NOFILE)."
    )
    call_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Wall-clock limit of a tool call that names none; past it everything is killed.",
    )
    max_output_chars: int = Field(
        default=MIB,
        ge=1,
        description="Characters of a tool's result kept; longer ones are cut inside the sandbox and flagged.",
    )

    def process_limits(self) -> dict[str, Any]:
        """The values the sandbox process applies to itself (sent to it as plain JSON)."""
        return self.model_dump(exclude={"call_timeout_s", "work_bytes", "work_inodes"})
