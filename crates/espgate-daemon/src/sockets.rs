//! The outer-side sockets and the inbound header synthesis.
//!
//! - [`UdpSock`]: ESP-in-UDP (RFC 3948) on `gateway.listen`. The kernel
//!   strips the outer IP and UDP headers, so for the core, which classifies
//!   whole IP packets, [`push_udp_outer`] writes a synthetic outer IP + UDP
//!   header into the buffer's headroom: source = the sender's address and
//!   port, destination = the address the packet was sent to
//!   (`IP_PKTINFO` / `IPV6_PKTINFO`), protocol UDP, and the received TOS /
//!   traffic class (`IP_RECVTOS` / `IPV6_RECVTCLASS`), which RFC 6040 ECN
//!   decapsulation needs.
//! - [`RawRx`]: raw ESP or AH (`encap = "none"`). An IPv4 raw socket
//!   delivers the whole IPv4 packet; an IPv6 raw socket delivers only what
//!   follows the IPv6 header and its extension headers, so
//!   [`push_ipv6_outer`] rebuilds a minimal IPv6 header. AH over IPv6
//!   authenticates the extension headers, which are lost: AH over IPv6
//!   with extension headers before it is not supported through raw sockets
//!   (the ICV check fails).
//! - [`RawTx`]: sends complete outer packets built by the core with
//!   `IPPROTO_RAW` (header included: IPv4 implies `IP_HDRINCL`, IPv6 sets
//!   `IPV6_HDRINCL`, Linux 4.5+), so AH's ICV over the outer header stays
//!   valid.

use crate::sys::{self, context};
use espgate_core::wire::{ipv4, ipv6, proto, udp};
use espgate_core::{DropReason, PResult, PacketBuf};
use nix::sys::socket::{setsockopt, sockopt as nixopt, MsgFlags};
use rustix::net::sockopt::{self, Ipv4PathMtuDiscovery, Ipv6PathMtuDiscovery};
use rustix::net::{AddressFamily, Protocol, SocketFlags, SocketType};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::num::NonZeroU32;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

// `IPV6_HDRINCL` (Linux 4.5+) is in neither `rustix` 1.1 nor `nix` 0.31;
// `nix`'s exported macro for socket options defines it (its expansion
// calls the `setsockopt_impl!` and `sockopt_impl!` macros by name).
use nix::{getsockopt_impl, setsockopt_impl, sockopt_impl};
sockopt_impl!(
    /// `IPV6_HDRINCL`: the application writes the IPv6 header.
    Ipv6HdrIncl,
    SetOnly,
    libc::IPPROTO_IPV6,
    libc::IPV6_HDRINCL,
    bool
);

sockopt_impl!(
    /// `SO_ATTACH_FILTER`: a classic BPF program run on every datagram
    /// before it is queued on the socket (absent from `nix` 0.31).
    AttachFilter,
    SetOnly,
    libc::SOL_SOCKET,
    libc::SO_ATTACH_FILTER,
    libc::sock_fprog
);
sockopt_impl!(
    /// `SO_MEMINFO`: the socket's memory counters; index
    /// `SK_MEMINFO_DROPS` counts the datagrams the kernel dropped at this
    /// socket (its filter refused them, or the receive buffer was full).
    MemInfo,
    GetOnly,
    libc::SOL_SOCKET,
    libc::SO_MEMINFO,
    [u32; 9]
);

/// Socket buffer size asked for on every outer socket.
pub const DEFAULT_SOCK_BUF: usize = 4 << 20;

/// Socket buffer size of the sockets opened from now on
/// (`gateway.socket_buffer`; set once at start-up).
static SOCK_BUF_BYTES: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(DEFAULT_SOCK_BUF);

/// Sets the send and receive buffer size of the sockets opened from now on.
pub fn set_buffer_size(bytes: usize) {
    SOCK_BUF_BYTES.store(bytes, std::sync::atomic::Ordering::Relaxed);
}

fn buf_size() -> usize {
    SOCK_BUF_BYTES.load(std::sync::atomic::Ordering::Relaxed)
}

fn family(v6: bool) -> AddressFamily {
    if v6 {
        AddressFamily::INET6
    } else {
        AddressFamily::INET
    }
}

/// TTL / hop limit written into synthetic headers (not checked by the core).
const SYNTH_TTL: u8 = 64;

/// The UDP socket for ESP-in-UDP.
#[derive(Debug)]
pub struct UdpSock {
    fd: OwnedFd,
    v6: bool,
    /// The address bound.
    pub local: SocketAddr,
}

impl UdpSock {
    /// Binds `listen`; an unspecified IPv6 address also receives IPv4
    /// (`IPV6_V6ONLY` cleared). Marks outgoing packets with `mark`. With
    /// `fragment`, datagrams larger than the path MTU are fragmented by the
    /// kernel (path MTU discovery off, DF clear) rather than refused.
    pub fn open(listen: SocketAddr, mark: Option<u32>, fragment: bool) -> io::Result<UdpSock> {
        UdpSock::open_with(listen, mark, fragment, false)
    }

    /// [`UdpSock::open`]; with `reuseport`, `SO_REUSEPORT` is set before
    /// binding, so that one socket per worker binds the same address (see
    /// [`UdpSock::steer_by_spi`]).
    pub fn open_with(
        listen: SocketAddr,
        mark: Option<u32>,
        fragment: bool,
        reuseport: bool,
    ) -> io::Result<UdpSock> {
        let v6 = listen.is_ipv6();
        let fd =
            rustix::net::socket_with(family(v6), SocketType::DGRAM, SocketFlags::CLOEXEC, None)
                .map_err(context("creating the UDP socket"))?;
        if reuseport {
            sockopt::set_socket_reuseport(&fd, true).map_err(context("setting SO_REUSEPORT"))?;
        }
        if v6 {
            sockopt::set_ipv6_v6only(&fd, false).map_err(context("clearing IPV6_V6ONLY"))?;
            setsockopt(&fd, nixopt::Ipv6RecvPacketInfo, &true)
                .map_err(context("setting IPV6_RECVPKTINFO"))?;
            sockopt::set_ipv6_recvtclass(&fd, true).map_err(context("setting IPV6_RECVTCLASS"))?;
        }
        // On an IPv6 socket these apply to the IPv4 packets it receives.
        setsockopt(&fd, nixopt::Ipv4PacketInfo, &true).map_err(context("setting IP_PKTINFO"))?;
        sockopt::set_ip_recvtos(&fd, true).map_err(context("setting IP_RECVTOS"))?;
        sys::set_buffers(fd.as_fd(), buf_size());
        if let Some(m) = mark {
            crate::netdev::set_socket_mark(&fd, m)?;
        }
        if fragment {
            sockopt::set_ip_mtu_discover(&fd, Ipv4PathMtuDiscovery::DONT)
                .map_err(context("setting IP_MTU_DISCOVER"))?;
            if v6 {
                sockopt::set_ipv6_mtu_discover(&fd, Ipv6PathMtuDiscovery::DONT)
                    .map_err(context("setting IPV6_MTU_DISCOVER"))?;
            }
        }
        rustix::net::bind(&fd, &listen).map_err(|e| {
            let e = io::Error::from(e);
            io::Error::new(e.kind(), format!("binding {listen}: {e}"))
        })?;
        Ok(UdpSock {
            fd,
            v6,
            local: listen,
        })
    }

    /// The address the socket is bound to, with the port the kernel chose
    /// if `listen` had port 0.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        let a = rustix::net::getsockname(&self.fd)?;
        SocketAddr::try_from(a).map_err(io::Error::from)
    }

    /// Steers the datagrams of this socket's `SO_REUSEPORT` group (`n`
    /// sockets, bound in order) by ESP SPI: a classic BPF program loads the
    /// first four bytes of the UDP payload (the SPI of an ESP-in-UDP packet,
    /// RFC 3948) and picks socket `SPI % n`. A datagram shorter than four
    /// bytes (a NAT keepalive) ends the program with 0, and an IKE packet
    /// on port 4500 starts with the zero non-ESP marker: both go to socket
    /// 0. Each datagram is steered on its own as long as UDP GRO is off.
    pub fn steer_by_spi(&self, n: u32) -> io::Result<()> {
        let mut prog = [
            sock_insn(BPF_LD_W_ABS, 0, 0, 0),
            sock_insn(BPF_ALU_MOD_K, 0, 0, n.max(1)),
            sock_insn(BPF_RET_A, 0, 0, 0),
        ];
        attach(&self.fd, nixopt::AttachReusePortCbpf, &mut prog)
            .map_err(context("attaching the SO_REUSEPORT steering program"))
    }

    /// Lets only datagrams that may be ours reach the socket queue (see
    /// [`spi_filter_program`]): a flood of junk ESP is then dropped in
    /// the kernel's receive path, before it is queued, copied and woken up
    /// for. `None`, or a program too long for the kernel, removes the
    /// filter (an error says which).
    pub fn set_spi_filter(&self, rules: Option<(&[SpiRule], bool)>) -> io::Result<()> {
        let prog = rules.map(|(r, other)| spi_filter_program(r, other));
        let (mut prog, too_long) = match prog {
            Some(Some(p)) => (p, false),
            // Keep everything (detaching fails when nothing is attached;
            // an accept-all program never does).
            other => (vec![sock_insn(BPF_RET_K, 0, 0, ACCEPT)], other.is_some()),
        };
        // The kernel swaps the new program in atomically.
        attach(&self.fd, AttachFilter, &mut prog).map_err(context("attaching the SPI filter"))?;
        if too_long {
            return Err(io::Error::other(format!(
                "more inbound SPIs than one SPI filter holds ({SPI_FILTER_MAX} per worker)"
            )));
        }
        Ok(())
    }

    /// Datagrams the kernel dropped at this socket since it was opened:
    /// refused by its filter or arriving to a full receive buffer.
    pub fn kernel_drops(&self) -> io::Result<u32> {
        let m = nix::sys::socket::getsockopt(&self.fd, MemInfo)
            .map_err(context("reading SO_MEMINFO"))?;
        Ok(m[libc::SK_MEMINFO_DROPS as usize])
    }

    /// Receives one datagram (without blocking) into `buf`.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<(usize, sys::RecvMeta)> {
        sys::recv_meta(self.fd.as_fd(), buf, MsgFlags::MSG_DONTWAIT)
    }

    /// Sends `payload` (what follows the UDP header) to `dst` with DS byte
    /// `tos`, from the local address `src` when given (else the route's
    /// choice). Blocks while the socket buffer is full (back-pressure).
    pub fn send(
        &self,
        payload: &[u8],
        dst: SocketAddr,
        tos: u8,
        src: Option<IpAddr>,
    ) -> io::Result<usize> {
        let data = [io::IoSlice::new(payload)];
        sys::send_iov(self.fd.as_fd(), &data, dst, Some(tos), src, self.v6, None)
    }

    /// Sends `payload` to `dst` from the local address `src` (IKE answers
    /// leave from the address their request was sent to; see
    /// [`sys::send_from`]).
    pub fn send_from(&self, payload: &[u8], src: IpAddr, dst: SocketAddr) -> io::Result<usize> {
        sys::send_from(self.fd.as_fd(), payload, src, dst, self.v6)
    }

    /// Asks the kernel to coalesce received datagrams (`UDP_GRO`); [`recv`]
    /// then reports the segment size in `RecvMeta::gro_size`. False when
    /// the kernel refuses.
    ///
    /// [`recv`]: UdpSock::recv
    pub fn enable_gro(&self) -> bool {
        setsockopt(&self.fd, nixopt::UdpGroSegment, &true).is_ok()
    }

    /// One `UDP_SEGMENT` send of the concatenated `payloads`: datagrams of
    /// `seg` bytes each (the last may be shorter), all to `dst`, from `src`
    /// when given.
    pub fn send_gso(
        &self,
        payloads: &[io::IoSlice<'_>],
        seg: u16,
        dst: SocketAddr,
        tos: u8,
        src: Option<IpAddr>,
    ) -> io::Result<usize> {
        sys::send_iov(
            self.fd.as_fd(),
            payloads,
            dst,
            Some(tos),
            src,
            self.v6,
            Some(seg),
        )
    }
}

impl UdpSock {
    /// One `sendmmsg` of `msgs`, each to its own destination with its own
    /// TOS, source and GSO size (see [`sys::send_msgs`]): how many the
    /// kernel took, or the first one's error.
    pub fn send_msgs(&self, msgs: &[sys::Msg<'_>]) -> io::Result<usize> {
        sys::send_msgs(self.fd.as_fd(), msgs, self.v6)
    }

    /// One `sendmsg` of message `m` (see [`sys::send_iov`]).
    pub fn send_msg(&self, m: &sys::Msg<'_>) -> io::Result<usize> {
        sys::send_iov(self.fd.as_fd(), m.iov, m.dst, m.tos, m.src, self.v6, m.gso)
    }
}

impl AsFd for UdpSock {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

const BPF_LD_W_LEN: u16 = 0x80; // BPF_LD | BPF_W | BPF_LEN
const BPF_LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const BPF_JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
const BPF_JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const BPF_ALU_MOD_K: u16 = 0x94; // BPF_ALU | BPF_MOD | BPF_K
const BPF_RET_A: u16 = 0x16; // BPF_RET | BPF_A
const BPF_RET_K: u16 = 0x06; // BPF_RET | BPF_K
/// A filter's "keep the whole datagram".
const ACCEPT: u32 = u32::MAX;

/// Attaches the classic BPF program `prog` with socket option `opt`.
fn attach<O>(fd: &OwnedFd, opt: O, prog: &mut [libc::sock_filter]) -> nix::Result<()>
where
    O: nix::sys::socket::SetSockOpt<Val = libc::sock_fprog>,
{
    // `fprog` points at `prog`, both live for the call; the kernel copies
    // the program.
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_mut_ptr(),
    };
    setsockopt(fd, opt, &fprog)
}

fn sock_insn(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The most inbound SPIs a filter lists; beyond it the socket has no
/// filter. Each costs two to eleven instructions (the kernel allows 4096)
/// and a compare per datagram: 256 keep a datagram's worst case near a
/// quarter of a microsecond with the kernel's BPF JIT.
pub const SPI_FILTER_MAX: usize = 256;

/// The kernel's limit on a classic BPF program (`BPF_MAXINSNS`).
const BPF_MAXINSNS: usize = 4096;

/// Classic BPF's base for loads relative to the network (IP) header.
const SKF_NET_OFF: i32 = -0x10_0000;

/// What [`spi_filter_program`] does with the datagrams of one SPI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct SpiRule {
    /// The inbound SPI.
    pub spi: u32,
    /// Keep its datagrams only from this source address (the peer's);
    /// `None`: from anywhere.
    pub only_from: Option<IpAddr>,
}

/// The classic BPF program of [`UdpSock::set_spi_filter`], `None` when
/// it would be too long ([`SPI_FILTER_MAX`] rules, or the kernel's
/// instruction limit). A socket filter sees a UDP datagram from its UDP
/// header on, so the payload's first word (the SPI of ESP-in-UDP, RFC
/// 3948) is at offset 8, and the IP header is reached through
/// `SKF_NET_OFF`. The program keeps:
/// - datagrams with fewer than 4 payload bytes (NAT keepalives: the
///   engine counts them, and anything malformed);
/// - payloads starting with the zero non-ESP marker (IKE on port 4500);
/// - payloads starting with a rule's SPI, from its `only_from` address if
///   it names one (IPv4 source at IP offset 12, IPv6 at 8);
///
/// and gives every other datagram `other_spis` (keep or drop). With UDP
/// GRO a coalesced train (one sender's datagrams, one 5-tuple) is judged
/// by its first datagram. The rules are scanned in order: a linear scan is
/// what classic BPF offers (no maps; jumps reach 255 ahead), and for the
/// few SPIs a gateway has it costs a handful of compares.
pub fn spi_filter_program(rules: &[SpiRule], other_spis: bool) -> Option<Vec<libc::sock_filter>> {
    if rules.len() > SPI_FILTER_MAX {
        return None;
    }
    let net = |off: i32| (SKF_NET_OFF + off) as u32;
    let mut p = Vec::with_capacity(8 + 4 * rules.len());
    p.push(sock_insn(BPF_LD_W_LEN, 0, 0, 0));
    // len >= 12: go on to the SPI; else keep.
    p.push(sock_insn(BPF_JGE_K, 1, 0, 12));
    p.push(sock_insn(BPF_RET_K, 0, 0, ACCEPT));
    p.push(sock_insn(BPF_LD_W_ABS, 0, 0, 8));
    p.push(sock_insn(BPF_JEQ_K, 0, 1, 0));
    p.push(sock_insn(BPF_RET_K, 0, 0, ACCEPT));
    for r in rules {
        // The source address's words and where they sit in the IP header.
        let (words, at): (Vec<u32>, i32) = match r.only_from {
            None => (Vec::new(), 0),
            Some(IpAddr::V4(a)) => (vec![u32::from(a)], 12),
            Some(IpAddr::V6(a)) => (
                a.octets()
                    .chunks_exact(4)
                    .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
                8,
            ),
        };
        // This SPI's block: [ld word, jeq word]..., keep, drop (or just
        // keep); the SPI stays in A for the next rule's compare only when
        // the block is skipped.
        let block = if words.is_empty() {
            1
        } else {
            2 * words.len() + 2
        };
        p.push(sock_insn(BPF_JEQ_K, 0, block as u8, r.spi));
        for (i, w) in words.iter().enumerate() {
            p.push(sock_insn(BPF_LD_W_ABS, 0, 0, net(at + 4 * i as i32)));
            // Unequal: on to the block's drop, past the remaining words
            // and the keep.
            let to_drop = 2 * (words.len() - i - 1) + 1;
            p.push(sock_insn(BPF_JEQ_K, 0, to_drop as u8, *w));
        }
        p.push(sock_insn(BPF_RET_K, 0, 0, ACCEPT));
        if !words.is_empty() {
            p.push(sock_insn(BPF_RET_K, 0, 0, 0));
        }
    }
    p.push(sock_insn(
        BPF_RET_K,
        0,
        0,
        if other_spis { ACCEPT } else { 0 },
    ));
    (p.len() <= BPF_MAXINSNS).then_some(p)
}

/// A raw socket receiving ESP or AH of one address family.
#[derive(Debug)]
pub struct RawRx {
    fd: OwnedFd,
    /// IPv6 (payload only) or IPv4 (whole packet).
    pub v6: bool,
    /// `proto::ESP` or `proto::AH`.
    pub proto: u8,
}

impl RawRx {
    /// Opens the socket (needs `CAP_NET_RAW`).
    pub fn open(v6: bool, proto: u8) -> io::Result<RawRx> {
        let protocol = NonZeroU32::new(u32::from(proto))
            .map(Protocol::from_raw)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "IP protocol 0"))?;
        let fd = rustix::net::socket_with(
            family(v6),
            SocketType::RAW,
            SocketFlags::CLOEXEC,
            Some(protocol),
        )
        .map_err(context("creating the raw socket"))?;
        if v6 {
            setsockopt(&fd, nixopt::Ipv6RecvPacketInfo, &true)
                .map_err(context("setting IPV6_RECVPKTINFO"))?;
            sockopt::set_ipv6_recvtclass(&fd, true).map_err(context("setting IPV6_RECVTCLASS"))?;
        }
        sys::set_buffers(fd.as_fd(), buf_size());
        Ok(RawRx { fd, v6, proto })
    }

    /// Receives one packet (without blocking) into `buf`.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<(usize, sys::RecvMeta)> {
        sys::recv_meta(self.fd.as_fd(), buf, MsgFlags::MSG_DONTWAIT)
    }
}

impl AsFd for RawRx {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A header-included raw socket sending complete outer packets.
#[derive(Debug)]
pub struct RawTx {
    fd: OwnedFd,
    v6: bool,
}

impl RawTx {
    /// Opens the socket for one family, marking packets with `mark`.
    pub fn open(v6: bool, mark: Option<u32>) -> io::Result<RawTx> {
        let fd = rustix::net::socket_with(
            family(v6),
            SocketType::RAW,
            SocketFlags::CLOEXEC,
            Some(rustix::net::ipproto::RAW),
        )
        .map_err(context("creating the IPPROTO_RAW socket"))?;
        if v6 {
            // IPPROTO_RAW implies it on current kernels; say so anyway.
            setsockopt(&fd, Ipv6HdrIncl, &true).map_err(context("setting IPV6_HDRINCL"))?;
        }
        sys::set_buffers(fd.as_fd(), buf_size());
        if let Some(m) = mark {
            crate::netdev::set_socket_mark(&fd, m)?;
        }
        Ok(RawTx { fd, v6 })
    }

    /// Sends each of `pkts` (IP packets, headers included) to `dst` in one
    /// system call: how many were sent, or the first one's error
    /// ([`sys::send_each`]).
    pub fn send_each(&self, pkts: &[io::IoSlice<'_>], dst: IpAddr) -> io::Result<usize> {
        debug_assert_eq!(dst.is_ipv6(), self.v6);
        sys::send_each(self.fd.as_fd(), pkts, SocketAddr::new(dst, 0))
    }
}

/// The source address each connection's ESP-in-UDP names when it leaves
/// through a UDP socket bound to `listen`, by connection: `(name, local,
/// carried in UDP)`. A socket bound to one address sends from it, so
/// nothing is needed. A socket bound to the wildcard address would send
/// from whichever address the route to the peer prefers, which on a
/// gateway with several addresses need not be the connection's `local`
/// (the tunnel endpoint the peer, its firewall and any NAT expect), so
/// each datagram names `local`. A `local` that is not an address of this
/// host (a bind to it fails: e.g. the public address of a 1:1 NAT in
/// front of us) cannot be named; that is logged and left to the route.
pub fn udp_sources<'a>(
    listen: Option<SocketAddr>,
    conns: impl Iterator<Item = (&'a str, IpAddr, bool)>,
) -> Vec<Option<IpAddr>> {
    let wildcard = listen.is_some_and(|l| l.ip().is_unspecified());
    conns
        .map(|(name, local, udp)| {
            if !(udp && wildcard) || local.is_unspecified() {
                return None;
            }
            match std::net::UdpSocket::bind(SocketAddr::new(local, 0)) {
                Ok(_) => Some(local),
                Err(e) => {
                    tracing::warn!(
                        "connection \"{name}\": local {local} is not an address of this host \
                         ({e}); its ESP-in-UDP leaves from the address the route to the peer \
                         prefers"
                    );
                    None
                }
            }
        })
        .collect()
}

fn v4(a: IpAddr) -> Option<Ipv4Addr> {
    match a {
        IpAddr::V4(v) => Some(v),
        IpAddr::V6(v) => v.to_ipv4_mapped(),
    }
}

fn v6(a: IpAddr) -> Ipv6Addr {
    match a {
        IpAddr::V4(v) => v.to_ipv6_mapped(),
        IpAddr::V6(v) => v,
    }
}

/// Puts a synthetic outer IP + UDP header in front of the UDP payload in
/// `buf`: from `src` to `dst`, with DS byte `tos`. IPv4 when both
/// addresses are IPv4 (or IPv4-mapped), else IPv6. The UDP checksum is
/// left zero (the kernel verified the real one).
pub fn push_udp_outer(
    buf: &mut PacketBuf,
    src: SocketAddr,
    dst: SocketAddr,
    tos: u8,
) -> PResult<()> {
    let payload_len = buf.len();
    let udp_len = payload_len + udp::HEADER_LEN;
    match (v4(src.ip()), v4(dst.ip())) {
        (Some(s), Some(d)) => {
            if ipv4::MIN_HEADER_LEN + udp_len > usize::from(u16::MAX) {
                return Err(DropReason::TooBig);
            }
            let p = buf.push_front(ipv4::MIN_HEADER_LEN + udp::HEADER_LEN);
            ipv4::Ipv4Repr {
                src: s,
                dst: d,
                protocol: proto::UDP,
                tos,
                ident: 0,
                dont_frag: false,
                ttl: SYNTH_TTL,
                payload_len: udp_len,
            }
            .emit(p)?;
            udp::emit(
                &mut p[ipv4::MIN_HEADER_LEN..],
                src.port(),
                dst.port(),
                payload_len,
            )
        }
        _ => {
            if udp_len > usize::from(u16::MAX) {
                return Err(DropReason::TooBig);
            }
            let p = buf.push_front(ipv6::HEADER_LEN + udp::HEADER_LEN);
            ipv6::Ipv6Repr {
                src: v6(src.ip()),
                dst: v6(dst.ip()),
                next_header: proto::UDP,
                traffic_class: tos,
                flow_label: 0,
                hop_limit: SYNTH_TTL,
                payload_len: udp_len,
            }
            .emit(p)?;
            udp::emit(
                &mut p[ipv6::HEADER_LEN..],
                src.port(),
                dst.port(),
                payload_len,
            )
        }
    }
}

/// [`push_udp_outer`] that remembers the last header it wrote and copies
/// it when the next datagram has the same addresses, DS byte and length:
/// every segment of a `UDP_GRO` read but the last does (the header costs a
/// copy of 28 or 48 bytes instead of being built and checksummed again).
#[derive(Debug)]
pub struct UdpOuter {
    /// Source, destination, DS byte and payload length of `hdr`.
    last: Option<(SocketAddr, SocketAddr, u8, usize)>,
    hdr: [u8; ipv6::HEADER_LEN + udp::HEADER_LEN],
    len: usize,
}

impl Default for UdpOuter {
    fn default() -> Self {
        UdpOuter {
            last: None,
            hdr: [0; ipv6::HEADER_LEN + udp::HEADER_LEN],
            len: 0,
        }
    }
}

impl UdpOuter {
    /// [`push_udp_outer`]`(buf, src, dst, tos)`, the same bytes.
    pub fn push(
        &mut self,
        buf: &mut PacketBuf,
        src: SocketAddr,
        dst: SocketAddr,
        tos: u8,
    ) -> PResult<()> {
        let key = (src, dst, tos, buf.len());
        if self.last == Some(key) {
            buf.push_front(self.len)[..self.len].copy_from_slice(&self.hdr[..self.len]);
            return Ok(());
        }
        push_udp_outer(buf, src, dst, tos)?;
        let n = buf.len() - key.3;
        self.hdr[..n].copy_from_slice(&buf.as_slice()[..n]);
        self.len = n;
        self.last = Some(key);
        Ok(())
    }
}

/// Puts a minimal IPv6 header (no extension headers) in front of what an
/// IPv6 raw socket delivered for protocol `next_header`.
pub fn push_ipv6_outer(
    buf: &mut PacketBuf,
    src: Ipv6Addr,
    dst: Ipv6Addr,
    next_header: u8,
    tclass: u8,
) -> PResult<()> {
    let payload_len = buf.len();
    if payload_len > usize::from(u16::MAX) {
        return Err(DropReason::TooBig);
    }
    let p = buf.push_front(ipv6::HEADER_LEN);
    ipv6::Ipv6Repr {
        src,
        dst,
        next_header,
        traffic_class: tclass,
        flow_label: 0,
        hop_limit: SYNTH_TTL,
        payload_len,
    }
    .emit(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use espgate_core::sa::{classify, Classified, Classifier};
    use espgate_core::wire::ip;

    /// The datagrams `sock` receives within a moment, by payload.
    fn drain(sock: &UdpSock) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        let mut buf = [0u8; 2048];
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
        while std::time::Instant::now() < deadline {
            match sock.recv(&mut buf) {
                Ok((n, _)) => got.push(buf[..n].to_vec()),
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
            }
        }
        got
    }

    fn esp(spi: u32) -> Vec<u8> {
        let mut p = spi.to_be_bytes().to_vec();
        p.extend_from_slice(&[0, 0, 0, 1, 0xaa, 0xbb]);
        p
    }

    fn rule(spi: u32, only_from: Option<&str>) -> SpiRule {
        SpiRule {
            spi,
            only_from: only_from.map(|a| a.parse().unwrap()),
        }
    }

    #[test]
    fn spi_filter_keeps_known_spis_ike_and_short_datagrams_on_loopback() {
        let sock = UdpSock::open("127.0.0.1:0".parse().unwrap(), None, false).unwrap();
        let to = sock.local_addr().unwrap();
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let rules = [rule(0x1000, None), rule(0x2000, None)];
        sock.set_spi_filter(Some((&rules, false))).unwrap();
        // esp(0) starts with the non-ESP marker: IKE, kept.
        let kept = [
            esp(0x1000),
            esp(0x2000),
            esp(0),
            vec![0, 0, 0, 0, 0x21, 0x20],
            vec![0xff],
            b"abc".to_vec(),
        ];
        let dropped = [esp(0x3000), esp(0x1001)];
        let before = sock.kernel_drops().unwrap();
        for p in kept.iter().chain(&dropped) {
            tx.send_to(p, to).unwrap();
        }
        let mut got = drain(&sock);
        got.sort();
        let mut want = kept.to_vec();
        want.sort();
        assert_eq!(got, want);
        assert_eq!(sock.kernel_drops().unwrap() - before, 2);
        // Other SPIs kept: only the rules' sources are checked.
        sock.set_spi_filter(Some((&rules, true))).unwrap();
        tx.send_to(&esp(0x3000), to).unwrap();
        assert_eq!(drain(&sock), vec![esp(0x3000)]);
        // Removed: everything arrives again.
        sock.set_spi_filter(None).unwrap();
        tx.send_to(&esp(0x3000), to).unwrap();
        assert_eq!(drain(&sock), vec![esp(0x3000)]);
        // Too many SPIs for one program: no filter rather than a wrong
        // one, and an error that says so.
        let many: Vec<SpiRule> = (1..=SPI_FILTER_MAX as u32 + 1)
            .map(|s| rule(s, None))
            .collect();
        assert!(spi_filter_program(&many, false).is_none());
        assert!(sock.set_spi_filter(Some((&many, false))).is_err());
        tx.send_to(&esp(0x7fff_0000), to).unwrap();
        assert_eq!(drain(&sock), vec![esp(0x7fff_0000)]);
        // The longest program: the last SPI still kept.
        let last: Vec<SpiRule> = (1..=SPI_FILTER_MAX as u32)
            .map(|s| rule(s, Some("2001:db8::1")))
            .collect();
        assert!(spi_filter_program(&last, false).is_some_and(|p| p.len() <= BPF_MAXINSNS));
        let mut last = last;
        last[SPI_FILTER_MAX - 1] = rule(SPI_FILTER_MAX as u32, None);
        sock.set_spi_filter(Some((&last, false))).unwrap();
        tx.send_to(&esp(SPI_FILTER_MAX as u32), to).unwrap();
        tx.send_to(&esp(0x7fff_0000), to).unwrap();
        assert_eq!(drain(&sock), vec![esp(SPI_FILTER_MAX as u32)]);
    }

    #[test]
    fn spi_filter_pins_sources_on_loopback() {
        // 127.0.0.1 sends; 127.0.0.2 is another source on loopback.
        let sock = UdpSock::open("127.0.0.1:0".parse().unwrap(), None, false).unwrap();
        let to = sock.local_addr().unwrap();
        let tx1 = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx2 = std::net::UdpSocket::bind("127.0.0.2:0").unwrap();
        let rules = [
            rule(0x1000, Some("127.0.0.1")),
            rule(0x2000, Some("127.0.0.2")),
            rule(0x3000, Some("2001:db8::1")),
            rule(0x4000, None),
        ];
        sock.set_spi_filter(Some((&rules, true))).unwrap();
        for spi in [0x1000, 0x2000, 0x3000, 0x4000, 0x5000] {
            tx1.send_to(&esp(spi), to).unwrap();
            tx2.send_to(&esp(spi), to).unwrap();
        }
        let mut got: Vec<(Vec<u8>, IpAddr)> = Vec::new();
        let mut buf = [0u8; 2048];
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
        while std::time::Instant::now() < deadline {
            match sock.recv(&mut buf) {
                Ok((n, m)) => got.push((buf[..n].to_vec(), m.src.unwrap().ip())),
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
            }
        }
        got.sort();
        let one: IpAddr = "127.0.0.1".parse().unwrap();
        let two: IpAddr = "127.0.0.2".parse().unwrap();
        let mut want = vec![
            (esp(0x1000), one),
            (esp(0x2000), two),
            (esp(0x4000), one),
            (esp(0x4000), two),
            (esp(0x5000), one),
            (esp(0x5000), two),
        ];
        want.sort();
        assert_eq!(got, want);
    }

    fn esp_payload() -> Vec<u8> {
        let mut p = vec![0u8; 40];
        p[..4].copy_from_slice(&0x1234_5678u32.to_be_bytes());
        p[7] = 1;
        p
    }

    #[test]
    fn ipv4_udp_header_is_what_the_core_classifies() {
        let mut b = PacketBuf::from_packet(&esp_payload());
        push_udp_outer(
            &mut b,
            "192.0.2.2:4501".parse().unwrap(),
            "192.0.2.1:4500".parse().unwrap(),
            0x02,
        )
        .unwrap();
        assert_eq!(b.len(), 20 + 8 + 40);
        let info = ip::parse(b.as_slice()).unwrap();
        assert_eq!(info.version, 4);
        assert_eq!(info.src, "192.0.2.2".parse::<IpAddr>().unwrap());
        assert_eq!(info.dst, "192.0.2.1".parse::<IpAddr>().unwrap());
        assert_eq!(
            (info.protocol, info.tos, info.packet_len),
            (proto::UDP, 0x02, 68)
        );
        assert!(ipv4::Ipv4::new_checked(b.as_slice()).unwrap().checksum_ok());
        let u = udp::Udp::new_checked(&b.as_slice()[20..]).unwrap();
        assert_eq!((u.src_port(), u.dst_port(), u.len()), (4501, 4500, 48));
        match classify(b.as_slice(), &Classifier::NAT_T).unwrap() {
            Classified::Ipsec(inb) => {
                assert_eq!(inb.spi, 0x1234_5678);
                assert_eq!((inb.offset, inb.udp_offset, inb.end), (28, Some(20), 68));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn mapped_addresses_give_ipv4_and_real_ipv6_gives_ipv6() {
        let mut b = PacketBuf::from_packet(&esp_payload());
        push_udp_outer(
            &mut b,
            "[::ffff:192.0.2.2]:4500".parse().unwrap(),
            "192.0.2.1:4500".parse().unwrap(),
            0,
        )
        .unwrap();
        assert_eq!(ip::parse(b.as_slice()).unwrap().version, 4);

        let mut b = PacketBuf::from_packet(&esp_payload());
        push_udp_outer(
            &mut b,
            "[2001:db8::2]:4500".parse().unwrap(),
            "[2001:db8::1]:4500".parse().unwrap(),
            0xb9,
        )
        .unwrap();
        let info = ip::parse(b.as_slice()).unwrap();
        assert_eq!(info.version, 6);
        assert_eq!(
            (info.protocol, info.tos, info.packet_len),
            (proto::UDP, 0xb9, 88)
        );
        assert_eq!(info.src, "2001:db8::2".parse::<IpAddr>().unwrap());
        assert!(matches!(
            classify(b.as_slice(), &Classifier::NAT_T).unwrap(),
            Classified::Ipsec(_)
        ));
        // Keepalives and IKE keep their meaning behind the synthetic header.
        let mut b = PacketBuf::from_packet(&[0xff]);
        push_udp_outer(
            &mut b,
            "192.0.2.2:4500".parse().unwrap(),
            "192.0.2.1:4500".parse().unwrap(),
            0,
        )
        .unwrap();
        assert_eq!(
            classify(b.as_slice(), &Classifier::NAT_T).unwrap(),
            Classified::Keepalive
        );
    }

    #[test]
    fn the_remembered_header_is_the_header_push_udp_outer_writes() {
        let a4: SocketAddr = "192.0.2.2:4501".parse().unwrap();
        let b4: SocketAddr = "192.0.2.1:4500".parse().unwrap();
        let c4: SocketAddr = "192.0.2.3:4500".parse().unwrap();
        let a6: SocketAddr = "[2001:db8::2]:4500".parse().unwrap();
        let b6: SocketAddr = "[2001:db8::1]:4500".parse().unwrap();
        // Repeats (copied) and every kind of change (built again), in turn.
        let seq = [
            (a4, b4, 0, 40),
            (a4, b4, 0, 40),
            (a4, b4, 0, 41),
            (a4, b4, 0, 41),
            (a4, b4, 2, 41),
            (c4, b4, 2, 41),
            (c4, b4, 2, 41),
            (a6, b6, 2, 41),
            (a6, b6, 2, 41),
            (a4, b4, 0, 40),
            (a4, b4, 0, 65_510),
            (a4, b4, 0, 40),
        ];
        let mut cache = UdpOuter::default();
        for (i, (src, dst, tos, len)) in seq.into_iter().enumerate() {
            let payload: Vec<u8> = (0..len).map(|k| (k * 7 + i) as u8).collect();
            let mut want = PacketBuf::from_packet(&payload);
            let mut got = PacketBuf::from_packet(&payload);
            let w = push_udp_outer(&mut want, src, dst, tos);
            let g = cache.push(&mut got, src, dst, tos);
            assert_eq!(g, w, "step {i}");
            if w.is_ok() {
                assert_eq!(got.as_slice(), want.as_slice(), "step {i}");
            }
        }
    }

    #[test]
    fn oversized_payloads_are_refused() {
        let mut b = PacketBuf::from_packet(&vec![0u8; 65_510]);
        let r = push_udp_outer(
            &mut b,
            "192.0.2.2:4500".parse().unwrap(),
            "192.0.2.1:4500".parse().unwrap(),
            0,
        );
        assert_eq!(r, Err(DropReason::TooBig));
    }

    /// One `UDP_SEGMENT` send from three slices arrives as datagrams cut
    /// at the segment size (TOS kept); with `UDP_GRO` on, the receiver may
    /// get them in one buffer with the segment size reported.
    #[test]
    fn gso_send_and_gro_receive_on_loopback() {
        let rx = UdpSock::open("127.0.0.1:0".parse().unwrap(), None, false).unwrap();
        let gro = rx.enable_gro();
        let tx = UdpSock::open("127.0.0.1:0".parse().unwrap(), None, false).unwrap();
        let to = rx.local_addr().unwrap();
        assert_eq!(to.ip(), IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_ne!(to.port(), 0);
        let (a, b, c) = ([1u8; 100], [2u8; 100], [3u8; 60]);
        // Segments of 100: [1;100], [2;100], [3;60] — the slices need not
        // line up with segments, so split the middle one across two.
        let iov = [
            io::IoSlice::new(&a),
            io::IoSlice::new(&b[..30]),
            io::IoSlice::new(&b[30..]),
            io::IoSlice::new(&c),
        ];
        assert_eq!(tx.send_gso(&iov, 100, to, 0x2e, None).unwrap(), 260);
        let mut got: Vec<Vec<u8>> = Vec::new();
        let mut buf = vec![0u8; 65536];
        for _ in 0..200 {
            match rx.recv(&mut buf) {
                Ok((n, meta)) => {
                    assert_eq!(meta.tos, Some(0x2e));
                    let seg = usize::from(meta.gro_size.unwrap_or(n as u16));
                    assert!(gro || meta.gro_size.is_none());
                    got.extend(buf[..n].chunks(seg).map(<[u8]>::to_vec));
                    if got.len() >= 3 {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(std::time::Duration::from_millis(5))
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(got, vec![a.to_vec(), b.to_vec(), c.to_vec()]);
    }

    /// `[::]` receives IPv4 too: the sender and destination come back as
    /// plain IPv4 addresses with the TOS, and replies go out as IPv4 with
    /// their TOS.
    #[test]
    fn dual_stack_udp_socket() {
        let Ok(u) = UdpSock::open("[::]:0".parse().unwrap(), None, false) else {
            eprintln!("skipping: no IPv6");
            return;
        };
        // The port the kernel chose.
        let port = u.local_addr().unwrap().port();
        assert_ne!(port, 0);
        let peer = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        sockopt::set_ip_recvtos(&peer, true).unwrap();
        peer.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let to: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        sys::send_to(peer.as_fd(), b"esp!", to, Some(0x2e), false).unwrap();
        let mut buf = [0u8; 16];
        let mut got = None;
        for _ in 0..100 {
            match u.recv(&mut buf) {
                Ok(x) => {
                    got = Some(x);
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(std::time::Duration::from_millis(10))
                }
                Err(e) => panic!("{e}"),
            }
        }
        let (n, meta) = got.expect("datagram within 1 s");
        assert_eq!(&buf[..n], b"esp!");
        assert_eq!(meta.src, Some(peer.local_addr().unwrap()));
        assert_eq!(meta.dst, Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        assert_eq!(meta.tos, Some(0x2e));
        u.send(b"back", meta.src.unwrap(), 0xb8, None).unwrap();
        let (n, meta) = sys::recv_meta(peer.as_fd(), &mut buf, MsgFlags::empty()).unwrap();
        assert_eq!(&buf[..n], b"back");
        assert_eq!(meta.tos, Some(0xb8));
    }

    #[test]
    fn ipv6_raw_header() {
        let mut b = PacketBuf::from_packet(&esp_payload());
        push_ipv6_outer(
            &mut b,
            "2001:db8::2".parse().unwrap(),
            "2001:db8::1".parse().unwrap(),
            proto::ESP,
            0x01,
        )
        .unwrap();
        let info = ip::parse(b.as_slice()).unwrap();
        assert_eq!(
            (info.protocol, info.tos, info.packet_len),
            (proto::ESP, 0x01, 80)
        );
        match classify(b.as_slice(), &Classifier::NAT_T).unwrap() {
            Classified::Ipsec(inb) => assert_eq!((inb.offset, inb.end), (40, 80)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn reuseport_group_is_steered_by_spi() {
        // A port free on loopback (bounded tries).
        let (first, addr) = (0..50u16)
            .find_map(|i| {
                let port = 20000 + (std::process::id() as u16 % 20000) + i * 7;
                let addr: SocketAddr = ([127, 0, 0, 1], port).into();
                UdpSock::open_with(addr, None, false, true)
                    .ok()
                    .map(|s| (s, addr))
            })
            .expect("a free loopback port");
        let second = UdpSock::open_with(addr, None, false, true).unwrap();
        first.steer_by_spi(2).unwrap();
        let tx = UdpSock::open("127.0.0.1:0".parse().unwrap(), None, false).unwrap();
        // SPI 0x1001 is odd: socket 1; 0x1002 even: socket 0; a keepalive
        // (one byte) and the non-ESP marker: socket 0.
        let mut buf = [0u8; 64];
        for (payload, want_second) in [
            (&[0x00, 0x00, 0x10, 0x01, 9][..], true),
            (&[0x00, 0x00, 0x10, 0x02, 9][..], false),
            (&[0xff][..], false),
            (&[0, 0, 0, 0, 1, 2, 3][..], false),
        ] {
            tx.send(payload, addr, 0, None).unwrap();
            let (yes, no) = if want_second {
                (&second, &first)
            } else {
                (&first, &second)
            };
            let mut got = None;
            for _ in 0..200 {
                if let Ok((n, _)) = yes.recv(&mut buf) {
                    got = Some(n);
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            assert_eq!(got, Some(payload.len()), "{payload:?}");
            assert!(no.recv(&mut buf).is_err(), "{payload:?} reached both");
        }
    }

    /// Only UDP connections behind a wildcard-bound socket name a source,
    /// and only one that is an address of this host.
    #[test]
    fn udp_sources_name_local_only_where_the_socket_cannot() {
        let conns = || {
            [
                ("ours", "127.0.0.1", true),
                ("raw", "127.0.0.1", false),
                ("not-ours", "192.0.2.99", true),
                ("v6-ours", "::1", true),
            ]
            .map(|(n, a, udp)| (n, a.parse::<IpAddr>().unwrap(), udp))
            .into_iter()
        };
        let some = |a: &str| Some(a.parse::<IpAddr>().unwrap());
        let wild = udp_sources(Some("[::]:4500".parse().unwrap()), conns());
        assert_eq!(wild, [some("127.0.0.1"), None, None, some("::1")]);
        let bound = udp_sources(Some("127.0.0.1:4500".parse().unwrap()), conns());
        assert_eq!(bound, [None; 4]);
        assert_eq!(udp_sources(None, conns()), [None; 4]);
    }
}
