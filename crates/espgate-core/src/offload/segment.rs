//! Splitting a TSO/USO super-segment read from the TUN into ordinary packets.

use super::{
    addrs, complete_checksum, csum_range_ok, GsoInfo, GsoKind, TCP_CSUM_OFFSET, UDP_CSUM_OFFSET,
};
use crate::buf::PacketBuf;
use crate::error::{DropReason, PResult};
use crate::wire::tcp::{flags, Tcp};
use crate::wire::{be16, checksum, ipv4, ipv6, proto, put16};

/// Most segments one super-segment may be split into. 64 KiB at TCP's
/// smallest sendable MSS (48 bytes, `tcp_min_snd_mss`) is 1366 segments and
/// the kernel caps UDP GSO at 128, so a larger count comes from a broken or
/// hostile header; refusing it bounds the work per read.
pub const MAX_SEGMENTS: usize = 2048;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Copy the packet unchanged.
    Pass,
    /// Copy it and complete its partial checksum.
    Csum { start: usize, offset: usize },
    /// Split a TCP super-segment.
    Tcp,
    /// Split a UDP super-segment into datagrams.
    Udp,
}

/// Iterates the packets of one TUN read: the segments of a super-segment, or
/// the packet itself (its partial checksum completed if it had one).
///
/// Every segment gets a copy of the full headers (IP options and IPv6
/// extension headers included) and then, like the kernel's software GSO:
/// IPv4 total length, identification (the super-segment's plus the segment
/// index, wrapping) and header checksum, or the IPv6 payload length; for TCP
/// the sequence number advanced by the payload before it, FIN and PSH kept on
/// the last segment only and CWR on the first only; for UDP the datagram
/// length; and a full L4 checksum (a UDP checksum of 0 is sent as 0xFFFF).
/// All validation happens in [`Segmenter::new`].
///
/// Over a shared slice, [`Segmenter::next_into`] copies each packet into a
/// buffer of its own. Over a mutable one, [`Segmenter::next_in_place`]
/// instead writes each segment's headers in front of its payload, where
/// the previous segment's payload ended (already protected by then), and
/// hands out the segment where it lies: no copy of the payload, which the
/// cipher then reads from the read buffer itself
/// ([`crate::gateway::Engine::outbound_from`]).
#[derive(Debug, Clone)]
pub struct Segmenter<B> {
    /// The packet (read up to `len`).
    pkt: B,
    /// Its IP length for super-segments, else its length.
    len: usize,
    cut: Cut,
    next: usize,
}

/// How a super-segment is cut: what each segment's headers get.
#[derive(Debug, Clone, Copy)]
struct Cut {
    mode: Mode,
    v6: bool,
    /// Offset of the L4 header.
    l4: usize,
    /// Offset of the payload (all headers before it).
    hdr: usize,
    gso_size: usize,
    count: usize,
    ip_id: u16,
    seq: u32,
    /// The super-segment's TCP flags (segments in place overwrite the
    /// header the later ones are made from).
    tcp_flags: u8,
    /// IPv4: the sum of the IP header without its total length,
    /// identification and checksum, the only fields that differ per
    /// segment: each segment's header checksum is this plus its two
    /// fields (RFC 1624's incremental form), not a new pass over the
    /// header.
    ip_sum: u32,
    /// The pseudo-header's sum without its length (addresses, protocol),
    /// the same for every segment.
    pseudo: u32,
}

impl<B: AsRef<[u8]>> Segmenter<B> {
    /// Validates `pkt` against `info`.
    ///
    /// `GsoKind::None`: without `needs_csum` the packet passes through
    /// unchanged and unparsed; with it, `csum_start`/`csum_offset` must lie
    /// inside the packet (`BadOffload`). Super-segments: the IP header must
    /// parse (`BadLength`, `BadIpHeader`, `BadIpVersion`), not be a fragment
    /// (`Fragment`) nor carry an IPv6 routing header (`Unsupported`: the
    /// pseudo-header would need the final destination); the IP version must
    /// match the kind and the protocol be TCP or UDP as the kind says, the
    /// segment size non-zero, `csum_start`/`csum_offset` (when `needs_csum`)
    /// exactly the L4 header and its checksum field, TCP must not carry SYN
    /// or RST, there must be payload and at most [`MAX_SEGMENTS`] segments
    /// (`BadOffload`); the TCP data offset and the UDP length must fit the
    /// IP length (`BadLength`). `info.hdr_len` is ignored: the real header
    /// length is computed from the packet.
    pub fn new(pkt: B, info: &GsoInfo) -> PResult<Segmenter<B>> {
        let (want_v6, l4_proto) = match info.kind {
            GsoKind::None => return Self::single(pkt, info),
            GsoKind::TcpV4 => (Some(false), proto::TCP),
            GsoKind::TcpV6 => (Some(true), proto::TCP),
            GsoKind::UdpL4 => (None, proto::UDP),
        };
        if info.gso_size == 0 {
            return Err(DropReason::BadOffload);
        }
        let whole = pkt.as_ref();
        let (v6, l4, end, protocol, ip_id) = match whole.first().map(|b| b >> 4) {
            Some(4) => {
                let h = ipv4::Ipv4::new_checked(whole)?;
                if h.is_fragment() {
                    return Err(DropReason::Fragment);
                }
                (
                    false,
                    h.header_len(),
                    h.packet_len(),
                    h.protocol(),
                    h.ident(),
                )
            }
            Some(6) => {
                let h = ipv6::Ipv6::new_checked(whole)?;
                let w = ipv6::walk_ext(whole)?;
                if w.fragment {
                    return Err(DropReason::Fragment);
                }
                if w.routing {
                    return Err(DropReason::Unsupported);
                }
                (true, w.offset, h.packet_len(), w.protocol, 0)
            }
            Some(_) => return Err(DropReason::BadIpVersion),
            None => return Err(DropReason::BadLength),
        };
        if want_v6.is_some_and(|w| w != v6) || protocol != l4_proto {
            return Err(DropReason::BadOffload);
        }
        // Both parsers guarantee l4 <= end <= pkt.len().
        let cut = &whole[..end];
        let l4_len = end - l4;
        let (l4_hdr, csum_offset, mode, seq, tcp_flags) = if l4_proto == proto::TCP {
            let t = Tcp::new_checked(&cut[l4..])?;
            if t.flags() & (flags::SYN | flags::RST) != 0 {
                return Err(DropReason::BadOffload);
            }
            let (h, s, f) = (t.header_len(), t.seq_number(), t.flags());
            (h, TCP_CSUM_OFFSET, Mode::Tcp, s, f)
        } else {
            if l4_len < 8 || usize::from(be16(cut, l4 + 4)) != l4_len {
                return Err(DropReason::BadLength);
            }
            (8, UDP_CSUM_OFFSET, Mode::Udp, 0, 0)
        };
        if info.needs_csum
            && (usize::from(info.csum_start) != l4 || info.csum_offset != csum_offset)
        {
            return Err(DropReason::BadOffload);
        }
        let hdr = l4 + l4_hdr;
        let payload = end - hdr;
        let gso_size = usize::from(info.gso_size);
        let count = payload.div_ceil(gso_size);
        if count == 0 || count > MAX_SEGMENTS {
            return Err(DropReason::BadOffload);
        }
        let (src, dst) = addrs(cut, v6);
        let ip_sum = if v6 {
            0
        } else {
            // Taking a 16-bit field out of a ones-complement sum is adding
            // its complement.
            let out = |at: usize| u32::from(!be16(cut, at));
            checksum::sum(0, &cut[..l4]) + out(2) + out(4) + out(10)
        };
        Ok(Segmenter {
            pkt,
            len: end,
            cut: Cut {
                mode,
                v6,
                l4,
                hdr,
                gso_size,
                count,
                ip_id,
                seq,
                tcp_flags,
                ip_sum,
                pseudo: checksum::pseudo_header(src, dst, l4_proto, 0),
            },
            next: 0,
        })
    }

    fn single(pkt: B, info: &GsoInfo) -> PResult<Segmenter<B>> {
        let len = pkt.as_ref().len();
        let mode = if info.needs_csum {
            let (start, offset) = (usize::from(info.csum_start), usize::from(info.csum_offset));
            if !csum_range_ok(len, start, offset) {
                return Err(DropReason::BadOffload);
            }
            Mode::Csum { start, offset }
        } else {
            Mode::Pass
        };
        Ok(Segmenter {
            pkt,
            len,
            cut: Cut {
                mode,
                v6: false,
                l4: 0,
                hdr: 0,
                gso_size: len,
                count: 1,
                ip_id: 0,
                seq: 0,
                tcp_flags: 0,
                ip_sum: 0,
                pseudo: 0,
            },
            next: 0,
        })
    }

    /// The packet as [`Segmenter::new`] cut it.
    fn packet(&self) -> &[u8] {
        &self.pkt.as_ref()[..self.len]
    }

    /// Number of packets this read yields (1 unless it is a super-segment).
    pub fn count(&self) -> usize {
        self.cut.count
    }

    /// Length of the largest packet produced (all headers plus `gso_size`,
    /// or the packet's length if it is not split).
    pub fn max_segment_len(&self) -> usize {
        match self.cut.mode {
            Mode::Pass | Mode::Csum { .. } => self.len,
            Mode::Tcp | Mode::Udp => self.len.min(self.cut.hdr + self.cut.gso_size),
        }
    }

    /// Writes the next packet into `out` (after its default headroom, so ESP
    /// headers can still be prepended in place); `None` when all are written.
    /// The error case is defensive only: everything is checked by
    /// [`Segmenter::new`].
    pub fn next_into(&mut self, out: &mut PacketBuf) -> Option<PResult<()>> {
        if self.next >= self.cut.count {
            return None;
        }
        let i = self.next;
        self.next += 1;
        Some(match self.cut.mode {
            Mode::Pass => {
                out.prepare(self.len).copy_from_slice(self.packet());
                Ok(())
            }
            Mode::Csum { start, offset } => {
                let b = out.prepare(self.len);
                b.copy_from_slice(self.packet());
                complete_checksum(b, start, offset)
            }
            Mode::Tcp | Mode::Udp => self.segment(i, out),
        })
    }

    /// Where segment `i`'s payload lies in the packet.
    fn payload_range(&self, i: usize) -> PResult<std::ops::Range<usize>> {
        let off = self.cut.hdr + i * self.cut.gso_size;
        if off > self.len {
            return Err(DropReason::BadLength);
        }
        Ok(off..self.len.min(off + self.cut.gso_size))
    }

    /// Writes segment `i` of a super-segment.
    fn segment(&self, i: usize, out: &mut PacketBuf) -> PResult<()> {
        let payload = self.payload_range(i)?;
        let pkt = self.packet();
        let b = out.prepare(self.cut.hdr + payload.len());
        b[..self.cut.hdr].copy_from_slice(&pkt[..self.cut.hdr]);
        b[self.cut.hdr..].copy_from_slice(&pkt[payload]);
        self.cut.fix_headers(i, b)
    }
}

impl Cut {
    /// Sets the fields of segment `i`'s headers in `b` (the segment, its
    /// headers copied from the super-segment's).
    fn fix_headers(&self, i: usize, b: &mut [u8]) -> PResult<()> {
        let len16 = u16::try_from(b.len()).map_err(|_| DropReason::TooBig)?;

        // IP layer. The index is below MAX_SEGMENTS, so it fits a u16.
        let index = u16::try_from(i).map_err(|_| DropReason::BadOffload)?;
        if self.v6 {
            ipv6::set_payload_len(b, len16 - ipv6::HEADER_LEN as u16);
        } else {
            let id = self.ip_id.wrapping_add(index);
            put16(b, 2, len16);
            put16(b, 4, id);
            let c = checksum::finish(self.ip_sum + u32::from(len16) + u32::from(id));
            put16(b, 10, c);
        }

        // Transport layer.
        let l4 = &mut b[self.l4..];
        let l4_len = l4.len();
        // Under 64 KiB: the length is one 16-bit word of the pseudo-header.
        let pseudo = self.pseudo + l4_len as u32;
        if self.mode == Mode::Tcp {
            // The header is a copy of the one Segmenter::new checked.
            let mut t = Tcp::new_unchecked(&mut *l4);
            // i * gso_size < 64 KiB: no truncation.
            t.set_seq_number(self.seq.wrapping_add((i * self.gso_size) as u32));
            let mut f = self.tcp_flags;
            if i + 1 < self.count {
                f &= !(flags::FIN | flags::PSH);
            }
            if i > 0 {
                f &= !flags::CWR;
            }
            t.set_flags(f);
            t.set_checksum(0);
            let c = checksum::finish(checksum::sum(pseudo, l4));
            put16(l4, usize::from(TCP_CSUM_OFFSET), c);
        } else {
            put16(l4, 4, l4_len as u16);
            put16(l4, 6, 0);
            let c = match checksum::finish(checksum::sum(pseudo, l4)) {
                0 => 0xffff,
                c => c,
            };
            put16(l4, 6, c);
        }
        Ok(())
    }
}

impl<B: AsRef<[u8]> + AsMut<[u8]>> Segmenter<B> {
    /// The next packet, in place in the packet given to
    /// [`Segmenter::new`]: the same bytes [`Segmenter::next_into`] would
    /// write, at a place of their own in that packet; `None` when all are
    /// out. Segment `i > 0` gets its headers where segment `i - 1`'s
    /// payload ends, so that segment must be done with (protected, or
    /// copied) before the next call: the borrow of the returned slice sees
    /// to that. The error case is defensive only, as for `next_into`.
    pub fn next_in_place(&mut self) -> Option<PResult<&mut [u8]>> {
        if self.next >= self.cut.count {
            return None;
        }
        let i = self.next;
        self.next += 1;
        Some(match self.cut.mode {
            Mode::Pass => Ok(&mut self.pkt.as_mut()[..self.len]),
            Mode::Csum { start, offset } => {
                let b = &mut self.pkt.as_mut()[..self.len];
                complete_checksum(b, start, offset).map(|()| b)
            }
            Mode::Tcp | Mode::Udp => self.segment_in_place(i),
        })
    }

    fn segment_in_place(&mut self, i: usize) -> PResult<&mut [u8]> {
        let payload = self.payload_range(i)?;
        let at = payload.start - self.cut.hdr;
        let pkt = &mut self.pkt.as_mut()[..self.len];
        if i > 0 {
            // The previous segment's headers, one segment size earlier
            // (overlapping when the headers are longer than a segment:
            // copy_within moves them correctly); fix_headers sets every
            // field that differs.
            let prev = at - self.cut.gso_size;
            pkt.copy_within(prev..prev + self.cut.hdr, at);
        }
        let b = &mut pkt[at..payload.end];
        self.cut.fix_headers(i, b)?;
        Ok(b)
    }
}
