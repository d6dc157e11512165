"""stitch-graph: PyTorch programs to verified, faster CUDA with Planner, Coder and Verifier agents."""
