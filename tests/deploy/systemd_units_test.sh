#!/usr/bin/env bash
# Installs deploy/systemd into a scratch root with install.sh (ExecStart pointed at the
# built binaries) and checks the units:
#   - `systemd-analyze verify` passes with no warning about them (unknown keys, bad
#     values and missing binaries are all reported there);
#   - every ${VAR} that ExecStart uses is set in the unit's /etc/ddp environment file;
#   - both are Type=notify, run as the ddp user, sandboxed, and the worker's trainers
#     are bounded and cannot take the agent down with an OOM.
# Usage: systemd_units_test.sh SOURCE_DIR BIN_DIR. Exits 77 (skipped) without
# systemd-analyze.
set -euo pipefail
src=$1
bin=$2
if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "SKIP: systemd-analyze is not installed (Debian package systemd)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

bash "$src/deploy/systemd/install.sh" --root "$tmp" --bindir "$bin" >/dev/null
units=("$tmp/etc/systemd/system/ddp-coordinator.service" "$tmp/etc/systemd/system/ddp-worker.service")
for u in "${units[@]}"; do [ -f "$u" ] || fail "install.sh did not install $u"; done
[ -f "$tmp/etc/ddp/coordinator.env" ] || fail "no /etc/ddp/coordinator.env"
[ -f "$tmp/etc/ddp/worker.env" ] || fail "no /etc/ddp/worker.env"
grep -q '^u ddp ' "$tmp/usr/lib/sysusers.d/ddp.conf" || fail "no sysusers entry for the ddp user"

if ! out=$(systemd-analyze verify "${units[@]}" 2>&1); then
  fail "systemd-analyze verify failed:"
  echo "$out"
elif grep -q 'ddp-' <<<"$out"; then
  fail "systemd-analyze verify warns about our units:"
  echo "$out"
fi

check() {  # unit, then lines that must be in it
  local unit=$1
  shift
  for line in "$@"; do
    grep -qxF "$line" "$unit" || fail "$(basename "$unit") lacks '$line'"
  done
}
common=(Type=notify User=ddp Group=ddp NoNewPrivileges=yes ProtectSystem=strict PrivateTmp=yes
        ProtectHome=yes CapabilityBoundingSet= )
check "${units[0]}" "${common[@]}" EnvironmentFile=/etc/ddp/coordinator.env StateDirectory=ddp \
  PrivateDevices=yes "ExecReload=/bin/kill -HUP \$MAINPID"
check "${units[1]}" "${common[@]}" EnvironmentFile=/etc/ddp/worker.env StateDirectory=ddp-worker \
  OOMPolicy=continue MemoryMax=90% KillMode=mixed DevicePolicy=closed "DeviceAllow=char-nvidia* rw"

for pair in coordinator:ddp-coordinator worker:ddp-worker; do
  env="$tmp/etc/ddp/${pair%%:*}.env"
  unit="$tmp/etc/systemd/system/${pair#*:}.service"
  grep -q "^ExecStart=$bin/${pair#*:} " "$unit" || fail "$(basename "$unit") does not run $bin/${pair#*:}"
  for var in $(grep '^ExecStart=' "$unit" | grep -o '\${\?[A-Z_]*}\?' | tr -d '${}' | sort -u); do
    [ "$var" = MAINPID ] && continue
    grep -q "^$var=" "$env" || fail "$(basename "$unit") uses \$$var, which $(basename "$env") does not set"
  done
  # TLS and tokens come from files (issue 10's flags).
  for flag in --tls-ca --tls-cert --tls-key; do
    grep '^ExecStart=' "$unit" | grep -q -- "$flag " || fail "$(basename "$unit") lacks $flag"
  done
done
grep '^ExecStart=' "${units[0]}" | grep -q -- '--auth-token-file ' || fail "the coordinator lacks --auth-token-file"

if [ "$failures" -gt 0 ]; then
  echo "0 passed, $failures failed"
  exit 1
fi
echo "systemd units: verified ${units[*]##*/}"
