//! Thin, commented `libc` wrappers for the sockets the data plane uses:
//! creation, options, `recvmsg` with the ancillary data we ask for
//! (destination address and TOS / traffic class) and `sendmsg` with a TOS.
//!
//! Every `unsafe` block is one system call on a descriptor the caller
//! owns (borrowed as `BorrowedFd`), with pointers to live, correctly sized
//! locals.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// A new socket with `SOCK_CLOEXEC`.
pub fn socket(domain: libc::c_int, ty: libc::c_int, proto: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: socket(2) takes integers only.
    let fd = unsafe { libc::socket(domain, ty | libc::SOCK_CLOEXEC, proto) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `setsockopt` with an `int` value.
pub fn set_int(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    val: libc::c_int,
) -> io::Result<()> {
    // SAFETY: the option value is a live `c_int` of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&val as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `getsockopt` of an `int` value.
pub fn get_int(fd: BorrowedFd<'_>, level: libc::c_int, name: libc::c_int) -> io::Result<i32> {
    let mut val: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into the live `val`.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&mut val as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(val)
    }
}

/// Asks for socket buffers of `bytes` each way: `SO_*BUFFORCE` (which
/// needs `CAP_NET_ADMIN`, as the daemon has) and the capped `SO_*BUF` if
/// that is refused. Best effort: the defaults work, only slower.
pub fn set_buffers(fd: BorrowedFd<'_>, bytes: i32) {
    for (force, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        if set_int(fd, libc::SOL_SOCKET, force, bytes).is_err() {
            let _ = set_int(fd, libc::SOL_SOCKET, plain, bytes);
        }
    }
}

/// A `sockaddr_storage` holding `addr`, and its length.
pub fn to_sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all-zero is valid.
    let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large and aligned enough for
            // any sockaddr, here a sockaddr_in.
            let sin = unsafe {
                &mut *(&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>()
            };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr = libc::in_addr {
                s_addr: u32::from_ne_bytes(a.ip().octets()),
            };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            // SAFETY: as above, for a sockaddr_in6.
            let sin6 = unsafe {
                &mut *(&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_flowinfo = 0;
            sin6.sin6_addr = libc::in6_addr {
                s6_addr: a.ip().octets(),
            };
            sin6.sin6_scope_id = a.scope_id();
            size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// The address in a `sockaddr_storage` the kernel filled in, with
/// IPv4-mapped IPv6 addresses turned back into IPv4.
pub fn from_sockaddr(ss: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    match libc::c_int::from(ss.ss_family) {
        libc::AF_INET if len as usize >= size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin =
                unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 if len as usize >= size_of::<libc::sockaddr_in6>() => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6 =
                unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            let port = u16::from_be(sin6.sin6_port);
            Some(match ip.to_ipv4_mapped() {
                Some(v4) => SocketAddr::V4(SocketAddrV4::new(v4, port)),
                None => SocketAddr::V6(SocketAddrV6::new(ip, port, 0, sin6.sin6_scope_id)),
            })
        }
        _ => None,
    }
}

/// Binds `fd` to `addr`.
pub fn bind(fd: BorrowedFd<'_>, addr: SocketAddr) -> io::Result<()> {
    let (ss, len) = to_sockaddr(addr);
    // SAFETY: `ss` is a live sockaddr of length `len`.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&ss as *const libc::sockaddr_storage).cast(),
            len,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
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
/// IPv6 20) and TOS (1 or 4 bytes), each with its header, with margin.
const CMSG_BUF: usize = 256;

/// `recvmsg` into `buf` with `flags` (e.g. `MSG_DONTWAIT`), parsing the
/// pktinfo and TOS control messages. A datagram longer than `buf` is
/// reported as `InvalidData` (it was truncated).
pub fn recv_meta(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    flags: libc::c_int,
) -> io::Result<(usize, RecvMeta)> {
    // SAFETY: plain old data; all-zero is valid.
    let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
    let mut cbuf = [0u64; CMSG_BUF / 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: plain old data; all-zero is valid.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_name = (&mut ss as *mut libc::sockaddr_storage).cast();
    msg.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = CMSG_BUF as _;
    // SAFETY: every pointer in `msg` points to a live local (or `buf`) of
    // the length given next to it.
    let n = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, flags) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if msg.msg_flags & libc::MSG_TRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "datagram larger than the receive buffer",
        ));
    }
    let mut meta = RecvMeta {
        src: from_sockaddr(&ss, msg.msg_namelen),
        dst: None,
        tos: None,
        gro_size: None,
    };
    // SAFETY: the CMSG_* helpers walk the control buffer the kernel
    // filled, within `msg_controllen`; each payload is read with an
    // unaligned read of a type whose size the length check guarantees.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            let h = &*c;
            let data = libc::CMSG_DATA(c);
            let len = (h.cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
            match (h.cmsg_level, h.cmsg_type) {
                (libc::SOL_IP, libc::IP_PKTINFO) if len >= size_of::<libc::in_pktinfo>() => {
                    let p: libc::in_pktinfo = std::ptr::read_unaligned(data.cast());
                    meta.dst = Some(IpAddr::V4(Ipv4Addr::from(p.ipi_addr.s_addr.to_ne_bytes())));
                }
                (libc::SOL_IPV6, libc::IPV6_PKTINFO) if len >= size_of::<libc::in6_pktinfo>() => {
                    let p: libc::in6_pktinfo = std::ptr::read_unaligned(data.cast());
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
                (libc::SOL_IP, libc::IP_TOS) if len >= 1 => {
                    meta.tos = Some(*data);
                }
                (libc::SOL_IPV6, libc::IPV6_TCLASS) if len >= size_of::<libc::c_int>() => {
                    let v: libc::c_int = std::ptr::read_unaligned(data.cast());
                    meta.tos = Some(v as u8);
                }
                // The kernel writes the GRO segment size as an int.
                (libc::SOL_UDP, libc::UDP_GRO) if len >= size_of::<libc::c_int>() => {
                    let v: libc::c_int = std::ptr::read_unaligned(data.cast());
                    meta.gro_size = u16::try_from(v).ok().filter(|&g| g > 0);
                }
                _ => {}
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n as usize, meta))
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
    send_iov(fd, &[io::IoSlice::new(data)], dst, tos, v6_socket, None)
}

/// [`send_to`] of the concatenation of `data`; with `gso = Some(size)`,
/// one `UDP_SEGMENT` send: the kernel cuts the bytes into datagrams of
/// `size` bytes (the last may be shorter), at most 64 of them.
pub fn send_iov(
    fd: BorrowedFd<'_>,
    data: &[io::IoSlice<'_>],
    dst: SocketAddr,
    tos: Option<u8>,
    v6_socket: bool,
    gso: Option<u16>,
) -> io::Result<usize> {
    let dst = match dst {
        SocketAddr::V4(a) if v6_socket => {
            SocketAddr::V6(SocketAddrV6::new(a.ip().to_ipv6_mapped(), a.port(), 0, 0))
        }
        d => d,
    };
    let v4_dst = match dst {
        SocketAddr::V4(_) => true,
        SocketAddr::V6(a) => a.ip().to_ipv4_mapped().is_some(),
    };
    let (ss, sslen) = to_sockaddr(dst);
    // Room for two control messages of an int each (TOS, UDP_SEGMENT).
    let mut cbuf = [0u64; 8];
    // SAFETY: plain old data; all-zero is valid.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_name = (&ss as *const libc::sockaddr_storage) as *mut libc::c_void;
    msg.msg_namelen = sslen;
    // `IoSlice` is ABI-compatible with `iovec` (documented by std); the
    // kernel only reads through these pointers.
    msg.msg_iov = data.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = data.len() as _;
    let tos_msg = tos.filter(|&t| t != 0).map(|tos| {
        let (level, ty) = if v4_dst {
            (libc::SOL_IP, libc::IP_TOS)
        } else {
            (libc::SOL_IPV6, libc::IPV6_TCLASS)
        };
        (level, ty, libc::c_int::from(tos), size_of::<libc::c_int>())
    });
    let gso_msg = gso.map(|g| (libc::SOL_UDP, libc::UDP_SEGMENT, libc::c_int::from(g), 2));
    let cmsgs = [tos_msg, gso_msg];
    if cmsgs.iter().any(Option::is_some) {
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = size_of_val(&cbuf) as _;
        let mut used = 0usize;
        // SAFETY: CMSG_* are the kernel's layout macros over `cbuf` (64
        // bytes, 8-aligned), which holds two headers (16 bytes each) with
        // their aligned int payloads (8 each); we write only through the
        // pointers they return and set `msg_controllen` to what was used.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            for (level, ty, value, len) in cmsgs.into_iter().flatten() {
                (*c).cmsg_level = level;
                (*c).cmsg_type = ty;
                (*c).cmsg_len = libc::CMSG_LEN(len as u32) as _;
                if len == 2 {
                    std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), value as u16);
                } else {
                    std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>(), value);
                }
                used += libc::CMSG_SPACE(len as u32) as usize;
                c = libc::CMSG_NXTHDR(&msg, c);
                if c.is_null() {
                    break;
                }
            }
        }
        msg.msg_controllen = used as _;
    }
    // SAFETY: every pointer in `msg` points to a live local (or `data`)
    // of the length given next to it; the kernel only reads them.
    let n = unsafe { libc::sendmsg(fd.as_raw_fd(), &msg, 0) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// `poll(2)` over `fds`, waiting at most `timeout_ms` (-1: forever).
/// `EINTR` counts as "nothing ready".
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize> {
    // SAFETY: `fds` is a live slice of pollfd of the length passed.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn sockaddr_round_trip() {
        for a in [
            "192.0.2.1:4500",
            "[2001:db8::1]:4500",
            "[::ffff:192.0.2.7]:9",
        ] {
            let a: SocketAddr = a.parse().unwrap();
            let (ss, len) = to_sockaddr(a);
            let back = from_sockaddr(&ss, len).unwrap();
            match a {
                SocketAddr::V6(v) if v.ip().to_ipv4_mapped().is_some() => {
                    assert_eq!(back, "192.0.2.7:9".parse().unwrap())
                }
                _ => assert_eq!(back, a),
            }
        }
    }

    /// Over loopback: the destination address and TOS come back as
    /// control messages, for IPv4 and IPv6 sockets.
    #[test]
    fn recv_reports_destination_and_tos() {
        for v6 in [false, true] {
            let (dom, lo, lvl_pk, pk, lvl_tos, tos_opt) = if v6 {
                (
                    libc::AF_INET6,
                    "[::1]:0",
                    libc::SOL_IPV6,
                    libc::IPV6_RECVPKTINFO,
                    libc::SOL_IPV6,
                    libc::IPV6_RECVTCLASS,
                )
            } else {
                (
                    libc::AF_INET,
                    "127.0.0.1:0",
                    libc::SOL_IP,
                    libc::IP_PKTINFO,
                    libc::SOL_IP,
                    libc::IP_RECVTOS,
                )
            };
            let Ok(rx) = socket(dom, libc::SOCK_DGRAM, 0) else {
                eprintln!("skipping: no socket of family {dom}");
                continue;
            };
            if bind(rx.as_fd(), lo.parse().unwrap()).is_err() {
                eprintln!("skipping: cannot bind {lo}");
                continue;
            }
            set_int(rx.as_fd(), lvl_pk, pk, 1).unwrap();
            set_int(rx.as_fd(), lvl_tos, tos_opt, 1).unwrap();
            // SAFETY: getsockname writes at most `len` bytes into `ss`.
            let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
            let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            let rc = unsafe {
                libc::getsockname(
                    rx.as_raw_fd(),
                    (&mut ss as *mut libc::sockaddr_storage).cast(),
                    &mut len,
                )
            };
            assert_eq!(rc, 0);
            let to = from_sockaddr(&ss, len).unwrap();
            let tx = socket(dom, libc::SOCK_DGRAM, 0).unwrap();
            send_to(tx.as_fd(), b"hello", to, Some(0xb8), v6).unwrap();
            let mut buf = [0u8; 64];
            let (n, meta) = recv_meta(rx.as_fd(), &mut buf, 0).unwrap();
            assert_eq!(&buf[..n], b"hello");
            assert_eq!(meta.dst, Some(to.ip()));
            assert_eq!(meta.tos, Some(0xb8));
            assert!(meta.src.is_some_and(|s| s.ip() == to.ip()));
            // Too small a buffer is an error, not a silently cut packet.
            send_to(tx.as_fd(), b"0123456789", to, None, v6).unwrap();
            let mut small = [0u8; 4];
            let e = recv_meta(rx.as_fd(), &mut small, 0).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        }
    }
}
