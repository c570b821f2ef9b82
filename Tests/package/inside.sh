#!/bin/bash
# Runs inside a fresh Debian 12 container under PID 1 systemd (Tests/package/package-test.sh) as
# package-test.service: installs, upgrades, removes and purges the userstore package the way an
# operator would. Every check prints "ok: ..." or "FAIL: ..."; the container exits with the
# number of failures.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export DEBIAN_FRONTEND=noninteractive
cd /root
fail=0
check() { if eval "$2"; then echo "ok: $1"; else echo "FAIL: $1"; fail=$((fail + 1)); fi; }
# Waits for a condition (at most 30 s); never a blind sleep.
wait_for() { for _ in $(seq 1 600); do eval "$1" && return 0; sleep 0.05; done; return 1; }
apt_get() { apt-get -q -y -o Dpkg::Options::=--force-confold "$@" > /root/apt.log 2>&1 || { tail -20 /root/apt.log; return 1; }; }
first=$(ls /root/debs/first/userstore_*_amd64.deb)
second=$(ls /root/debs/second/userstore_*_amd64.deb)
invocation() { systemctl show -p InvocationID --value userstored.service; }
active() { [ "$(systemctl is-active "$1")" = active ]; }

echo "== install into a fresh Debian 12: apt pulls the dependencies the package declares"
check "no Swift toolchain in the container" '! command -v swift >/dev/null && [ ! -e /opt/swift ]'
apt_get update
check "apt-get install ./userstore_*.deb" 'apt_get install "$first"'
check "userstored is in /usr/sbin, userstorectl in /usr/bin" '[ -x /usr/sbin/userstored ] && [ -x /usr/bin/userstorectl ]'
check "the binaries need no Swift runtime (ldd finds every library)" '! ldd /usr/sbin/userstored /usr/bin/userstorectl | grep -q "not found"'
check "--version of both binaries is the package's version" \
    '[ "$(userstorectl --version)" = "$(dpkg-query -W -f="\${Version}" userstore | cut -d- -f1)" ] && [ "$(userstored --version)" = "$(userstorectl --version)" ]'
check "the socket unit is enabled and active" 'systemctl is-enabled userstored.socket >/dev/null && wait_for "active userstored.socket"'
check "the service is enabled (through its socket: Also=userstored.socket)" 'systemctl is-enabled userstored.service >/dev/null'
check "the user and groups exist (sysusers)" 'getent passwd userstore >/dev/null && getent group userstore-clients >/dev/null && getent group userstore-admins >/dev/null'
check "the journal catalog is installed and indexed (journalctl -x explains entries)" \
    'journalctl --list-catalog 2>/dev/null | grep -q "userstore"'
check "/etc/userstore/userstored.yaml is a conffile" 'dpkg-query -W -f="\${Conffiles}" userstore | grep -q " /etc/userstore/userstored.yaml "'
check "bash, zsh and fish completions are installed" \
    '[ -s /usr/share/bash-completion/completions/userstorectl ] && [ -s /usr/share/zsh/vendor-completions/_userstorectl ] && [ -s /usr/share/fish/vendor_completions.d/userstorectl.fish ]'
check "docs and the example configuration are under /usr/share/doc/userstore" \
    '[ -s /usr/share/doc/userstore/deploy.md ] && [ -s /usr/share/doc/userstore/examples/userstored.yaml ]'

echo "== userstorectl, as root and as an administrator in the service's group"
check "userstorectl status answers as root" 'userstorectl status | grep -q "^userstored "'
check "the first request started the service (socket activation)" 'wait_for "active userstored.service"'
useradd -m -G userstore-clients,userstore-admins fleetadmin
useradd -m -G userstore-clients appuser
check "userstorectl status answers as an administrator (userstore-admins, and userstore-clients for the socket)" 'runuser -u fleetadmin -- userstorectl status | grep -q "^userstored "'
check "a member of userstore-clients only is refused as an administrator (exit 3)" \
    'runuser -u appuser -- userstorectl status >/dev/null 2>&1; [ $? = 3 ]'
check "a store opens and takes a row" \
    'userstorectl sql alice "CREATE TABLE notes (body TEXT)" >/dev/null && userstorectl sql alice "INSERT INTO notes VALUES (?)" kept >/dev/null'
check "the row is there" 'userstorectl --json sql alice "SELECT count(*) AS n FROM notes" | grep -q "\[\[1\]\]"'

echo "== man pages"
check "man userstorectl renders" 'MANPAGER=cat man userstorectl 2>/dev/null | grep -q "SYNOPSIS"'
check "man userstored (8) and man userstored.yaml (5) render" \
    'MANPAGER=cat man 8 userstored 2>/dev/null | grep -q "SYNOPSIS" && MANPAGER=cat man 5 userstored.yaml 2>/dev/null | grep -q "dataDirectory"'
check "each subcommand has a page (man userstorectl-migrate)" 'MANPAGER=cat man userstorectl-migrate 2>/dev/null | grep -q "SYNOPSIS"'

echo "== upgrade to a rebuilt package with a higher version"
echo "# changed by the operator" >> /etc/userstore/userstored.yaml
before=$(invocation)
check "apt-get install of the higher version" 'apt_get install "$second"'
check "the package is at the higher version" '[ "$(dpkg-query -W -f="\${Version}" userstore)" = "$(dpkg-deb -f "$second" Version)" ]'
check "the service was restarted (a new invocation) and is active" 'wait_for "active userstored.service" && [ "$(invocation)" != "$before" ]'
check "the changed conffile is kept" 'grep -q "^# changed by the operator" /etc/userstore/userstored.yaml'
check "the store is intact" 'userstorectl --json sql alice "SELECT body FROM notes" | grep -q "\[\[\"kept\"\]\]"'

echo "== remove: service stopped, units gone, data and configuration kept"
check "apt-get remove userstore" 'apt_get remove userstore'
check "no userstored process runs" '! pgrep -x userstored >/dev/null'
check "the units are gone" '[ ! -e /lib/systemd/system/userstored.service ] && [ ! -e /lib/systemd/system/userstored.socket ] && ! systemctl cat userstored.service >/dev/null 2>&1'
check "the store is kept" '[ -n "$(find /var/lib/userstore -name "*.sqlite" | head -1)" ]'
check "the configuration is kept" '[ -e /etc/userstore/userstored.yaml ]'

echo "== purge: nothing of the package left; users' stores kept and said so"
check "apt-get purge userstore" 'apt_get purge userstore'
check "the purge said the stores are kept" 'grep -q "kept /var/lib/userstore" /root/apt.log'
check "the configuration and runtime folders are gone" '[ ! -e /etc/userstore ] && [ ! -e /run/userstore ]'
check "dpkg knows nothing of the package" '! dpkg-query -W -f="\${Status}" userstore 2>/dev/null | grep -q installed'
check "no file of the package is left" '[ ! -e /usr/sbin/userstored ] && [ ! -e /usr/bin/userstorectl ] && [ ! -e /usr/libexec/userstore ] && [ ! -e /usr/share/doc/userstore ] && [ ! -e /usr/lib/sysusers.d/userstore.conf ] && [ ! -e /usr/lib/tmpfiles.d/userstore.conf ] && [ ! -e /usr/lib/systemd/catalog/userstored.catalog ]'
check "the stores are kept (users' data)" '[ -n "$(find /var/lib/userstore -name "*.sqlite" | head -1)" ]'
check "the system user and groups stay (Debian's practice, docs/package.md)" 'getent passwd userstore >/dev/null'

echo "== install and purge with no store: /var/lib/userstore goes too"
rm -rf /var/lib/userstore
check "apt-get install again" 'apt_get install "$second" && wait_for "active userstored.socket"'
check "userstorectl status answers" 'userstorectl status | grep -q "^userstored "'
check "apt-get purge" 'apt_get purge userstore'
check "/var/lib/userstore is gone with no store in it" '[ ! -e /var/lib/userstore ]'

echo "failures: $fail"
systemctl exit "$fail" --no-block
