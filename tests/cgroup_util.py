"""What the tests that run under a memory cgroup share: the v1 controller's
place, and the skip (exit 77, with the reason) where there is none or where
a cgroup cannot be made."""
import os
import sys

CG_ROOT = "/sys/fs/cgroup/memory"


def need_memory_cgroup():
    if os.geteuid() != 0:
        print("SKIP: needs root to create a memory cgroup")
        sys.exit(77)
    if not os.path.exists(os.path.join(CG_ROOT, "cgroup.procs")):
        print(f"SKIP: no cgroup v1 memory controller at {CG_ROOT}")
        sys.exit(77)
