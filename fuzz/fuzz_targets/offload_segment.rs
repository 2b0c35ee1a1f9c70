//! TUN offload segmentation: `offload::Segmenter` (and through it
//! `offload::complete_checksum`) on what a TUN read with a virtio-net header
//! may yield, checked against an independent model of kernel GSO
//! (`offload_common::check_split`, own checksum code).
//!
//! Byte 0 picks the mode (bit 0):
//! - 0 `raw`: byte 1 % 4 is the GSO kind (none, TCPv4, TCPv6, UDP L4),
//!   byte 2 bit 0 `needs_csum`, then big-endian u16 `hdr_len`, `gso_size`,
//!   `csum_start`, `csum_offset`; the rest is the packet.
//! - 1 `built`: a well-formed super-segment is built from the input (IPv4
//!   with options or IPv6 with a destination-options header, TCP with
//!   options and any flags but SYN/RST, or UDP; fuzz-chosen header fields,
//!   segment size and `hdr_len` hint; payload = the rest), with a partial or
//!   an arbitrary L4 checksum.
//!
//! Asserts:
//! - whatever `Segmenter::new` accepts yields exactly `count()` packets, each
//!   at most `max_segment_len()`, the same whether copied out or cut in
//!   place; a GSO-none packet comes back unchanged or
//!   with exactly the checksum the kernel's `skb_checksum_help` would write;
//!   a super-segment's segments carry the original payload in order, the
//!   original headers except the rewritten fields, consecutive IPv4 IDs,
//!   advancing sequence numbers, FIN/PSH on the last and CWR on the first
//!   segment only, correct lengths and checksums;
//! - raw: a zero segment size is refused, GSO-none without `needs_csum` is
//!   always accepted;
//! - built: the super-segment is always accepted; TCP segments fed to a
//!   `Coalescer` and the result split again give back exactly those
//!   segments, and a coalescable flow of 2..=64 segments comes back as the
//!   original super-segment in one write.
#![no_main]

#[path = "offload_common/mod.rs"]
mod common;

use common::*;
use espgate_core::offload::{
    Coalescer, GsoInfo, GsoKind, Segmenter, MAX_COALESCE_SEGMENTS, MAX_SEGMENTS,
};
use espgate_core::DropReason;
use espgate_fuzz::Cursor;
use libfuzzer_sys::fuzz_target;

const ECE: u8 = 0x40;

fn raw_info(c: &mut Cursor) -> GsoInfo {
    let kind = [
        GsoKind::None,
        GsoKind::TcpV4,
        GsoKind::TcpV6,
        GsoKind::UdpL4,
    ][usize::from(c.u8() % 4)];
    let needs_csum = c.u8() & 1 != 0;
    GsoInfo {
        kind,
        needs_csum,
        hdr_len: c.u16(),
        gso_size: c.u16(),
        csum_start: c.u16(),
        csum_offset: c.u16(),
    }
}

fn run_raw(data: &[u8]) {
    let mut c = Cursor::new(data);
    let info = raw_info(&mut c);
    let pkt = c.rest();
    match Segmenter::new(pkt, &info) {
        Ok(_) => {
            let out = split(pkt, &info).expect("accepted twice");
            check_split(pkt, &info, &out);
        }
        Err(e) => {
            assert!(
                info.kind != GsoKind::None || info.needs_csum,
                "plain packet refused: {e}"
            );
            if info.kind == GsoKind::None {
                assert_eq!(e, DropReason::BadOffload);
            }
        }
    }
    if info.kind != GsoKind::None && info.gso_size == 0 {
        assert_eq!(
            Segmenter::new(pkt, &info).map(|_| ()),
            Err(DropReason::BadOffload)
        );
    }
}

fn run_built(data: &[u8]) {
    let mut c = Cursor::new(data);
    let mut flow = Flow::from_cursor(&mut c, false);
    flow.flags &= !(SYN | RST);
    let gso_seed = c.u16();
    let knobs = c.u8();
    let needs_csum = knobs & 1 != 0;
    let hint = c.u16();
    let raw_csum = c.u16();
    let mut payload = c.rest().to_vec();
    if payload.is_empty() {
        payload.push(0xab);
    }
    payload.truncate(65535 - flow.hdr());
    let gso = usize::from(gso_seed)
        .max(1)
        .max(payload.len().div_ceil(MAX_SEGMENTS));
    let gso = u16::try_from(gso).expect("gso fits");
    let csum = if needs_csum {
        Csum::Partial
    } else {
        Csum::Raw(raw_csum)
    };
    let pkt = flow.packet(&payload, csum);
    let info = flow.info(gso, needs_csum, hint);
    let segs = match split(&pkt, &info) {
        Ok(s) => s,
        Err(e) => panic!("well-formed super-segment refused: {e} ({flow:?}, gso {gso})"),
    };
    check_split(&pkt, &info, &segs);
    if flow.udp {
        return;
    }
    let written = drive(&mut Coalescer::new(), &segs);
    assert_same_stream(&segs, &expand(&written));
    let coalescable = flow.ip_opts.is_empty()
        && flow.ext == 0
        && flow.flags & ACK != 0
        && flow.flags & !(ACK | PSH | ECE) == 0;
    if coalescable && segs.len() <= MAX_COALESCE_SEGMENTS {
        assert_eq!(written.len(), 1, "one flow, one write");
        let (b, i) = &written[0];
        if segs.len() == 1 {
            assert_eq!((b, *i), (&segs[0], GsoInfo::NONE));
        } else {
            assert_eq!(b, &flow.packet(&payload, Csum::Partial));
            assert_eq!(i.gso_size, gso);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    match data.split_first() {
        Some((m, rest)) if m & 1 == 1 => run_built(rest),
        Some((_, rest)) => run_raw(rest),
        None => {}
    }
});
