//! Helpers shared by the `offload_segment` and `offload_coalesce` targets
//! (included with `#[path]`; not a target itself): an Internet checksum
//! written here independently of the core, a packet builder, the
//! segmentation oracle and the coalescing driver and oracle.
#![allow(dead_code)]

use espgate_core::offload::{
    Coalescer, GsoInfo, GsoKind, Push, Segmenter, MAX_COALESCE_SEGMENTS, MAX_SEGMENTS,
    MAX_SUPER_LEN,
};
use espgate_core::wire::ip;
use espgate_core::{DropReason, PacketBuf};
use espgate_fuzz::Cursor;

pub const FIN: u8 = 0x01;
pub const SYN: u8 = 0x02;
pub const RST: u8 = 0x04;
pub const PSH: u8 = 0x08;
pub const ACK: u8 = 0x10;
pub const CWR: u8 = 0x80;

// ---------------------------------------------------------------------------
// Reference checksum: byte-wise into a u64, folded at the end.

pub fn ref_sum(data: &[u8]) -> u64 {
    data.iter()
        .enumerate()
        .map(|(i, b)| u64::from(*b) << if i % 2 == 0 { 8 } else { 0 })
        .sum()
}

pub fn ref_fold(mut s: u64) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// Pseudo-header bytes for the IP packet `pkt` (addresses at the fixed
/// offsets of either version).
pub fn ref_pseudo(pkt: &[u8], v6: bool, protocol: u8, l4_len: usize) -> Vec<u8> {
    let mut p = Vec::with_capacity(40);
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

/// The L4 checksum of `pkt[l4..]` verifies.
pub fn ref_l4_ok(pkt: &[u8], v6: bool, l4: usize, protocol: u8) -> bool {
    let mut all = ref_pseudo(pkt, v6, protocol, pkt.len() - l4);
    all.extend_from_slice(&pkt[l4..]);
    ref_fold(ref_sum(&all)) == 0xffff
}

pub fn ref_ipv4_ok(pkt: &[u8]) -> bool {
    let hl = usize::from(pkt[0] & 0x0f) * 4;
    ref_fold(ref_sum(&pkt[..hl])) == 0xffff
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// A byte reader like `espgate_fuzz::Cursor` (zeros once exhausted) that
/// also says when it is exhausted.
pub struct Reader<'a>(pub &'a [u8]);

impl Reader<'_> {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }
}

// ---------------------------------------------------------------------------
// Building packets.

/// What goes into the L4 checksum field.
#[derive(Debug, Clone, Copy)]
pub enum Csum {
    /// The full checksum.
    Full,
    /// The pseudo-header sum (a `NEEDS_CSUM` packet).
    Partial,
    /// Whatever (a super-segment read without `NEEDS_CSUM`).
    Raw(u16),
}

/// Headers of one flow.
#[derive(Debug, Clone)]
pub struct Flow {
    pub v6: bool,
    pub udp: bool,
    pub ip_opts: Vec<u8>,
    /// IPv6 destination-options header length (0: none).
    pub ext: usize,
    pub tcp_opts: Vec<u8>,
    pub flags: u8,
    pub seq: u32,
    pub ack: u32,
    pub win: u16,
    pub urg: u16,
    pub id: u16,
    pub tos: u8,
    pub ttl: u8,
    pub df: bool,
    pub flow: u32,
    pub sport: u16,
    pub dport: u16,
    pub src: [u8; 16],
    pub dst: [u8; 16],
}

impl Flow {
    /// A flow from fuzz bytes. `coalescable` keeps it to what the coalescer
    /// merges (TCP, no IP options or extension headers, ACK[|PSH|ECE]
    /// chosen by the caller).
    pub fn from_cursor(c: &mut Cursor, coalescable: bool) -> Flow {
        let shape = c.u8();
        let v6 = shape & 1 != 0;
        let udp = !coalescable && shape & 2 != 0;
        let ip_words = if coalescable || v6 {
            0
        } else {
            usize::from(shape >> 2 & 0x0f) % 11
        };
        let ext = if coalescable || !v6 {
            0
        } else {
            usize::from(shape >> 2 & 3) * 8
        };
        let tcp_words = if udp { 0 } else { usize::from(shape >> 4) % 11 };
        let mut src = [0u8; 16];
        let mut dst = [0u8; 16];
        for b in src.iter_mut().chain(dst.iter_mut()) {
            *b = c.u8();
        }
        let ip_opts = (0..ip_words * 4).map(|_| c.u8()).collect();
        let tcp_opts = (0..tcp_words * 4).map(|_| c.u8()).collect();
        Flow {
            v6,
            udp,
            ip_opts,
            ext,
            tcp_opts,
            flags: c.u8(),
            seq: c.u32(),
            ack: c.u32(),
            win: c.u16(),
            urg: c.u16(),
            id: c.u16(),
            tos: c.u8(),
            ttl: c.u8(),
            df: shape & 0x40 != 0,
            flow: c.u32() & 0xfffff,
            sport: c.u16(),
            dport: c.u16(),
            src,
            dst,
        }
    }

    pub fn protocol(&self) -> u8 {
        if self.udp {
            17
        } else {
            6
        }
    }

    pub fn l4(&self) -> usize {
        if self.v6 {
            40 + self.ext
        } else {
            20 + self.ip_opts.len()
        }
    }

    pub fn hdr(&self) -> usize {
        self.l4()
            + if self.udp {
                8
            } else {
                20 + self.tcp_opts.len()
            }
    }

    /// One packet with `payload` (cut so the IP length fits 16 bits).
    pub fn packet(&self, payload: &[u8], csum: Csum) -> Vec<u8> {
        let l4 = self.l4();
        let hdr = self.hdr();
        let payload = &payload[..payload.len().min(65535 - hdr)];
        let len = hdr + payload.len();
        let mut p = vec![0u8; len];
        if self.v6 {
            p[0] = 0x60 | (self.tos >> 4);
            p[1] = (self.tos << 4) | (self.flow >> 16) as u8;
            p[2..4].copy_from_slice(&(self.flow as u16).to_be_bytes());
            p[4..6].copy_from_slice(&((len - 40) as u16).to_be_bytes());
            p[6] = if self.ext > 0 { 60 } else { self.protocol() };
            p[7] = self.ttl;
            p[8..24].copy_from_slice(&self.src);
            p[24..40].copy_from_slice(&self.dst);
            if self.ext > 0 {
                p[40] = self.protocol();
                p[41] = (self.ext / 8 - 1) as u8;
                p[42] = 1;
                p[43] = (self.ext - 4) as u8;
            }
        } else {
            p[0] = 0x40 | (l4 / 4) as u8;
            p[1] = self.tos;
            p[2..4].copy_from_slice(&(len as u16).to_be_bytes());
            p[4..6].copy_from_slice(&self.id.to_be_bytes());
            p[6] = if self.df { 0x40 } else { 0 };
            p[8] = self.ttl;
            p[9] = self.protocol();
            p[12..16].copy_from_slice(&self.src[..4]);
            p[16..20].copy_from_slice(&self.dst[..4]);
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
            p[l4 + 12] = (((hdr - l4) / 4) as u8) << 4;
            p[l4 + 13] = self.flags;
            p[l4 + 14..l4 + 16].copy_from_slice(&self.win.to_be_bytes());
            p[l4 + 18..l4 + 20].copy_from_slice(&self.urg.to_be_bytes());
            p[l4 + 20..hdr].copy_from_slice(&self.tcp_opts);
        }
        p[hdr..].copy_from_slice(payload);
        let at = l4 + if self.udp { 6 } else { 16 };
        let pseudo = ref_pseudo(&p, self.v6, self.protocol(), len - l4);
        let c = match csum {
            Csum::Partial => ref_fold(ref_sum(&pseudo)),
            Csum::Raw(v) => v,
            Csum::Full => {
                let mut all = pseudo;
                all.extend_from_slice(&p[l4..]);
                !ref_fold(ref_sum(&all))
            }
        };
        p[at..at + 2].copy_from_slice(&c.to_be_bytes());
        p
    }

    /// The offload header a TUN read would carry for this super-segment.
    pub fn info(&self, gso_size: u16, needs_csum: bool, hdr_len: u16) -> GsoInfo {
        GsoInfo {
            kind: match (self.udp, self.v6) {
                (true, _) => GsoKind::UdpL4,
                (false, false) => GsoKind::TcpV4,
                (false, true) => GsoKind::TcpV6,
            },
            needs_csum,
            hdr_len,
            gso_size,
            csum_start: if needs_csum { self.l4() as u16 } else { 0 },
            csum_offset: match (needs_csum, self.udp) {
                (false, _) => 0,
                (true, true) => 6,
                (true, false) => 16,
            },
        }
    }
}

// ---------------------------------------------------------------------------
// Segmentation.

/// All packets of one TUN read.
pub fn split(pkt: &[u8], info: &GsoInfo) -> Result<Vec<Vec<u8>>, DropReason> {
    let mut s = Segmenter::new(pkt, info)?;
    let n = s.count();
    assert!((1..=MAX_SEGMENTS).contains(&n), "count {n}");
    let max = s.max_segment_len();
    let mut buf = PacketBuf::with_capacity(256);
    let mut out = Vec::with_capacity(n);
    while let Some(r) = s.next_into(&mut buf) {
        r.expect("next_into failed after new() accepted");
        assert!(buf.len() <= max, "segment {} > max {max}", buf.len());
        out.push(buf.as_slice().to_vec());
        assert!(out.len() <= n);
    }
    assert_eq!(out.len(), n, "count() vs segments written");
    // Cut in place (each segment's headers over the previous payload's
    // end): the same packets.
    let mut owned = pkt.to_vec();
    let mut s = Segmenter::new(&mut owned[..], info).expect("accepted in place too");
    let mut k = 0;
    while let Some(r) = s.next_in_place() {
        let seg = r.expect("next_in_place failed after new() accepted");
        assert_eq!(seg, &out[k][..], "segment {k} in place");
        k += 1;
    }
    assert_eq!(k, n, "count() vs segments cut in place");
    Ok(out)
}

/// Checks the packets `out` produced from `orig` under `info` against what
/// segmentation must do, with the reference checksum.
pub fn check_split(orig: &[u8], info: &GsoInfo, out: &[Vec<u8>]) {
    if info.kind == GsoKind::None {
        assert_eq!(out.len(), 1);
        let got = &out[0];
        assert_eq!(got.len(), orig.len());
        if !info.needs_csum {
            assert_eq!(got, orig, "pass-through changed the packet");
            return;
        }
        let (start, at) = (
            usize::from(info.csum_start),
            usize::from(info.csum_start) + usize::from(info.csum_offset),
        );
        let mut want = !ref_fold(ref_sum(&orig[start..]));
        if want == 0 {
            want = 0xffff;
        }
        let mut expect = orig.to_vec();
        expect[at..at + 2].copy_from_slice(&want.to_be_bytes());
        assert_eq!(got, &expect, "completed checksum");
        return;
    }
    let ipi = ip::parse(orig).expect("accepted super-segment must parse");
    assert!(!ipi.fragment);
    let v6 = ipi.version == 6;
    let l4 = ipi.payload_offset;
    let end = ipi.packet_len;
    let tcp = ipi.protocol == 6;
    assert_eq!(
        (tcp, info.kind),
        match (tcp, v6) {
            (true, false) => (true, GsoKind::TcpV4),
            (true, true) => (true, GsoKind::TcpV6),
            (false, _) => (false, GsoKind::UdpL4),
        }
    );
    let hdr = l4
        + if tcp {
            usize::from(orig[l4 + 12] >> 4) * 4
        } else {
            8
        };
    assert!(hdr < end);
    let gso = usize::from(info.gso_size);
    let payload = &orig[hdr..end];
    assert_eq!(out.len(), payload.len().div_ceil(gso), "segment count");
    let flags = if tcp { orig[l4 + 13] } else { 0 };
    assert_eq!(flags & (SYN | RST), 0);
    for (i, seg) in out.iter().enumerate() {
        let off = i * gso;
        let plen = gso.min(payload.len() - off);
        let last = i + 1 == out.len();
        assert_eq!(seg.len(), hdr + plen, "segment {i} length");
        assert_eq!(
            &seg[hdr..],
            &payload[off..off + plen],
            "segment {i} payload"
        );
        // Header bytes: equal except the fields segmentation rewrites.
        let mut changed: Vec<usize> = if v6 {
            vec![4, 5]
        } else {
            vec![2, 3, 4, 5, 10, 11]
        };
        if tcp {
            changed.extend([l4 + 4, l4 + 5, l4 + 6, l4 + 7, l4 + 13, l4 + 16, l4 + 17]);
        } else {
            changed.extend([l4 + 4, l4 + 5, l4 + 6, l4 + 7]);
        }
        for k in 0..hdr {
            if !changed.contains(&k) {
                assert_eq!(seg[k], orig[k], "segment {i} header byte {k}");
            }
        }
        if v6 {
            assert_eq!(usize::from(be16(seg, 4)), seg.len() - 40);
        } else {
            assert_eq!(usize::from(be16(seg, 2)), seg.len());
            assert_eq!(
                be16(seg, 4),
                be16(orig, 4).wrapping_add(i as u16),
                "IPv4 ID"
            );
            assert!(ref_ipv4_ok(seg), "segment {i} IPv4 header checksum");
        }
        if tcp {
            assert_eq!(
                be32(seg, l4 + 4),
                be32(orig, l4 + 4).wrapping_add(off as u32)
            );
            let mut want = flags;
            if !last {
                want &= !(FIN | PSH);
            }
            if i > 0 {
                want &= !CWR;
            }
            assert_eq!(seg[l4 + 13], want, "segment {i} flags");
        } else {
            assert_eq!(usize::from(be16(seg, l4 + 4)), 8 + plen);
            assert_ne!(be16(seg, l4 + 6), 0, "UDP checksum 0");
        }
        assert!(
            ref_l4_ok(seg, v6, l4, ipi.protocol),
            "segment {i} L4 checksum"
        );
    }
}

// ---------------------------------------------------------------------------
// Coalescing.

/// Drives a coalescer as the data plane must; returns what it would write.
pub fn drive(co: &mut Coalescer, pkts: &[Vec<u8>]) -> Vec<(Vec<u8>, GsoInfo)> {
    let mut out = Vec::new();
    let take = |co: &mut Coalescer, out: &mut Vec<(Vec<u8>, GsoInfo)>| {
        let pending = co.segments();
        if let Some((b, info, n)) = co.take() {
            assert_eq!(n, pending, "take() count");
            assert!(n >= 1);
            out.push((b.to_vec(), info));
        }
        assert!(co.is_empty());
    };
    for p in pkts {
        match co.push(p) {
            Push::Absorbed => {}
            Push::FlushFirst => {
                assert!(!co.is_empty(), "FlushFirst with nothing pending");
                take(co, &mut out);
                match co.push(p) {
                    Push::Absorbed => {}
                    Push::Ineligible => out.push((p.clone(), GsoInfo::NONE)),
                    Push::FlushFirst => panic!("FlushFirst on an empty coalescer"),
                }
            }
            Push::Ineligible => {
                take(co, &mut out);
                out.push((p.clone(), GsoInfo::NONE));
            }
        }
    }
    take(co, &mut out);
    out
}

/// A written super-segment is well formed.
pub fn check_super(b: &[u8], info: &GsoInfo) {
    let v6 = b[0] >> 4 == 6;
    let l4 = if v6 { 40 } else { 20 };
    assert!(b.len() <= MAX_SUPER_LEN);
    let udp = info.kind == GsoKind::UdpL4;
    let (proto, csum_at) = if udp { (17, 6) } else { (6, 16) };
    if udp {
        // A UDP super-packet (USO): its length field covers all of it.
        assert_eq!(usize::from(be16(b, l4 + 4)), b.len() - l4);
        assert_eq!(usize::from(info.hdr_len), l4 + 8);
    } else {
        assert_eq!(info.kind, if v6 { GsoKind::TcpV6 } else { GsoKind::TcpV4 });
        assert_eq!(
            usize::from(info.hdr_len),
            l4 + usize::from(b[l4 + 12] >> 4) * 4
        );
    }
    assert!(info.needs_csum);
    assert_eq!(
        (usize::from(info.csum_start), info.csum_offset),
        (l4, csum_at as u16)
    );
    let n = (b.len() - usize::from(info.hdr_len)).div_ceil(usize::from(info.gso_size));
    assert!((2..=MAX_COALESCE_SEGMENTS).contains(&n), "{n} segments");
    if v6 {
        assert_eq!(usize::from(be16(b, 4)), b.len() - 40);
    } else {
        assert_eq!(usize::from(be16(b, 2)), b.len());
        assert!(ref_ipv4_ok(b));
    }
    let partial = ref_fold(ref_sum(&ref_pseudo(b, v6, proto, b.len() - l4)));
    assert_eq!(be16(b, l4 + csum_at), partial, "partial checksum");
}

/// Splits what was written again, marking packets that were merged.
pub fn expand(written: &[(Vec<u8>, GsoInfo)]) -> Vec<(Vec<u8>, bool)> {
    let mut v = Vec::new();
    for (b, info) in written {
        if info.kind == GsoKind::None {
            assert_eq!(*info, GsoInfo::NONE);
            v.push((b.clone(), false));
        } else {
            check_super(b, info);
            let segs = split(b, info).expect("written super-segment must split");
            check_split(b, info, &segs);
            v.extend(segs.into_iter().map(|s| (s, true)));
        }
    }
    v
}

/// Coalescing and splitting again is the identity on the packet stream,
/// except for consecutive IPv4 IDs in merged packets (and the two encodings
/// of a zero checksum).
pub fn assert_same_stream(pushed: &[Vec<u8>], got: &[(Vec<u8>, bool)]) {
    assert_eq!(pushed.len(), got.len(), "packet count");
    for (i, (p, (g, merged))) in pushed.iter().zip(got).enumerate() {
        if !merged {
            assert_eq!(p, g, "packet {i} written alone must be unchanged");
            continue;
        }
        assert_eq!(p.len(), g.len(), "packet {i} length");
        let v6 = p[0] >> 4 == 6;
        let l4 = if v6 { 40 } else { 20 };
        let proto = if v6 { p[6] } else { p[9] };
        let csum_at = if proto == 17 { 6 } else { 16 };
        // (A merged IPv4 UDP datagram may have had no checksum: 0.)
        assert!(
            ref_l4_ok(p, v6, l4, proto) || (proto == 17 && !v6 && be16(p, l4 + 6) == 0),
            "merged packet {i} had a bad checksum"
        );
        if !v6 {
            assert!(ref_ipv4_ok(p), "merged packet {i} had a bad IPv4 header");
        }
        let mut masked = [p.clone(), g.clone()];
        for m in &mut masked {
            if !v6 {
                m[4..6].fill(0);
                m[10..12].fill(0);
            }
            m[l4 + csum_at..l4 + csum_at + 2].fill(0);
        }
        assert_eq!(masked[0], masked[1], "packet {i}");
    }
}
