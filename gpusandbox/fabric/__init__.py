"""The network half of a GPU job (docs/fabric.md): RDMA adapters, GPUDirect,
NVSwitch and IMEX nodes (discover, select, inject), the host's verbs
libraries (libs) and the host's MPI (mpi).

Nothing is imported here: the planner reads CALLER_VARS on every launch to
decide whether this package is needed at all."""

# The caller's variables that ask for fabric devices (select.py reads them).
CALLER_VARS = ("MELLANOX_VISIBLE_DEVICES", "NVIDIA_MOFED", "NVIDIA_IMEX_CHANNELS",
               "NVIDIA_GDRCOPY", "NVIDIA_GDS", "NVIDIA_NVSWITCH")

# The sysfs classes (under the sys root) whose entries are the adapters a
# task may be given: RDMA HCAs and HPE Slingshot NICs (discover.py reads
# them).  A host with neither entry has no fabric adapter to choose.
NIC_CLASSES = ("class/infiniband", "class/cxi_user")
