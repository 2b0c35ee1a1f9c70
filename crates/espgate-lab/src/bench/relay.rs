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
//!
//! With `--seal-key-file` the relay also seals what it carries with
//! AES-GCM, in the library espgate's gateways use on this CPU
//! ([`GcmImpl::current`]): one seal per path-MTU's worth of each read (as a
//! tunnel that encrypts each packet makes), the tags and the first nonce
//! in front of the read. The other side opens every piece in place and
//! drops a message that does not verify (counted as forged). That is the
//! least any encrypting userspace tunnel does here: the kernel's work plus
//! the cipher's, with no ESP, no replay window, no SPD, no segmenting or
//! coalescing. It is still **not a VPN**: there is no key exchange (`bench
//! tunnel` writes one random key for both sides), no replay protection and
//! no policy.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::ExitCode;

use anyhow::{bail, ensure, Context, Result};
use nix::libc;

use espgate_core::crypto::{GcmImpl, GcmKey};
use zeroize::Zeroizing;

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
/// A sealed message's nonce: the first of its pieces' (4 bytes that tell
/// the two directions apart, then a 64-bit counter).
pub const NONCE: usize = 12;
/// One AES-GCM tag.
pub const TAG: usize = 16;
/// Room for the tags in front of the longest read: pieces are at least
/// 528 bytes (`--mtu` 576, IPv6), so a read of up to 64 KiB and its
/// `virtio_net_hdr` has at most 125.
const TAGS_MAX: usize = 128 * TAG;
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
    /// Seal what is carried with AES-GCM under the key in this file (32
    /// or 64 hex digits, the same file for both sides; `bench tunnel`
    /// writes a random one).
    #[arg(long, value_name = "PATH")]
    pub seal_key_file: Option<std::path::PathBuf>,
}

/// The AES-GCM of a relay started with `--seal-key-file`.
#[derive(Debug)]
pub struct Seal {
    key: GcmKey,
    /// This side's first nonce bytes; the other side has the other value,
    /// so the two directions never share a nonce under the one key.
    prefix: [u8; 4],
    /// The next nonce's counter: each piece takes one, never again.
    next: u64,
    /// Bytes of a read per seal.
    piece: usize,
}

impl Seal {
    /// Sealing with `key` in pieces of `piece` bytes (at least 528); `low`:
    /// this side's address is the lower of the two (the sides' nonces
    /// differ by it).
    pub fn new(key: &[u8], piece: usize, low: bool) -> Result<Seal> {
        ensure!(piece >= 528, "a piece of {piece} bytes: at least 528");
        let key =
            GcmKey::new(key, GcmImpl::current()).context("an AES-GCM key is 16 or 32 bytes")?;
        let prefix = if low { [0, 0, 0, 1] } else { [0, 0, 0, 2] };
        Ok(Seal {
            key,
            prefix,
            next: 0,
            piece,
        })
    }

    /// The bytes in front of a sealed read of `len` bytes: its nonce and
    /// one tag per piece.
    pub fn overhead(&self, len: usize) -> usize {
        NONCE + TAG * len.div_ceil(self.piece)
    }

    /// Seals `buf[data]` in place, piece by piece, and writes the first
    /// nonce and the tags in the [`Seal::overhead`] bytes before it;
    /// returns where they start. Fails (and seals nothing) when the room
    /// in front is short, or when the nonce counter would wrap.
    pub fn seal(&mut self, buf: &mut [u8], data: std::ops::Range<usize>) -> Result<usize> {
        let pieces = data.len().div_ceil(self.piece);
        let start = data
            .start
            .checked_sub(self.overhead(data.len()))
            .context("no room for the tags")?;
        let first = self.next;
        self.next = first
            .checked_add(pieces as u64)
            .context("the nonce counter is spent")?;
        let (front, body) = buf.split_at_mut(data.start);
        let front = &mut front[start..];
        front[..4].copy_from_slice(&self.prefix);
        front[4..NONCE].copy_from_slice(&first.to_be_bytes());
        let tags = front[NONCE..].chunks_exact_mut(TAG);
        let pieces = body[..data.len()].chunks_mut(self.piece);
        for ((i, p), tag) in pieces.enumerate().zip(tags) {
            let tag: &mut [u8; TAG] = tag.try_into().context("tag room")?;
            let nonce = piece_nonce(&self.prefix, first.wrapping_add(i as u64));
            self.key
                .seal(nonce, &[], p, tag)
                .map_err(|d| anyhow::anyhow!("sealing: {d:?}"))?;
        }
        Ok(start)
    }

    /// Opens a sealed message in place; the range of `msg` its read is
    /// in, or `None` if it is too short or any piece does not verify.
    pub fn open(&self, msg: &mut [u8]) -> Option<std::ops::Range<usize>> {
        let rest = msg.len().checked_sub(NONCE)?;
        // rest = data + TAG * ceil(data / piece): ceil(rest / (piece + TAG))
        // pieces.
        let pieces = rest.div_ceil(self.piece + TAG);
        let front = NONCE + TAG * pieces;
        if front >= msg.len() {
            return None;
        }
        let (head, body) = msg.split_at_mut(front);
        let prefix: [u8; 4] = head[..4].try_into().ok()?;
        let first = u64::from_be_bytes(head[4..NONCE].try_into().ok()?);
        let tags = head[NONCE..].chunks_exact(TAG);
        if body.len().div_ceil(self.piece) != pieces {
            return None;
        }
        for ((i, p), tag) in body.chunks_mut(self.piece).enumerate().zip(tags) {
            let tag: &[u8; TAG] = tag.try_into().ok()?;
            let nonce = piece_nonce(&prefix, first.wrapping_add(i as u64));
            self.key.open(nonce, &[], p, tag).ok()?;
        }
        Some(front..msg.len())
    }
}

/// The nonce of the piece numbered `n`.
fn piece_nonce(prefix: &[u8; 4], n: u64) -> [u8; NONCE] {
    let mut nonce = [0u8; NONCE];
    nonce[..4].copy_from_slice(prefix);
    nonce[4..].copy_from_slice(&n.to_be_bytes());
    nonce
}

/// The key in `path`: 32 or 64 hex digits (surrounding white space
/// ignored). The file's text and the bytes are wiped when dropped.
fn read_key(path: &std::path::Path) -> Result<Zeroizing<Vec<u8>>> {
    let text = Zeroizing::new(
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
    );
    let hex = text.trim();
    ensure!(
        matches!(hex.len(), 32 | 64),
        "{}: an AES-GCM key is 32 or 64 hex digits",
        path.display()
    );
    let mut key = Zeroizing::new(vec![0u8; hex.len() / 2]);
    hex::decode_to_slice(hex, &mut key[..])
        .map_err(|_| anyhow::anyhow!("{}: not hex", path.display()))?;
    Ok(key)
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
    /// Sealed messages that did not verify (dropped).
    pub forged: u64,
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

/// The message of `read` that starts at `at`; `None` at the end. A
/// message cut short or a missing magic byte is `Err(())`: the rest of the
/// read is torn.
fn next_message(read: &[u8], at: usize) -> Option<Result<Message, ()>> {
    let rest = read.get(at..).filter(|r| !r.is_empty())?;
    let first = rest[0] == MAGIC_FIRST;
    let len = if rest.len() >= HEADER && (first || rest[0] == MAGIC) {
        u32::from_be_bytes([0, rest[1], rest[2], rest[3]]) as usize
    } else {
        0
    };
    if len == 0 || HEADER + len > rest.len() {
        return Some(Err(()));
    }
    Some(Ok(Message {
        at: at + HEADER..at + HEADER + len,
        first,
    }))
}

/// The messages of one UDP read, in order. A message cut short or a
/// missing magic byte ends the read with `Err(())`: the read was torn.
pub fn messages(read: &[u8]) -> impl Iterator<Item = Result<Message, ()>> + '_ {
    let mut at = Some(0);
    std::iter::from_fn(move || {
        let m = next_message(read, at?);
        at = match &m {
            Some(Ok(m)) => Some(m.at.end),
            _ => None,
        };
        m
    })
}

/// What [`deliver`] did with one UDP read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Delivered {
    /// Where in the read a first part ending it (opened, if sealed) waits
    /// for its rest: to be held for the next read.
    pub hold: Option<std::ops::Range<usize>>,
    /// Messages dropped as torn: cut short, without a magic byte, a first
    /// part not followed by its rest, or a rest whose first part was
    /// forged.
    pub torn: u64,
    /// Messages `open` refused.
    pub forged: u64,
}

/// Hands every TUN packet of one UDP read to `write`, as its one or two
/// parts, given the first part `held` back from the read before. Each
/// message is first given to `open`, which returns the range of it that
/// is the TUN read (all of it in clear; [`Seal::open`] when sealed) or
/// `None` to drop it as forged.
pub fn deliver(
    read: &mut [u8],
    held: Option<&[u8]>,
    mut open: impl FnMut(&mut [u8]) -> Option<std::ops::Range<usize>>,
    mut write: impl FnMut([&[u8]; 2]),
) -> Delivered {
    /// A first part waiting for its rest.
    #[derive(Clone, PartialEq)]
    enum First {
        Held,
        At(std::ops::Range<usize>),
    }
    let mut d = Delivered::default();
    let mut first = held.map(|_| First::Held);
    // A forged first part: its rest is dropped too.
    let mut orphan = false;
    let mut at = 0;
    while let Some(m) = next_message(read, at) {
        let Ok(m) = m else {
            d.torn += 1 + u64::from(first.is_some());
            return d;
        };
        at = m.at.end;
        let Some(r) = open(&mut read[m.at.clone()]) else {
            d.forged += 1;
            // What waits for a rest cannot have this one.
            d.torn += u64::from(first.take().is_some());
            orphan = m.first;
            continue;
        };
        let r = m.at.start + r.start..m.at.start + r.end;
        match (first.take(), m.first) {
            (prev, true) => {
                // A first part before this one lost its rest.
                d.torn += u64::from(prev.is_some());
                first = Some(First::At(r));
            }
            (Some(First::At(a)), false) => write([&read[a], &read[r]]),
            (Some(First::Held), false) => write([held.unwrap_or_default(), &read[r]]),
            (None, false) if orphan => d.torn += 1,
            (None, false) => write([&read[r], &[]]),
        }
        orphan = false;
    }
    match first {
        Some(First::At(r)) => d.hold = Some(r),
        // Held from before and still without its rest.
        Some(First::Held) => d.torn += 1,
        None => {}
    }
    d
}

/// `espgate bench relay`.
pub fn main(a: &Args) -> ExitCode {
    match relay(a) {
        Ok(c) => {
            eprintln!(
                "espgate bench relay: stopped; sent {} delivered {} torn {} forged {} errors {}",
                c.sent, c.delivered, c.torn, c.forged, c.errors
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

    let mut seal = match &a.seal_key_file {
        Some(path) => {
            let key = read_key(path)?;
            let low = a.local.ip() < a.peer.ip()
                || (a.local.ip() == a.peer.ip() && a.local.port() < a.peer.port());
            Some(Seal::new(&key, seg, low)?)
        }
        None => None,
    };

    let mut c = Counts::default();
    // The TUN read goes after room for the frame header, the nonce and
    // the tags in front of it.
    let off = HEADER + if seal.is_some() { NONCE + TAGS_MAX } else { 0 };
    let mut tx = vec![0u8; off + BUF];
    // Two receive buffers: a first part at the end of one read stays where
    // it is while the rest is read into the other.
    let mut rx = [vec![0u8; BUF], vec![0u8; BUF]];
    let mut cur = 0;
    let mut pending: Option<std::ops::Range<usize>> = None;
    let seg16 = u16::try_from(seg).context("segment size")?;
    // Sends `tx[data]` as one message (sealed first, if sealing), its
    // frame header and what sealing adds written in front of it.
    let send = |tx: &mut [u8],
                data: std::ops::Range<usize>,
                first: bool,
                seal: Option<&mut Seal>,
                c: &mut Counts|
     -> Result<()> {
        let start = match seal {
            Some(s) => s.seal(tx, data.clone())?,
            None => data.start,
        };
        let at = start
            .checked_sub(HEADER)
            .context("no room for the header")?;
        put_header(&mut tx[at..], data.end - start, first);
        let msg = &tx[at..data.end];
        let iov = [std::io::IoSlice::new(msg)];
        let gso = [ControlMessage::UdpGsoSegments(&seg16)];
        let cmsgs: &[ControlMessage] = if msg.len() > seg { &gso } else { &[] };
        match sock::sendmsg::<()>(udp.as_raw_fd(), &iov, cmsgs, MsgFlags::empty(), None) {
            Ok(_) => c.sent += 1,
            Err(_) => c.errors += 1,
        }
        Ok(())
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
        // in two (the second part's header, nonce and tags written over
        // the first part's last bytes, already sent).
        for _ in 0..BATCH {
            let n = match nix::unistd::read(&tun, &mut tx[off..]) {
                Ok(n) => n,
                Err(nix::errno::Errno::EAGAIN) => break,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => bail!("TUN read: {e}"),
            };
            if n <= VNET_HDR {
                continue;
            }
            let extra = seal.as_ref().map_or(0, |s| s.overhead(n));
            if HEADER + extra + n <= UDP_MAX {
                send(&mut tx, off..off + n, false, seal.as_mut(), &mut c)?;
                continue;
            }
            let half = n / 2;
            send(&mut tx, off..off + half, true, seal.as_mut(), &mut c)?;
            send(&mut tx, off + half..off + n, false, seal.as_mut(), &mut c)?;
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
            let [r0, r1] = &mut rx;
            let (now, other) = if cur == 0 { (r0, &*r1) } else { (r1, &*r0) };
            let held = pending.take().map(|r| &other[r]);
            let (mut ok, mut failed) = (0, 0);
            let d = deliver(
                &mut now[..n],
                held,
                |m| match &seal {
                    Some(s) => s.open(m),
                    None => Some(0..m.len()),
                },
                |parts| {
                    let iov = parts.map(std::io::IoSlice::new);
                    match nix::sys::uio::writev(&tun, &iov) {
                        Ok(_) => ok += 1,
                        Err(_) => failed += 1,
                    }
                },
            );
            c.delivered += ok;
            c.errors += failed;
            c.torn += d.torn;
            c.forged += d.forged;
            // A first part ending the read waits, where it is, for the rest.
            if let Some(r) = d.hold {
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

    /// `deliver`'s packets (in clear), each as its parts joined, and its
    /// result.
    fn delivered(
        read: &[u8],
        held: Option<&[u8]>,
    ) -> (Vec<Vec<u8>>, Option<std::ops::Range<usize>>, u64) {
        let mut v = Vec::new();
        let mut read = read.to_vec();
        let d = deliver(
            &mut read,
            held,
            |m| Some(0..m.len()),
            |[a, b]| v.push([a, b].concat()),
        );
        assert_eq!(d.forged, 0);
        (v, d.hold, d.torn)
    }

    /// A sealed message of `data` (sealed by `s`) with its frame header.
    fn sealed(s: &mut Seal, data: &[u8], first: bool) -> Vec<u8> {
        let off = HEADER + NONCE + TAGS_MAX;
        let mut buf = vec![0u8; off];
        buf.extend_from_slice(data);
        let end = buf.len();
        let start = s.seal(&mut buf, off..end).unwrap();
        assert_eq!(off - start, s.overhead(data.len()));
        put_header(&mut buf[start - HEADER..], end - start, first);
        buf.drain(..start - HEADER);
        buf
    }

    #[test]
    fn sealed_reads_open_on_the_other_side_and_a_changed_bit_is_forged() {
        let key = [0x42u8; 16];
        let (mut a, b) = (
            Seal::new(&key, 1472, true).unwrap(),
            Seal::new(&key, 1472, false).unwrap(),
        );
        let data: Vec<Vec<u8>> = [1usize, 1472, 1473, 5000, 65_000]
            .iter()
            .map(|&n| (0..n).map(|i| (i * 7 + n) as u8).collect())
            .collect();
        let mut read = Vec::new();
        for d in &data {
            let m = sealed(&mut a, d, false);
            // Ciphertext, not the read (a long read's first 64 bytes are
            // nowhere in it).
            if d.len() >= 64 {
                assert!(!m.windows(64).any(|w| w == &d[..64]));
            }
            read.extend_from_slice(&m);
        }
        let mut got = Vec::new();
        let d = deliver(
            &mut read.clone(),
            None,
            |m| b.open(m),
            |[x, y]| got.push([x, y].concat()),
        );
        assert_eq!((got, d), (data.clone(), Delivered::default()));
        // Each piece has a nonce of its own: 1 + 1 + 2 + 4 + 45 so far.
        assert_eq!(a.next, 53);
        // One bit changed anywhere in the second message (nonce, a tag,
        // the body): that message alone is forged.
        let second = HEADER + NONCE + TAG + 1 + HEADER;
        let len2 = NONCE + TAG + 1472;
        for at in [
            second,
            second + 5,
            second + NONCE,
            second + NONCE + TAG,
            second + len2 - 1,
        ] {
            let mut bad = read.clone();
            bad[at] ^= 0x10;
            let mut got = Vec::new();
            let d = deliver(
                &mut bad,
                None,
                |m| b.open(m),
                |[x, y]| got.push([x, y].concat()),
            );
            assert_eq!(d.forged, 1, "bit at {at}");
            assert_eq!(got.len(), data.len() - 1, "bit at {at}");
            assert!(!got.contains(&data[1]), "bit at {at}");
        }
        // The side that sealed cannot open its own messages as the
        // other side's: the directions' nonces differ.
        let mut a2 = Seal::new(&key, 1472, true).unwrap();
        let b2 = Seal::new(&key, 1472, false).unwrap();
        let mut m = sealed(&mut a2, &data[1], false);
        let mut m2 = m.clone();
        let mut opened = m2.split_off(HEADER);
        assert!(b2.open(&mut opened).is_some());
        assert_eq!(m[HEADER..HEADER + 4], [0, 0, 0, 1]);
        let mut from_b = sealed(&mut Seal::new(&key, 1472, false).unwrap(), &data[1], false);
        assert_eq!(from_b[HEADER..HEADER + 4], [0, 0, 0, 2]);
        assert_ne!(m[HEADER + NONCE..], from_b[HEADER + NONCE..]);
        // Too short to hold a nonce and a piece: refused.
        for n in [0, NONCE, NONCE + TAG] {
            assert!(b2.open(&mut m[HEADER..HEADER + n]).is_none(), "{n}");
        }
        assert!(b2.open(&mut from_b[HEADER..]).is_some());
    }

    #[test]
    fn a_forged_first_part_takes_its_rest_with_it() {
        let key = [7u8; 32];
        let (mut a, b) = (
            Seal::new(&key, 600, true).unwrap(),
            Seal::new(&key, 600, false).unwrap(),
        );
        let mut read = sealed(&mut a, b"one", false);
        let first_at = read.len();
        read.extend(sealed(&mut a, &[1; 900], true));
        read.extend(sealed(&mut a, &[2; 900], false));
        read.extend(sealed(&mut a, b"last", false));
        read[first_at + HEADER + NONCE + 3] ^= 1;
        let mut got = Vec::new();
        let d = deliver(
            &mut read,
            None,
            |m| b.open(m),
            |[x, y]| got.push([x, y].concat()),
        );
        assert_eq!(got, [&b"one"[..], b"last"].map(<[u8]>::to_vec));
        assert_eq!((d.forged, d.torn, d.hold), (1, 1, None));
    }

    #[test]
    fn sealing_refuses_a_spent_counter_short_room_and_bad_keys() {
        let mut s = Seal::new(&[1; 16], 1000, true).unwrap();
        s.next = u64::MAX - 1;
        let mut buf = vec![0u8; 4000];
        assert!(
            s.seal(&mut buf, 2000..4000).is_err(),
            "three pieces, two nonces left"
        );
        assert_eq!(s.next, u64::MAX - 1, "nothing taken");
        s.next = 0;
        assert!(
            s.seal(&mut buf, 20..1000).is_err(),
            "no room for nonce and tag"
        );
        assert!(Seal::new(&[1; 24], 1000, true).is_err());
        assert!(Seal::new(&[1; 16], 100, true).is_err());
        assert!(!format!("{s:?}").contains("[1, 1"));
        let dir = std::env::temp_dir().join(format!("espgate-relay-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("k");
        for (text, ok) in [
            ("00112233445566778899aabbccddeeff\n", true),
            ("0011", false),
            ("zz112233445566778899aabbccddeeff", false),
        ] {
            std::fs::write(&f, text).unwrap();
            assert_eq!(read_key(&f).is_ok(), ok, "{text}");
        }
        assert!(read_key(&f.with_extension("none")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
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
