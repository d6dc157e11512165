"""Problems in: load a KernelBench-format file, validate it, and describe it as a ``Task``."""

from stitch_graph.task.infer import OutputInference, infer_outputs
from stitch_graph.task.loader import TaskLoadError, load_task

__all__ = ["OutputInference", "TaskLoadError", "infer_outputs", "load_task"]
