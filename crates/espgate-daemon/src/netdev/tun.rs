//! Linux L3 TUN devices: `/dev/net/tun` with `IFF_TUN | IFF_NO_PI`,
//! optionally multi-queue and with a virtio-net header for offloads.
//!
//! Reads, writes and `O_NONBLOCK` go through `rustix`. The two TUN
//! ioctls (`TUNSETIFF`, `TUNSETOFFLOAD`) stay hand-written over `libc`:
//! neither `rustix` 1.1 nor `nix` 0.31 has them, and both crates' generic
//! ioctl helpers (`rustix::ioctl::ioctl`, `nix`'s `ioctl_*!` macros) are
//! as unsafe as the call itself. Every `unsafe` block here is one of them,
//! on a descriptor this module owns, with a `#[repr(C)]` argument from
//! `libc` of the size the kernel expects.
//!
//! The device is *not* persistent: it exists while at least one of its
//! queues is open and the kernel deletes it (with its addresses and routes)
//! when the last one is closed.

use super::NetError;
use std::fmt;
use std::fs::OpenOptions;
use std::io;
use std::ops::{BitAnd, BitOr, BitOrAssign, Sub};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

/// Path of the TUN/TAP clone device.
const TUN_CLONE_DEV: &str = "/dev/net/tun";

/// `IFF_TUN_EXCL`: fail `TUNSETIFF` with `EBUSY` if the name already exists.
/// Used for the first queue only so that we never attach to someone else's
/// (e.g. persistent or multi-queue) device by accident.
const IFF_TUN_EXCL: libc::c_int = 0x8000;

/// Length of the `struct virtio_net_hdr` that prefixes every packet read
/// from or written to a queue opened with [`TunBuilder::vnet_hdr`].
///
/// This is the kernel's default (`TUNGETVNETHDRSZ` = 10); it is not changed.
pub const VNET_HDR_LEN: usize = 10;

/// The `struct virtio_net_hdr` that prefixes packets on a `IFF_VNET_HDR`
/// device (native byte order, which is what the TUN driver uses unless
/// `TUNSETVNETBE` is set; it never is here).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VirtioNetHdr {
    /// `VIRTIO_NET_HDR_F_*`: 1 = `NEEDS_CSUM`, 2 = `DATA_VALID`.
    pub flags: u8,
    /// `VIRTIO_NET_HDR_GSO_*`: 0 none, 1 TCPv4, 3 UDP (UFO), 4 TCPv6,
    /// 5 UDP_L4 (USO); 0x80 ECN.
    pub gso_type: u8,
    /// Length of the headers to copy into each segment.
    pub hdr_len: u16,
    /// Payload bytes per segment (the MSS).
    pub gso_size: u16,
    /// Where checksumming starts, from the start of the packet.
    pub csum_start: u16,
    /// Where to store the checksum, from `csum_start`.
    pub csum_offset: u16,
}

impl VirtioNetHdr {
    /// `VIRTIO_NET_HDR_F_NEEDS_CSUM`.
    pub const F_NEEDS_CSUM: u8 = 1;
    /// `VIRTIO_NET_HDR_GSO_NONE`.
    pub const GSO_NONE: u8 = 0;
    /// `VIRTIO_NET_HDR_GSO_TCPV4`.
    pub const GSO_TCPV4: u8 = 1;
    /// `VIRTIO_NET_HDR_GSO_TCPV6`.
    pub const GSO_TCPV6: u8 = 4;
    /// `VIRTIO_NET_HDR_GSO_UDP_L4` (USO).
    pub const GSO_UDP_L4: u8 = 5;
    /// `VIRTIO_NET_HDR_GSO_ECN`: or'ed into a TSO type when the
    /// super-segment carries CWR (only with `TSO_ECN`, never requested here).
    pub const GSO_ECN: u8 = 0x80;

    /// Parses the first [`VNET_HDR_LEN`] bytes; `None` if `b` is shorter.
    pub fn parse(b: &[u8]) -> Option<VirtioNetHdr> {
        let b: &[u8; VNET_HDR_LEN] = b.get(..VNET_HDR_LEN)?.try_into().ok()?;
        let u16_at = |i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
        Some(VirtioNetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u16_at(2),
            gso_size: u16_at(4),
            csum_start: u16_at(6),
            csum_offset: u16_at(8),
        })
    }

    /// The header's wire form.
    pub fn to_bytes(&self) -> [u8; VNET_HDR_LEN] {
        let mut b = [0u8; VNET_HDR_LEN];
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_ne_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_ne_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_ne_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_ne_bytes());
        b
    }
}

/// A set of `TUN_F_*` offload flags (`TUNSETOFFLOAD`): what the reader of
/// the TUN can handle in packets the kernel sends it (checksum left to do,
/// TCP/UDP super-packets to segment).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Offloads(u32);

impl Offloads {
    /// No offloads: every packet is complete and checksummed.
    pub const NONE: Offloads = Offloads(0);
    /// `TUN_F_CSUM`: packets may carry a partial checksum. Every other flag
    /// requires this one.
    pub const CSUM: Offloads = Offloads(libc::TUN_F_CSUM);
    /// `TUN_F_TSO4`: TCP/IPv4 super-packets.
    pub const TSO4: Offloads = Offloads(libc::TUN_F_TSO4);
    /// `TUN_F_TSO6`: TCP/IPv6 super-packets.
    pub const TSO6: Offloads = Offloads(libc::TUN_F_TSO6);
    /// `TUN_F_TSO_ECN`: TSO with the ECN (CWR) bit set; needs TSO4 or TSO6.
    pub const TSO_ECN: Offloads = Offloads(libc::TUN_F_TSO_ECN);
    /// `TUN_F_USO4`: UDP/IPv4 super-packets (`UDP_SEGMENT`). Kernels up to
    /// at least 6.18 accept it only together with [`Offloads::USO6`].
    pub const USO4: Offloads = Offloads(libc::TUN_F_USO4);
    /// `TUN_F_USO6`: UDP/IPv6 super-packets.
    pub const USO6: Offloads = Offloads(libc::TUN_F_USO6);
    /// `TUN_F_UDP_TUNNEL_GSO` (Linux 6.17+): GSO of UDP-tunnelled packets.
    /// Needs a larger vnet header than [`VNET_HDR_LEN`] to be usable; listed
    /// so that probing can report it.
    pub const UDP_TUNNEL_GSO: Offloads = Offloads(0x080);
    /// `TUN_F_UDP_TUNNEL_GSO_CSUM` (Linux 6.17+): ditto, with outer checksum.
    pub const UDP_TUNNEL_GSO_CSUM: Offloads = Offloads(0x100);

    /// Every flag this module knows, in the order they are probed.
    const NAMED: [(Offloads, &'static str); 8] = [
        (Offloads::CSUM, "CSUM"),
        (Offloads::TSO4, "TSO4"),
        (Offloads::TSO6, "TSO6"),
        (Offloads::TSO_ECN, "TSO_ECN"),
        (Offloads::USO4, "USO4"),
        (Offloads::USO6, "USO6"),
        (Offloads::UDP_TUNNEL_GSO, "UDP_TUNNEL_GSO"),
        (Offloads::UDP_TUNNEL_GSO_CSUM, "UDP_TUNNEL_GSO_CSUM"),
    ];

    /// The flags a TCP/UDP-segmentation-aware reader would ask for:
    /// `CSUM | TSO4 | TSO6 | USO4 | USO6`.
    pub const fn tcp_udp_gso() -> Offloads {
        Offloads(
            libc::TUN_F_CSUM
                | libc::TUN_F_TSO4
                | libc::TUN_F_TSO6
                | libc::TUN_F_USO4
                | libc::TUN_F_USO6,
        )
    }

    /// The raw `TUN_F_*` bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// From raw `TUN_F_*` bits (unknown bits are kept and will be refused
    /// by the kernel, then dropped by [`Tun::set_offloads`]).
    pub const fn from_bits(bits: u32) -> Offloads {
        Offloads(bits)
    }

    /// True if every flag of `other` is in `self`.
    pub const fn contains(self, other: Offloads) -> bool {
        self.0 & other.0 == other.0
    }

    /// True if no flag is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl BitOr for Offloads {
    type Output = Offloads;
    fn bitor(self, rhs: Offloads) -> Offloads {
        Offloads(self.0 | rhs.0)
    }
}

impl BitOrAssign for Offloads {
    fn bitor_assign(&mut self, rhs: Offloads) {
        self.0 |= rhs.0;
    }
}

impl BitAnd for Offloads {
    type Output = Offloads;
    fn bitand(self, rhs: Offloads) -> Offloads {
        Offloads(self.0 & rhs.0)
    }
}

impl Sub for Offloads {
    type Output = Offloads;
    /// The flags of `self` that are not in `rhs`.
    fn sub(self, rhs: Offloads) -> Offloads {
        Offloads(self.0 & !rhs.0)
    }
}

impl fmt::Display for Offloads {
    /// `CSUM|TSO4|…`, `none` for the empty set, unknown bits in hex.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("none");
        }
        let mut rest = *self;
        let mut first = true;
        for (flag, name) in Offloads::NAMED {
            if self.contains(flag) {
                if !first {
                    f.write_str("|")?;
                }
                f.write_str(name)?;
                first = false;
                rest = rest - flag;
            }
        }
        if !rest.is_empty() {
            if !first {
                f.write_str("|")?;
            }
            write!(f, "{:#x}", rest.0)?;
        }
        Ok(())
    }
}

impl fmt::Debug for Offloads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Offloads({self})")
    }
}

/// Options for creating a TUN device; see [`Tun::builder`].
#[derive(Debug, Clone)]
pub struct TunBuilder {
    name: String,
    queues: usize,
    multi_queue: bool,
    vnet_hdr: bool,
    nonblocking: bool,
}

impl TunBuilder {
    /// Opens `n` queues (`n >= 1`) with `IFF_MULTI_QUEUE`, so that `n`
    /// threads can each read and write their own descriptor. The kernel
    /// spreads the packets it sends to the device over the queues by flow.
    pub fn multi_queue(mut self, n: usize) -> TunBuilder {
        self.queues = n;
        self.multi_queue = true;
        self
    }

    /// Sets `IFF_VNET_HDR`: every packet read or written is prefixed by a
    /// [`VirtioNetHdr`] of [`VNET_HDR_LEN`] bytes. Required for
    /// [`Tun::set_offloads`].
    pub fn vnet_hdr(mut self, on: bool) -> TunBuilder {
        self.vnet_hdr = on;
        self
    }

    /// Opens the queues with `O_NONBLOCK`: `read` returns
    /// [`io::ErrorKind::WouldBlock`] when no packet is waiting.
    pub fn nonblocking(mut self, on: bool) -> TunBuilder {
        self.nonblocking = on;
        self
    }

    /// Creates the device and opens its queues.
    ///
    /// Creation is exclusive: if an interface of that name already exists
    /// (even another TUN), this fails with `EBUSY` rather than attach to it.
    pub fn open(self) -> Result<Tun, NetError> {
        let action = || format!("creating TUN device {}", self.name);
        let name = ifname(&self.name).map_err(|e| NetError::new(action(), e))?;
        if self.queues == 0 {
            return Err(NetError::new(
                action(),
                io::Error::new(io::ErrorKind::InvalidInput, "zero queues requested"),
            ));
        }
        let mut flags = libc::IFF_TUN | libc::IFF_NO_PI;
        if self.multi_queue {
            flags |= libc::IFF_MULTI_QUEUE;
        }
        if self.vnet_hdr {
            flags |= libc::IFF_VNET_HDR;
        }
        let (first, real_name) = open_queue(&name, flags | IFF_TUN_EXCL, self.nonblocking)
            .map_err(|e| {
                let busy = e.raw_os_error() == Some(libc::EBUSY);
                NetError::new(action(), e).with_detail(
                    busy.then(|| format!("an interface named {} already exists", self.name)),
                )
            })?;
        let mut tun = Tun {
            name: real_name,
            flags,
            nonblocking: self.nonblocking,
            queues: vec![first],
            offloads: Offloads::NONE,
        };
        for _ in 1..self.queues {
            tun.attach_queue()?;
        }
        Ok(tun)
    }
}

/// One queue of a TUN device: a descriptor on which one packet is read or
/// written per call.
#[derive(Debug)]
pub struct TunQueue {
    fd: OwnedFd,
}

impl TunQueue {
    /// Reads one packet (with its [`VirtioNetHdr`] first on a vnet-header
    /// device) into `buf`, returning its length. A packet longer than `buf`
    /// is truncated. On a non-blocking queue, `WouldBlock` means none is
    /// waiting.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        Ok(rustix::io::read(&self.fd, buf)?)
    }

    /// Writes one packet (an IPv4 or IPv6 datagram, preceded by its
    /// [`VirtioNetHdr`] on a vnet-header device) for the kernel to receive
    /// as if it had arrived on the interface. Returns the bytes written.
    pub fn write(&self, pkt: &[u8]) -> io::Result<usize> {
        Ok(rustix::io::write(&self.fd, pkt)?)
    }

    /// Writes one packet given in parts (on a vnet-header device: the
    /// [`VirtioNetHdr`] bytes, then the packet), in one `writev(2)`, so the
    /// header need not be copied in front of the packet.
    pub fn write_parts(&self, parts: &[io::IoSlice<'_>]) -> io::Result<usize> {
        Ok(rustix::io::writev(&self.fd, parts)?)
    }

    /// Switches `O_NONBLOCK` on or off for this queue.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        set_nonblocking(self.fd.as_fd(), on)
    }
}

impl AsRawFd for TunQueue {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for TunQueue {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A named L3 TUN device (`IFF_TUN | IFF_NO_PI`) and its open queues.
///
/// `read`, `write` and `as_raw_fd` on the `Tun` itself use queue 0; use
/// [`Tun::queues`] or [`Tun::into_queues`] for the others.
#[derive(Debug)]
pub struct Tun {
    name: String,
    flags: libc::c_int,
    nonblocking: bool,
    queues: Vec<TunQueue>,
    offloads: Offloads,
}

impl Tun {
    /// Starts building a TUN device named `name` (at most 15 bytes; a
    /// `%d` in it lets the kernel pick a number). Defaults: one queue, no
    /// vnet header, blocking.
    pub fn builder(name: &str) -> TunBuilder {
        TunBuilder {
            name: name.to_owned(),
            queues: 1,
            multi_queue: false,
            vnet_hdr: false,
            nonblocking: false,
        }
    }

    /// Creates a single-queue, blocking TUN device named `name`.
    pub fn open(name: &str) -> Result<Tun, NetError> {
        Tun::builder(name).open()
    }

    /// The interface name the kernel gave the device.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// True if opened with `IFF_MULTI_QUEUE`.
    pub fn is_multi_queue(&self) -> bool {
        self.flags & libc::IFF_MULTI_QUEUE != 0
    }

    /// True if packets carry a [`VirtioNetHdr`] (`IFF_VNET_HDR`).
    pub fn has_vnet_hdr(&self) -> bool {
        self.flags & libc::IFF_VNET_HDR != 0
    }

    /// The open queues.
    pub fn queues(&self) -> &[TunQueue] {
        &self.queues
    }

    /// Gives up the `Tun` for its queues, e.g. to move one to each thread.
    /// The device lives until the last queue is dropped.
    pub fn into_queues(self) -> Vec<TunQueue> {
        self.queues
    }

    /// Opens one more queue on a multi-queue device, with the same flags.
    pub fn attach_queue(&mut self) -> Result<&TunQueue, NetError> {
        let action = || {
            format!(
                "opening queue {} of TUN device {}",
                self.queues.len(),
                self.name
            )
        };
        if !self.is_multi_queue() {
            return Err(NetError::new(
                action(),
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "the device was not created multi-queue",
                ),
            ));
        }
        let name = ifname(&self.name).map_err(|e| NetError::new(action(), e))?;
        let (q, _) = open_queue(&name, self.flags, self.nonblocking)
            .map_err(|e| NetError::new(action(), e))?;
        if !self.offloads.is_empty() {
            // Offloads are device-wide, but re-assert them in case the
            // attach reset anything; the kernel accepted this set already.
            tunsetoffload(q.as_fd(), self.offloads).map_err(|e| NetError::new(action(), e))?;
        }
        self.queues.push(q);
        Ok(self.queues.last().expect("just pushed"))
    }

    /// The offloads last accepted by [`Tun::set_offloads`] (none at first).
    pub fn offloads(&self) -> Offloads {
        self.offloads
    }

    /// Asks the kernel for the offloads in `want` (`TUNSETOFFLOAD`, which
    /// applies to the whole device) and returns the subset it accepted.
    ///
    /// The kernel takes a set or refuses it whole (`EINVAL`), so when the
    /// whole of `want` is refused this probes: it builds the accepted set
    /// flag by flag in [`Offloads`] order, trying `USO4` and `USO6`
    /// together before alone (kernels up to 6.18 only take them as a pair),
    /// and keeps what each step accepts. `CSUM` is a prerequisite of the
    /// rest. The device ends up with exactly the returned set; [`Offloads::NONE`]
    /// is always accepted, so this only fails for reasons other than
    /// unsupported flags (or without a vnet header: packets the kernel
    /// could not describe would be corrupt).
    pub fn set_offloads(&mut self, want: Offloads) -> Result<Offloads, NetError> {
        let action = || format!("setting offloads {want} on TUN device {}", self.name);
        if !self.has_vnet_hdr() && !want.is_empty() {
            return Err(NetError::new(
                action(),
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "offloads need a device opened with vnet_hdr(true)",
                ),
            ));
        }
        let fd = self.queues[0].as_fd();
        match tunsetoffload(fd, want) {
            Ok(()) => {
                self.offloads = want;
                return Ok(want);
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(NetError::new(action(), e)),
        }
        let mut accepted = Offloads::NONE;
        let uso_pair = Offloads::USO4 | Offloads::USO6;
        let mut steps: Vec<Offloads> = Vec::new();
        for (flag, _) in Offloads::NAMED {
            if flag == Offloads::USO4 && want.contains(uso_pair) {
                steps.push(uso_pair);
            }
            steps.push(flag);
        }
        // Unknown bits last, all together.
        let known = Offloads::NAMED
            .iter()
            .fold(Offloads::NONE, |a, (f, _)| a | *f);
        steps.push(want - known);
        for step in steps {
            let step = step & want;
            if step.is_empty() || accepted.contains(step) {
                continue;
            }
            match tunsetoffload(fd, accepted | step) {
                Ok(()) => accepted |= step,
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                Err(e) => return Err(NetError::new(action(), e)),
            }
        }
        // Leave the device with exactly `accepted` (the last successful call
        // already did, unless nothing was accepted at all).
        tunsetoffload(fd, accepted).map_err(|e| NetError::new(action(), e))?;
        self.offloads = accepted;
        Ok(accepted)
    }

    /// Reads one packet from queue 0; see [`TunQueue::read`].
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.queues[0].read(buf)
    }

    /// Writes one packet to queue 0; see [`TunQueue::write`].
    pub fn write(&self, pkt: &[u8]) -> io::Result<usize> {
        self.queues[0].write(pkt)
    }

    /// Writes one packet in parts to queue 0; see [`TunQueue::write_parts`].
    pub fn write_parts(&self, parts: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.queues[0].write_parts(parts)
    }
}

impl AsRawFd for Tun {
    /// The descriptor of queue 0.
    fn as_raw_fd(&self) -> RawFd {
        self.queues[0].as_raw_fd()
    }
}

impl AsFd for Tun {
    /// The descriptor of queue 0.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.queues[0].as_fd()
    }
}

/// Checks `name` and turns it into the NUL-padded `ifr_name` array.
fn ifname(name: &str) -> io::Result<[libc::c_char; libc::IFNAMSIZ]> {
    let bad = |why: &str| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad interface name {name:?}: {why}"),
        )
    };
    if name.is_empty() {
        return Err(bad("empty"));
    }
    if name.len() >= libc::IFNAMSIZ {
        return Err(bad("longer than 15 bytes"));
    }
    if name
        .bytes()
        .any(|b| b == 0 || b == b'/' || b == b':' || b.is_ascii_whitespace())
    {
        return Err(bad("contains NUL, '/', ':' or whitespace"));
    }
    let mut out = [0 as libc::c_char; libc::IFNAMSIZ];
    for (o, b) in out.iter_mut().zip(name.bytes()) {
        *o = b as libc::c_char;
    }
    Ok(out)
}

/// Opens `/dev/net/tun` and attaches it to (or creates) `name` with `flags`
/// (`IFF_*`); returns the queue and the name the kernel reports.
fn open_queue(
    name: &[libc::c_char; libc::IFNAMSIZ],
    flags: libc::c_int,
    nonblocking: bool,
) -> io::Result<(TunQueue, String)> {
    let mut custom = libc::O_CLOEXEC;
    if nonblocking {
        custom |= libc::O_NONBLOCK;
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(custom)
        .open(TUN_CLONE_DEV)
        .map_err(|e| io::Error::new(e.kind(), format!("opening {TUN_CLONE_DEV}: {e}")))?;
    let fd: OwnedFd = file.into();
    // SAFETY: `ifreq` is plain old data (a char array and a union of
    // integers, sockaddrs and a pointer), for which all-zero is valid.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    ifr.ifr_name = *name;
    // `ifr_flags` is a C short; IFF_TUN_EXCL (0x8000) is its sign bit.
    ifr.ifr_ifru.ifru_flags = flags as u16 as libc::c_short;
    // SAFETY: TUNSETIFF reads and writes one `struct ifreq` through the
    // pointer, which points to a live, properly sized `libc::ifreq`; the
    // fd is an open /dev/net/tun descriptor we own.
    let rc = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            libc::TUNSETIFF,
            &mut ifr as *mut libc::ifreq,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let real: Vec<u8> = ifr
        .ifr_name
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    Ok((TunQueue { fd }, String::from_utf8_lossy(&real).into_owned()))
}

/// `TUNSETOFFLOAD`: the argument is the flag word itself, not a pointer.
fn tunsetoffload(fd: BorrowedFd<'_>, flags: Offloads) -> io::Result<()> {
    // SAFETY: TUNSETOFFLOAD takes an integer argument by value and touches
    // no user memory; `fd` is an open TUN queue owned by the caller.
    let rc = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            libc::TUNSETOFFLOAD,
            libc::c_ulong::from(flags.bits()),
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Sets or clears `O_NONBLOCK` on `fd`.
fn set_nonblocking(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    use rustix::fs::{fcntl_getfl, fcntl_setfl, OFlags};
    let fl = fcntl_getfl(fd)?;
    let mut new = fl;
    new.set(OFlags::NONBLOCK, on);
    if new != fl {
        fcntl_setfl(fd, new)?;
    }
    Ok(())
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn offloads_display() {
        assert_eq!(Offloads::NONE.to_string(), "none");
        assert_eq!(
            Offloads::tcp_udp_gso().to_string(),
            "CSUM|TSO4|TSO6|USO4|USO6"
        );
        assert_eq!(
            (Offloads::CSUM | Offloads::from_bits(0x1000)).to_string(),
            "CSUM|0x1000"
        );
        assert_eq!(
            (Offloads::tcp_udp_gso() - Offloads::USO4).to_string(),
            "CSUM|TSO4|TSO6|USO6"
        );
    }

    #[test]
    fn vnet_hdr_round_trip() {
        let h = VirtioNetHdr {
            flags: VirtioNetHdr::F_NEEDS_CSUM,
            gso_type: VirtioNetHdr::GSO_UDP_L4,
            hdr_len: 28,
            gso_size: 1400,
            csum_start: 20,
            csum_offset: 6,
        };
        assert_eq!(VirtioNetHdr::parse(&h.to_bytes()), Some(h));
        assert_eq!(VirtioNetHdr::parse(&[0; 9]), None);
    }

    #[test]
    fn bad_names() {
        assert!(ifname("").is_err());
        assert!(ifname("0123456789abcdef").is_err());
        assert!(ifname("a/b").is_err());
        assert!(ifname("espgate0").is_ok());
        assert!(ifname("0123456789abcde").is_ok());
    }
}
