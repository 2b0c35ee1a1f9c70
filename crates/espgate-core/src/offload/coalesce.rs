//! Merging back-to-back TCP packets of one flow into a super-segment for one
//! TUN write (software GRO), and, when the kernel takes UDP super-packets
//! (USO), back-to-back UDP datagrams of one flow likewise (as wireguard-go
//! does since 2024): one TUN write instead of one per datagram.

use super::{addrs, fold, GsoInfo, GsoKind, TCP_CSUM_OFFSET, UDP_CSUM_OFFSET};
use crate::wire::tcp::{field, flags, Tcp};
use crate::wire::{checksum, ipv4, ipv6, proto, put16, udp};

/// Largest super-segment the coalescer builds (IP total length, either
/// version).
pub const MAX_SUPER_LEN: usize = 65535;
/// Most packets merged into one super-segment.
pub const MAX_COALESCE_SEGMENTS: usize = 64;

/// What [`Coalescer::push`] did with a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Push {
    /// Copied in: it started a new super-segment or was appended to the
    /// pending one. The caller's buffer is free again.
    Absorbed,
    /// It cannot join the pending super-segment (other flow, sequence gap,
    /// larger payload, limits reached, the pending one is closed or its first
    /// packet's checksum is bad). [`Coalescer::take`] and write the pending
    /// one, then push this packet again (it will be absorbed or ineligible).
    FlushFirst,
    /// Not coalescable at all. Nothing was copied. Take and write the pending
    /// super-segment first (to keep the order), then write this packet alone.
    Ineligible,
}

/// A parsed packet that may be coalesced.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    v6: bool,
    /// UDP (else TCP).
    udp: bool,
    /// IP header length (20 or 40: no options, no extension headers).
    l4: usize,
    /// IP + TCP header length.
    hdr: usize,
    payload: usize,
    seq: u32,
    flags: u8,
}

/// Builds TCP super-segments out of consecutive packets of one flow (and,
/// with [`Coalescer::with_udp`], UDP super-datagrams), in one buffer of
/// [`MAX_SUPER_LEN`] bytes allocated at construction.
///
/// A packet is a candidate if it is IPv4 without options, not a fragment,
/// with a correct header checksum, or IPv6 with TCP directly after the fixed
/// header; its IP length equals the bytes given; it carries payload; and its
/// flags are ACK plus optionally PSH and ECE (no SYN, FIN, RST, URG, CWR:
/// like the kernel's GRO, such packets go through alone; CWR additionally
/// because a super-segment carrying it would need the GSO ECN flag).
///
/// It joins the pending super-segment only if everything but the IPv4
/// identification, the sequence number, the PSH flag and the checksums is
/// identical to the pending first packet: IP version, addresses, TOS /
/// traffic class and flow label, TTL / hop limit, IPv4 flags (DF), ports,
/// acknowledgment number, data offset, ECE, window, urgent pointer and the
/// option bytes (timestamps included); its sequence number is exactly where
/// the pending data ends; its payload is at most the first packet's (the
/// segment size) — a shorter one or one with PSH closes the super-segment;
/// and the result stays within [`MAX_SUPER_LEN`] bytes and
/// [`MAX_COALESCE_SEGMENTS`] packets.
///
/// Corruption is never merged into a super-segment (whose checksum the
/// kernel then trusts): a packet's TCP checksum is verified before it is
/// appended (bad: `Ineligible`), and the pending first packet's when the
/// second arrives (bad: `FlushFirst`, and it goes out alone, unchanged, for
/// the receiver to drop). A packet that is never merged is never verified.
pub struct Coalescer {
    buf: Box<[u8]>,
    /// Bytes pending; 0 when empty.
    len: usize,
    /// UDP datagrams are merged too ([`Coalescer::with_udp`]).
    udp_on: bool,
    v6: bool,
    /// The pending super-segment is UDP (else TCP).
    udp: bool,
    l4: usize,
    hdr: usize,
    gso_size: usize,
    segs: usize,
    next_seq: u32,
    /// Nothing more may be appended.
    closed: bool,
    /// The first packet's TCP checksum was checked (and is good).
    first_verified: bool,
}

impl std::fmt::Debug for Coalescer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coalescer")
            .field("len", &self.len)
            .field("segs", &self.segs)
            .field("gso_size", &self.gso_size)
            .field("closed", &self.closed)
            .finish()
    }
}

impl Default for Coalescer {
    fn default() -> Self {
        Self::new()
    }
}

impl Coalescer {
    /// An empty coalescer with its buffer, for TCP only.
    pub fn new() -> Coalescer {
        Coalescer::with_udp(false)
    }

    /// An empty coalescer that, with `udp`, also merges UDP datagrams of
    /// one flow into a UDP super-packet (`VIRTIO_NET_HDR_GSO_UDP_L4`): only
    /// for a TUN whose kernel takes USO (`TUN_F_USO4 | TUN_F_USO6`).
    ///
    /// UDP datagrams join when everything but the IPv4 identification and
    /// the UDP checksum is identical to the first one's (IP fields as for
    /// TCP, ports), their payload is at most the first one's (a shorter one
    /// closes the super-packet) and the limits hold. Each one's UDP
    /// checksum is verified before it is merged (a zero IPv4 checksum means
    /// none was sent; the kernel then fills one in), because the kernel
    /// trusts the super-packet's.
    pub fn with_udp(udp: bool) -> Coalescer {
        Coalescer {
            buf: vec![0u8; MAX_SUPER_LEN].into_boxed_slice(),
            len: 0,
            udp_on: udp,
            udp: false,
            v6: false,
            l4: 0,
            hdr: 0,
            gso_size: 0,
            segs: 0,
            next_seq: 0,
            closed: false,
            first_verified: false,
        }
    }

    /// True when nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Packets in the pending super-segment.
    pub fn segments(&self) -> usize {
        if self.len == 0 {
            0
        } else {
            self.segs
        }
    }

    /// Offers one complete inner IP packet. See [`Push`] for what the caller
    /// does with each answer.
    pub fn push(&mut self, pkt: &[u8]) -> Push {
        let Some(c) = candidate(pkt, self.udp_on) else {
            return Push::Ineligible;
        };
        if self.len == 0 {
            self.start(pkt, &c);
            return Push::Absorbed;
        }
        if !self.mergeable(pkt, &c) {
            return Push::FlushFirst;
        }
        if !self.first_verified {
            if !l4_checksum_ok(
                &self.buf[..self.len],
                self.v6,
                self.udp,
                self.l4,
                self.hdr,
                None,
            ) {
                self.closed = true;
                return Push::FlushFirst;
            }
            self.first_verified = true;
        }
        // The payload is copied into place while its checksum is summed
        // (one pass, `checksum::copy_sum`); a bad checksum leaves the
        // pending length as it was, so the bytes copied past it are unused.
        let end = self.len + c.payload;
        if !l4_checksum_ok(
            pkt,
            c.v6,
            c.udp,
            c.l4,
            c.hdr,
            Some(&mut self.buf[self.len..end]),
        ) {
            return Push::Ineligible;
        }
        self.appended(&c);
        Push::Absorbed
    }

    /// Hands out the pending packet(s), leaving the coalescer empty. A single
    /// packet comes back unchanged with [`GsoInfo::NONE`]. A super-segment
    /// gets its IPv4 total length and header checksum (or IPv6 payload
    /// length) fixed and, as the kernel expects of a `CHECKSUM_PARTIAL`
    /// packet (what its own GRO leaves: `th->check = ~tcp_v4_check(len,
    /// saddr, daddr, 0)`), the folded but not complemented pseudo-header sum
    /// over the whole TCP length in the TCP checksum field; its info says
    /// `needs_csum`, `csum_start` = IP header length, `csum_offset` = 16,
    /// `hdr_len` = IP + TCP header length, `gso_size` = the first packet's
    /// payload length. The third value is the number of packets merged (for
    /// counters).
    pub fn take(&mut self) -> Option<(&[u8], GsoInfo, usize)> {
        if self.len == 0 {
            return None;
        }
        let n = std::mem::take(&mut self.len);
        let info = if self.segs == 1 {
            GsoInfo::NONE
        } else {
            self.finish_super(n)
        };
        Some((&self.buf[..n], info, self.segs))
    }

    fn start(&mut self, pkt: &[u8], c: &Candidate) {
        self.buf[..pkt.len()].copy_from_slice(pkt);
        self.len = pkt.len();
        self.v6 = c.v6;
        self.udp = c.udp;
        self.l4 = c.l4;
        self.hdr = c.hdr;
        self.gso_size = c.payload;
        self.segs = 1;
        self.next_seq = c.seq.wrapping_add(c.payload as u32);
        self.closed = c.flags & flags::PSH != 0;
        self.first_verified = false;
    }

    fn mergeable(&self, pkt: &[u8], c: &Candidate) -> bool {
        if self.closed
            || c.v6 != self.v6
            || c.udp != self.udp
            || c.hdr != self.hdr
            || (!c.udp && c.seq != self.next_seq)
            || c.payload > self.gso_size
            || self.segs >= MAX_COALESCE_SEGMENTS
            || self.len + c.payload > MAX_SUPER_LEN
        {
            return false;
        }
        let (a, b) = (&self.buf[..self.hdr], &pkt[..self.hdr]);
        let ip_same = if self.v6 {
            // Version, traffic class, flow label; next header, hop limit, addresses.
            a[..4] == b[..4] && a[6..40] == b[6..40]
        } else {
            // TOS; flags (MF is already known clear); TTL, protocol; addresses.
            a[1] == b[1]
                && a[6] & 0xe0 == b[6] & 0xe0
                && a[8..10] == b[8..10]
                && a[12..20] == b[12..20]
        };
        let (ta, tb) = (&a[self.l4..], &b[self.l4..]);
        if self.udp {
            // Ports (the length follows from the IP length, the checksum
            // is verified).
            return ip_same && ta[..4] == tb[..4];
        }
        let ece = |t: &[u8]| t[field::FLAGS] & flags::ECE;
        // Ports; ack, data offset (and reserved bits); ECE; window,
        // [checksum skipped], urgent pointer, options.
        ip_same
            && ta[field::SRC_PORT.start..field::DST_PORT.end]
                == tb[field::SRC_PORT.start..field::DST_PORT.end]
            && ta[field::ACK_NUM.start..=field::DATA_OFFSET]
                == tb[field::ACK_NUM.start..=field::DATA_OFFSET]
            && ece(ta) == ece(tb)
            && ta[field::WINDOW] == tb[field::WINDOW]
            && ta[field::URGENT.start..] == tb[field::URGENT.start..]
    }

    /// Takes in the packet `c` describes, whose payload was copied after
    /// the pending bytes: its length, sequence number and flags.
    fn appended(&mut self, c: &Candidate) {
        self.len += c.payload;
        self.segs += 1;
        self.next_seq = c.seq.wrapping_add(c.payload as u32);
        if c.payload < self.gso_size {
            self.closed = true;
        }
        if !c.udp && c.flags & flags::PSH != 0 {
            let mut t = Tcp::new_unchecked(&mut self.buf[self.l4..self.hdr]);
            t.set_flags(t.flags() | flags::PSH);
            self.closed = true;
        }
    }

    fn finish_super(&mut self, n: usize) -> GsoInfo {
        // n <= MAX_SUPER_LEN: the conversions below cannot saturate.
        let b = &mut self.buf[..n];
        let (kind, l4) = if self.v6 {
            ipv6::set_payload_len(b, u16::try_from(n - ipv6::HEADER_LEN).unwrap_or(u16::MAX));
            (GsoKind::TcpV6, self.l4)
        } else {
            put16(b, 2, u16::try_from(n).unwrap_or(u16::MAX));
            if let Ok(mut h) = ipv4::Ipv4::new_header_checked(&mut *b) {
                h.fill_checksum();
            }
            (GsoKind::TcpV4, self.l4)
        };
        let (src, dst) = addrs(b, self.v6);
        let l4_len = n - l4;
        let (kind, proto, csum_offset) = if self.udp {
            // The UDP length covers the whole super-packet; the kernel's
            // segmentation rewrites it (and adjusts the checksum) per
            // datagram.
            put16(b, l4 + 4, u16::try_from(l4_len).unwrap_or(u16::MAX));
            (GsoKind::UdpL4, proto::UDP, UDP_CSUM_OFFSET)
        } else {
            (kind, proto::TCP, TCP_CSUM_OFFSET)
        };
        let pseudo = fold(checksum::pseudo_header(src, dst, proto, l4_len as u32));
        put16(b, l4 + usize::from(csum_offset), pseudo);
        GsoInfo {
            kind,
            needs_csum: true,
            hdr_len: u16::try_from(self.hdr).unwrap_or(u16::MAX),
            gso_size: u16::try_from(self.gso_size).unwrap_or(u16::MAX),
            csum_start: u16::try_from(l4).unwrap_or(u16::MAX),
            csum_offset,
        }
    }
}

/// Checks everything about `pkt` that does not depend on the pending
/// super-segment (the TCP checksum is checked later, only if needed).
fn candidate(pkt: &[u8], udp_on: bool) -> Option<Candidate> {
    if pkt.len() > MAX_SUPER_LEN {
        return None;
    }
    let wanted = |p: u8| p == proto::TCP || (udp_on && p == proto::UDP);
    let (v6, l4, l4_proto) = match pkt.first()? >> 4 {
        4 => {
            let h = ipv4::Ipv4::new_checked(pkt).ok()?;
            if h.header_len() != ipv4::MIN_HEADER_LEN
                || h.packet_len() != pkt.len()
                || h.is_fragment()
                || !wanted(h.protocol())
                || !h.checksum_ok()
            {
                return None;
            }
            (false, ipv4::MIN_HEADER_LEN, h.protocol())
        }
        6 => {
            let h = ipv6::Ipv6::new_checked(pkt).ok()?;
            if h.packet_len() != pkt.len() || !wanted(h.next_header()) {
                return None;
            }
            (true, ipv6::HEADER_LEN, h.next_header())
        }
        _ => return None,
    };
    if l4_proto == proto::UDP {
        let u = udp::Udp::new_checked(&pkt[l4..]).ok()?;
        // The UDP length must be the IP payload's: no trailing bytes.
        if u.len() != pkt.len() - l4 || u.payload().is_empty() {
            return None;
        }
        return Some(Candidate {
            v6,
            udp: true,
            l4,
            hdr: l4 + udp::HEADER_LEN,
            payload: u.payload().len(),
            seq: 0,
            flags: 0,
        });
    }
    let tcp = Tcp::new_checked(&pkt[l4..]).ok()?;
    let f = tcp.flags();
    let allowed = flags::ACK | flags::PSH | flags::ECE;
    if f & flags::ACK == 0 || f & !allowed != 0 {
        return None;
    }
    let payload = tcp.payload().len();
    if payload == 0 {
        return None;
    }
    Some(Candidate {
        v6,
        udp: false,
        l4,
        hdr: l4 + tcp.header_len(),
        payload,
        seq: tcp.seq_number(),
        flags: f,
    })
}

/// True if the TCP or UDP checksum of `pkt` (IP header of `l4` bytes, IP
/// and L4 headers of `hdr`, as [`candidate`] found them) verifies. An IPv4
/// UDP checksum of zero (none sent) passes; in IPv6 it is invalid (RFC 8200
/// §8.1). With `copy_to`, the payload (the bytes after `hdr`; its length
/// is theirs) is copied there in the same pass.
fn l4_checksum_ok(
    pkt: &[u8],
    v6: bool,
    is_udp: bool,
    l4: usize,
    hdr: usize,
    copy_to: Option<&mut [u8]>,
) -> bool {
    let proto = if is_udp { proto::UDP } else { proto::TCP };
    // The pseudo-header's addresses end where the L4 header starts (a
    // candidate has no IPv4 options or IPv6 extension headers), so they
    // and the L4 header are summed as one span; its protocol and length
    // are added as numbers. Both spans start at an even offset and the L4
    // header's length is a multiple of 4 (TCP data offset, UDP 8), so
    // their words line up with the pseudo-header's and the segment's.
    let addrs_at = if v6 { 8 } else { 12 };
    let len = (pkt.len() - l4) as u32;
    let acc = u32::from(proto) + (len >> 16) + (len & 0xffff);
    let acc = checksum::sum(acc, &pkt[addrs_at..hdr]);
    let total = match copy_to {
        Some(out) => checksum::copy_sum(acc, out, &pkt[hdr..]),
        None => checksum::sum(acc, &pkt[hdr..]),
    };
    if is_udp && pkt[l4 + 6..l4 + 8] == [0, 0] {
        return !v6;
    }
    checksum::finish(total) == 0
}
