"""HPC at node scale: pods of ranks sharing namespaces, Slurm."""
