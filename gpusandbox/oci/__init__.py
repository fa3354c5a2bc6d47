"""The container stack's own interfaces: CDI, OCI hook and filter, runtime wrapper, OCI runtime."""
