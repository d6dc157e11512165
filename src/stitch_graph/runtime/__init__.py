"""What a candidate program's host code runs against: kernel loading and launching."""

from stitch_graph.runtime.kernels import (
    GuardFailed,
    KernelLauncher,
    KernelLibrary,
    kernel_signatures,
)

__all__ = ["GuardFailed", "KernelLauncher", "KernelLibrary", "kernel_signatures"]
