//! The data plane's per-packet socket calls: `recvmsg` and `recvmmsg`
//! with the ancillary data we ask for (destination address, TOS / traffic
//! class, UDP GRO segment size), `sendmsg` with a TOS, a UDP GSO
//! segment size and a source address, and `sendmmsg` of a batch of such
//! messages (ESP-in-UDP runs to several peers, raw packets); plus the
//! socket buffer sizes.
//!
//! # Crate choices
//!
//! - Receiving is hand-written over `libc::recvmsg` and `libc::recvmmsg`
//!   (a batch of datagrams per call, [`RecvBatch`]), with one parser of
//!   the control messages (`IP_PKTINFO`, `IPV6_PKTINFO`, `IP_TOS`,
//!   `IPV6_TCLASS`, `UDP_GRO`) for both. `nix` 0.31's `recvmmsg` reuses
//!   headers whose lengths the kernel has shrunk (see [`RecvBatch`]), and
//!   `rustix` 1.1 has no `recvmmsg` and decodes only `SCM_RIGHTS` and
//!   `SCM_CREDENTIALS`. The buffers are allocated once; nothing is
//!   allocated per packet.
//! - Sending stays hand-written: one `sendmsg`, or one `sendmmsg` whose
//!   headers live on the stack ([`send_msgs`], [`send_each`]; the tests
//!   check the control-message layout against libc's `CMSG_*` macros):
//!   `nix` 0.31's `sendmsg` allocates its control-message buffer (a `Vec`)
//!   on every call that carries one (`src/sys/socket/mod.rs`, `vec![0u8;
//!   capacity]`), which the hot path must not do (the `hot_path_allocs`
//!   test); its `sendmmsg` avoids that only through a `MultiHeaders` that
//!   holds raw pointers (not `Send`) and always passes its whole control
//!   capacity, not what was written. `rustix`'s `SendAncillaryMessage`
//!   has no TOS or `UDP_SEGMENT` variant. The control messages themselves
//!   are built in safe code (byte copies at the offsets of libc's
//!   `cmsghdr`, `Cmsgs`). IKE's sends use the same function.
//! - Socket options, socket creation and `bind` are `rustix` or `nix`
//!   calls made by the callers ([`crate::sockets`]).

use nix::sys::socket::{MsgFlags, SockaddrLike, SockaddrStorage};
use std::io;
use std::mem::{offset_of, size_of};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, BorrowedFd};

/// The kernel's path MTU towards `dst`: `IP_MTU` / `IPV6_MTU` of a UDP
/// socket connected to it (nothing is sent), which reports what the kernel
/// learnt from ICMP "fragmentation needed" / "packet too big" or else the
/// route's MTU. Called when a send was refused as too big, not per packet.
pub fn path_mtu(dst: IpAddr) -> io::Result<u32> {
    use rustix::net::{sockopt, AddressFamily, SocketFlags, SocketType};
    let family = if dst.is_ipv4() {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    };
    let s = rustix::net::socket_with(family, SocketType::DGRAM, SocketFlags::CLOEXEC, None)?;
    rustix::net::connect(&s, &SocketAddr::new(dst, 9))?;
    Ok(match dst {
        IpAddr::V4(_) => sockopt::ip_mtu(&s)?,
        IpAddr::V6(_) => sockopt::ipv6_mtu(&s)?,
    })
}

/// Adds what was being done to an error, keeping its kind (for set-up
/// calls; the per-packet calls return the bare OS error).
pub(crate) fn context<E: Into<io::Error>>(what: &'static str) -> impl FnOnce(E) -> io::Error {
    move |e| {
        let e = e.into();
        io::Error::new(e.kind(), format!("{what}: {e}"))
    }
}

/// Asks for socket buffers of `bytes` each way: `SO_*BUFFORCE` (which
/// needs `CAP_NET_ADMIN`, as the daemon has) and the capped `SO_*BUF` if
/// that is refused. Best effort: the defaults work, only slower.
pub fn set_buffers(fd: BorrowedFd<'_>, bytes: usize) {
    use rustix::net::sockopt;
    // The kernel takes an int.
    let bytes = bytes.min(i32::MAX as usize);
    if sockopt::set_socket_recv_buffer_size_force(fd, bytes).is_err() {
        let _ = sockopt::set_socket_recv_buffer_size(fd, bytes);
    }
    if sockopt::set_socket_send_buffer_size_force(fd, bytes).is_err() {
        let _ = sockopt::set_socket_send_buffer_size(fd, bytes);
    }
}

/// The `std` form of an address the kernel filled in, with IPv4-mapped
/// IPv6 addresses turned back into IPv4 (and the flow label dropped).
pub fn std_addr(ss: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(sin) = ss.as_sockaddr_in() {
        return Some(SocketAddr::V4(SocketAddrV4::from(*sin)));
    }
    let sin6 = ss.as_sockaddr_in6()?;
    let (ip, port) = (sin6.ip(), sin6.port());
    Some(match ip.to_ipv4_mapped() {
        Some(v4) => SocketAddr::V4(SocketAddrV4::new(v4, port)),
        None => SocketAddr::V6(SocketAddrV6::new(ip, port, 0, sin6.scope_id())),
    })
}

/// What `recvmsg` said about a datagram besides its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvMeta {
    /// Sender.
    pub src: Option<SocketAddr>,
    /// Destination address of the packet (`IP_PKTINFO` / `IPV6_PKTINFO`).
    pub dst: Option<IpAddr>,
    /// TOS / traffic class byte (`IP_TOS` / `IPV6_TCLASS`).
    pub tos: Option<u8>,
    /// With `UDP_GRO` on: the buffer holds several datagrams of this size
    /// (the last one may be shorter), coalesced by the kernel.
    pub gro_size: Option<u16>,
}

/// Room for the control messages we ask for: pktinfo (IPv4 12 bytes,
/// IPv6 20), TOS (1 or 4 bytes) and the GRO size (4), each with its
/// header, with margin.
const CMSG_BUF: usize = 256;

/// A receive control buffer, aligned for `struct cmsghdr` (the kernel
/// writes the headers in place and we read them there).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct RecvCmsgBuf([u8; CMSG_BUF]);

/// What the kernel wrote for one received datagram: its length, flags,
/// sender and control messages, read into a [`RecvMeta`]. `Err` if the
/// datagram was longer than its buffer (`MSG_TRUNC`).
fn meta_of(
    hdr: &libc::msghdr,
    name: &libc::sockaddr_storage,
    bytes: usize,
) -> io::Result<(usize, RecvMeta)> {
    if hdr.msg_flags & libc::MSG_TRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "datagram larger than the receive buffer",
        ));
    }
    let namelen = hdr
        .msg_namelen
        .min(size_of::<libc::sockaddr_storage>() as u32);
    // SAFETY: `name` is a whole `sockaddr_storage` the kernel filled in,
    // of which `namelen` bytes are the address.
    let src = unsafe {
        SockaddrStorage::from_raw(
            std::ptr::from_ref(name).cast::<libc::sockaddr>(),
            Some(namelen),
        )
    };
    let mut meta = RecvMeta {
        src: src.as_ref().and_then(std_addr),
        dst: None,
        tos: None,
        gro_size: None,
    };
    // With `MSG_CTRUNC` (which `CMSG_BUF` rules out) the messages that
    // fit are still whole; the walk below reads only those.
    //
    // SAFETY: `hdr.msg_control` points to our aligned control buffer of
    // `hdr.msg_controllen` bytes (the length the kernel wrote); the
    // `CMSG_*` macros stay within it and every read is unaligned-safe and
    // bounded by the message's own length.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(hdr);
        while !c.is_null() {
            let (level, ty) = ((*c).cmsg_level, (*c).cmsg_type);
            let data = libc::CMSG_DATA(c);
            let len = ((*c).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
            let int = || (len >= 4).then(|| data.cast::<libc::c_int>().read_unaligned());
            match (level, ty) {
                (libc::SOL_IP, libc::IP_PKTINFO) if len >= size_of::<libc::in_pktinfo>() => {
                    let p = data.cast::<libc::in_pktinfo>().read_unaligned();
                    meta.dst = Some(IpAddr::V4(Ipv4Addr::from(p.ipi_addr.s_addr.to_ne_bytes())));
                }
                (libc::SOL_IPV6, libc::IPV6_PKTINFO) if len >= size_of::<libc::in6_pktinfo>() => {
                    let p = data.cast::<libc::in6_pktinfo>().read_unaligned();
                    let a = Ipv6Addr::from(p.ipi6_addr.s6_addr);
                    // IP_PKTINFO, when also present, says the same.
                    if meta.dst.is_none() {
                        meta.dst = Some(match a.to_ipv4_mapped() {
                            Some(v4) => IpAddr::V4(v4),
                            None => IpAddr::V6(a),
                        });
                    }
                }
                // IP_TOS comes as one byte; IPV6_TCLASS as an int.
                (libc::SOL_IP, libc::IP_TOS) if len >= 1 => meta.tos = Some(*data),
                (libc::SOL_IPV6, libc::IPV6_TCLASS) => {
                    meta.tos = int().map(|t| t as u8);
                }
                (libc::SOL_UDP, libc::UDP_GRO) => {
                    meta.gro_size = int().and_then(|g| u16::try_from(g).ok()).filter(|&g| g > 0);
                }
                _ => {}
            }
            c = libc::CMSG_NXTHDR(hdr, c);
        }
    }
    Ok((bytes, meta))
}

/// A `msghdr` for receiving into `iov`, the sender into `name` and the
/// control messages into `cmsg`.
fn recv_hdr(
    iov: &mut libc::iovec,
    name: &mut libc::sockaddr_storage,
    cmsg: &mut RecvCmsgBuf,
) -> libc::msghdr {
    libc::msghdr {
        msg_name: std::ptr::from_mut(name).cast(),
        msg_namelen: size_of::<libc::sockaddr_storage>() as u32,
        msg_iov: iov,
        msg_iovlen: 1,
        msg_control: cmsg.0.as_mut_ptr().cast(),
        msg_controllen: CMSG_BUF,
        msg_flags: 0,
    }
}

/// An all-zero `sockaddr_storage` (a valid value of the C struct).
fn no_name() -> libc::sockaddr_storage {
    // SAFETY: `sockaddr_storage` is plain integers; all zeros is valid.
    unsafe { std::mem::zeroed() }
}

/// `recvmsg` into `buf` with `flags` (e.g. `MSG_DONTWAIT`), parsing the
/// pktinfo, TOS and GRO control messages. A datagram longer than `buf` is
/// reported as `InvalidData` (it was truncated).
pub fn recv_meta(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    flags: MsgFlags,
) -> io::Result<(usize, RecvMeta)> {
    let mut cbuf = RecvCmsgBuf([0; CMSG_BUF]);
    let mut name = no_name();
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut hdr = recv_hdr(&mut iov, &mut name, &mut cbuf);
    // SAFETY: `hdr` points to `buf`, `name` and `cbuf`, all live and of
    // the lengths given, for the duration of the call.
    let n = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut hdr, flags.bits()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    meta_of(&hdr, &name, n as usize)
}

/// Most datagrams one [`RecvBatch::recv`] reads.
pub const RECV_BATCH_MAX: usize = 32;

/// Buffers for reading many datagrams with one `recvmmsg` call, allocated
/// once (per worker) and reused: nothing is allocated per call.
///
/// Hand-written over `libc::recvmmsg`: `nix` 0.31's `recvmmsg` fills in
/// its preallocated `MultiHeaders` but never resets `msg_controllen` and
/// `msg_namelen`, which the kernel overwrites with the lengths it used;
/// the next call then offers less control space (a datagram that brings
/// the GRO segment size after one that did not would lose it to
/// `MSG_CTRUNC` and be read as one large datagram). `rustix` has no
/// `recvmmsg`. Here every header is built afresh on the stack per call.
pub struct RecvBatch {
    bufs: Vec<Box<[u8]>>,
    names: Box<[libc::sockaddr_storage]>,
    cmsgs: Box<[RecvCmsgBuf]>,
    /// Per datagram read by the last call: its length and metadata, or
    /// `None` if it was longer than its buffer (truncated).
    got: [Option<(usize, RecvMeta)>; RECV_BATCH_MAX],
    n: usize,
}

impl RecvBatch {
    /// Room for `count` datagrams (at most [`RECV_BATCH_MAX`]) of up to
    /// `size` bytes each (with UDP GRO on: up to 64 KiB).
    pub fn new(count: usize, size: usize) -> RecvBatch {
        let count = count.clamp(1, RECV_BATCH_MAX);
        RecvBatch {
            bufs: (0..count)
                .map(|_| vec![0u8; size].into_boxed_slice())
                .collect(),
            names: vec![no_name(); count].into_boxed_slice(),
            cmsgs: vec![RecvCmsgBuf([0; CMSG_BUF]); count].into_boxed_slice(),
            got: [None; RECV_BATCH_MAX],
            n: 0,
        }
    }

    /// Reads up to the batch's count of datagrams without blocking; the
    /// number read (`WouldBlock` if none was waiting).
    pub fn recv(&mut self, fd: BorrowedFd<'_>) -> io::Result<usize> {
        let count = self.bufs.len();
        let mut iovs: [libc::iovec; RECV_BATCH_MAX] = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; RECV_BATCH_MAX];
        // SAFETY: `mmsghdr` is plain data and null pointers; every header
        // used below is filled in by `recv_hdr`.
        let mut hdrs: [libc::mmsghdr; RECV_BATCH_MAX] = unsafe { std::mem::zeroed() };
        let slots = self
            .bufs
            .iter_mut()
            .zip(self.names.iter_mut())
            .zip(self.cmsgs.iter_mut())
            .zip(iovs.iter_mut().zip(hdrs.iter_mut()));
        for (((buf, name), cmsg), (iov, h)) in slots {
            *iov = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            };
            h.msg_hdr = recv_hdr(iov, name, cmsg);
            h.msg_len = 0;
        }
        // SAFETY: the first `count` headers point to this batch's buffers,
        // names and control buffers and to `iovs`, all live and of the
        // lengths given for the duration of the call.
        let r = unsafe {
            libc::recvmmsg(
                fd.as_raw_fd(),
                hdrs.as_mut_ptr(),
                count as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        self.n = 0;
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = (r as usize).min(count);
        for (i, h) in hdrs[..n].iter().enumerate() {
            self.got[i] = meta_of(&h.msg_hdr, &self.names[i], h.msg_len as usize).ok();
        }
        self.n = n;
        Ok(n)
    }

    /// Datagram `i` (below the count the last [`RecvBatch::recv`]
    /// returned): its bytes and metadata, or `None` if it was truncated
    /// (longer than its buffer) or `i` is out of range.
    pub fn get(&self, i: usize) -> Option<(&[u8], RecvMeta)> {
        let (len, meta) = (*self.got.get(i).filter(|_| i < self.n)?)?;
        Some((&self.bufs[i][..len], meta))
    }
}

/// Room for the control messages of one send: a TOS or traffic class
/// (an int), a `UDP_SEGMENT` size (a u16) and a source address
/// (`in6_pktinfo`, 20 bytes), each `CMSG_SPACE` of its value.
const CMSG_ROOM: usize = 3 * size_of::<libc::cmsghdr>() + 8 + 8 + 24;

/// The control messages of one `sendmsg`, laid out as the kernel walks
/// them (`CMSG_NXTHDR`): each a `struct cmsghdr` (`__kernel_size_t`,
/// `int`, `int`) whose `cmsg_len` counts the header and the value, then
/// the value, zero-padded to a multiple of `size_t` (`CMSG_SPACE`). Built
/// with safe byte copies into a `size_t`-aligned buffer; the tests check
/// the layout against libc's `CMSG_*` macros.
#[repr(C, align(8))]
struct Cmsgs {
    buf: [u8; CMSG_ROOM],
    len: usize,
}

const _: () = assert!(align_of::<libc::cmsghdr>() <= 8);

impl Cmsgs {
    fn new() -> Cmsgs {
        Cmsgs {
            buf: [0; CMSG_ROOM],
            len: 0,
        }
    }

    /// Appends a message of `value` (whose length the kernel checks:
    /// `IP_TOS` and `IPV6_TCLASS` take an int, `UDP_SEGMENT` a u16,
    /// `IP_PKTINFO` an `in_pktinfo`, `IPV6_PKTINFO` an `in6_pktinfo`).
    /// The callers add at most one of each kind, which [`CMSG_ROOM`] holds.
    fn push(&mut self, level: libc::c_int, ty: libc::c_int, value: &[u8]) {
        let hdr = size_of::<libc::cmsghdr>();
        let space = hdr + value.len().next_multiple_of(size_of::<usize>());
        let Some(m) = self.buf.get_mut(self.len..self.len + space) else {
            debug_assert!(false, "control messages beyond CMSG_ROOM");
            return;
        };
        let (len_at, level_at, ty_at) = (
            offset_of!(libc::cmsghdr, cmsg_len),
            offset_of!(libc::cmsghdr, cmsg_level),
            offset_of!(libc::cmsghdr, cmsg_type),
        );
        m[len_at..len_at + size_of::<usize>()].copy_from_slice(&(hdr + value.len()).to_ne_bytes());
        m[level_at..level_at + 4].copy_from_slice(&level.to_ne_bytes());
        m[ty_at..ty_at + 4].copy_from_slice(&ty.to_ne_bytes());
        m[hdr..hdr + value.len()].copy_from_slice(value);
        m[hdr + value.len()..].fill(0);
        self.len += space;
    }

    /// The source address `src` of a datagram to an IPv4 (`v4_dst`) or
    /// IPv6 destination: `IP_PKTINFO`'s `ipi_spec_dst`, or
    /// `IPV6_PKTINFO`'s `ipi6_addr` (interface index 0: the route
    /// decides). Nothing when the families differ or `src` is unspecified.
    fn push_source(&mut self, src: IpAddr, v4_dst: bool) {
        match (src.to_canonical(), v4_dst) {
            (IpAddr::V4(s), true) if !s.is_unspecified() => {
                // struct in_pktinfo { int ipi_ifindex; in_addr ipi_spec_dst; in_addr ipi_addr; }
                let mut v = [0u8; 12];
                v[4..8].copy_from_slice(&s.octets());
                self.push(libc::SOL_IP, libc::IP_PKTINFO, &v);
            }
            (IpAddr::V6(s), false) if !s.is_unspecified() => {
                // struct in6_pktinfo { in6_addr ipi6_addr; unsigned ipi6_ifindex; }
                let mut v = [0u8; 20];
                v[..16].copy_from_slice(&s.octets());
                self.push(libc::SOL_IPV6, libc::IPV6_PKTINFO, &v);
            }
            _ => {}
        }
    }

    fn as_slice(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// `sendmsg` of `data` to `dst`; with `tos`, an `IP_TOS` (IPv4 and
/// IPv4-mapped destinations) or `IPV6_TCLASS` control message sets the
/// DS field of this datagram. `v6_socket` says whether `fd` is `AF_INET6`
/// (IPv4 destinations are then written IPv4-mapped).
pub fn send_to(
    fd: BorrowedFd<'_>,
    data: &[u8],
    dst: SocketAddr,
    tos: Option<u8>,
    v6_socket: bool,
) -> io::Result<usize> {
    send_iov(
        fd,
        &[io::IoSlice::new(data)],
        dst,
        tos,
        None,
        v6_socket,
        None,
    )
}

/// [`send_to`] of the concatenation of `data`; with `gso = Some(size)`,
/// one `UDP_SEGMENT` send: the kernel cuts the bytes into datagrams of
/// `size` bytes (the last may be shorter), at most 64 of them. With
/// `src`, the datagrams leave from that local address (`IP_PKTINFO` /
/// `IPV6_PKTINFO`) instead of the one the route to `dst` prefers: a
/// gateway with several addresses on a socket bound to the wildcard
/// address sends each connection's ESP from that connection's `local`.
///
/// Hand-written over `libc::sendmsg`: see the module documentation for
/// why neither `nix` nor `rustix` does it without allocating.
pub fn send_iov(
    fd: BorrowedFd<'_>,
    data: &[io::IoSlice<'_>],
    dst: SocketAddr,
    tos: Option<u8>,
    src: Option<IpAddr>,
    v6_socket: bool,
    gso: Option<u16>,
) -> io::Result<usize> {
    let m = Msg {
        iov: data,
        dst,
        tos,
        src,
        gso,
    };
    let (addr, cmsgs) = m.header(v6_socket);
    let mut msg = libc::msghdr {
        msg_name: std::ptr::null_mut(),
        msg_namelen: 0,
        msg_iov: std::ptr::null_mut(),
        msg_iovlen: 0,
        msg_control: std::ptr::null_mut(),
        msg_controllen: 0,
        msg_flags: 0,
    };
    m.fill(&mut msg, &addr, &cmsgs);
    // SAFETY: every pointer in `msg` points to a live local (`addr`,
    // `cmsgs`) or to `data`, with the length given next to it; the kernel
    // only reads them during the call.
    let n = unsafe { libc::sendmsg(fd.as_raw_fd(), &msg, 0) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// One message of a [`send_msgs`] call: the concatenation of `iov` to
/// `dst`, as one datagram or, with `gso = Some(size)`, one `UDP_SEGMENT`
/// run of datagrams of `size` bytes; with the TOS / traffic class `tos`
/// and from the local address `src` when given (see [`send_iov`]).
#[derive(Clone, Copy)]
pub struct Msg<'a> {
    pub iov: &'a [io::IoSlice<'a>],
    pub dst: SocketAddr,
    pub tos: Option<u8>,
    pub src: Option<IpAddr>,
    pub gso: Option<u16>,
}

impl Msg<'_> {
    /// The destination as the socket takes it (IPv4 written IPv4-mapped on
    /// an `AF_INET6` socket) and the control messages.
    fn header(&self, v6_socket: bool) -> (SockaddrStorage, Cmsgs) {
        let dst = match self.dst {
            SocketAddr::V4(a) if v6_socket => {
                SocketAddr::V6(SocketAddrV6::new(a.ip().to_ipv6_mapped(), a.port(), 0, 0))
            }
            d => d,
        };
        let v4_dst = match dst {
            SocketAddr::V4(_) => true,
            SocketAddr::V6(a) => a.ip().to_ipv4_mapped().is_some(),
        };
        let mut cmsgs = Cmsgs::new();
        if let Some(tos) = self.tos.filter(|&t| t != 0) {
            let (level, ty) = if v4_dst {
                (libc::SOL_IP, libc::IP_TOS)
            } else {
                (libc::SOL_IPV6, libc::IPV6_TCLASS)
            };
            cmsgs.push(level, ty, &libc::c_int::from(tos).to_ne_bytes());
        }
        if let Some(g) = self.gso {
            cmsgs.push(libc::SOL_UDP, libc::UDP_SEGMENT, &g.to_ne_bytes());
        }
        if let Some(src) = self.src {
            cmsgs.push_source(src, v4_dst);
        }
        (SockaddrStorage::from(dst), cmsgs)
    }

    /// Points `msg` at `addr`, `cmsgs` and this message's bytes.
    fn fill(&self, msg: &mut libc::msghdr, addr: &SockaddrStorage, cmsgs: &Cmsgs) {
        let control = cmsgs.as_slice();
        msg.msg_name = addr.as_ptr().cast_mut().cast();
        msg.msg_namelen = addr.len();
        // `IoSlice` is ABI-compatible with `iovec` (documented by std); the
        // kernel only reads through these pointers.
        msg.msg_iov = self.iov.as_ptr().cast_mut().cast();
        msg.msg_iovlen = self.iov.len();
        msg.msg_control = if control.is_empty() {
            std::ptr::null_mut()
        } else {
            control.as_ptr().cast_mut().cast()
        };
        msg.msg_controllen = control.len();
    }
}

/// Most messages one [`send_msgs`] call sends.
pub const SEND_MSGS_MAX: usize = 64;

/// One `sendmmsg` call sending each of `msgs` (at most [`SEND_MSGS_MAX`];
/// the rest are left), each to its own destination with its own TOS,
/// source and GSO size: a worker's batch holds runs for several peers, or
/// one peer's runs cut by a TOS change, and they leave in one system call
/// instead of one each. Returns how many messages the kernel took, or the
/// error of the first one when it took none: after a refusal in the middle
/// the call returns the count before it, and the caller calls again from
/// there to see that message's error (the kernel does not keep it).
///
/// Hand-written over `libc::sendmmsg` like [`send_iov`] (see the module
/// documentation); headers, addresses and control messages live on the
/// stack, nothing is allocated.
pub fn send_msgs(fd: BorrowedFd<'_>, msgs: &[Msg<'_>], v6_socket: bool) -> io::Result<usize> {
    let n = msgs.len().min(SEND_MSGS_MAX);
    if n == 0 {
        return Ok(0);
    }
    let heads: [Option<(SockaddrStorage, Cmsgs)>; SEND_MSGS_MAX] =
        std::array::from_fn(|i| msgs.get(i).filter(|_| i < n).map(|m| m.header(v6_socket)));
    // SAFETY: `mmsghdr` is plain data for which all-zero bytes (null
    // pointers, zero lengths) is a valid value.
    let mut hdrs: [libc::mmsghdr; SEND_MSGS_MAX] = unsafe { std::mem::zeroed() };
    for ((h, m), head) in hdrs.iter_mut().zip(&msgs[..n]).zip(&heads) {
        if let Some((addr, cmsgs)) = head {
            m.fill(&mut h.msg_hdr, addr, cmsgs);
        }
    }
    // SAFETY: the first `n` headers point to `heads` and to the slices of
    // `msgs`, all alive for the call; the kernel reads them and writes
    // only the headers' `msg_len`.
    let r = unsafe { libc::sendmmsg(fd.as_raw_fd(), hdrs.as_mut_ptr(), n as libc::c_uint, 0) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Most datagrams one [`send_each`] call sends.
pub const SEND_EACH_MAX: usize = SEND_MSGS_MAX;

/// One `sendmmsg` call sending each of `pkts` (at most [`SEND_EACH_MAX`];
/// the rest are left) as its own datagram to `dst`: for raw ESP/AH, which
/// has no GSO, so that a batch costs one system call instead of one per
/// packet. Returns how many the kernel took, or the error of the first one
/// when it took none: after a refusal in the middle the call returns the
/// count before it, and the caller calls again from there to see that
/// packet's error (the kernel does not keep it).
///
/// One [`send_msgs`] call without control messages; nothing is allocated.
pub fn send_each(
    fd: BorrowedFd<'_>,
    pkts: &[io::IoSlice<'_>],
    dst: SocketAddr,
) -> io::Result<usize> {
    let n = pkts.len().min(SEND_EACH_MAX);
    let msgs: [Msg<'_>; SEND_EACH_MAX] = std::array::from_fn(|i| Msg {
        iov: pkts.get(i..i + 1).unwrap_or(&[]),
        dst,
        tos: None,
        src: None,
        gso: None,
    });
    send_msgs(fd, &msgs[..n], false)
}

/// [`send_to`] from the source address `src` (`IP_PKTINFO` /
/// `IPV6_PKTINFO`), so that an answer leaves from the address its request
/// was sent to rather than from whichever address the route to the
/// sender prefers (RFC 7296 §2.11: IKE answers come from the address the
/// request went to). An unspecified `src`, or one of the other family,
/// lets the kernel choose.
pub fn send_from(
    fd: BorrowedFd<'_>,
    data: &[u8],
    src: IpAddr,
    dst: SocketAddr,
    v6_socket: bool,
) -> io::Result<usize> {
    let data = [io::IoSlice::new(data)];
    send_iov(fd, &data, dst, None, Some(src), v6_socket, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::net::{sockopt, AddressFamily, SocketFlags, SocketType};
    use std::os::fd::AsFd;

    #[test]
    fn sockaddr_round_trip() {
        for a in [
            "192.0.2.1:4500",
            "[2001:db8::1]:4500",
            "[::ffff:192.0.2.7]:9",
        ] {
            let a: SocketAddr = a.parse().unwrap();
            let back = std_addr(&SockaddrStorage::from(a)).unwrap();
            match a {
                SocketAddr::V6(v) if v.ip().to_ipv4_mapped().is_some() => {
                    assert_eq!(back, "192.0.2.7:9".parse().unwrap())
                }
                _ => assert_eq!(back, a),
            }
        }
    }

    /// An answer sent with `send_from` leaves from the address asked for,
    /// not from the one the route prefers (loopback: 127.0.0.2 is local
    /// but the route to 127.0.0.1 prefers 127.0.0.1).
    #[test]
    fn send_from_sets_the_source_address() {
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let tx = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        let to = rx.local_addr().unwrap();
        let mut buf = [0u8; 16];
        for src in ["127.0.0.2", "0.0.0.0"] {
            let n = send_from(tx.as_fd(), b"ike", src.parse().unwrap(), to, false).unwrap();
            assert_eq!(n, 3);
            let (n, from) = rx.recv_from(&mut buf).unwrap();
            assert_eq!(&buf[..n], b"ike");
            let want = if src == "0.0.0.0" { "127.0.0.1" } else { src };
            assert_eq!(from.ip().to_string(), want);
        }
    }

    /// `send_each` sends each slice as its own datagram in one call, and
    /// a refused one in the middle behaves as the raw flush relies on: the
    /// call returns the count before it, the next call from there returns
    /// its error, the one after sends the rest.
    #[test]
    fn send_each_sends_datagrams_and_reports_a_refusal_on_the_next_call() {
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx.local_addr().unwrap();
        let big = vec![7u8; 70_000];
        let pkts = [b"one".as_slice(), b"two", &big, b"four"].map(io::IoSlice::new);
        assert_eq!(send_each(tx.as_fd(), &pkts[..2], to).unwrap(), 2);
        assert_eq!(send_each(tx.as_fd(), &pkts, to).unwrap(), 2);
        let e = send_each(tx.as_fd(), &pkts[2..], to).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EMSGSIZE), "{e}");
        assert_eq!(send_each(tx.as_fd(), &pkts[3..], to).unwrap(), 1);
        assert_eq!(send_each(tx.as_fd(), &[], to).unwrap(), 0);
        let mut buf = [0u8; 16];
        for want in ["one", "two", "one", "two", "four"] {
            let n = rx.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], want.as_bytes());
        }
    }

    /// `send_msgs` sends messages to several destinations in one call, each
    /// with its own GSO size and TOS (a GSO message arrives as its
    /// segments), and a refused message in the middle is reported as
    /// `send_each`'s are: the count before it, then its error.
    #[test]
    fn send_msgs_sends_runs_to_several_destinations_in_one_call() {
        let rx: Vec<_> = (0..2)
            .map(|_| {
                let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
                s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
                    .unwrap();
                sockopt::set_ip_recvtos(&s, true).unwrap();
                s
            })
            .collect();
        let to: Vec<SocketAddr> = rx.iter().map(|s| s.local_addr().unwrap()).collect();
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let (a, b, c) = ([1u8; 100], [2u8; 100], [3u8; 60]);
        let run = [&a[..], &b, &c].map(io::IoSlice::new);
        let one = [io::IoSlice::new(b"single")];
        let big = vec![7u8; 70_000];
        let too_big = [io::IoSlice::new(&big)];
        let msg = |iov, dst, tos, gso| Msg {
            iov,
            dst,
            tos,
            src: None,
            gso,
        };
        let msgs = [
            msg(&run[..], to[0], Some(0xb8), Some(100)),
            msg(&one[..], to[1], None, None),
            msg(&too_big[..], to[1], None, None),
            msg(&one[..], to[0], Some(0x28), None),
        ];
        assert_eq!(send_msgs(tx.as_fd(), &msgs, false).unwrap(), 2);
        let e = send_msgs(tx.as_fd(), &msgs[2..], false).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EMSGSIZE), "{e}");
        assert_eq!(send_msgs(tx.as_fd(), &msgs[3..], false).unwrap(), 1);
        assert_eq!(send_msgs(tx.as_fd(), &[], false).unwrap(), 0);
        let mut batch = RecvBatch::new(4, 2048);
        let mut got = Vec::new();
        for (i, want) in [(0, 4), (1, 1)] {
            let mut left = want;
            while left > 0 {
                let n = batch.recv(rx[i].as_fd()).unwrap();
                for k in 0..n {
                    let (data, meta) = batch.get(k).unwrap();
                    got.push((i, data.len(), data[0], meta.tos));
                }
                left -= n.min(left);
            }
        }
        assert_eq!(
            got,
            [
                (0, 100, 1, Some(0xb8)),
                (0, 100, 2, Some(0xb8)),
                (0, 60, 3, Some(0xb8)),
                (0, 6, b's', Some(0x28)),
                (1, 6, b's', Some(0)),
            ]
        );
    }

    /// The hand-built control messages have the kernel's layout: each
    /// `cmsg_len` is `CMSG_LEN` of its value, and walking the buffer with
    /// `CMSG_FIRSTHDR` / `CMSG_NXTHDR` finds every message, with its
    /// value, where `CMSG_DATA` says.
    #[test]
    fn control_messages_match_the_cmsg_macros() {
        let tos = (libc::SOL_IP, libc::IP_TOS, 7i32.to_ne_bytes().to_vec());
        let seg = (
            libc::SOL_UDP,
            libc::UDP_SEGMENT,
            1400u16.to_ne_bytes().to_vec(),
        );
        let mut v6 = "2001:db8::7".parse::<Ipv6Addr>().unwrap().octets().to_vec();
        v6.extend([0; 4]);
        let src6 = (libc::SOL_IPV6, libc::IPV6_PKTINFO, v6);
        let src4 = (
            libc::SOL_IP,
            libc::IP_PKTINFO,
            vec![0, 0, 0, 0, 192, 0, 2, 7, 0, 0, 0, 0],
        );
        // The most one send carries (CMSG_ROOM), and a source alone;
        // families that differ, or an unspecified source, add nothing.
        let mut full = Cmsgs::new();
        full.push(tos.0, tos.1, &tos.2);
        full.push(seg.0, seg.1, &seg.2);
        full.push_source("2001:db8::7".parse().unwrap(), false);
        let mut alone = Cmsgs::new();
        alone.push_source("192.0.2.7".parse().unwrap(), false);
        alone.push_source("0.0.0.0".parse().unwrap(), true);
        alone.push_source("192.0.2.7".parse().unwrap(), true);
        for (c, want) in [(full, vec![tos, seg, src6]), (alone, vec![src4])] {
            // SAFETY: CMSG_SPACE is arithmetic on its argument.
            let space: usize = want
                .iter()
                .map(|w| unsafe { libc::CMSG_SPACE(w.2.len() as u32) } as usize)
                .sum();
            assert!(space <= CMSG_ROOM);
            assert_eq!(c.as_slice().len(), space);
            let mut buf = c.buf;
            // SAFETY: `msg` describes `buf`, which outlives the walk; the
            // macros only do pointer arithmetic within it and read headers
            // that `push` wrote.
            unsafe {
                let mut msg: libc::msghdr = std::mem::zeroed();
                msg.msg_control = buf.as_mut_ptr().cast();
                msg.msg_controllen = space;
                let mut h = libc::CMSG_FIRSTHDR(&msg);
                for (level, ty, value) in &want {
                    assert!(!h.is_null());
                    assert_eq!(((*h).cmsg_level, (*h).cmsg_type), (*level, *ty));
                    assert_eq!((*h).cmsg_len, libc::CMSG_LEN(value.len() as u32) as usize);
                    let data = std::slice::from_raw_parts(libc::CMSG_DATA(h), value.len());
                    assert_eq!(data, &value[..]);
                    h = libc::CMSG_NXTHDR(&msg, h);
                }
                assert!(h.is_null());
            }
        }
    }

    /// A datagram sent with a source leaves from it, with or without a
    /// TOS and a GSO size beside it, from IPv4 and dual-stack sockets; a
    /// source that is not ours is refused by the kernel.
    #[test]
    fn send_iov_sets_the_source_beside_tos_and_gso() {
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let to = rx.local_addr().unwrap();
        let mut buf = [0u8; 64];
        for (bind, v6) in [("0.0.0.0:0", false), ("[::]:0", true)] {
            let tx = std::net::UdpSocket::bind(bind).unwrap();
            for (tos, gso) in [(None, None), (Some(0x28), Some(4))] {
                let data = [io::IoSlice::new(b"espg"), io::IoSlice::new(b"ate!")];
                let src = Some("127.0.0.3".parse().unwrap());
                let n = send_iov(tx.as_fd(), &data, to, tos, src, v6, gso).unwrap();
                assert_eq!(n, 8);
                let want: &[&[u8]] = if gso.is_some() {
                    &[b"espg", b"ate!"]
                } else {
                    &[b"espgate!"]
                };
                for w in want {
                    let (n, from) = rx.recv_from(&mut buf).unwrap();
                    assert_eq!(
                        (&buf[..n], from.ip().to_canonical().to_string().as_str()),
                        (*w, "127.0.0.3")
                    );
                }
            }
            let data = [io::IoSlice::new(b"x")];
            let e = send_iov(
                tx.as_fd(),
                &data,
                to,
                None,
                Some("192.0.2.99".parse().unwrap()),
                v6,
                None,
            );
            assert!(e.is_err(), "a source not on this host was accepted");
        }
    }

    /// Over loopback: the destination address and TOS come back as
    /// control messages, for IPv4 and IPv6 sockets.
    #[test]
    fn recv_reports_destination_and_tos() {
        for v6 in [false, true] {
            let (dom, lo) = if v6 {
                (AddressFamily::INET6, "[::1]:0")
            } else {
                (AddressFamily::INET, "127.0.0.1:0")
            };
            let Ok(rx) =
                rustix::net::socket_with(dom, SocketType::DGRAM, SocketFlags::CLOEXEC, None)
            else {
                eprintln!("skipping: no socket of family {dom:?}");
                continue;
            };
            let lo: SocketAddr = lo.parse().unwrap();
            if rustix::net::bind(&rx, &lo).is_err() {
                eprintln!("skipping: cannot bind {lo}");
                continue;
            }
            if v6 {
                nix::sys::socket::setsockopt(
                    &rx,
                    nix::sys::socket::sockopt::Ipv6RecvPacketInfo,
                    &true,
                )
                .unwrap();
                sockopt::set_ipv6_recvtclass(&rx, true).unwrap();
            } else {
                nix::sys::socket::setsockopt(&rx, nix::sys::socket::sockopt::Ipv4PacketInfo, &true)
                    .unwrap();
                sockopt::set_ip_recvtos(&rx, true).unwrap();
            }
            let to = SocketAddr::try_from(rustix::net::getsockname(&rx).unwrap()).unwrap();
            let tx = rustix::net::socket_with(dom, SocketType::DGRAM, SocketFlags::CLOEXEC, None)
                .unwrap();
            send_to(tx.as_fd(), b"hello", to, Some(0xb8), v6).unwrap();
            let mut buf = [0u8; 64];
            let (n, meta) = recv_meta(rx.as_fd(), &mut buf, MsgFlags::empty()).unwrap();
            assert_eq!(&buf[..n], b"hello");
            assert_eq!(meta.dst, Some(to.ip()));
            assert_eq!(meta.tos, Some(0xb8));
            assert!(meta.src.is_some_and(|s| s.ip() == to.ip()));
            // Too small a buffer is an error, not a silently cut packet.
            send_to(tx.as_fd(), b"0123456789", to, None, v6).unwrap();
            let mut small = [0u8; 4];
            let e = recv_meta(rx.as_fd(), &mut small, MsgFlags::empty()).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        }
    }

    /// One `recvmmsg` reads every waiting datagram from several senders,
    /// each with its own sender, destination and TOS; a truncated one is
    /// reported as such, and the headers are reset between calls (a
    /// datagram with control messages after one without keeps them).
    #[test]
    fn recv_batch_reads_many_with_their_metadata() {
        let lo: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let udp = || {
            let s = rustix::net::socket_with(
                AddressFamily::INET,
                SocketType::DGRAM,
                SocketFlags::CLOEXEC,
                None,
            )
            .unwrap();
            rustix::net::bind(&s, &lo).unwrap();
            s
        };
        let rx = udp();
        nix::sys::socket::setsockopt(&rx, nix::sys::socket::sockopt::Ipv4PacketInfo, &true)
            .unwrap();
        sockopt::set_ip_recvtos(&rx, true).unwrap();
        let to = SocketAddr::try_from(rustix::net::getsockname(&rx).unwrap()).unwrap();
        let senders: Vec<_> = (0..3).map(|_| udp()).collect();
        let mut batch = RecvBatch::new(8, 16);
        assert_eq!(
            batch.recv(rx.as_fd()).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        for round in 0..2u8 {
            for (i, s) in senders.iter().enumerate() {
                let tos = (i as u8 + 1) << 2;
                send_to(s.as_fd(), &[round, i as u8], to, Some(tos), false).unwrap();
            }
            send_to(senders[0].as_fd(), &[7; 40], to, None, false).unwrap();
            let n = batch.recv(rx.as_fd()).unwrap();
            assert_eq!(n, 4, "round {round}");
            for (i, s) in senders.iter().enumerate() {
                let (data, meta) = batch.get(i).unwrap();
                assert_eq!(data, &[round, i as u8]);
                let from = SocketAddr::try_from(rustix::net::getsockname(s).unwrap()).unwrap();
                assert_eq!(meta.src, Some(from));
                assert_eq!(meta.dst, Some(to.ip()));
                assert_eq!(meta.tos, Some((i as u8 + 1) << 2));
            }
            // 40 bytes into a 16-byte buffer: truncated, not cut silently.
            assert!(batch.get(3).is_none());
            assert!(batch.get(4).is_none());
        }
    }
}
