"""What a candidate program's host code runs against: kernel loading and launching."""

from stitch_graph.runtime.kernels import KernelLauncher, KernelLibrary, kernel_signatures

__all__ = ["KernelLauncher", "KernelLibrary", "kernel_signatures"]
