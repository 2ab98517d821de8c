#!/bin/sh
# PID 1 inside the guest (the initramfs switch_roots into the host's / under a tmpfs overlay and
# execs this file). Mounts the basics, the work and result shares, sets up soft-RoCE, runs the job
# from /run/vm/cmd in the host's cwd, stores its output and exit code in /run/vm, powers off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs dev /dev
ln -sf /proc/self/fd /dev/fd            # bash process substitution, /dev/stdin
ln -sf /proc/self/fd/0 /dev/stdin; ln -sf /proc/self/fd/1 /dev/stdout; ln -sf /proc/self/fd/2 /dev/stderr
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs shm /dev/shm
mount -t tmpfs tmp /tmp
mount -t tmpfs run /run
P9=trans=virtio,version=9p2000.L,msize=512000
mkdir -p /run/vm && mount -t 9p -o $P9 vmout /run/vm
CWD=$(cat /run/vm/cwd)
if [ "$CWD" != / ]; then mkdir -p "$CWD" && mount -t 9p -o $P9,cache=mmap work "$CWD"; fi
echo "$(cut -d' ' -f1 /proc/uptime) kernel+mounts done" >> /run/vm/timings

. "$(dirname "$0")/rdma-net.sh" >> /run/vm/setup.log 2>&1; rc=$?
echo "$(cut -d' ' -f1 /proc/uptime) rdma setup done (rc=$rc)" >> /run/vm/timings

hostname rdma-vm
ulimit -l unlimited                # memory registration (root has CAP_IPC_LOCK anyway)
. /run/vm/env                      # the caller's environment
cd "$CWD"
touch /run/vm/started              # its mtime (host clock) marks the start
sh -c "$(cat /run/vm/cmd)" > /run/vm/output 2>&1 < /dev/null
echo $? > /run/vm/rc
echo "$(cut -d' ' -f1 /proc/uptime) command done" >> /run/vm/timings
cd /
umount "$CWD" /run/vm 2>/dev/null
echo o > /proc/sysrq-trigger       # immediate power off; qemu exits
sleep 10
