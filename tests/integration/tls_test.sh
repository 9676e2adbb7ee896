#!/usr/bin/env bash
# TLS end to end on a real coordinator: certificates made here with openssl
# (a CA, a server cert for 127.0.0.1/localhost, a client cert).
#  1. server TLS: tandemctl with --tls-ca lists workers; tandemctl without the
#     CA (plaintext) fails with exit 4; a worker with --tls-ca registers and a
#     tiny SFT job (whose engine store channel also uses the CA) succeeds.
#  2. mutual TLS (tls.require_client_cert): a worker with a client cert
#     registers; tandemctl (CA only, no client cert) and a worker without a
#     client cert are refused; tandemctl with --tls-cert/--tls-key lists
#     workers and runs a job to SUCCEEDED (the engine's store channel presents
#     the worker's client cert).
# Fails, naming the package, when openssl is missing.
source "$(dirname "$0")/lib.sh"
require_program openssl openssl
JOB="$TI_DIR/jobs/sft-tiny.yaml"
PKI="$WORK/pki"

# make_pki: ca.pem, server.pem/server.key (SAN IP:127.0.0.1, DNS:localhost),
# client.pem/client.key, all signed by the CA.
make_pki() {
  mkdir -p "$PKI"
  local o=(-nodes -newkey rsa:2048)
  timeout 60 openssl req -x509 "${o[@]}" -days 2 -subj "/CN=tandem-test-ca" \
    -keyout "$PKI/ca.key" -out "$PKI/ca.pem" >/dev/null 2>&1 || fail "openssl: CA"
  timeout 60 openssl req "${o[@]}" -subj "/CN=localhost" \
    -keyout "$PKI/server.key" -out "$PKI/server.csr" >/dev/null 2>&1 || fail "openssl: server csr"
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >"$PKI/server.ext"
  timeout 60 openssl x509 -req -in "$PKI/server.csr" -CA "$PKI/ca.pem" -CAkey "$PKI/ca.key" \
    -CAcreateserial -days 2 -extfile "$PKI/server.ext" -out "$PKI/server.pem" >/dev/null 2>&1 \
    || fail "openssl: server cert"
  timeout 60 openssl req "${o[@]}" -subj "/CN=tandem-worker" \
    -keyout "$PKI/client.key" -out "$PKI/client.csr" >/dev/null 2>&1 || fail "openssl: client csr"
  printf 'extendedKeyUsage=clientAuth\n' >"$PKI/client.ext"
  timeout 60 openssl x509 -req -in "$PKI/client.csr" -CA "$PKI/ca.pem" -CAkey "$PKI/ca.key" \
    -CAcreateserial -days 2 -extfile "$PKI/client.ext" -out "$PKI/client.pem" >/dev/null 2>&1 \
    || fail "openssl: client cert"
  openssl verify -CAfile "$PKI/ca.pem" "$PKI/server.pem" "$PKI/client.pem" >/dev/null || fail "openssl verify"
}

# tctl ARGS: tandemctl over TLS (CA only), bounded.
tctl() { timeout 30 "$TANDEMCTL" --coordinator "$GRPC_ADDR" --token-file "$WORK/admin.token" --tls-ca "$PKI/ca.pem" "$@"; }
worker_listed() { tctl workers --output json | grep -q "\"$1\""; }
worker_idle() { tctl workers --output json | grep "\"$1\"" | grep -q 'WORKER_STATE_IDLE'; }

make_pki

# ---- 1. server-side TLS
log "--- server TLS"
start_coordinator --tls-cert "$PKI/server.pem" --tls-key "$PKI/server.key"
expect_exit 0 tctl workers
expect_exit 0 tctl workers --output json
# No CA: tandemctl speaks plaintext to a TLS port -> cannot reach (exit 4).
expect_exit 4 timeout 30 "$TANDEMCTL" --coordinator "$GRPC_ADDR" --token-file "$WORK/admin.token" workers
[[ -s "$WORK/out.txt" ]] || fail "plaintext tandemctl printed no error"
log "plaintext tandemctl: $(head -c 300 "$WORK/out.txt" | tr '\n' ' ')"
# The wrong CA (the server cert itself is not a CA) is refused as well.
expect_exit 4 timeout 30 "$TANDEMCTL" --coordinator "$GRPC_ADDR" --token-file "$WORK/admin.token" \
  --tls-ca "$PKI/client.pem" workers
# TLS without the admin token: authentication error (5), i.e. TLS itself works.
expect_exit 5 timeout 30 "$TANDEMCTL" --coordinator "$GRPC_ADDR" --tls-ca "$PKI/ca.pem" workers

start_worker tls0 --tls-ca "$PKI/ca.pem"
wait_until 30 worker_idle tls0 || fail "TLS worker did not register"
expect_exit 0 tctl workers
expect_output "tls0"
# A plaintext worker cannot register.
start_worker plain0
# What is tested is that nothing happens: the plaintext worker, retrying,
# stays unregistered for a while (a TLS handshake that fails reaches no RPC
# handler, so no event or metric counts its tries).
sleep 3
worker_listed plain0 && fail "plaintext worker registered with a TLS coordinator"
kill_member TERM plain0

ID=$(tctl submit "$JOB" --workers 1 --set name=sft-tls --set train.steps=2 --set "output_dir=$WORK/final")
[[ -n "$ID" ]] || fail "submit over TLS printed no job id"
expect_exit 0 timeout 240 "$TANDEMCTL" --coordinator "$GRPC_ADDR" --token-file "$WORK/admin.token" \
  --tls-ca "$PKI/ca.pem" watch "$ID"
expect_output "SUCCEEDED"
expect_exit 0 tctl status "$ID" --output json
expect_output "JOB_STATE_SUCCEEDED"
expect_exit 0 tctl logs "$ID"
signal_and_wait TERM tls0 plain0 coordinator
# (signal_and_wait fails the test itself if a process does not stop.)

# ---- 2. mutual TLS
log "--- mutual TLS"
start_coordinator --tls-cert "$PKI/server.pem" --tls-key "$PKI/server.key" \
  --tls-ca "$PKI/ca.pem" --tls-require-client-cert
start_worker mtls0 --tls-ca "$PKI/ca.pem" --tls-cert "$PKI/client.pem" --tls-key "$PKI/client.key"
start_worker nocert0 --tls-ca "$PKI/ca.pem"
# tandemctl without a client certificate: the handshake is refused.
expect_exit 4 tctl workers
log "tandemctl without client cert: $(head -c 300 "$WORK/out.txt" | tr '\n' ' ')"
# The worker with a client cert registers (tandemctl with a client
# certificate lists it), while the one without does not.
mctl() { tctl --tls-cert "$PKI/client.pem" --tls-key "$PKI/client.key" "$@"; }
registered() { mctl workers --output json | grep -q "\"name\":\"$1\""; }
wait_until 30 registered mtls0 || fail "mutual-TLS worker did not register"
# As above, what is tested is that nothing happens for a while.
sleep 2
registered nocert0 && fail "worker without a client cert registered under mutual TLS"
[[ $(cluster exit-code mtls0) == running ]] || fail "mutual-TLS worker exited"
# tandemctl with a client certificate gets in, and a job runs end to end under
# mutual TLS (the worker's engine reaches the rendezvous store with its cert).
expect_exit 0 mctl workers
expect_output "mtls0"
expect_exit 2 tctl --tls-cert "$PKI/client.pem" workers   # cert without key: usage error
ID=$(mctl submit "$JOB" --workers 1 --set name=sft-mtls --set train.steps=2 --set "output_dir=$WORK/final-mtls")
[[ -n "$ID" ]] || fail "submit under mutual TLS printed no job id"
expect_exit 0 timeout 240 "$TANDEMCTL" --coordinator "$GRPC_ADDR" --token-file "$WORK/admin.token" \
  --tls-ca "$PKI/ca.pem" --tls-cert "$PKI/client.pem" --tls-key "$PKI/client.key" watch "$ID"
expect_output "SUCCEEDED"
signal_and_wait TERM mtls0 nocert0 coordinator
log "PASS"
