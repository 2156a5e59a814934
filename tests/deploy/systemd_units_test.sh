#!/usr/bin/env bash
# Installs deploy/systemd into a scratch root with install.sh (ExecStart pointed at the
# built binaries) and checks the units:
#   - `systemd-analyze verify` passes with no warning about them (unknown keys, bad
#     values and missing binaries are all reported there);
#   - every ${VAR} that ExecStart uses is set in the unit's /etc/ddp environment file;
#   - the coordinator's state option (DDP_STATE_OPTION) keeps SQLite in /var/lib/ddp by
#     default, also for an environment file written before it existed, and ExecStart,
#     expanded as systemd does, is a command line the built ddp-coordinator accepts
#     with SQLite and with --store (coordinators in standby);
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

# Where the coordinator's state lives: the whole option in DDP_STATE_OPTION, SQLite by
# default (the unit's Environment= covers an older coordinator.env without it), split
# into words on the command line ($VAR unbraced).
coord_env="$tmp/etc/ddp/coordinator.env"
check "${units[0]}" 'Environment="DDP_STATE_OPTION=--state-dir /var/lib/ddp"'
grep -qx 'DDP_STATE_OPTION=--state-dir /var/lib/ddp' "$coord_env" ||
  fail "coordinator.env does not keep the SQLite state in /var/lib/ddp by default"
exec_line=$(sed -n 's/^ExecStart=//p' "${units[0]}")
grep -q ' \$DDP_STATE_OPTION ' <<<"$exec_line" || fail "ExecStart does not split \$DDP_STATE_OPTION into words"
if grep -qE -- '--state-dir|--store' <<<"$exec_line"; then
  fail "ExecStart names --state-dir or --store itself (both at once are refused)"
fi
[ "$(stat -c %a "$coord_env")" = 640 ] || fail "coordinator.env (which may hold the store's password) is not 0640"

# ExecStart as systemd expands it (${VAR}: one word; $VAR: split at whitespace), the
# unit's Environment= first and the environment file over it, run with the built
# coordinator. Exit 1 naming --tls-cert (the example certificates are not there) means
# every flag before them was accepted; a flag error would be exit 2.
run_execstart() {  # ENV_FILE; prints the exit code, the output goes to $tmp/out
  (
    export DDP_STATE_OPTION
    DDP_STATE_OPTION=$(sed -n 's/^Environment="DDP_STATE_OPTION=\(.*\)"$/\1/p' "${units[0]}")
    while IFS= read -r l; do
      [[ $l =~ ^([A-Za-z_][A-Za-z0-9_]*)=(.*)$ ]] || continue
      name=${BASH_REMATCH[1]} value=${BASH_REMATCH[2]}
      [[ $value =~ ^\'(.*)\'$ ]] && value=${BASH_REMATCH[1]}
      export "$name=$value"
    done <"$1"
    eval "args=($(sed 's/\${\([A-Za-z_]*\)}/"${\1}"/g' <<<"$exec_line"))"
    rc=0
    timeout 20 "${args[@]}" >"$tmp/out" 2>&1 || rc=$?
    echo "$rc"
  )
}
if [ -x "$bin/ddp-coordinator" ]; then
  sed 's#^DDP_STATE_OPTION=.*#DDP_STATE_OPTION=--store postgresql://ddp@db.example.com:5432/ddp#
       s#^DDP_COORDINATOR_FLAGS=.*#DDP_COORDINATOR_FLAGS=--advertise-addr coord-a.example.com:29400 --lease-ttl 3s --lease-renew 1s#' \
    "$coord_env" >"$tmp/store.env"
  echo "PGPASSWORD='not a real one'" >>"$tmp/store.env"
  grep -v '^DDP_STATE_OPTION=' "$coord_env" >"$tmp/old.env"
  sed 's#^DDP_STATE_OPTION=.*#DDP_STATE_OPTION=#' "$coord_env" >"$tmp/none.env"
  for case in "default:$coord_env:1" "store:$tmp/store.env:1" "older env file:$tmp/old.env:1" \
              "no state option:$tmp/none.env:2"; do
    IFS=: read -r what file want <<<"$case"
    rc=$(run_execstart "$file")
    if [ "$rc" != "$want" ]; then
      fail "ExecStart with the $what environment exits $rc, not $want: $(head -n 1 "$tmp/out")"
    elif [ "$want" = 1 ] && ! grep -q -- '--tls-cert' "$tmp/out"; then
      fail "ExecStart with the $what environment stops before the certificates: $(head -n 1 "$tmp/out")"
    fi
  done
else
  echo "note: $bin/ddp-coordinator is not built; its command line was not run"
fi

if [ "$failures" -gt 0 ]; then
  echo "0 passed, $failures failed"
  exit 1
fi
echo "systemd units: verified ${units[*]##*/}"
