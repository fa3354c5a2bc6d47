"""gpusandbox as an OCI runtime: the runc command line over the stages of `gpusandbox run`."""
