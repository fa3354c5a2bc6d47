"""Live sandboxes: run --name/--detach, and ps, exec, stop, kill, logs,
wait, rm on them (docs/live.md)."""
