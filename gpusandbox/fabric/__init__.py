"""The network half of a GPU job (docs/fabric.md): RDMA adapters, GPUDirect,
NVSwitch and IMEX nodes (discover, select, inject), the host's verbs
libraries (libs) and the host's MPI (mpi).

The caller's fabric variables and the adapters' sysfs classes are defined
in gpusandbox.gpu, which every GPU launch loads anyway: the planner reads
them on every launch to decide whether this package is needed at all
(plandev.fabric)."""
from gpusandbox.gpu import FABRIC_CALLER_VARS as CALLER_VARS  # noqa: F401
from gpusandbox.gpu import FABRIC_NIC_CLASSES as NIC_CLASSES  # noqa: F401
