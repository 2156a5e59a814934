#!/usr/bin/env bash
# Installs ddp's systemd units, environment files and user.
#
#   deploy/systemd/install.sh [--root DIR] [--bindir DIR] [--no-reload]
#
# --bindir  where ddp-coordinator, ddp-worker and ddp-trainer are (default
#           /usr/local/bin); the units' ExecStart lines are pointed there.
# --root    install under DIR instead of / (tests, images); implies --no-reload.
# Existing /etc/ddp/*.env files are kept (new defaults go next to them as .env.new).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=/
bindir=/usr/local/bin
reload=1
while [ $# -gt 0 ]; do
  case "$1" in
    --root) root=$2; reload=0; shift 2 ;;
    --bindir) bindir=$2; shift 2 ;;
    --no-reload) reload=0; shift ;;
    *) echo "install.sh: unknown argument $1 (see the comment at the top)" >&2; exit 2 ;;
  esac
done
case "$bindir" in
  /*) ;;
  *) echo "install.sh: --bindir must be an absolute path (got $bindir)" >&2; exit 2 ;;
esac
for b in ddp-coordinator ddp-worker ddp-trainer; do
  [ -x "$bindir/$b" ] || echo "install.sh: warning: $bindir/$b is not there yet" >&2
done

units="$root/etc/systemd/system"
etc="$root/etc/ddp"
sysusers="$root/usr/lib/sysusers.d"
install -d -m 0755 "$units" "$sysusers"
install -d -m 0750 "$etc" "$etc/tls"
for u in ddp-coordinator.service ddp-worker.service; do
  sed "s#/usr/local/bin/#${bindir%/}/#g" "$here/$u" > "$units/$u.tmp"
  chmod 0644 "$units/$u.tmp"
  mv "$units/$u.tmp" "$units/$u"
done
for e in coordinator.env worker.env; do
  if [ -e "$etc/$e" ]; then
    install -m 0640 "$here/$e" "$etc/$e.new"
    echo "install.sh: kept $etc/$e; the current defaults are in $e.new"
  else
    install -m 0640 "$here/$e" "$etc/$e"
  fi
done
install -m 0644 "$here/ddp.sysusers" "$sysusers/ddp.conf"

if [ "$reload" -eq 1 ]; then
  systemd-sysusers "$sysusers/ddp.conf"
  chgrp -R ddp "$etc"
  systemctl daemon-reload
  echo "install.sh: installed; edit $etc/*.env, put certificates in $etc/tls, then"
  echo "  systemctl enable --now ddp-coordinator   # on the coordinator's host"
  echo "  systemctl enable --now ddp-worker        # on every node"
fi
