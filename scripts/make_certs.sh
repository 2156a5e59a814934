#!/usr/bin/env bash
# Makes everything a secured ddp cluster needs, with openssl, into one directory:
#
#   ca.pem, ca.key                  a private CA (10 years); keep ca.key offline
#   coordinator.pem, .key           the coordinator's server certificate; SANs:
#                                   localhost, 127.0.0.1, ::1, this host's name, and
#                                   every --san given (DNS names or IP addresses)
#   <worker>.pem, <worker>.key      one client certificate per worker (CN and SAN =
#                                   the worker's --name), for mTLS
#   tokens                          the coordinator's --auth-token-file: one admin,
#                                   user and viewer token, and a worker token each
#   admin.token, user.token,        each token alone, for ddpctl --token-file (and
#   viewer.token, <worker>.token    ddp-worker --token-file where mTLS is not used)
#
#   scripts/make_certs.sh DIR [--san NAME_OR_IP]... [--worker NAME]... [--days N]
#
# Without --worker it makes worker-1 and worker-2 (the demo's). Keys and tokens are
# 0600. Run it again into a fresh DIR to rotate: the daemons pick up replaced
# certificate files by themselves, and the coordinator re-reads its token file on
# SIGHUP (or when it changes).
set -euo pipefail

usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[ $# -ge 1 ] || usage
out=$1; shift
sans=() workers=() days=825
while [ $# -gt 0 ]; do
  case "$1" in
    --san) sans+=("$2"); shift 2 ;;
    --worker) workers+=("$2"); shift 2 ;;
    --days) days=$2; shift 2 ;;
    -h|--help) usage ;;
    *) echo "make_certs.sh: unknown argument $1" >&2; usage ;;
  esac
done
[ ${#workers[@]} -gt 0 ] || workers=(worker-1 worker-2)
command -v openssl >/dev/null || { echo "make_certs.sh: needs openssl (apt-get install openssl)" >&2; exit 1; }

mkdir -p "$out"
chmod 700 "$out"
umask 077
cd "$out"

alt_names() {  # Subject alternative names for openssl's -addext.
  local list=() n
  for n in "$@"; do
    if [[ $n =~ ^[0-9.]+$ || $n == *:* ]]; then list+=("IP:$n"); else list+=("DNS:$n"); fi
  done
  local IFS=,
  echo "${list[*]}"
}

if [ ! -s ca.pem ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
    -subj "/CN=ddp cluster CA" -keyout ca.key -out ca.pem \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    2>/dev/null
fi

# issue NAME EXTENDED_KEY_USAGE SAN...: NAME.key and NAME.pem signed by the CA.
issue() {
  local name=$1 eku=$2; shift 2
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$name" \
    -keyout "$name.key.tmp" -out "$name.csr" 2>/dev/null
  printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=%s\nsubjectAltName=%s\n' \
    "$eku" "$(alt_names "$@")" >"$name.ext"
  openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days "$days" \
    -extfile "$name.ext" -out "$name.pem.tmp" 2>/dev/null
  rm -f "$name.csr" "$name.ext"
  # Key first, then certificate, each renamed into place: a watcher never reads a
  # half-written file.
  mv "$name.key.tmp" "$name.key"
  mv "$name.pem.tmp" "$name.pem"
  chmod 644 "$name.pem"
}

issue coordinator serverAuth localhost 127.0.0.1 ::1 "$(hostname)" ${sans[@]+"${sans[@]}"}
for w in "${workers[@]}"; do issue "$w" clientAuth "$w"; done
chmod 644 ca.pem

new_token() { openssl rand -base64 32 | tr -d '=\n' | tr '+/' '-_'; }
{
  echo "# ddp-coordinator --auth-token-file: token role [name]"
  for role in admin user viewer; do
    t=$(new_token); echo "$t" >"$role.token"; echo "$t $role $role"
  done
  for w in "${workers[@]}"; do
    t=$(new_token); echo "$t" >"$w.token"; echo "$t worker $w"
  done
} >tokens.tmp
mv tokens.tmp tokens
echo "make_certs.sh: CA, coordinator and ${#workers[@]} worker certificate(s), and tokens in $out"
