#!/usr/bin/env bash
# A development CA and the certificates compose.yaml mounts, in deploy/certs/ (git-ignored).
# FOR DEVELOPMENT ONLY: a production deployment uses certificates from its own CA.
#
#     deploy/dev-ca.sh            # from anywhere; writes deploy/certs/
#
# deploy/certs/
#   ca.pem, ca-key.pem            the development CA (its key never leaves this folder)
#   client.pem, client-key.pem    a client certificate (CN=dev-client) for your own clients
#   server/                       what the effect-ledger container mounts at /etc/effect-ledger/tls:
#     server.pem, server-key.pem    the server's certificate chain and key; names: effect-ledger
#                                   (the compose service), localhost, 127.0.0.1, ::1
#     ca.pem                        the CA: client certificates must be signed by it (mTLS), and
#                                   the container's health check trusts the server through it
#     healthcheck.pem, healthcheck-key.pem
#                                   the health check's own client certificate
#
# Refuses to overwrite an existing deploy/certs/ (delete it to start over). Needs openssl.
set -euo pipefail

DAYS_CA=825
DAYS_LEAF=397
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="$here/certs"

if [ -e "$out" ]; then
    echo "dev-ca.sh: $out exists; delete it to make new certificates" >&2
    exit 1
fi
mkdir -p "$out/server"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

new_key() {  # an EC P-256 key, PKCS#8, unencrypted (gRPC cannot ask for a passphrase)
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null
}

# issue NAME CN EXTENSIONS: NAME.pem and NAME-key.pem in $work, signed by the CA.
issue() {
    local name="$1" common_name="$2" extensions="$3"
    new_key "$work/$name-key.pem"
    openssl req -new -key "$work/$name-key.pem" -subj "/O=effect-ledger development/CN=$common_name" \
        -out "$work/$name.csr"
    printf '%s\n' "$extensions" > "$work/$name.ext"
    openssl x509 -req -in "$work/$name.csr" -CA "$out/ca.pem" -CAkey "$out/ca-key.pem" \
        -CAcreateserial -CAserial "$work/ca.srl" -days "$DAYS_LEAF" -sha256 \
        -extfile "$work/$name.ext" -out "$work/$name.pem" 2>/dev/null
}

new_key "$out/ca-key.pem"
chmod 600 "$out/ca-key.pem"
openssl req -x509 -new -key "$out/ca-key.pem" -sha256 -days "$DAYS_CA" \
    -subj "/O=effect-ledger development/CN=effect-ledger development CA" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$out/ca.pem"

leaf="basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature"
issue server effect-ledger "$leaf
extendedKeyUsage=serverAuth
subjectAltName=DNS:effect-ledger,DNS:localhost,IP:127.0.0.1,IP:::1"
issue client dev-client "$leaf
extendedKeyUsage=clientAuth"
issue healthcheck effect-ledger-healthcheck "$leaf
extendedKeyUsage=clientAuth"

cp "$work/client.pem" "$work/client-key.pem" "$out/"
chmod 600 "$out/client-key.pem"
cp "$work/server.pem" "$work/server-key.pem" "$work/healthcheck.pem" "$work/healthcheck-key.pem" "$out/ca.pem" \
    "$out/server/"
# The container runs as uid 10001, not as you, and reads these through a bind mount: they must
# be readable by others. Acceptable for a development CA on your own machine, not beyond it.
chmod 755 "$out/server"
chmod 644 "$out/server/"*

for name in server/server client server/healthcheck; do
    openssl verify -CAfile "$out/ca.pem" "$out/$name.pem" >/dev/null
done
echo "development certificates in $out (CA: ca.pem; server: server/; your client: client.pem, client-key.pem)"
