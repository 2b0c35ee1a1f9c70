//! `espgate bench relay`: the ceiling of a userspace UDP tunnel on this
//! host, for `bench tunnel --relay`.
//!
//! A userspace tunnel cannot beat the work the kernel does for it: reading
//! each packet out of a TUN device, sending it in UDP, receiving it on the
//! other side and writing it into the other TUN device. The relay does
//! exactly that work and nothing else. It has no cryptography, no ESP and
//! no per-packet headers, so it is **not a VPN** and must never carry real
//! traffic: it exists to be measured.
//!
//! - A TUN read with the offloads espgate asks for (`IFF_VNET_HDR`, TSO,
//!   checksum offload) gives a TCP super-segment of up to 64 KiB with its
//!   `virtio_net_hdr`.
//! - That read goes out whole: one `UDP_SEGMENT` send, cut by the kernel
//!   into datagrams that fit the path, as espgate sends its ESP
//!   datagrams. A read too long for one UDP send (a 64 KiB super-segment
//!   with its headers) goes out as two, a first part and the rest. A
//!   4-byte frame header (a magic byte that also says which part, then
//!   the length) lets the other side find each message again.
//! - The other side's `UDP_GRO` read gives the message back, and it is
//!   written into that side's TUN device as it was read, `virtio_net_hdr`
//!   and all (two parts in one `writev`, from where they were read). The kernel fills in the checksums, as it would have for the
//!   original sender.
//!
//! So per byte the relay costs what every userspace UDP tunnel here pays,
//! the kernel's four copies and its stack, and next to nothing in user
//! space: no cipher, no checksums, no segmenting or coalescing. Its TCP
//! throughput against plain routing is the ratio no userspace UDP tunnel
//! can exceed on the host it runs on. For small packets it is not a
//! ceiling (it reads and sends them one at a time, without espgate's
//! batches), so `bench tunnel` measures it on TCP tests only.
//!
//! A message that arrives cut (its length runs past the end of the read),
//! without its magic byte, or a first part without the rest, is dropped
//! and counted; the counts are printed when the relay stops.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::ExitCode;

use anyhow::{bail, ensure, Context, Result};
use nix::libc;

use crate::netlab;

/// The first byte of a message that is a whole TUN read, or the rest of
/// one whose first part came before.
pub const MAGIC: u8 = 0xEB;
/// The first byte of a message that is the first part of a TUN read; the
/// next message is the rest.
pub const MAGIC_FIRST: u8 = 0xEC;
/// Frame header: the magic byte, then the message's length (24 bits, big
/// endian).
pub const HEADER: usize = 4;
/// The longest UDP payload of one send (IPv4: 65 535 − 20 − 8).
const UDP_MAX: usize = 65_507;
/// The `virtio_net_hdr` in front of every TUN packet (`IFF_VNET_HDR`,
/// without `num_buffers`).
const VNET_HDR: usize = 10;
/// Reads per poll wake-up and direction (bounded work per round).
const BATCH: usize = 64;
/// Room for the longest TUN read and for the longest UDP read.
const BUF: usize = 1 << 17;
/// The TUN offloads asked for, as espgate asks for them: checksum
/// offload, TSO for IPv4 and IPv6 (`TUN_F_CSUM | TUN_F_TSO4 |
/// TUN_F_TSO6`).
const OFFLOADS: libc::c_uint = 0x01 | 0x02 | 0x04;

/// Arguments of `espgate bench relay` (started by `bench tunnel --relay`
/// in each gateway namespace).
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The TUN device to create.
    #[arg(long)]
    pub tun: String,
    /// The local UDP address and port.
    #[arg(long, value_name = "ADDR:PORT")]
    pub local: SocketAddr,
    /// The other relay's UDP address and port.
    #[arg(long, value_name = "ADDR:PORT")]
    pub peer: SocketAddr,
    /// The path MTU between the two relays: datagrams are cut to fit it.
    #[arg(long, default_value_t = 1500)]
    pub mtu: u32,
}

/// What the relay carried, printed when it stops.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Counts {
    /// UDP sends: one per TUN read, two for a read too long for one.
    pub sent: u64,
    /// TUN writes: one per TUN read of the other side.
    pub delivered: u64,
    /// Messages dropped because they arrived cut or without the magic
    /// byte (the rest of that read is dropped with them).
    pub torn: u64,
    /// Sends or writes the kernel refused (counted, dropped).
    pub errors: u64,
}

/// Writes the frame header of a message of `len` bytes into `hdr`; `first`:
/// the first part of a read, whose rest follows.
pub fn put_header(hdr: &mut [u8], len: usize, first: bool) {
    debug_assert!(len < 1 << 24);
    hdr[0] = if first { MAGIC_FIRST } else { MAGIC };
    hdr[1..HEADER].copy_from_slice(&(len as u32).to_be_bytes()[1..]);
}

/// One message found in a UDP read: where its bytes are, and whether it is
/// the first part of a TUN read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Its bytes, as a range of the read.
    pub at: std::ops::Range<usize>,
    /// The first part of a read; the next message is the rest.
    pub first: bool,
}

/// The messages of one UDP read, in order. A message cut short or a
/// missing magic byte ends the read with `Err(())`: the read was torn.
pub fn messages(read: &[u8]) -> impl Iterator<Item = Result<Message, ()>> + '_ {
    let mut at = 0;
    let mut done = false;
    std::iter::from_fn(move || {
        if done || at >= read.len() {
            return None;
        }
        let rest = &read[at..];
        let first = rest[0] == MAGIC_FIRST;
        let len = if rest.len() >= HEADER && (first || rest[0] == MAGIC) {
            u32::from_be_bytes([0, rest[1], rest[2], rest[3]]) as usize
        } else {
            0
        };
        if len == 0 || HEADER + len > rest.len() {
            done = true;
            return Some(Err(()));
        }
        let m = Message {
            at: at + HEADER..at + HEADER + len,
            first,
        };
        at += HEADER + len;
        Some(Ok(m))
    })
}

/// Hands every TUN packet of one UDP read to `write`, as its one or two
/// parts, given the first part `held` back from the read before. Returns
/// where in `read` a first part ending it waits for its rest (to be held
/// for the next read), and how many messages were dropped as torn: cut
/// short, without a magic byte, or a first part not followed by its rest.
pub fn deliver(
    read: &[u8],
    held: Option<&[u8]>,
    mut write: impl FnMut([&[u8]; 2]),
) -> (Option<std::ops::Range<usize>>, u64) {
    let mut torn = 0;
    // A first part waiting for its rest, and where it is if in `read`.
    let mut first: Option<(&[u8], Option<std::ops::Range<usize>>)> = held.map(|h| (h, None));
    for m in messages(read) {
        let Ok(m) = m else {
            torn += 1 + u64::from(first.is_some());
            return (None, torn);
        };
        let bytes = &read[m.at.clone()];
        match (first.take(), m.first) {
            (prev, true) => {
                // A first part before this one lost its rest.
                torn += u64::from(prev.is_some());
                first = Some((bytes, Some(m.at)));
            }
            (Some((a, _)), false) => write([a, bytes]),
            (None, false) => write([bytes, &[]]),
        }
    }
    match first {
        Some((_, Some(at))) => (Some(at), torn),
        // Held from before and still without its rest.
        Some((_, None)) => (None, torn + 1),
        None => (None, torn),
    }
}

/// `espgate bench relay`.
pub fn main(a: &Args) -> ExitCode {
    match relay(a) {
        Ok(c) => {
            eprintln!(
                "espgate bench relay: stopped; sent {} delivered {} torn {} errors {}",
                c.sent, c.delivered, c.torn, c.errors
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("espgate bench relay: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Opens the TUN device `name` with `IFF_VNET_HDR` and the offloads.
fn open_tun(name: &str) -> Result<OwnedFd> {
    ensure!(
        !name.is_empty() && name.len() < libc::IFNAMSIZ,
        "--tun {name}: 1 to {} bytes",
        libc::IFNAMSIZ - 1
    );
    let path = c"/dev/net/tun";
    // SAFETY: open(2) on a NUL-terminated path; the result is checked.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("opening /dev/net/tun");
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: an all-zero ifreq is valid; name and flags are set below.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    ifr.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as i16;
    // SAFETY: TUNSETIFF reads and writes one ifreq through the pointer,
    // which is valid for the call.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &mut ifr) } < 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("TUNSETIFF {name}"));
    }
    // SAFETY: TUNSETOFFLOAD takes the flag word by value.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETOFFLOAD, OFFLOADS) } < 0 {
        return Err(std::io::Error::last_os_error()).context("TUNSETOFFLOAD (TSO)");
    }
    Ok(fd)
}

fn relay(a: &Args) -> Result<Counts> {
    use nix::sys::socket::{self as sock, sockopt, ControlMessage, MsgFlags};
    ensure!(
        (576..=65535).contains(&a.mtu),
        "--mtu {}: 576 to 65535",
        a.mtu
    );
    let seg = match a.local {
        SocketAddr::V4(_) => a.mtu as usize - 28,
        SocketAddr::V6(_) => a.mtu as usize - 48,
    };
    ensure!(
        a.local.is_ipv4() == a.peer.is_ipv4(),
        "--local and --peer: one address family"
    );
    // It carries traffic in clear: never outside a test namespace.
    netlab::refuse_host_namespace("relay", "bench relay", "bench tunnel --relay")?;
    netlab::install_signal_handlers();
    let tun = open_tun(&a.tun)?;
    let family = if a.local.is_ipv4() {
        sock::AddressFamily::Inet
    } else {
        sock::AddressFamily::Inet6
    };
    let udp = sock::socket(
        family,
        sock::SockType::Datagram,
        sock::SockFlag::SOCK_NONBLOCK | sock::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .context("a UDP socket")?;
    sock::bind(udp.as_raw_fd(), &sock::SockaddrStorage::from(a.local))
        .with_context(|| format!("binding {}", a.local))?;
    sock::connect(udp.as_raw_fd(), &sock::SockaddrStorage::from(a.peer))
        .with_context(|| format!("connecting to {}", a.peer))?;
    // The buffers espgate's gateways get by default (gateway.socket_buffer).
    let _ = sock::setsockopt(&udp, sockopt::SndBufForce, &(4 << 20));
    let _ = sock::setsockopt(&udp, sockopt::RcvBufForce, &(4 << 20));
    sock::setsockopt(&udp, sockopt::UdpGroSegment, &true).context("UDP_GRO")?;

    let mut c = Counts::default();
    let mut tx = vec![0u8; BUF];
    // Two receive buffers: a first part at the end of one read stays where
    // it is while the rest is read into the other.
    let mut rx = [vec![0u8; BUF], vec![0u8; BUF]];
    let mut cur = 0;
    let mut pending: Option<std::ops::Range<usize>> = None;
    let seg16 = u16::try_from(seg).context("segment size")?;
    let send = |msg: &[u8], c: &mut Counts| {
        let iov = [std::io::IoSlice::new(msg)];
        let gso = [ControlMessage::UdpGsoSegments(&seg16)];
        let cmsgs: &[ControlMessage] = if msg.len() > seg { &gso } else { &[] };
        match sock::sendmsg::<()>(udp.as_raw_fd(), &iov, cmsgs, MsgFlags::empty(), None) {
            Ok(_) => c.sent += 1,
            Err(_) => c.errors += 1,
        }
    };
    while !netlab::interrupted() {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        let mut fds = [
            PollFd::new(&tun, PollFlags::IN),
            PollFd::new(&udp, PollFlags::IN),
        ];
        let wait = Timespec {
            tv_sec: 0,
            tv_nsec: 200_000_000,
        };
        match poll(&mut fds, Some(&wait)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => bail!("poll: {e}"),
        }
        // TUN -> UDP: each read whole, in one send or, too long for one,
        // in two (the second part's header written over the first part's
        // last bytes, already sent).
        for _ in 0..BATCH {
            let n = match nix::unistd::read(&tun, &mut tx[HEADER..]) {
                Ok(n) => n,
                Err(nix::errno::Errno::EAGAIN) => break,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => bail!("TUN read: {e}"),
            };
            if n <= VNET_HDR {
                continue;
            }
            if HEADER + n <= UDP_MAX {
                put_header(&mut tx, n, false);
                send(&tx[..HEADER + n], &mut c);
                continue;
            }
            let half = n / 2;
            put_header(&mut tx, half, true);
            send(&tx[..HEADER + half], &mut c);
            put_header(&mut tx[half..], n - half, false);
            send(&tx[half..HEADER + n], &mut c);
        }
        // UDP -> TUN: every read's messages, as they were read.
        for _ in 0..BATCH {
            let n = match sock::recv(udp.as_raw_fd(), &mut rx[cur], MsgFlags::empty()) {
                Ok(n) => n,
                Err(nix::errno::Errno::EAGAIN) => break,
                Err(nix::errno::Errno::EINTR) => continue,
                // An ICMP error from a peer not up yet, and the like.
                Err(_) => {
                    c.errors += 1;
                    continue;
                }
            };
            let (now, other) = (&rx[cur][..n], &rx[1 - cur]);
            let held = pending.take().map(|r| &other[r]);
            let (mut ok, mut failed) = (0, 0);
            let (hold, torn) = deliver(now, held, |parts| {
                let iov = parts.map(std::io::IoSlice::new);
                match nix::sys::uio::writev(&tun, &iov) {
                    Ok(_) => ok += 1,
                    Err(_) => failed += 1,
                }
            });
            c.delivered += ok;
            c.errors += failed;
            c.torn += torn;
            // A first part ending the read waits, where it is, for the rest.
            if let Some(r) = hold {
                pending = Some(r);
                cur = 1 - cur;
            }
        }
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(parts: &[(&[u8], bool)]) -> Vec<u8> {
        let mut v = Vec::new();
        for (p, first) in parts {
            let mut h = [0u8; HEADER];
            put_header(&mut h, p.len(), *first);
            v.extend_from_slice(&h);
            v.extend_from_slice(p);
        }
        v
    }

    fn collect(read: &[u8]) -> Vec<Result<(Vec<u8>, bool), ()>> {
        messages(read)
            .map(|m| m.map(|m| (read[m.at].to_vec(), m.first)))
            .collect()
    }

    #[test]
    fn messages_come_back_whole_in_order_with_their_part() {
        let big = vec![7u8; 70_000];
        let read = frame(&[(b"one", false), (&big, true), (b"rest", false)]);
        assert_eq!(
            collect(&read),
            vec![
                Ok((b"one".to_vec(), false)),
                Ok((big, true)),
                Ok((b"rest".to_vec(), false))
            ]
        );
    }

    /// `deliver`'s packets, each as its parts joined, and its result.
    fn delivered(
        read: &[u8],
        held: Option<&[u8]>,
    ) -> (Vec<Vec<u8>>, Option<std::ops::Range<usize>>, u64) {
        let mut v = Vec::new();
        let (hold, torn) = deliver(read, held, |[a, b]| v.push([a, b].concat()));
        (v, hold, torn)
    }

    #[test]
    fn a_read_split_in_two_parts_is_written_whole_within_a_read_and_across_two() {
        // Both parts in one read, between whole packets.
        let read = frame(&[
            (b"one", false),
            (b"two-a", true),
            (b"two-b", false),
            (b"3", false),
        ]);
        let (got, hold, torn) = delivered(&read, None);
        assert_eq!(got, [&b"one"[..], b"two-atwo-b", b"3"].map(<[u8]>::to_vec));
        assert_eq!((hold, torn), (None, 0));
        // A first part ends the read: held (where it lies), written with the
        // rest from the next read.
        let first = frame(&[(b"x", false), (b"big-a", true)]);
        let (got, hold, torn) = delivered(&first, None);
        assert_eq!((got, torn), (vec![b"x".to_vec()], 0));
        let hold = hold.unwrap();
        assert_eq!(&first[hold.clone()], b"big-a");
        let next = frame(&[(b"big-b", false), (b"y", false)]);
        let (got, again, torn) = delivered(&next, Some(&first[hold]));
        assert_eq!(got, [&b"big-abig-b"[..], b"y"].map(<[u8]>::to_vec));
        assert_eq!((again, torn), (None, 0));
    }

    #[test]
    fn a_first_part_without_its_rest_is_torn_and_the_rest_delivered() {
        // Two first parts in a row: the earlier one lost its rest.
        let read = frame(&[(b"a1", true), (b"b1", true), (b"b2", false)]);
        let (got, hold, torn) = delivered(&read, None);
        assert_eq!((got, hold, torn), (vec![b"b1b2".to_vec()], None, 1));
        // Held from before, but the next read starts with a new first part.
        let read = frame(&[(b"c1", true), (b"c2", false)]);
        let (got, hold, torn) = delivered(&read, Some(b"old"));
        assert_eq!((got, hold, torn), (vec![b"c1c2".to_vec()], None, 1));
        // Held from before, and the next read is torn: both counted.
        let (got, hold, torn) = delivered(&[0, 1, 2, 3, 4], Some(b"old"));
        assert_eq!((got, hold, torn), (vec![], None, 2));
        // Held from before, and an empty read: the held part is dropped.
        let (got, hold, torn) = delivered(&[], Some(b"old"));
        assert_eq!((got, hold, torn), (vec![], None, 1));
    }

    #[test]
    fn a_cut_or_foreign_message_ends_the_read_as_torn() {
        let read = frame(&[(b"first", false), (b"second", false)]);
        // The second message cut by one byte.
        assert_eq!(
            collect(&read[..read.len() - 1]),
            vec![Ok((b"first".to_vec(), false)), Err(())]
        );
        // A read that does not start with a magic byte.
        let mut junk = read.clone();
        junk[0] = 0;
        assert_eq!(collect(&junk), vec![Err(())]);
        // Shorter than a header, a header alone, an empty message.
        for cut in [1, 3, 4] {
            assert_eq!(collect(&read[..cut]), vec![Err(())], "{cut}");
        }
        assert_eq!(collect(&frame(&[(b"", false)])), vec![Err(())]);
        // Nothing read: nothing torn.
        assert_eq!(collect(&[]), vec![]);
    }
}
