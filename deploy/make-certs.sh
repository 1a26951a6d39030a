#!/usr/bin/env bash
# Make what a hardened fleet needs, into folder OUT:
#   OUT/certs/ca.crt, ca.key        a certificate authority (keep ca.key offline)
#   OUT/certs/server.pem, .key      the SuperLink's TLS certificate, for HOSTS
#   OUT/keys/client_<i>, .pub       one SuperNode key pair each (ECDSA P-384, OpenSSH format)
# Usage: deploy/make-certs.sh OUT NUM_SUPERNODES HOST [HOST ...]
#   HOST: the names and addresses SuperNodes and admins use to reach the SuperLink,
#   e.g. superlink.example.org 203.0.113.7 (DNS names and IPs both go into subjectAltName).
set -euo pipefail
out=$1 num=$2; shift 2
[ $# -ge 1 ] || { echo "usage: $0 OUT NUM_SUPERNODES HOST [HOST ...]" >&2; exit 2; }
mkdir -p "$out/certs" "$out/keys"
san=""
for h in "$@"; do
  if [[ $h =~ ^[0-9.]+$ || $h == *:* ]]; then san+="IP:$h,"; else san+="DNS:$h,"; fi
done
san=${san%,}
c="$out/certs"
openssl genrsa -out "$c/ca.key" 4096 2>/dev/null
openssl req -new -x509 -key "$c/ca.key" -sha256 -days 365 \
  -subj "/O=fedamp-flwr/CN=fedamp-flwr fleet CA" -out "$c/ca.crt"
openssl genrsa -out "$c/server.key" 4096 2>/dev/null
openssl req -new -key "$c/server.key" -subj "/CN=$1" -addext "subjectAltName=$san" \
  -out "$c/server.csr"
openssl x509 -req -in "$c/server.csr" -CA "$c/ca.crt" -CAkey "$c/ca.key" -CAcreateserial \
  -days 365 -sha256 -copy_extensions copy -out "$c/server.pem" 2>/dev/null
chmod 600 "$c/ca.key" "$c/server.key"
for ((i = 0; i < num; i++)); do
  rm -f "$out/keys/client_$i" "$out/keys/client_$i.pub"
  ssh-keygen -q -t ecdsa -b 384 -N "" -C "supernode $i" -f "$out/keys/client_$i"
done
echo "CA and SuperLink certificate (subjectAltName $san) in $c; $num SuperNode key pairs in $out/keys"
