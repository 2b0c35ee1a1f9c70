#!/usr/bin/env bash
# Installs what the tests and the demo need on a fresh Debian machine (as
# root). Idempotent: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v cc >/dev/null 2>&1 || need_apt+=(build-essential)
# C++: libFuzzer, which the fuzz targets link (fuzz/replay.sh in make test).
command -v c++ >/dev/null 2>&1 || need_apt+=(g++)
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need_apt+=(python3-venv)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
command -v tcpdump >/dev/null 2>&1 || need_apt+=(tcpdump)
command -v ping >/dev/null 2>&1 || need_apt+=(iputils-ping)
command -v iperf3 >/dev/null 2>&1 || need_apt+=(iperf3)
command -v strace >/dev/null 2>&1 || need_apt+=(strace)
command -v tshark >/dev/null 2>&1 || need_apt+=(tshark)
# nftables: the lab's policing (001-itr-cross-traffic) and DiffServ marking (002-priority-congestion).
command -v nft >/dev/null 2>&1 || need_apt+=(nftables)
# conntrack: the NAT test flushes a NAT's mappings (tests/python/test_ike.py).
command -v conntrack >/dev/null 2>&1 || need_apt+=(conntrack)
# strongSwan, the IKEv2 interop peer (tests/python/test_ike_strongswan.py):
# charon with the kernel-libipsec userspace data plane, swanctl and pki.
[ -x /usr/lib/ipsec/charon ] && command -v swanctl >/dev/null 2>&1 \
    && [ -e /usr/lib/ipsec/plugins/libstrongswan-kernel-libipsec.so ] \
    || need_apt+=(strongswan-charon strongswan-swanctl libcharon-extra-plugins libstrongswan-standard-plugins)
command -v pki >/dev/null 2>&1 || need_apt+=(strongswan-pki)
# protoc builds etcd-client's gRPC code; etcd runs the cluster agent's tests
# (crates/espgate-cluster) and etcdctl looks into a cluster by hand.
command -v protoc >/dev/null 2>&1 || need_apt+=(protobuf-compiler)
[ -x /usr/bin/etcd ] || need_apt+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || need_apt+=(etcd-client)
# openssl makes the certificates of the agent's etcd-over-TLS test.
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "setup: installing ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # tshark's package would otherwise ask whether non-root users may capture.
    echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
    apt-get update -qq
    apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: cargo (Rust >= 1.88) is required; install it with rustup and re-run" >&2
    exit 1
fi
rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt clippy

if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import scapy, cryptography, pytest' 2>/dev/null; then
    echo "setup: creating .venv with Scapy, cryptography and pytest"
    python3 -m venv .venv
    .venv/bin/pip install -q --upgrade pip
    .venv/bin/pip install -q -r tests/requirements.txt
fi
