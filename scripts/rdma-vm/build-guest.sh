#!/bin/sh
# Prepare the guest boot files from the host's Debian kernel package, cached in $RDMA_VM_CACHE:
#   vmlinux       - the uncompressed kernel (ELF with a PVH entry): qemu enters it directly,
#                   skipping the real-mode setup and the xz decompressor (~8 s saved under TCG)
#   initramfs.img - busybox-static + the virtio/9p/overlay modules + a 10-line /init that
#                   mounts the host's / (9p, read-only) under a tmpfs overlay and switch_roots.
# Prints the cache directory. Usage: build-guest.sh [KERNEL_VERSION]
set -eu
KVER=${1:-$(ls /lib/modules | grep -- '-amd64$' | sort -V | tail -1)}
[ -n "$KVER" ] && [ -e "/boot/vmlinuz-$KVER" ] || { echo "no kernel: run install-deps.sh" >&2; exit 1; }
CACHE=${RDMA_VM_CACHE:-/var/tmp/te-rdma-vm}/$KVER
[ -s "$CACHE/vmlinux" ] && [ "$CACHE/initramfs.img" -nt "$0" ] && { echo "$CACHE"; exit 0; }
mkdir -p "$CACHE"

# 1. vmlinux: the payload of Debian's bzImage is one xz stream.
OFF=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "/boot/vmlinuz-$KVER" | head -n 1 | cut -d: -f1)
tail -c +$((OFF + 1)) "/boot/vmlinuz-$KVER" | xz -dc --single-stream > "$CACHE/vmlinux"

# 2. initramfs
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/bin" "$T/m" "$T/proc" "$T/dev" "$T/lower" "$T/upper" "$T/newroot"
cp /bin/busybox "$T/bin/busybox"
for a in sh mount mkdir insmod switch_root cat; do ln -s busybox "$T/bin/$a"; done
for m in virtio_pci 9pnet_virtio 9p overlay; do
  modprobe -S "$KVER" --show-depends "$m" | awk '$1 == "insmod" {print $2}'
done | awk '!seen[$0]++' > "$T/order.full"
while read -r ko; do cp "$ko" "$T/m/"; basename "$ko"; done < "$T/order.full" > "$T/m/order"
rm "$T/order.full"
cat > "$T/init" <<'INIT'
#!/bin/sh
# Runs as PID 1 from the initramfs. $vminit comes from the kernel command line.
mount -t proc proc /proc
for m in $(cat /m/order); do insmod /m/$m; done
mount -t 9p -o ro,trans=virtio,version=9p2000.L,msize=512000,cache=loose hostroot /lower
mount -t tmpfs -o mode=755 upper /upper && mkdir /upper/u /upper/w
mount -t overlay -o lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w overlay /newroot ||
  mount --bind /lower /newroot            # fallback: read-only root
exec switch_root /newroot "${vminit:-/sbin/init}"
INIT
chmod +x "$T/init"
(cd "$T" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1) > "$CACHE/initramfs.img"
echo "$CACHE"
