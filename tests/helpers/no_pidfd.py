"""Run a command where pidfd_open(2) fails with EPERM, as a seccomp filter
makes it fail (container runtimes' default profiles did before they knew the
call), and as a kernel before 5.3 makes it fail with ENOSYS.

    python no_pidfd.py COMMAND...

x86-64 only: the filter checks the architecture and the syscall number.
A filter is inherited by every child and cannot be lifted.
"""
import ctypes
import os
import struct
import sys

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
AUDIT_ARCH_X86_64, NR_PIDFD_OPEN = 0xC000003E, 434
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO, SECCOMP_RET_KILL = 0x7FFF0000, 0x00050000, 0
BPF_LD_W_ABS, BPF_JEQ_K, BPF_RET_K = 0x20, 0x15, 0x06
EPERM = 1


def instruction(code, jt, jf, k):
    return struct.pack("HBBI", code, jt, jf, k)


PROGRAM = b"".join([
    instruction(BPF_LD_W_ABS, 0, 0, 4),                      # seccomp_data.arch
    instruction(BPF_JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
    instruction(BPF_RET_K, 0, 0, SECCOMP_RET_KILL),
    instruction(BPF_LD_W_ABS, 0, 0, 0),                      # seccomp_data.nr
    instruction(BPF_JEQ_K, 0, 1, NR_PIDFD_OPEN),
    instruction(BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | EPERM),
    instruction(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
])


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def main(argv):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p,
                           ctypes.c_ulong, ctypes.c_ulong]
    program = SockFprog(len(PROGRAM) // 8, PROGRAM)
    if (libc.prctl(PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) != 0
            or libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER,
                          ctypes.cast(ctypes.pointer(program), ctypes.c_void_p), 0, 0) != 0):
        sys.exit("no_pidfd.py: seccomp: %s" % os.strerror(ctypes.get_errno()))
    os.execvp(argv[1], argv[1:])


if __name__ == "__main__":
    main(sys.argv)
