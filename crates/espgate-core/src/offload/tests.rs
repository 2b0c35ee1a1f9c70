//! Offload tests: hand-built super-segments split and checked field by field
//! against an independent checksum, coalescing round trips, every rejection
//! path, and garbage that must not panic.

use super::*;
use crate::buf::PacketBuf;
use crate::wire::tcp::flags::{ACK, CWR, ECE, FIN, PSH, RST, SYN, URG};
use proptest::prelude::*;

const SRC4: [u8; 4] = [192, 0, 2, 1];
const DST4: [u8; 4] = [198, 51, 100, 7];
const SRC6: [u8; 16] = [
    0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xab, 0x01,
];
const DST6: [u8; 16] = [
    0x20, 0x01, 0x0d, 0xb8, 0xff, 0xff, 0, 0, 0, 0, 0x12, 0x34, 0, 0, 0xcd, 0x07,
];

// ---------------------------------------------------------------------------
// An independent Internet checksum: byte-wise into a u64, folded at the end.

fn ref_sum(data: &[u8]) -> u64 {
    data.iter()
        .enumerate()
        .map(|(i, b)| u64::from(*b) << if i % 2 == 0 { 8 } else { 0 })
        .sum()
}

fn ref_fold(mut s: u64) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

fn ref_pseudo(pkt: &[u8], v6: bool, protocol: u8, l4_len: usize) -> Vec<u8> {
    let mut p = Vec::new();
    if v6 {
        p.extend_from_slice(&pkt[8..40]);
        p.extend_from_slice(&(l4_len as u32).to_be_bytes());
        p.extend_from_slice(&[0, 0, 0, protocol]);
    } else {
        p.extend_from_slice(&pkt[12..20]);
        p.extend_from_slice(&[0, protocol]);
        p.extend_from_slice(&(l4_len as u16).to_be_bytes());
    }
    p
}

/// The L4 checksum (pseudo-header included) of `pkt[l4..]` verifies.
fn ref_l4_ok(pkt: &[u8], v6: bool, l4: usize, protocol: u8) -> bool {
    let mut all = ref_pseudo(pkt, v6, protocol, pkt.len() - l4);
    all.extend_from_slice(&pkt[l4..]);
    ref_fold(ref_sum(&all)) == 0xffff
}

fn ref_ipv4_ok(pkt: &[u8]) -> bool {
    let hl = usize::from(pkt[0] & 0x0f) * 4;
    ref_fold(ref_sum(&pkt[..hl])) == 0xffff
}

/// Offset of the L4 header of a packet built by [`Spec`] (IPv4 options or one
/// IPv6 destination-options header allowed).
fn l4_of(pkt: &[u8]) -> (bool, usize, u8) {
    if pkt[0] >> 4 == 6 {
        if pkt[6] == 60 {
            (true, 40 + (usize::from(pkt[41]) + 1) * 8, pkt[40])
        } else {
            (true, 40, pkt[6])
        }
    } else {
        (false, usize::from(pkt[0] & 0x0f) * 4, pkt[9])
    }
}

/// Recomputes the IPv4 header checksum and the full L4 checksum with the
/// reference implementation (for crafting variants of valid packets).
fn refix(pkt: &mut [u8]) {
    let (v6, l4, protocol) = l4_of(pkt);
    if !v6 {
        let hl = usize::from(pkt[0] & 0x0f) * 4;
        pkt[10..12].fill(0);
        let c = !ref_fold(ref_sum(&pkt[..hl]));
        pkt[10..12].copy_from_slice(&c.to_be_bytes());
    }
    let at = l4 + if protocol == 17 { 6 } else { 16 };
    pkt[at..at + 2].fill(0);
    let mut all = ref_pseudo(pkt, v6, protocol, pkt.len() - l4);
    all.extend_from_slice(&pkt[l4..]);
    let c = !ref_fold(ref_sum(&all));
    pkt[at..at + 2].copy_from_slice(&c.to_be_bytes());
}

// ---------------------------------------------------------------------------
// Building packets by hand.

#[derive(Debug, Clone)]
struct Spec {
    v6: bool,
    udp: bool,
    /// IPv4 options (a multiple of 4 bytes).
    ip_opts: Vec<u8>,
    /// Length of an IPv6 destination-options header (0: none; multiple of 8).
    ext: usize,
    /// TCP options (a multiple of 4 bytes).
    tcp_opts: Vec<u8>,
    flags: u8,
    seq: u32,
    ack: u32,
    win: u16,
    urg: u16,
    id: u16,
    tos: u8,
    ttl: u8,
    df: bool,
    flow: u32,
    sport: u16,
    dport: u16,
    payload: Vec<u8>,
}

impl Spec {
    fn new(v6: bool, udp: bool, payload_len: usize) -> Spec {
        Spec {
            v6,
            udp,
            ip_opts: Vec::new(),
            ext: 0,
            tcp_opts: Vec::new(),
            flags: ACK,
            seq: 0xfffff000,
            ack: 0x1234_5678,
            win: 501,
            urg: 0,
            id: 0xfffe,
            tos: 0xb9,
            ttl: 63,
            df: true,
            flow: 0xabcde,
            sport: 40000,
            dport: 443,
            payload: (0..payload_len)
                .map(|i| (i as u8).wrapping_mul(7) ^ (i >> 8) as u8)
                .collect(),
        }
    }

    fn l4(&self) -> usize {
        if self.v6 {
            40 + self.ext
        } else {
            20 + self.ip_opts.len()
        }
    }

    fn hdr(&self) -> usize {
        self.l4()
            + if self.udp {
                8
            } else {
                20 + self.tcp_opts.len()
            }
    }

    fn protocol(&self) -> u8 {
        if self.udp {
            17
        } else {
            6
        }
    }

    /// One packet with these headers and `payload`; the L4 checksum is the
    /// partial one (pseudo-header sum, as the kernel hands over a
    /// `NEEDS_CSUM` packet) or the full one.
    fn packet(&self, payload: &[u8], partial: bool) -> Vec<u8> {
        let l4 = self.l4();
        let hdr = self.hdr();
        let len = hdr + payload.len();
        let mut p = vec![0u8; len];
        if self.v6 {
            p[0] = 0x60 | (self.tos >> 4);
            p[1] = (self.tos << 4) | (self.flow >> 16) as u8;
            p[2..4].copy_from_slice(&(self.flow as u16).to_be_bytes());
            p[4..6].copy_from_slice(&((len - 40) as u16).to_be_bytes());
            p[6] = if self.ext > 0 { 60 } else { self.protocol() };
            p[7] = self.ttl;
            p[8..24].copy_from_slice(&SRC6);
            p[24..40].copy_from_slice(&DST6);
            if self.ext > 0 {
                p[40] = self.protocol();
                p[41] = (self.ext / 8 - 1) as u8;
                // A PadN option filling the rest.
                p[42] = 1;
                p[43] = (self.ext - 4) as u8;
            }
        } else {
            p[0] = 0x40 | ((20 + self.ip_opts.len()) / 4) as u8;
            p[1] = self.tos;
            p[2..4].copy_from_slice(&(len as u16).to_be_bytes());
            p[4..6].copy_from_slice(&self.id.to_be_bytes());
            p[6] = if self.df { 0x40 } else { 0 };
            p[8] = self.ttl;
            p[9] = self.protocol();
            p[12..16].copy_from_slice(&SRC4);
            p[16..20].copy_from_slice(&DST4);
            p[20..l4].copy_from_slice(&self.ip_opts);
            let c = !ref_fold(ref_sum(&p[..l4]));
            p[10..12].copy_from_slice(&c.to_be_bytes());
        }
        p[l4..l4 + 2].copy_from_slice(&self.sport.to_be_bytes());
        p[l4 + 2..l4 + 4].copy_from_slice(&self.dport.to_be_bytes());
        if self.udp {
            p[l4 + 4..l4 + 6].copy_from_slice(&((len - l4) as u16).to_be_bytes());
        } else {
            p[l4 + 4..l4 + 8].copy_from_slice(&self.seq.to_be_bytes());
            p[l4 + 8..l4 + 12].copy_from_slice(&self.ack.to_be_bytes());
            p[l4 + 12] = (((20 + self.tcp_opts.len()) / 4) as u8) << 4;
            p[l4 + 13] = self.flags;
            p[l4 + 14..l4 + 16].copy_from_slice(&self.win.to_be_bytes());
            p[l4 + 18..l4 + 20].copy_from_slice(&self.urg.to_be_bytes());
            p[l4 + 20..hdr].copy_from_slice(&self.tcp_opts);
        }
        p[hdr..].copy_from_slice(payload);
        let at = l4 + if self.udp { 6 } else { 16 };
        let c = if partial {
            ref_fold(ref_sum(&ref_pseudo(&p, self.v6, self.protocol(), len - l4)))
        } else {
            let mut all = ref_pseudo(&p, self.v6, self.protocol(), len - l4);
            all.extend_from_slice(&p[l4..]);
            !ref_fold(ref_sum(&all))
        };
        p[at..at + 2].copy_from_slice(&c.to_be_bytes());
        p
    }

    /// The super-segment as a TSO/USO read yields it.
    fn super_segment(&self) -> Vec<u8> {
        self.packet(&self.payload, true)
    }

    fn info(&self, gso: usize) -> GsoInfo {
        GsoInfo {
            kind: match (self.udp, self.v6) {
                (true, _) => GsoKind::UdpL4,
                (false, false) => GsoKind::TcpV4,
                (false, true) => GsoKind::TcpV6,
            },
            needs_csum: true,
            // What the kernel may report: more than the headers.
            hdr_len: (self.hdr() + 100) as u16,
            gso_size: gso as u16,
            csum_start: self.l4() as u16,
            csum_offset: if self.udp { 6 } else { 16 },
        }
    }

    /// Segment `i` as the sender would have sent it (full checksum).
    fn segment(&self, gso: usize, i: usize) -> Vec<u8> {
        let mut s = self.clone();
        let off = i * gso;
        let end = (off + gso).min(self.payload.len());
        s.seq = self.seq.wrapping_add(off as u32);
        s.id = self.id.wrapping_add(i as u16);
        let last = end == self.payload.len();
        if !last {
            s.flags &= !(FIN | PSH);
        }
        if i > 0 {
            s.flags &= !CWR;
        }
        s.packet(&self.payload[off..end], false)
    }
}

fn segment_all(pkt: &[u8], info: &GsoInfo) -> PResult<Vec<Vec<u8>>> {
    let mut seg = Segmenter::new(pkt, info)?;
    let mut out = Vec::new();
    let mut buf = PacketBuf::with_capacity(1500);
    let n = seg.count();
    assert!(n <= MAX_SEGMENTS);
    while let Some(r) = seg.next_into(&mut buf) {
        r?;
        out.push(buf.as_slice().to_vec());
        assert!(out.len() <= n, "more segments than count()");
    }
    assert_eq!(out.len(), n);
    // Drained: nothing more, however often asked.
    assert!(seg.next_into(&mut buf).is_none());
    // Cut in place (headers written over the previous segment's payload),
    // the same packets.
    assert_eq!(segment_in_place(pkt, info)?, out);
    Ok(out)
}

/// The packets of [`Segmenter::next_in_place`] on a copy of `pkt`.
fn segment_in_place(pkt: &[u8], info: &GsoInfo) -> PResult<Vec<Vec<u8>>> {
    let mut owned = pkt.to_vec();
    let mut seg = Segmenter::new(&mut owned[..], info)?;
    let n = seg.count();
    let mut out = Vec::new();
    while let Some(r) = seg.next_in_place() {
        out.push(r?.to_vec());
        assert!(out.len() <= n, "more segments than count()");
    }
    assert!(seg.next_in_place().is_none());
    Ok(out)
}

/// Checks every field of every segment against the spec, with the
/// reference checksum.
fn check_segments(s: &Spec, gso: usize, segs: &[Vec<u8>]) {
    let n = s.payload.len().div_ceil(gso);
    assert_eq!(segs.len(), n, "segment count");
    let (l4, hdr) = (s.l4(), s.hdr());
    let orig = s.super_segment();
    for (i, seg) in segs.iter().enumerate() {
        let off = i * gso;
        let plen = gso.min(s.payload.len() - off);
        let last = i + 1 == n;
        assert_eq!(seg.len(), hdr + plen, "segment {i} length");
        assert_eq!(
            &seg[hdr..],
            &s.payload[off..off + plen],
            "segment {i} payload"
        );
        if s.v6 {
            let fl = s.flow;
            assert_eq!(
                seg[..4],
                [
                    0x60 | (s.tos >> 4),
                    (s.tos << 4) | (fl >> 16) as u8,
                    (fl >> 8) as u8,
                    fl as u8
                ]
            );
            assert_eq!(
                usize::from(u16::from_be_bytes([seg[4], seg[5]])),
                seg.len() - 40
            );
            assert_eq!(seg[6], if s.ext > 0 { 60 } else { s.protocol() });
            assert_eq!(seg[7], s.ttl);
            assert_eq!(seg[8..24], SRC6);
            assert_eq!(seg[24..40], DST6);
            assert_eq!(seg[40..l4], orig[40..l4], "extension header");
        } else {
            assert_eq!(seg[0], 0x40 | (l4 / 4) as u8);
            assert_eq!(seg[1], s.tos);
            assert_eq!(usize::from(u16::from_be_bytes([seg[2], seg[3]])), seg.len());
            assert_eq!(
                u16::from_be_bytes([seg[4], seg[5]]),
                s.id.wrapping_add(i as u16)
            );
            assert_eq!(seg[6..8], [if s.df { 0x40 } else { 0 }, 0]);
            assert_eq!((seg[8], seg[9]), (s.ttl, s.protocol()));
            assert_eq!(seg[12..16], SRC4);
            assert_eq!(seg[16..20], DST4);
            assert_eq!(seg[20..l4], s.ip_opts[..]);
            assert!(ref_ipv4_ok(seg), "segment {i} IPv4 header checksum");
        }
        let t = &seg[l4..];
        assert_eq!(t[..2], s.sport.to_be_bytes());
        assert_eq!(t[2..4], s.dport.to_be_bytes());
        if s.udp {
            assert_eq!(usize::from(u16::from_be_bytes([t[4], t[5]])), 8 + plen);
            assert_ne!(t[6..8], [0, 0], "UDP checksum 0 means none");
        } else {
            let seq = u32::from_be_bytes([t[4], t[5], t[6], t[7]]);
            assert_eq!(seq, s.seq.wrapping_add(off as u32), "segment {i} seq");
            assert_eq!(t[8..12], s.ack.to_be_bytes());
            assert_eq!(usize::from(t[12] >> 4) * 4, 20 + s.tcp_opts.len());
            let mut want = s.flags;
            if !last {
                want &= !(FIN | PSH);
            }
            if i > 0 {
                want &= !CWR;
            }
            assert_eq!(t[13], want, "segment {i} flags");
            assert_eq!(t[14..16], s.win.to_be_bytes());
            assert_eq!(t[18..20], s.urg.to_be_bytes());
            assert_eq!(t[20..hdr - l4], s.tcp_opts[..]);
        }
        assert!(
            ref_l4_ok(seg, s.v6, l4, s.protocol()),
            "segment {i} L4 checksum"
        );
        // And the segment is exactly what a sender would have sent (up to
        // the two encodings of a zero checksum, both verified above).
        let at = l4 + if s.udp { 6 } else { 16 };
        let mut want = s.segment(gso, i);
        let mut got = seg.clone();
        want[at..at + 2].fill(0);
        got[at..at + 2].fill(0);
        assert_eq!(got, want, "segment {i} bytes");
    }
}

fn split_and_check(s: &Spec, gso: usize) -> Vec<Vec<u8>> {
    let segs = segment_all(&s.super_segment(), &s.info(gso)).expect("valid super-segment");
    check_segments(s, gso, &segs);
    segs
}

// ---------------------------------------------------------------------------
// Segmenter: hand-built super-segments.

#[test]
fn tcp4_exactly_divisible() {
    let s = Spec::new(false, false, 4 * 1448);
    let segs = split_and_check(&s, 1448);
    assert_eq!(segs.len(), 4);
    assert!(segs.iter().all(|p| p.len() == 20 + 20 + 1448));
}

#[test]
fn tcp4_with_options_last_short() {
    let mut s = Spec::new(false, false, 3 * 1000 + 17);
    s.ip_opts = vec![0x94, 0x04, 0, 0]; // router alert
    s.tcp_opts = vec![1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2]; // NOP NOP timestamps
    s.flags = ACK | PSH | FIN | CWR | ECE;
    s.id = 0xffff; // wraps
    let segs = split_and_check(&s, 1000);
    assert_eq!(segs.len(), 4);
    assert_eq!(segs[3].len(), 24 + 32 + 17);
    // FIN and PSH on the last only, CWR on the first only, ECE everywhere.
    let flags: Vec<u8> = segs.iter().map(|p| p[24 + 13]).collect();
    assert_eq!(
        flags,
        [ACK | CWR | ECE, ACK | ECE, ACK | ECE, ACK | ECE | PSH | FIN]
    );
    let ids: Vec<u16> = segs
        .iter()
        .map(|p| u16::from_be_bytes([p[4], p[5]]))
        .collect();
    assert_eq!(ids, [0xffff, 0, 1, 2]);
}

#[test]
fn tcp6_with_extension_header_and_options() {
    let mut s = Spec::new(true, false, 5000);
    s.ext = 16;
    s.tcp_opts = vec![1, 1, 8, 10, 9, 9, 9, 9, 8, 8, 8, 8];
    s.flags = ACK | PSH;
    s.seq = 0xffff_ff00; // wraps within the super-segment
    let segs = split_and_check(&s, 1220);
    assert_eq!(segs.len(), 5);
    let seqs: Vec<u32> = segs
        .iter()
        .map(|p| u32::from_be_bytes([p[60], p[61], p[62], p[63]]))
        .collect();
    assert_eq!(
        seqs,
        [0xffff_ff00, 0x3c4, 0x3c4 + 1220, 0x3c4 + 2440, 0x3c4 + 3660]
    );
}

/// Segments shorter than the headers: cut in place, each segment's
/// headers overlap the previous one's (`segment_all` compares the in-place
/// cut with the copying one byte for byte).
#[test]
fn segments_shorter_than_their_headers() {
    for (v6, udp) in [(false, false), (true, false), (false, true), (true, true)] {
        for gso in [1, 7, 48] {
            let mut s = Spec::new(v6, udp, 5 * gso + 1);
            if !udp {
                s.tcp_opts = vec![1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2];
                s.flags = ACK | PSH | FIN | CWR;
            }
            assert_eq!(
                split_and_check(&s, gso).len(),
                6,
                "v6={v6} udp={udp} gso={gso}"
            );
        }
    }
}

#[test]
fn tcp6_exactly_divisible_no_options() {
    let s = Spec::new(true, false, 2 * 1440);
    assert_eq!(split_and_check(&s, 1440).len(), 2);
}

#[test]
fn udp4_and_udp6_segments() {
    for v6 in [false, true] {
        let s = Spec::new(v6, true, 1200 * 3 + 1);
        let segs = split_and_check(&s, 1200);
        assert_eq!(segs.len(), 4);
        assert_eq!(segs[3].len(), s.l4() + 8 + 1);
        let mut s = Spec::new(v6, true, 600 * 5);
        s.ip_opts = if v6 { vec![] } else { vec![1, 1, 1, 0] };
        s.ext = if v6 { 8 } else { 0 };
        assert_eq!(split_and_check(&s, 600).len(), 5);
    }
}

#[test]
fn single_segment_super_is_completed() {
    // Payload not above gso_size: one packet, full checksum.
    for (v6, udp) in [(false, false), (true, false), (false, true), (true, true)] {
        let s = Spec::new(v6, udp, 700);
        let segs = split_and_check(&s, 1400);
        assert_eq!(segs.len(), 1);
        assert_eq!(segs[0], s.segment(1400, 0));
    }
}

#[test]
fn udp_checksum_zero_is_sent_as_ffff() {
    for v6 in [false, true] {
        // One datagram whose last payload word makes the sum 0xffff.
        let mut s = Spec::new(v6, true, 64);
        let n = s.payload.len();
        s.payload[n - 2..].fill(0);
        let l4 = s.l4();
        let mut p = s.packet(&s.payload, false);
        p[l4 + 6..l4 + 8].fill(0);
        let mut all = ref_pseudo(&p, v6, 17, p.len() - l4);
        all.extend_from_slice(&p[l4..]);
        let slot = !ref_fold(ref_sum(&all));
        s.payload[n - 2..].copy_from_slice(&slot.to_be_bytes());
        let segs = split_and_check(&s, 1000);
        assert_eq!(segs[0][l4 + 6..l4 + 8], [0xff, 0xff], "v6={v6}");
        // The partial-checksum path does the same.
        let mut p = s.packet(&s.payload, true);
        complete_checksum(&mut p, l4, 6).unwrap();
        assert_eq!(p[l4 + 6..l4 + 8], [0xff, 0xff]);
    }
}

#[test]
fn super_segment_needs_csum_flag_is_optional() {
    // Without NEEDS_CSUM the field is ignored and recomputed all the same.
    let s = Spec::new(false, false, 3000);
    let mut info = s.info(1000);
    info.needs_csum = false;
    info.csum_start = 0;
    info.csum_offset = 0;
    let mut pkt = s.super_segment();
    pkt[s.l4() + 16] ^= 0x55;
    let segs = segment_all(&pkt, &info).unwrap();
    check_segments(&s, 1000, &segs);
}

#[test]
fn trailing_bytes_after_ip_length_are_ignored() {
    let s = Spec::new(true, false, 2500);
    let mut pkt = s.super_segment();
    pkt.extend_from_slice(&[0xee; 7]);
    let segs = segment_all(&pkt, &s.info(1000)).unwrap();
    check_segments(&s, 1000, &segs);
}

#[test]
fn gso_none_passes_through_or_completes() {
    // Unchanged, unparsed: even garbage.
    for pkt in [
        vec![],
        vec![0x45, 1, 2],
        Spec::new(false, false, 100).super_segment(),
    ] {
        let segs = segment_all(&pkt, &GsoInfo::NONE).unwrap();
        assert_eq!(segs, vec![pkt.clone()]);
    }
    // NEEDS_CSUM without GSO: the checksum is completed.
    for (v6, udp) in [(false, false), (true, false), (false, true), (true, true)] {
        let s = Spec::new(v6, udp, 333);
        let info = GsoInfo {
            kind: GsoKind::None,
            needs_csum: true,
            hdr_len: 0,
            gso_size: 0,
            csum_start: s.l4() as u16,
            csum_offset: if udp { 6 } else { 16 },
        };
        let segs = segment_all(&s.super_segment(), &info).unwrap();
        assert_eq!(segs, vec![s.packet(&s.payload, false)]);
        assert!(ref_l4_ok(&segs[0], v6, s.l4(), s.protocol()));
    }
}

#[test]
fn complete_checksum_in_place_and_bounds() {
    let s = Spec::new(false, false, 51); // odd length
    let mut p = s.super_segment();
    complete_checksum(&mut p, 20, 16).unwrap();
    assert_eq!(p, s.packet(&s.payload, false));
    let len = p.len();
    for (start, off) in [
        (len, 0),
        (len - 1, 0),
        (20, len - 21),
        (20, usize::MAX),
        (usize::MAX, 2),
    ] {
        let before = p.clone();
        assert_eq!(
            complete_checksum(&mut p, start, off),
            Err(DropReason::BadOffload)
        );
        assert_eq!(p, before);
    }
    // The field may be the last two bytes.
    complete_checksum(&mut p, 20, len - 22).unwrap();
    assert_eq!(
        complete_checksum(&mut [], 0, 0),
        Err(DropReason::BadOffload)
    );
}

#[test]
fn virtio_gso_types() {
    assert_eq!(GsoKind::from_virtio(0), Ok(GsoKind::None));
    assert_eq!(GsoKind::from_virtio(1), Ok(GsoKind::TcpV4));
    assert_eq!(GsoKind::from_virtio(0x81), Ok(GsoKind::TcpV4));
    assert_eq!(GsoKind::from_virtio(4), Ok(GsoKind::TcpV6));
    assert_eq!(GsoKind::from_virtio(0x84), Ok(GsoKind::TcpV6));
    assert_eq!(GsoKind::from_virtio(5), Ok(GsoKind::UdpL4));
    for bad in [3u8, 2, 6, 0x80, 0x85, 0xff] {
        assert_eq!(
            GsoKind::from_virtio(bad),
            Err(DropReason::BadOffload),
            "{bad}"
        );
    }
    for k in [
        GsoKind::None,
        GsoKind::TcpV4,
        GsoKind::TcpV6,
        GsoKind::UdpL4,
    ] {
        assert_eq!(GsoKind::from_virtio(k.to_virtio()), Ok(k));
    }
    assert_eq!(GsoInfo::default(), GsoInfo::NONE);
}

// ---------------------------------------------------------------------------
// Segmenter: every rejection.

#[test]
fn segmenter_rejections() {
    let tcp4 = Spec::new(false, false, 3000);
    let tcp6 = Spec::new(true, false, 3000);
    let udp4 = Spec::new(false, true, 3000);
    let err = |pkt: &[u8], info: GsoInfo| Segmenter::new(pkt, &info).map(|_| ()).unwrap_err();
    let p4 = tcp4.super_segment();
    let p6 = tcp6.super_segment();
    let u4 = udp4.super_segment();
    let i4 = tcp4.info(1000);

    // Zero segment size.
    assert_eq!(
        err(&p4, GsoInfo { gso_size: 0, ..i4 }),
        DropReason::BadOffload
    );
    // IP version does not match the kind.
    assert_eq!(err(&p6, i4), DropReason::BadOffload);
    assert_eq!(err(&p4, tcp6.info(1000)), DropReason::BadOffload);
    // Protocol does not match the kind.
    assert_eq!(
        err(
            &u4,
            GsoInfo {
                kind: GsoKind::TcpV4,
                ..udp4.info(1000)
            }
        ),
        DropReason::BadOffload
    );
    assert_eq!(
        err(
            &p4,
            GsoInfo {
                kind: GsoKind::UdpL4,
                ..i4
            }
        ),
        DropReason::BadOffload
    );
    let mut icmp = p4.clone();
    icmp[9] = 1;
    assert_eq!(err(&icmp, i4), DropReason::BadOffload);
    // Checksum offsets not at the L4 checksum.
    assert_eq!(
        err(
            &p4,
            GsoInfo {
                csum_start: 21,
                ..i4
            }
        ),
        DropReason::BadOffload
    );
    assert_eq!(
        err(
            &p4,
            GsoInfo {
                csum_offset: 6,
                ..i4
            }
        ),
        DropReason::BadOffload
    );
    assert_eq!(
        err(
            &u4,
            GsoInfo {
                csum_offset: 16,
                ..udp4.info(1000)
            }
        ),
        DropReason::BadOffload
    );
    // SYN or RST in a super-segment.
    for f in [SYN, RST, SYN | ACK] {
        let mut s = tcp4.clone();
        s.flags = f;
        assert_eq!(
            err(&s.super_segment(), i4),
            DropReason::BadOffload,
            "flags {f:#x}"
        );
    }
    // No payload.
    let empty = Spec::new(false, false, 0);
    assert_eq!(
        err(&empty.super_segment(), empty.info(1000)),
        DropReason::BadOffload
    );
    let empty_udp = Spec::new(true, true, 0);
    assert_eq!(
        err(&empty_udp.super_segment(), empty_udp.info(1000)),
        DropReason::BadOffload
    );
    // Too many segments.
    let big = Spec::new(false, true, MAX_SEGMENTS + 1);
    assert_eq!(
        err(&big.super_segment(), big.info(1)),
        DropReason::BadOffload
    );
    let ok = Spec::new(false, true, MAX_SEGMENTS);
    assert_eq!(
        Segmenter::new(&ok.super_segment(), &ok.info(1))
            .unwrap()
            .count(),
        MAX_SEGMENTS
    );
    // Fragments.
    let mut mf = p4.clone();
    mf[6] |= 0x20;
    assert_eq!(err(&mf, i4), DropReason::Fragment);
    let mut later = p4.clone();
    later[7] = 1;
    assert_eq!(err(&later, i4), DropReason::Fragment);
    let mut frag6 = tcp6.clone();
    frag6.ext = 8;
    let mut f6 = frag6.super_segment();
    f6[6] = 44; // the 8-byte header becomes a fragment header
    assert_eq!(err(&f6, frag6.info(1000)), DropReason::Fragment);
    // IPv6 routing header.
    let mut rt6 = f6.clone();
    rt6[6] = 43;
    assert_eq!(err(&rt6, frag6.info(1000)), DropReason::Unsupported);
    // Truncated IP packet, bad IHL, unknown version, empty.
    assert_eq!(err(&p4[..p4.len() - 1], i4), DropReason::BadLength);
    assert_eq!(
        err(&p6[..p6.len() - 1], tcp6.info(1000)),
        DropReason::BadLength
    );
    let mut ihl = p4.clone();
    ihl[0] = 0x44;
    assert_eq!(err(&ihl, i4), DropReason::BadIpHeader);
    let mut v5 = p4.clone();
    v5[0] = 0x55;
    assert_eq!(err(&v5, i4), DropReason::BadIpVersion);
    assert_eq!(err(&[], i4), DropReason::BadLength);
    // TCP header shorter than 20 bytes, data offset below 20 or past the end.
    let short = &p4[..];
    let mut cut = short[..30].to_vec();
    cut[2..4].copy_from_slice(&30u16.to_be_bytes());
    assert_eq!(err(&cut, i4), DropReason::BadLength);
    for doff in [0u8, 4, 0xf] {
        let mut s = Spec::new(false, false, 20);
        s.payload.clear();
        let mut p = s.packet(&[], true);
        p[20 + 12] = doff << 4;
        let i = GsoInfo {
            gso_size: 1,
            ..s.info(1)
        };
        assert_eq!(err(&p, i), DropReason::BadLength, "doff {doff}");
    }
    // UDP length field disagreeing with the IP length, or too short a header.
    let mut ul = u4.clone();
    ul[24..26].copy_from_slice(&100u16.to_be_bytes());
    assert_eq!(err(&ul, udp4.info(1000)), DropReason::BadLength);
    let mut uc = u4[..26].to_vec();
    uc[2..4].copy_from_slice(&26u16.to_be_bytes());
    assert_eq!(err(&uc, udp4.info(1000)), DropReason::BadLength);
    // NEEDS_CSUM without GSO pointing outside the packet.
    let none = |start: u16, off: u16| GsoInfo {
        needs_csum: true,
        csum_start: start,
        csum_offset: off,
        ..GsoInfo::NONE
    };
    assert_eq!(err(&p4, none(p4.len() as u16, 0)), DropReason::BadOffload);
    assert_eq!(
        err(&p4, none(20, (p4.len() - 21) as u16)),
        DropReason::BadOffload
    );
    assert_eq!(err(&[], none(0, 0)), DropReason::BadOffload);
}

#[test]
fn hdr_len_hint_is_ignored() {
    let s = Spec::new(true, false, 4000);
    for hint in [0u16, 1, 60, 9999, u16::MAX] {
        let info = GsoInfo {
            hdr_len: hint,
            ..s.info(1000)
        };
        check_segments(&s, 1000, &segment_all(&s.super_segment(), &info).unwrap());
    }
}

// ---------------------------------------------------------------------------
// Coalescer.

fn flows() -> Vec<Spec> {
    let mut v4 = Spec::new(false, false, 10 * 1448 + 100);
    v4.tcp_opts = vec![1, 1, 8, 10, 0, 1, 2, 3, 4, 5, 6, 7];
    let v6 = Spec::new(true, false, 10 * 1428 + 100);
    vec![v4, v6]
}

fn gso_of(s: &Spec) -> usize {
    if s.v6 {
        1428
    } else {
        1448
    }
}

/// `Coalescer::take` with its packet count checked against the pending
/// count and the bytes.
fn take(c: &mut Coalescer) -> Option<(&[u8], GsoInfo)> {
    let pending = c.segments();
    let (b, info, n) = c.take()?;
    assert_eq!(n, pending);
    let want = if info.kind == GsoKind::None {
        1
    } else {
        (b.len() - usize::from(info.hdr_len)).div_ceil(usize::from(info.gso_size))
    };
    assert_eq!(n, want, "packet count of a taken super-segment");
    Some((b, info))
}

/// Drives a coalescer the way the shell must: FlushFirst → take, write,
/// push again; Ineligible → take and write the pending one, write this one.
/// Returns what would be written, in order.
fn drive(c: &mut Coalescer, pkts: &[Vec<u8>]) -> Vec<(Vec<u8>, GsoInfo)> {
    let mut out = Vec::new();
    for p in pkts {
        let mut tries = 0;
        loop {
            tries += 1;
            assert!(tries <= 2, "FlushFirst twice in a row");
            match c.push(p) {
                Push::Absorbed => break,
                Push::FlushFirst => {
                    let (b, i) = take(c).expect("FlushFirst with nothing pending");
                    out.push((b.to_vec(), i));
                }
                Push::Ineligible => {
                    if let Some((b, i)) = take(c) {
                        out.push((b.to_vec(), i));
                    }
                    out.push((p.clone(), GsoInfo::NONE));
                    break;
                }
            }
        }
    }
    if let Some((b, i)) = take(c) {
        out.push((b.to_vec(), i));
    }
    assert!(c.is_empty());
    out
}

/// Splits written super-segments again (what the kernel does), marking the
/// packets that came out of one.
fn expand(written: &[(Vec<u8>, GsoInfo)]) -> Vec<(Vec<u8>, bool)> {
    let mut v = Vec::new();
    for (b, info) in written {
        if info.kind == GsoKind::None {
            assert_eq!(*info, GsoInfo::NONE);
            v.push((b.clone(), false));
        } else {
            check_super(b, info);
            for s in segment_all(b, info).expect("a written super-segment splits") {
                v.push((s, true));
            }
        }
    }
    v
}

/// A written super-segment is well formed: lengths, IPv4 header checksum,
/// partial TCP checksum = folded pseudo-header sum, info consistent.
fn check_super(b: &[u8], info: &GsoInfo) {
    let v6 = b[0] >> 4 == 6;
    let l4 = if v6 { 40 } else { 20 };
    assert!(b.len() <= MAX_SUPER_LEN);
    assert_eq!(info.kind, if v6 { GsoKind::TcpV6 } else { GsoKind::TcpV4 });
    assert!(info.needs_csum);
    assert_eq!(usize::from(info.csum_start), l4);
    assert_eq!(info.csum_offset, 16);
    assert_eq!(
        usize::from(info.hdr_len),
        l4 + usize::from(b[l4 + 12] >> 4) * 4
    );
    let payload = b.len() - usize::from(info.hdr_len);
    let segs = payload.div_ceil(usize::from(info.gso_size));
    assert!(
        (2..=MAX_COALESCE_SEGMENTS).contains(&segs),
        "{segs} segments"
    );
    if v6 {
        assert_eq!(usize::from(u16::from_be_bytes([b[4], b[5]])), b.len() - 40);
    } else {
        assert_eq!(usize::from(u16::from_be_bytes([b[2], b[3]])), b.len());
        assert!(ref_ipv4_ok(b));
    }
    let partial = ref_fold(ref_sum(&ref_pseudo(b, v6, 6, b.len() - l4)));
    assert_eq!(
        b[l4 + 16..l4 + 18],
        partial.to_be_bytes(),
        "partial checksum"
    );
    // Completing it gives a valid checksum over the whole.
    let mut full = b.to_vec();
    complete_checksum(&mut full, l4, 16).unwrap();
    assert!(ref_l4_ok(&full, v6, l4, 6));
}

/// Coalescing then segmenting again gives back exactly the packets pushed,
/// except that merged IPv4 packets get consecutive identifications (and a
/// checksum of 0 may come back as 0xFFFF or the reverse).
fn assert_same_stream(pushed: &[Vec<u8>], got: &[(Vec<u8>, bool)]) {
    assert_eq!(pushed.len(), got.len(), "packet count");
    for (i, (p, (g, merged))) in pushed.iter().zip(got).enumerate() {
        if !merged {
            assert_eq!(p, g, "packet {i} written alone must be unchanged");
            continue;
        }
        assert_eq!(p.len(), g.len(), "packet {i} length");
        let v6 = p[0] >> 4 == 6;
        let l4 = if v6 { 40 } else { 20 };
        assert!(
            ref_l4_ok(p, v6, l4, 6),
            "merged packet {i} had a bad checksum"
        );
        assert!(ref_l4_ok(g, v6, l4, 6));
        let mut masked = [p.clone(), g.clone()];
        for m in &mut masked {
            if !v6 {
                assert!(ref_ipv4_ok(m));
                m[4..6].fill(0);
                m[10..12].fill(0);
            }
            m[l4 + 16..l4 + 18].fill(0);
        }
        assert_eq!(masked[0], masked[1], "packet {i}");
    }
}

#[test]
fn coalesce_roundtrip_exact() {
    for s in flows() {
        let gso = gso_of(&s);
        let segs = split_and_check(&s, gso);
        assert_eq!(segs.len(), 11);
        let mut c = Coalescer::new();
        for (i, p) in segs.iter().enumerate() {
            assert_eq!(c.push(p), Push::Absorbed, "segment {i}");
            assert_eq!(c.segments(), i + 1);
        }
        let (b, info) = take(&mut c).unwrap();
        assert_eq!(b, &s.super_segment()[..]);
        assert_eq!(
            info,
            GsoInfo {
                hdr_len: s.hdr() as u16,
                ..s.info(gso)
            }
        );
        assert!(c.is_empty() && take(&mut c).is_none());
        // The coalescer is reusable.
        assert_eq!(c.push(&segs[0]), Push::Absorbed);
        let (b, info) = take(&mut c).unwrap();
        assert_eq!(
            (b, info),
            (&segs[0][..], GsoInfo::NONE),
            "a single packet is unchanged"
        );
    }
}

#[test]
fn psh_ends_a_super_segment() {
    let mut s = flows().remove(0);
    s.flags = ACK | PSH;
    let gso = gso_of(&s);
    let mut segs = split_and_check(&s, gso);
    let more = {
        let mut t = s.clone();
        t.seq = s.seq.wrapping_add(s.payload.len() as u32);
        t.packet(&s.payload[..gso], false)
    };
    segs.push(more.clone());
    let mut c = Coalescer::new();
    for p in &segs[..11] {
        assert_eq!(c.push(p), Push::Absorbed);
    }
    // After the PSH packet nothing more is appended.
    assert_eq!(c.push(&more), Push::FlushFirst);
    let (b, _) = take(&mut c).unwrap();
    assert_eq!(b, &s.super_segment()[..], "PSH kept on the super-segment");
    assert_eq!(c.push(&more), Push::Absorbed);
    // A first packet with PSH stays alone.
    let mut c = Coalescer::new();
    let mut first = segs[0].clone();
    first[s.l4() + 13] |= PSH;
    refix(&mut first);
    assert_eq!(c.push(&first), Push::Absorbed);
    assert_eq!(c.push(&segs[1]), Push::FlushFirst);
    assert_eq!(take(&mut c).unwrap(), (&first[..], GsoInfo::NONE));
}

#[test]
fn short_segment_closes() {
    let s = flows().remove(1);
    let gso = gso_of(&s);
    let mut c = Coalescer::new();
    let a = s.segment(gso, 0);
    let mut t = s.clone();
    t.seq = s.seq.wrapping_add(gso as u32);
    let short = t.packet(&s.payload[..100], false);
    t.seq = t.seq.wrapping_add(100);
    let after = t.packet(&s.payload[..100], false);
    assert_eq!(c.push(&a), Push::Absorbed);
    assert_eq!(c.push(&short), Push::Absorbed);
    assert_eq!(c.push(&after), Push::FlushFirst);
    let (b, info) = take(&mut c).unwrap();
    assert_eq!(b.len(), s.hdr() + gso + 100);
    assert_eq!(usize::from(info.gso_size), gso);
    check_super(b, &info);
}

#[test]
fn segment_and_length_limits() {
    // 64 small segments, then FlushFirst.
    let s = Spec::new(false, false, 65 * 100);
    let segs = split_and_check(&s, 100);
    let mut c = Coalescer::new();
    for p in &segs[..MAX_COALESCE_SEGMENTS] {
        assert_eq!(c.push(p), Push::Absorbed);
    }
    assert_eq!(c.push(&segs[64]), Push::FlushFirst);
    let (b, info) = take(&mut c).unwrap();
    check_super(b, &info);
    assert_eq!(b.len(), 40 + 64 * 100);
    // The 65535-byte cap: 1460-byte segments, 44 fit (40 + 44 * 1460 = 64280).
    // (Built one by one: 45 of them do not fit one super-segment.)
    let s = Spec::new(false, false, 46 * 1460);
    let segs: Vec<Vec<u8>> = (0..46).map(|i| s.segment(1460, i)).collect();
    let mut c = Coalescer::new();
    for p in &segs[..44] {
        assert_eq!(c.push(p), Push::Absorbed);
    }
    assert_eq!(c.push(&segs[44]), Push::FlushFirst);
    let (b, info) = take(&mut c).unwrap();
    check_super(b, &info);
    assert_eq!(b.len(), 40 + 44 * 1460);
    // A shorter packet that still fits is appended right up to the cap.
    let mut c = Coalescer::new();
    for p in &segs[..44] {
        assert_eq!(c.push(p), Push::Absorbed);
    }
    let mut t = s.clone();
    t.seq = s.seq.wrapping_add(44 * 1460);
    let fill = MAX_SUPER_LEN - (40 + 44 * 1460);
    let last = t.packet(&s.payload[..fill], false);
    assert_eq!(c.push(&last), Push::Absorbed);
    let (b, info) = take(&mut c).unwrap();
    assert_eq!(b.len(), MAX_SUPER_LEN);
    check_super(b, &info);
}

/// A valid second segment of `s` after `first` with one change, checksums
/// fixed up.
fn variant(s: &Spec, f: impl Fn(&mut Spec)) -> Vec<u8> {
    let gso = gso_of(s);
    let mut t = s.clone();
    t.seq = s.seq.wrapping_add(gso as u32);
    t.id = s.id.wrapping_add(1);
    f(&mut t);
    t.packet(&s.payload[gso..2 * gso], false)
}

#[test]
fn flush_first_reasons() {
    for s in flows() {
        let gso = gso_of(&s);
        let first = s.segment(gso, 0);
        let good = variant(&s, |_| {});
        assert_eq!(good, s.segment(gso, 1));
        type Change = Box<dyn Fn(&mut Spec)>;
        let mut cases: Vec<(&str, Change)> = vec![
            ("sport", Box::new(|t| t.sport ^= 1)),
            ("dport", Box::new(|t| t.dport ^= 1)),
            ("tos", Box::new(|t| t.tos ^= 4)),
            ("ecn", Box::new(|t| t.tos ^= 3)),
            ("ttl", Box::new(|t| t.ttl -= 1)),
            ("ack", Box::new(|t| t.ack += 1)),
            ("window", Box::new(|t| t.win += 1)),
            ("urgent pointer", Box::new(|t| t.urg = 9)),
            ("ECE", Box::new(|t| t.flags |= ECE)),
            ("seq gap", Box::new(|t| t.seq = t.seq.wrapping_add(1))),
            (
                "seq retransmit",
                Box::new(move |t| t.seq = t.seq.wrapping_sub(gso as u32)),
            ),
            (
                "options length",
                Box::new(|t| t.tcp_opts.extend_from_slice(&[1, 1, 1, 1])),
            ),
            ("version", Box::new(|t| t.v6 = !t.v6)),
        ];
        if !s.tcp_opts.is_empty() {
            cases.push(("timestamp", Box::new(|t| t.tcp_opts[11] ^= 1)));
        }
        if s.v6 {
            cases.push(("flow label", Box::new(|t| t.flow ^= 1)));
        } else {
            cases.push(("DF", Box::new(|t| t.df = !t.df)));
        }
        for (name, f) in &cases {
            let p = variant(&s, f);
            let mut c = Coalescer::new();
            assert_eq!(c.push(&first), Push::Absorbed);
            assert_eq!(c.push(&p), Push::FlushFirst, "{name} v6={}", s.v6);
            assert_eq!(take(&mut c).unwrap(), (&first[..], GsoInfo::NONE));
            assert_eq!(c.push(&p), Push::Absorbed, "{name} then starts anew");
        }
        // Addresses (not in Spec: patch and refix).
        for at in if s.v6 { [8usize, 39] } else { [12, 19] } {
            let mut p = good.clone();
            p[at] ^= 1;
            refix(&mut p);
            let mut c = Coalescer::new();
            c.push(&first);
            assert_eq!(c.push(&p), Push::FlushFirst, "address byte {at}");
        }
        // A larger payload than the first packet's.
        let mut t = s.clone();
        t.seq = s.seq.wrapping_add(gso as u32);
        let bigger = t.packet(&s.payload[gso..2 * gso + 1], false);
        let mut c = Coalescer::new();
        c.push(&first);
        assert_eq!(c.push(&bigger), Push::FlushFirst, "larger payload");
        // Identification need not be consecutive.
        let odd_id = variant(&s, |t| t.id = t.id.wrapping_add(1000));
        let mut c = Coalescer::new();
        c.push(&first);
        assert_eq!(c.push(&odd_id), Push::Absorbed, "IPv4 ID is free");
    }
}

#[test]
fn bad_first_checksum_is_found_when_merging() {
    for s in flows() {
        let gso = gso_of(&s);
        let mut bad = s.segment(gso, 0);
        let n = bad.len();
        bad[n - 1] ^= 0x40;
        let second = s.segment(gso, 1);
        let mut c = Coalescer::new();
        assert_eq!(c.push(&bad), Push::Absorbed, "held unverified");
        assert_eq!(c.push(&second), Push::FlushFirst);
        assert_eq!(
            take(&mut c).unwrap(),
            (&bad[..], GsoInfo::NONE),
            "goes out alone, unchanged"
        );
        assert_eq!(c.push(&second), Push::Absorbed);
        // And once flagged, the bad one stays closed.
        let mut c = Coalescer::new();
        c.push(&bad);
        assert_eq!(c.push(&second), Push::FlushFirst);
        assert_eq!(c.push(&second), Push::FlushFirst);
    }
}

#[test]
fn ineligible_packets() {
    for s in flows() {
        let gso = gso_of(&s);
        let first = s.segment(gso, 0);
        let l4 = s.l4();
        let mut cases: Vec<(&str, Vec<u8>)> = vec![];
        let mut push_spec = |name, f: &dyn Fn(&mut Spec)| cases.push((name, variant(&s, f)));
        push_spec("SYN", &|t: &mut Spec| t.flags |= SYN);
        push_spec("FIN", &|t: &mut Spec| t.flags |= FIN);
        push_spec("RST", &|t: &mut Spec| t.flags |= RST);
        push_spec("URG", &|t: &mut Spec| t.flags |= URG);
        push_spec("CWR", &|t: &mut Spec| t.flags |= CWR);
        push_spec("no ACK", &|t: &mut Spec| t.flags = PSH);
        push_spec("UDP", &|t: &mut Spec| t.udp = true);
        if s.v6 {
            push_spec("extension header", &|t: &mut Spec| t.ext = 8);
        } else {
            push_spec("IPv4 options", &|t: &mut Spec| t.ip_opts = vec![1, 1, 1, 0]);
        }
        let mut t = s.clone();
        t.seq = s.seq.wrapping_add(gso as u32);
        cases.push(("no payload", t.packet(&[], false)));
        let good = s.segment(gso, 1);
        let mut bad_tcp = good.clone();
        let n = bad_tcp.len();
        bad_tcp[n - 1] ^= 1;
        cases.push(("bad TCP checksum", bad_tcp));
        let mut trailing = good.clone();
        trailing.push(0);
        cases.push(("trailing byte", trailing));
        cases.push(("truncated", good[..good.len() - 1].to_vec()));
        let mut doff = good.clone();
        doff[l4 + 12] = 4 << 4;
        refix(&mut doff);
        cases.push(("data offset 16", doff));
        let mut doff = good[..l4 + 24].to_vec();
        if s.v6 {
            doff[4..6].copy_from_slice(&24u16.to_be_bytes());
        } else {
            doff[2..4].copy_from_slice(&((l4 + 24) as u16).to_be_bytes());
        }
        doff[l4 + 12] = 15 << 4;
        refix(&mut doff);
        cases.push(("data offset past the end", doff));
        let mut v = good.clone();
        v[0] = (v[0] & 0x0f) | 0x50;
        cases.push(("version 5", v));
        cases.push(("empty", vec![]));
        cases.push(("one byte", vec![0x45]));
        if s.v6 {
            let mut jumbo = vec![0u8; 40 + 65535];
            jumbo[..40].copy_from_slice(&good[..40]);
            jumbo[4..6].copy_from_slice(&u16::MAX.to_be_bytes());
            cases.push(("longer than 65535", jumbo));
        } else {
            let mut mf = good.clone();
            mf[6] |= 0x20;
            refix(&mut mf);
            cases.push(("MF", mf));
            let mut off = good.clone();
            off[7] = 8;
            refix(&mut off);
            cases.push(("fragment offset", off));
            let mut hcs = good.clone();
            hcs[10] ^= 1;
            cases.push(("bad IPv4 header checksum", hcs));
        }
        for (name, p) in &cases {
            let mut c = Coalescer::new();
            if name != &"bad TCP checksum" {
                assert_eq!(c.push(p), Push::Ineligible, "{name} alone v6={}", s.v6);
                assert!(c.is_empty());
            }
            assert_eq!(c.push(&first), Push::Absorbed);
            assert_eq!(
                c.push(p),
                Push::Ineligible,
                "{name} after a packet v6={}",
                s.v6
            );
            assert_eq!(c.segments(), 1, "{name}: nothing taken in");
            assert_eq!(c.push(&good), Push::Absorbed, "{name}: pending intact");
            // A rejected packet leaves no trace in what is written (a bad
            // checksum is found while its payload is being copied, past the
            // pending bytes): the same super-segment as without it.
            let mut clean = Coalescer::new();
            clean.push(&first);
            clean.push(&good);
            assert_eq!(take(&mut c), take(&mut clean), "{name}: same bytes");
        }
    }
}

#[test]
fn ineligible_stream_keeps_order() {
    let s = flows().remove(0);
    let gso = gso_of(&s);
    let mut pkts: Vec<Vec<u8>> = (0..6).map(|i| s.segment(gso, i)).collect();
    let udp = Spec::new(false, true, 50).packet(&[7; 50], false);
    pkts.insert(3, udp);
    let written = drive(&mut Coalescer::new(), &pkts);
    assert_eq!(written.len(), 3, "super, UDP alone, super");
    assert_eq!(written[1].0, pkts[3]);
    assert_same_stream(&pkts, &expand(&written));
}

// ---------------------------------------------------------------------------
// Properties.

fn spec_strategy(max_payload: usize) -> impl Strategy<Value = (Spec, usize)> {
    (
        any::<bool>(),
        0usize..=10,
        prop::collection::vec(any::<u8>(), 40),
        1usize..=max_payload,
        any::<(u32, u32, u16, u16, u8, u8, u32, u16, u16)>(),
        any::<(bool, bool)>(),
        any::<u16>(),
    )
        .prop_flat_map(move |(v6, words, optbytes, plen, f, (psh, ece), urg)| {
            let mut s = Spec::new(v6, false, plen);
            s.tcp_opts = optbytes[..words * 4].to_vec();
            (
                s.seq, s.ack, s.win, s.id, s.tos, s.ttl, s.flow, s.sport, s.dport,
            ) = f;
            s.flow &= 0xfffff;
            s.urg = urg;
            s.flags = ACK | if psh { PSH } else { 0 } | if ece { ECE } else { 0 };
            // Segment sizes giving 1..=64 segments.
            let min = plen.div_ceil(MAX_COALESCE_SEGMENTS).max(1);
            (Just(s), min..=plen.max(min))
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Random super-segment → segments (each checked) → coalescer → the
    /// original bytes and segment size back.
    #[test]
    fn prop_segment_then_coalesce_is_identity(
        (s, gso) in spec_strategy(20_000),
        payload_seed in any::<u64>(),
    ) {
        let mut s = s;
        let mut x = payload_seed | 1;
        for b in s.payload.iter_mut() {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            *b = x as u8;
        }
        let segs = split_and_check(&s, gso);
        let mut c = Coalescer::new();
        for p in &segs {
            prop_assert_eq!(c.push(p), Push::Absorbed);
        }
        let (b, info) = take(&mut c).unwrap();
        if segs.len() == 1 {
            prop_assert_eq!(b, &segs[0][..]);
            prop_assert_eq!(info, GsoInfo::NONE);
        } else {
            prop_assert_eq!(b, &s.super_segment()[..]);
            prop_assert_eq!(usize::from(info.gso_size), gso);
            prop_assert_eq!(info, GsoInfo { hdr_len: s.hdr() as u16, ..s.info(gso) });
        }
    }

    /// With any flags (CWR, FIN, URG included) and more segments than one
    /// super-segment holds, the written stream splits back into exactly the
    /// packets pushed.
    #[test]
    fn prop_any_flags_stream_roundtrip(
        (s, _) in spec_strategy(12_000),
        extra in prop::sample::subsequence(vec![CWR, FIN, URG, PSH, ECE], 0..=5),
        gso in 6usize..=1500, // at most 2000 segments
    ) {
        let mut s = s;
        s.flags = extra.iter().fold(ACK, |a, f| a | f);
        let segs = split_and_check(&s, gso);
        let written = drive(&mut Coalescer::new(), &segs);
        for (b, i) in &written {
            if i.kind != GsoKind::None {
                prop_assert_eq!(usize::from(i.gso_size), gso);
                prop_assert!(b.len() <= MAX_SUPER_LEN);
            }
        }
        assert_same_stream(&segs, &expand(&written));
        if segs.len() > 1 && s.flags & (URG | CWR) == 0 && segs.len() <= MAX_COALESCE_SEGMENTS && s.flags & FIN == 0 {
            prop_assert_eq!(written.len(), 1);
        }
    }

    /// One changed byte in the second segment never lets it be merged.
    #[test]
    fn prop_corruption_is_never_merged(
        v6 in any::<bool>(),
        at in any::<prop::sample::Index>(),
        xor in 1u8..=255,
        corrupt_first in any::<bool>(),
    ) {
        let s = Spec::new(v6, false, 3000);
        let segs = split_and_check(&s, 1000);
        let (mut a, mut b) = (segs[0].clone(), segs[1].clone());
        let victim = if corrupt_first { &mut a } else { &mut b };
        let i = at.index(victim.len());
        victim[i] ^= xor;
        let mut c = Coalescer::new();
        let first = c.push(&a);
        let second = c.push(&b);
        prop_assert_ne!((first, second), (Push::Absorbed, Push::Absorbed), "byte {} ^ {:#x}", i, xor);
    }

    /// Streams mixing valid segments, mutated ones and garbage: nothing
    /// panics and the output splits back into exactly the input.
    #[test]
    fn prop_mixed_stream_roundtrip(
        ops in prop::collection::vec((0u8..6, any::<prop::sample::Index>(), any::<u8>(), prop::collection::vec(any::<u8>(), 0..80)), 1..60),
    ) {
        let flows = flows();
        let mut next = [0usize; 2];
        let mut pkts = Vec::new();
        for (op, idx, byte, junk) in ops {
            let f = usize::from(op % 2);
            let s = &flows[f];
            let gso = gso_of(s);
            let n = s.payload.len().div_ceil(gso);
            let seg = s.segment(gso, next[f] % n);
            match op {
                0 | 1 => { next[f] += 1; pkts.push(seg) }
                2 | 3 => {
                    let mut p = seg;
                    let i = idx.index(p.len());
                    p[i] ^= byte | 1;
                    pkts.push(p);
                }
                4 => pkts.push(junk),
                _ => { next[f] += 2; pkts.push(seg) }
            }
        }
        let written = drive(&mut Coalescer::new(), &pkts);
        assert_same_stream(&pkts, &expand(&written));
    }

    /// Arbitrary bytes and offload headers: the segmenter never panics and
    /// what it produces stays within its bounds.
    #[test]
    fn prop_segmenter_garbage(
        pkt in prop::collection::vec(any::<u8>(), 0..400),
        kind in 0u8..4,
        needs_csum in any::<bool>(),
        gso_size in 0u16..300,
        csum_start in 0u16..100,
        csum_offset in 0u16..40,
        hdr_len in any::<u16>(),
        version in prop::sample::select(vec![0x45u8, 0x46, 0x60, 0x4f, 0x00]),
    ) {
        let mut pkt = pkt;
        if let Some(b) = pkt.first_mut() {
            *b = version;
        }
        let kind = [GsoKind::None, GsoKind::TcpV4, GsoKind::TcpV6, GsoKind::UdpL4][usize::from(kind)];
        let info = GsoInfo { kind, needs_csum, hdr_len, gso_size, csum_start, csum_offset };
        if let Ok(mut seg) = Segmenter::new(&pkt, &info) {
            let mut buf = PacketBuf::with_capacity(64);
            let mut n = 0;
            let max = seg.max_segment_len();
            let mut copied = Vec::new();
            while let Some(r) = seg.next_into(&mut buf) {
                prop_assert!(r.is_ok());
                prop_assert!(buf.len() <= max.max(pkt.len()));
                copied.push(buf.as_slice().to_vec());
                n += 1;
            }
            prop_assert_eq!(n, Segmenter::new(&pkt, &info).unwrap().count());
            prop_assert_eq!(segment_in_place(&pkt, &info).unwrap(), copied);
        }
        let mut c = Coalescer::new();
        let _ = c.push(&pkt);
        let _ = take(&mut c);
    }
}

// UDP coalescing (USO writes).

#[test]
fn udp_datagrams_of_one_flow_coalesce_and_split_back_exactly() {
    for v6 in [false, true] {
        let s = Spec::new(v6, true, 10 * 1200 + 100);
        let segs = split_and_check(&s, 1200);
        assert_eq!(segs.len(), 11);
        // Without USO, UDP is never merged.
        let mut tcp_only = Coalescer::new();
        assert_eq!(tcp_only.push(&segs[0]), Push::Ineligible);
        let mut c = Coalescer::with_udp(true);
        for (i, p) in segs.iter().enumerate() {
            assert_eq!(c.push(p), Push::Absorbed, "datagram {i}");
        }
        let (b, info) = take(&mut c).unwrap();
        let b = b.to_vec();
        assert_eq!(b, s.super_segment(), "v6 {v6}");
        assert_eq!(
            info,
            GsoInfo {
                hdr_len: s.hdr() as u16,
                ..s.info(1200)
            }
        );
        assert_eq!(info.kind, GsoKind::UdpL4);
        // What the kernel's segmentation gives back: the same datagrams.
        let again = segment_all(&b, &info).unwrap();
        assert_eq!(again.len(), segs.len());
        for (i, (a, g)) in segs.iter().zip(&again).enumerate() {
            let l4 = s.l4();
            assert!(ref_l4_ok(g, v6, l4, 17), "datagram {i}");
            let mut m = [a.clone(), g.clone()];
            for x in &mut m {
                if !v6 {
                    x[4..6].fill(0);
                    x[10..12].fill(0);
                }
                x[l4 + 6..l4 + 8].fill(0);
            }
            assert_eq!(m[0], m[1], "datagram {i}");
        }
    }
}

#[test]
fn udp_coalescing_refuses_what_it_must() {
    let s = Spec::new(false, true, 4 * 1000);
    let segs = split_and_check(&s, 1000);
    let l4 = s.l4();
    let mut c = Coalescer::with_udp(true);
    assert_eq!(c.push(&segs[0]), Push::Absorbed);
    // Another destination port: another flow.
    let mut other = segs[1].clone();
    other[l4 + 3] ^= 1;
    refix(&mut other);
    assert_eq!(c.push(&other), Push::FlushFirst);
    // A corrupted payload (checksum no longer matches) is never merged.
    let mut bad = segs[1].clone();
    let n = bad.len();
    bad[n - 1] ^= 0x40;
    assert_eq!(c.push(&bad), Push::Ineligible);
    // A larger datagram than the first cannot join; a shorter one closes.
    let big = Spec::new(false, true, 1100).packet(&[7u8; 1100], false);
    assert_eq!(c.push(&big), Push::FlushFirst);
    let short = Spec::new(false, true, 300).packet(&[9u8; 300], false);
    assert_eq!(c.push(&short), Push::Absorbed);
    assert_eq!(c.push(&segs[1]), Push::FlushFirst);
    let (_, info) = take(&mut c).unwrap();
    assert_eq!((info.kind, c.segments()), (GsoKind::UdpL4, 0));
    // IPv4 without a UDP checksum (0) may be merged; IPv6 with 0 may not.
    let mut none = segs[2].clone();
    none[l4 + 6..l4 + 8].fill(0);
    assert_eq!(c.push(&segs[1]), Push::Absorbed);
    assert_eq!(c.push(&none), Push::Absorbed);
    let _ = take(&mut c);
    let s6 = Spec::new(true, true, 2 * 500);
    let segs6 = split_and_check(&s6, 500);
    let mut zero6 = segs6[1].clone();
    let l6 = s6.l4();
    zero6[l6 + 6..l6 + 8].fill(0);
    assert_eq!(c.push(&segs6[0]), Push::Absorbed);
    assert_eq!(c.push(&zero6), Push::Ineligible);
    // TCP after UDP: another kind, another super-segment.
    let t = split_and_check(&Spec::new(false, false, 2 * 1448), 1448);
    assert_eq!(c.push(&t[0]), Push::FlushFirst);
}
