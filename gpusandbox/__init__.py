"""gpusandbox: a daemonless container runtime for GPU jobs."""
__version__ = "0.1.0"
