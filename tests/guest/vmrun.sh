#!/usr/bin/env bash
# vmrun.sh 'COMMAND' -- run COMMAND in a throwaway QEMU VM whose cgroups are
# pure cgroup v2 (cgroup2 at /sys/fs/cgroup, every v1 controller disabled), and
# exit with its status. The guest's / is the host's / (read-only 9p under a
# tmpfs overlay: writes succeed and vanish, the checkout's too), COMMAND runs in
# the current directory as root under /bin/sh -c with the caller's environment;
# its stdout and stderr come back on ours.
#
# The project's copy of the workplace's vmrig harness (tests/test_guest.py
# boots it once for the guest's batch of tests). One change: the current
# directory is not shared read-write (VMRIG_RWDIRS still shares directories),
# so that a checkout whose path has a space or a comma works.
#
# Needs: qemu-system-x86_64, a distribution kernel in /boot with its modules
# (9p, 9pnet_virtio, virtio_pci, overlay), busybox (static), python3, kmod
# (modprobe). Run as root (9p then reads every file as its owner).
#
# Environment (all optional):
#   VMRIG_KERNEL       kernel image (default: newest /boot/vmlinuz-*)
#   VMRIG_MODULES      its modules (default: /lib/modules/<version from the name>)
#   VMRIG_CACHE        where the extracted vmlinux and the initramfs are kept
#                      (default: ${XDG_CACHE_HOME:-$HOME/.cache}/vmrig)
#   VMRIG_ACCEL        auto | kvm | tcg (default auto: kvm where kvm_intel or
#                      kvm_amd drives a usable /dev/kvm, else tcg)
#   VMRIG_SMP          vCPUs (default 1: under TCG on a 2-CPU host a second
#                      vCPU made boot and runs slower, see README)
#   VMRIG_MEM          guest memory in MiB (default 1024)
#   VMRIG_TIMEOUT      seconds for the whole VM, boot included (default 900);
#                      past it the VM is killed and vmrun.sh exits 124
#   VMRIG_RWDIRS       host directories shared read-write, ':'-separated
#   VMRIG_CONTROLLERS  written to cgroup.subtree_control of the root and of each
#                      ancestor of VMRIG_CGROUP (default "+cpu +memory +pids")
#   VMRIG_CGROUP       start COMMAND in this cgroup below the root (e.g. ci/job),
#                      a leaf like a delegated systemd scope; default: the root
#   VMRIG_HOST_TMP     1: the guest's /tmp is the host's (read-only, under the
#                      overlay); default: a fresh tmpfs (shared directories
#                      below /tmp are still mounted there)
#   VMRIG_CMDLINE      more guest kernel parameters
#   VMRIG_QEMU         the QEMU binary (default qemu-system-x86_64)
#   VMRIG_QEMU_ARGS    more QEMU arguments (split on spaces), e.g. "-cpu max"
#   VMRIG_VERBOSE      1: say on stderr what was booted and how long it took
#   VMRIG_KEEP         1: keep the run directory (console log, timings)
#
# Exit status: COMMAND's; 124 when VMRIG_TIMEOUT ran out; 125 when the VM
# gave no status (the console log's tail is then printed on stderr).
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: vmrun.sh 'COMMAND'" >&2
    exit 2
fi
COMMAND=$1

say() { if [ "${VMRIG_VERBOSE:-0}" = 1 ]; then echo "vmrun: $*" >&2; fi; }
die() { echo "vmrun: $*" >&2; exit 125; }

QEMU=${VMRIG_QEMU:-qemu-system-x86_64}
command -v "$QEMU" >/dev/null || die "no $QEMU (apt-get install qemu-system-x86)"
PY=$(command -v python3) || die "no python3"

# --- the kernel and its cached boot files ----------------------------------------
KERNEL=${VMRIG_KERNEL:-}
if [ -z "$KERNEL" ]; then
    KERNEL=$(ls -1v /boot/vmlinuz-* 2>/dev/null | tail -n 1 || true)
    [ -n "$KERNEL" ] || die "no /boot/vmlinuz-* (apt-get install linux-image-amd64), or set VMRIG_KERNEL"
fi
[ -r "$KERNEL" ] || die "cannot read $KERNEL"
KVER=${KERNEL##*/vmlinuz-}
MODULES=${VMRIG_MODULES:-/lib/modules/$KVER}
[ -d "$MODULES" ] || die "no modules at $MODULES (set VMRIG_MODULES)"
BUSYBOX=$(command -v busybox || true)
[ -n "$BUSYBOX" ] || die "no busybox (apt-get install busybox-static)"
if ldd "$BUSYBOX" >/dev/null 2>&1; then
    die "$BUSYBOX is not static (apt-get install busybox-static)"
fi

CACHE=${VMRIG_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vmrig}
KEY=$( { echo "$KERNEL $MODULES $BUSYBOX"; stat -Lc '%s %Y' "$KERNEL" "$BUSYBOX" "$0"; } | cksum | cut -d' ' -f1)
ART=$CACHE/$KVER-$KEY
mkdir -p "$CACHE"

build_artifacts() {
    local tmp mods
    tmp=$(mktemp -d "$CACHE/.build.XXXXXX")
    # The modules the guest's /init loads, in dependency order ('builtin' lines
    # name the ones compiled in).
    mods=$(for m in virtio_pci 9pnet_virtio 9p overlay; do
               modprobe -d "${MODULES%/lib/modules/"$KVER"}/" -S "$KVER" --show-depends "$m" ||
                   echo "vmrun: modprobe finds no $m for $KVER under $MODULES" >&2
           done | awk '$1 == "insmod" {print $2}' | awk '!seen[$0]++')
    "$PY" - "$KERNEL" "$BUSYBOX" "$tmp" $mods <<'PYEOF'
import bz2, gzip, lzma, os, shutil, stat, struct, subprocess, sys, zlib

kernel, busybox, out, mods = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]

# 1. An uncompressed vmlinux with a PVH entry note, so QEMU boots it directly
#    (no real-mode setup, no decompression under TCG). Absent: boot the bzImage.
def has_pvh_note(elf):
    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        return False
    phoff, = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    for i in range(phnum):
        p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", elf, phoff + i * phentsize)
        if p_type != 4:  # PT_NOTE
            continue
        pos, end = p_offset, p_offset + p_filesz
        while pos + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", elf, pos)
            name = elf[pos + 12:pos + 12 + namesz].rstrip(b"\0")
            if name == b"Xen" and ntype == 18:  # XEN_ELFNOTE_PHYS32_ENTRY
                return True
            pos += 12 + (namesz + 3) // 4 * 4 + (descsz + 3) // 4 * 4
    return False

def decompressors():
    yield b"\xfd7zXZ\x00", lambda d: lzma.LZMADecompressor(lzma.FORMAT_XZ).decompress(d)
    yield b"\x1f\x8b\x08", lambda d: zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(d)
    yield b"BZh", lambda d: bz2.BZ2Decompressor().decompress(d)
    yield b"\x28\xb5\x2f\xfd", lambda d: subprocess.run(["zstd", "-dcq"], input=d, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout
    yield b"\x02\x21\x4c\x18", lambda d: subprocess.run(["lz4", "-dcq"], input=d, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout

image = open(kernel, "rb").read()
vmlinux = None
for magic, decompress in decompressors():
    at = image.find(magic)
    while at >= 0 and vmlinux is None:
        try:
            data = decompress(image[at:])
            if has_pvh_note(data):
                vmlinux = data
        except Exception:
            pass
        at = image.find(magic, at + 1) if vmlinux is None and at < 1 << 20 else -1
    if vmlinux:
        break
if vmlinux:
    with open(os.path.join(out, "vmlinux"), "wb") as f:
        f.write(vmlinux)

# 2. The initramfs (newc cpio, gzip): static busybox, the modules, /init.
INIT = r'''#!/bin/sh
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /mods/order); do insmod /mods/$m 2>/dev/null; done
N=/newroot
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 hostroot /lower || echo "vmrig: no hostroot" >&2
mount -t tmpfs -o mode=0755 tmpfs /rw
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay $N || echo "vmrig: no overlay" >&2
mount -t proc proc $N/proc
mount -t sysfs sys $N/sys
mount -t devtmpfs dev $N/dev
mkdir -p $N/dev/pts $N/dev/shm
mount -t devpts devpts $N/dev/pts
mount -t tmpfs -o mode=1777 tmpfs $N/dev/shm
mount -t tmpfs -o mode=0755 tmpfs $N/run
case " $(cat /proc/cmdline) " in
    *" vmrig.tmp=host "*) ;;
    *) mount -t tmpfs -o mode=1777 tmpfs $N/tmp ;;
esac
mount -t cgroup2 -o nsdelegate cgroup2 $N/sys/fs/cgroup
mkdir -p $N/run/vmrig
mount -t 9p -o trans=virtio,version=9p2000.L,cache=none,msize=262144 ctl $N/run/vmrig || echo "vmrig: no ctl" >&2
while read -r tag dir; do
    mkdir -p "$N$dir" 2>/dev/null
    mount -t 9p -o trans=virtio,version=9p2000.L,cache=none,msize=262144 "$tag" "$N$dir" || echo "vmrig: cannot mount $dir" >&2
done < $N/run/vmrig/shares
# Move the new root onto / (as switch_root does) before the chroot: a process that
# joins a mount namespace with setns (runc/crun exec) then lands in that root.
(cd $N && mount --move . / && exec chroot . /bin/sh /run/vmrig/stage2.sh)
sync
poweroff -f
'''

def cpio(entries):
    blob, ino = bytearray(), 1
    def rec(name, mode, data=b"", nlink=1):
        nonlocal ino
        name_b = name.encode() + b"\0"
        hdr = "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X" % (
            ino, mode, 0, 0, nlink, 0, len(data), 0, 0, 0, 0, len(name_b), 0)
        ino += 1
        blob.extend(hdr.encode() + name_b)
        blob.extend(b"\0" * (-len(blob) % 4))
        blob.extend(data)
        blob.extend(b"\0" * (-len(blob) % 4))
    for e in entries:
        rec(*e)
    rec("TRAILER!!!", 0)
    return bytes(blob)

def module_bytes(path):
    data = open(path, "rb").read()
    if path.endswith(".xz"):
        return lzma.decompress(data)
    if path.endswith(".gz"):
        return gzip.decompress(data)
    if path.endswith(".zst"):
        return subprocess.run(["zstd", "-dcq"], input=data, stdout=subprocess.PIPE, check=True).stdout
    return data

entries = [(d, stat.S_IFDIR | 0o755) for d in
           ("bin", "dev", "proc", "sys", "mods", "lower", "rw", "newroot")]
entries.append(("bin/busybox", stat.S_IFREG | 0o755, open(busybox, "rb").read()))
for applet in ("sh", "mount", "insmod", "mkdir", "cat", "chroot", "poweroff", "sync", "echo"):
    entries.append(("bin/" + applet, stat.S_IFLNK | 0o777, b"busybox"))
order = []
for path in mods:
    name = os.path.basename(path).split(".ko")[0] + ".ko"
    entries.append(("mods/" + name, stat.S_IFREG | 0o644, module_bytes(path)))
    order.append(name)
entries.append(("mods/order", stat.S_IFREG | 0o644, ("\n".join(order) + "\n").encode()))
entries.append(("init", stat.S_IFREG | 0o755, INIT.encode()))
with open(os.path.join(out, "initrd.gz"), "wb") as f:
    f.write(gzip.compress(cpio(entries), 1))
PYEOF
    rm -rf "$ART"
    mv "$tmp" "$ART"
}

(
    flock 9
    [ -f "$ART/initrd.gz" ] || build_artifacts
) 9>"$CACHE/.lock"
if [ -f "$ART/vmlinux" ]; then BOOT=$ART/vmlinux; else BOOT=$KERNEL; fi

# --- accelerator -----------------------------------------------------------------------
ACCEL=${VMRIG_ACCEL:-auto}
if [ "$ACCEL" = auto ]; then
    ACCEL=tcg
    if [ -r /dev/kvm ] && [ -w /dev/kvm ] && { [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; }; then
        ACCEL=kvm
    fi
fi
case $ACCEL in
    kvm) ACCEL_ARGS=(-accel kvm -cpu host) ;;
    tcg) ACCEL_ARGS=(-accel tcg,thread=multi -cpu max) ;;
    *) die "VMRIG_ACCEL is auto, kvm or tcg, not $ACCEL" ;;
esac
SMP=${VMRIG_SMP:-1}

# --- the run directory: what the guest reads, where it writes back ---------------------
RUN=$(mktemp -d "${TMPDIR:-/tmp}/vmrun.XXXXXX")
cleanup() { if [ "${VMRIG_KEEP:-0}" = 1 ]; then echo "vmrun: kept $RUN" >&2; else rm -rf "$RUN"; fi; }
trap cleanup EXIT

printf '%s' "$COMMAND" >"$RUN/cmd"
pwd -P >"$RUN/cwd"
# The environment, as POSIX sh assignments (names that cannot be one are left out).
"$PY" - >"$RUN/env.sh" <<'PYEOF'
import os, re
skip = {"PWD", "OLDPWD", "SHLVL", "_", "HOSTNAME", "TMPDIR"}
for k, v in sorted(os.environ.items()):
    if k in skip or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
        continue
    print("export %s='%s'" % (k, v.replace("'", "'\\''")))
PYEOF

SHARE_ARGS=(-virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap"
            -virtfs "local,path=$RUN,mount_tag=ctl,security_model=none")
: >"$RUN/shares"
i=0
IFS=: read -r -a EXTRA <<<"${VMRIG_RWDIRS:-}"
for dir in "${EXTRA[@]}"; do
    [ -n "$dir" ] || continue
    dir=$(cd "$dir" && pwd -P) || die "no directory $dir"
    case $dir in *[[:space:]]* | *,*) die "cannot share a path with a space or a comma: $dir" ;; esac
    [ "$dir" = / ] && die "will not share / read-write"
    SHARE_ARGS+=(-virtfs "local,path=$dir,mount_tag=rw$i,security_model=none,multidevs=remap")
    echo "rw$i $dir" >>"$RUN/shares"
    i=$((i + 1))
done

cat >"$RUN/stage2.sh" <<'EOF'
#!/bin/sh
# Runs in the guest, chrooted into the host's tree, as a child of /init.
C=/run/vmrig
cut -d' ' -f1 /proc/uptime >$C/t_start
. $C/env.sh
controllers=${VMRIG_CONTROLLERS-+cpu +memory +pids}
cd /sys/fs/cgroup
[ -z "$controllers" ] || echo "$controllers" >cgroup.subtree_control
if [ -n "${VMRIG_CGROUP:-}" ]; then
    cg=${VMRIG_CGROUP#/}
    mkdir -p "$cg"
    dir=/sys/fs/cgroup
    rest=$cg
    while [ "${rest#*/}" != "$rest" ]; do          # every ancestor below the root
        dir=$dir/${rest%%/*}
        rest=${rest#*/}
        [ -z "$controllers" ] || echo "$controllers" >"$dir/cgroup.subtree_control"
    done
    echo $$ >"/sys/fs/cgroup/$cg/cgroup.procs"
fi
cd "$(cat $C/cwd)" || { echo 125 >$C/rc; exit; }
/bin/sh -c "$(cat $C/cmd)" </dev/null >$C/stdout 2>$C/stderr
echo $? >$C/rc
cut -d' ' -f1 /proc/uptime >$C/t_end
EOF

APPEND="console=ttyS0 quiet loglevel=3 panic=-1 mitigations=off cgroup_no_v1=all"
[ "${VMRIG_HOST_TMP:-0}" = 1 ] && APPEND="$APPEND vmrig.tmp=host"
APPEND="$APPEND ${VMRIG_CMDLINE:-}"
say "kernel $BOOT ($ACCEL, $SMP vCPU, ${VMRIG_MEM:-1024} MiB)"
T0=$(date +%s.%N)
set +e
timeout -k 5 "${VMRIG_TIMEOUT:-900}" "$QEMU" "${ACCEL_ARGS[@]}" -M q35 -smp "$SMP" -m "${VMRIG_MEM:-1024}" \
    -nodefaults -display none -no-reboot -serial "file:$RUN/console.log" \
    -kernel "$BOOT" -initrd "$ART/initrd.gz" -append "$APPEND" \
    "${SHARE_ARGS[@]}" ${VMRIG_QEMU_ARGS:-} </dev/null >"$RUN/qemu.log" 2>&1
QRC=$?
set -e
T1=$(date +%s.%N)

[ -f "$RUN/stdout" ] && cat "$RUN/stdout"
[ -f "$RUN/stderr" ] && cat "$RUN/stderr" >&2
if [ -f "$RUN/t_start" ] && [ -f "$RUN/t_end" ]; then
    say "$(awk -v a="$(cat "$RUN/t_start")" -v b="$(cat "$RUN/t_end")" -v w="$(echo "$T0 $T1" | awk '{print $2-$1}')" \
        'BEGIN {printf "wall %.2f s: boot to command %.2f s, command %.2f s, the rest %.2f s", w, a, b-a, w-b}')"
fi
if [ "$QRC" = 124 ] || [ "$QRC" = 137 ]; then
    echo "vmrun: the VM ran past VMRIG_TIMEOUT=${VMRIG_TIMEOUT:-900}s" >&2
    exit 124
fi
if [ ! -s "$RUN/rc" ]; then
    echo "vmrun: the VM gave no exit status (qemu exited $QRC); its console:" >&2
    tail -n 30 "$RUN/console.log" "$RUN/qemu.log" >&2 2>/dev/null || true
    exit 125
fi
exit "$(cat "$RUN/rc")"
