#!/bin/bash
# The Debian package, end to end (docs/package.md): builds it twice (revision 1, then a rebuild
# as revision 2), boots a fresh Debian 12 (debootstrap, cached in .build/package-test) under PID 1
# systemd in systemd-nspawn, and runs Tests/package/inside.sh there: install, status as root and
# as an administrator, a store, man pages, the upgrade (restart, conffile kept, store intact),
# remove and purge. Exit code: the number of failed checks (0: all passed).
# Usage: bash Tests/package/package-test.sh      (make package-test; needs the network to
#        deb.debian.org for debootstrap and apt)
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PATH:/opt/swift/usr/bin"
work=.build/package-test
mkdir -p "$work"
for tool in debootstrap systemd-container; do
    dpkg-query -W -f='${Status}' "$tool" 2>/dev/null | grep -q "install ok installed" \
        || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$tool" >/dev/null
done

# Two builds of the package: the upgrade installs a rebuilt one with a higher version.
rm -rf "$work/debs"
mkdir -p "$work/debs/first" "$work/debs/second"
DEB_REVISION=1 bash scripts/deb.sh >"$work/deb-1.log" 2>&1 || { tail -40 "$work/deb-1.log"; exit 1; }
mv .build/deb/userstore_*-1_amd64.deb "$work/debs/first/"
DEB_REVISION=2 bash scripts/deb.sh >"$work/deb-2.log" 2>&1 || { tail -40 "$work/deb-2.log"; exit 1; }
mv .build/deb/userstore_*-2_amd64.deb "$work/debs/second/"

# A fresh Debian 12: minbase with systemd as PID 1 and man-db; nothing of this machine's.
base="$work/bookworm.tar"
if [ ! -s "$base" ]; then
    rm -rf "$work/bootstrap"
    debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,man-db,procps bookworm "$work/bootstrap" http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 \
        || { tail -20 "$work/debootstrap.log"; exit 1; }
    tar -C "$work/bootstrap" -cf "$base" .
    rm -rf "$work/bootstrap"
fi
root="$work/root"
rm -rf "$root"
mkdir -p "$root"
tar -C "$root" -xf "$base"
mkdir -p "$root/root/debs"
cp -r "$work/debs/first" "$work/debs/second" "$root/root/debs/"
cp Tests/package/inside.sh "$root/root/inside.sh"
cat > "$root/etc/systemd/system/package-test.service" <<'UNIT'
[Unit]
Description=userstore package checks under PID 1 systemd
After=multi-user.target network-online.target
[Service]
Type=oneshot
ExecStart=/bin/bash /root/inside.sh
StandardOutput=file:/root/inside.log
StandardError=file:/root/inside.log
UNIT
rm -rf /run/systemd/nspawn* 2>/dev/null || true
status=0
systemd-nspawn -q -D "$root" --register=no --keep-unit --console=pipe --resolv-conf=copy-host \
    -b systemd.wants=package-test.service systemd.mask=systemd-firstboot.service </dev/null >"$work/console.log" 2>&1 || status=$?
cat "$root/root/inside.log" 2>/dev/null || { echo "no results; console:"; tail -50 "$work/console.log"; }
rm -rf /run/systemd/nspawn* 2>/dev/null || true
echo "package-test: exit $status"
exit "$status"
