"""Did-you-mean for a mistyped command or option, and the reason for a
docker option gpusandbox does not take.  Imported only when an error is
being reported: difflib is not on the launch path."""

# docker/podman run options with no equivalent here: (why, hint).
DOCKER_ONLY = {
    "--publish": ("there is no port mapping",
                  "in the host's network (--net host) the command binds the host's ports itself"),
    "--network": ("the option is --net", "use --net host or --net none"),
    "--tmpfs": ("the option is --mount", "use --mount type=tmpfs,dst=DIR[,tmpfs-size=SIZE]"),
    "--privileged": ("not offered", "the device filter, seccomp and capability limits always "
                     "apply; select devices with --gpus and --device"),
}
DOCKER_ONLY["-p"] = DOCKER_ONLY["--publish"]


# docker/podman commands for containers kept beyond their command.
LIFECYCLE = ("attach", "start", "create", "restart")
LIFECYCLE_WHY = ("a sandbox lives as long as its command and is never restarted: 'run -d' "
                 "starts one in the background, 'exec' runs more in it (docs/live.md)")


def unknown_command(cmd, commands):
    """The error line's text for a command that is not one."""
    if cmd in LIFECYCLE:
        return f"unknown command: {cmd}: {LIFECYCLE_WHY}"
    guess = close(cmd, commands)
    return f"unknown command: {cmd}" + (f"; did you mean {guess}?" if guess else "")


def close(word, choices):
    """The one choice closest to `word`, or None when none is close."""
    import difflib
    found = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.6)
    return found[0] if found else None


def unknown_option(token, name, choices, hint):
    """The UsageError for an option of `run` that is not one."""
    from .errors import UsageError
    if name in DOCKER_ONLY:
        why, docker_hint = DOCKER_ONLY[name]
        return UsageError(f"unknown option {token!r}", why, docker_hint)
    guess = close(name, choices)
    if guess is None and not name.startswith("--") and len(name) > 2:
        guess = close("-" + name, choices)    # -rm, -gpus: one dash short
    what = f"unknown option {token!r}" + (f"; did you mean {guess}?" if guess else "")
    return UsageError(what, None, hint)
