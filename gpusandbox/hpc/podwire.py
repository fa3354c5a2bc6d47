"""What a rank (pod.py) and the pod's keeper (keeper.py) say to each other
over the pod's socket, below both: the keeper imports nothing of the rank's
side, and a rank loads the keeper only to start one.

The keeper answers a connecting rank with b"P" + repr(its id map) and the
descriptors of NS_ORDER's namespaces (the user namespace only for a pod
with an id map of its own), or b"E" + why it could not set the pod up; a
rank then sends b"R" with its init's pidfd.  Descriptors travel as
SCM_RIGHTS, read here without socket.py (its import of enum and more would
cost every rank's launch)."""
# The pod's namespaces, in the order the keeper sends their descriptors
# (host.join_ns joins them in its own order).
NS_ORDER = ("user", "pid", "ipc", "mount")
_BO = __import__("sys").byteorder


def ns_types(idmap):
    """The namespace types the keeper of a pod with `idmap` hands over, in order."""
    return [t for t in NS_ORDER if t != "user" or idmap]


def recv_fds(conn, size, maxfds):
    """(message, [descriptors]) of one recvmsg: socket.recv_fds without
    socket.py."""
    import _socket
    msg, anc, _, _ = conn.recvmsg(size, _socket.CMSG_SPACE(4 * maxfds))
    fds = []
    for level, kind, data in anc:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            end = len(data) - len(data) % 4
            fds += [int.from_bytes(data[i:i + 4], _BO, signed=True)
                    for i in range(0, end, 4)]
    return msg, fds
