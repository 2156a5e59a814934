# Sourced by test scripts: claim_port_block claims a block of 16 ports of the script's
# own, as tests/common/ports.h and ddp_test_ports.py do (the same lock files), and sets
# port_block to its first port. The lock is held by an open file descriptor, which the
# script's children inherit: it goes when the script and what it started are gone.
claim_port_block() {
  local here s
  here=$(dirname "${BASH_SOURCE[0]}")
  mkdir -p /tmp/ddp-test-ports && chmod 1777 /tmp/ddp-test-ports 2>/dev/null || true
  for s in $(python3 "$here/ddp_test_ports.py" starts | shuf); do
    exec {port_lock}>>"/tmp/ddp-test-ports/block-$s.lock" || continue
    if flock -n "$port_lock"; then
      chmod 666 "/tmp/ddp-test-ports/block-$s.lock" 2>/dev/null || true
      port_block=$s
      return 0
    fi
    exec {port_lock}>&-
  done
  echo "claim_port_block: every block of test ports in /tmp/ddp-test-ports is claimed" >&2
  return 1
}
