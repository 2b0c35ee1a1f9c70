//! TUN offload coalescing: `offload::Coalescer` on a fuzz-chosen stream
//! of decrypted inner packets, driven the way the data plane must
//! (`offload_common::drive`: FlushFirst → take, write, push again;
//! Ineligible → take and write the pending one, then write this one).
//!
//! Input layout: two TCP flows (`Flow::from_cursor`: version, addresses,
//! options, sequence and acknowledgment numbers, window, ...), a segment
//! size (byte pair % 1500 + 1), then operations, one byte each plus
//! arguments, on flow `op >> 7`:
//! - 0, 1: the flow's next full-sized segment (valid checksums);
//! - 2: the next segment with a fuzz-chosen payload length (0..=size+1);
//! - 3: the next segment with one byte XORed (sequence not advanced);
//! - 4: up to 99 raw bytes;
//! - 5: set the flow's TCP flags for the packets that follow;
//! - 6: the next segment with one header byte replaced and both checksums
//!   recomputed (a valid packet that differs in one field);
//! - 7: move the flow's sequence number by a fuzz-chosen amount.
//!
//! Asserts: the coalescer never answers FlushFirst when empty; `take()`
//! counts match; every written super-segment is well formed (lengths, IPv4
//! header checksum, partial TCP checksum = folded pseudo-header sum, at
//! most 64 segments and 65535 bytes, consistent GsoInfo); and splitting the
//! written stream again (with `Segmenter`) gives back exactly the pushed
//! packets, except for consecutive IPv4 IDs in merged packets — so a
//! corrupted packet is never merged and nothing is lost, reordered or
//! altered.
#![no_main]

#[path = "offload_common/mod.rs"]
mod common;

use common::*;
use espgate_core::offload::Coalescer;
use espgate_fuzz::Cursor;
use libfuzzer_sys::fuzz_target;

/// Most operations per input (bounds the work).
const MAX_OPS: usize = 300;

fn payload(seq: u32, len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|k| (seq.wrapping_add(k as u32) as u8) ^ salt)
        .collect()
}

/// Recomputes the IPv4 header checksum and the TCP checksum of a packet
/// with the layout `Flow` builds for coalescable flows (20- or 40-byte IP
/// header), if it is still long enough to have them.
fn refix(p: &mut [u8], v6: bool) {
    let l4 = if v6 { 40 } else { 20 };
    if p.len() < l4 + 18 {
        return;
    }
    if !v6 {
        p[10..12].fill(0);
        let c = !ref_fold(ref_sum(&p[..20]));
        p[10..12].copy_from_slice(&c.to_be_bytes());
    }
    p[l4 + 16..l4 + 18].fill(0);
    let mut all = ref_pseudo(p, v6, 6, p.len() - l4);
    all.extend_from_slice(&p[l4..]);
    let c = !ref_fold(ref_sum(&all));
    p[l4 + 16..l4 + 18].copy_from_slice(&c.to_be_bytes());
}

fuzz_target!(|data: &[u8]| {
    let mut c = Cursor::new(data);
    let mut flows = [
        Flow::from_cursor(&mut c, true),
        Flow::from_cursor(&mut c, true),
    ];
    for f in &mut flows {
        f.flags = ACK;
    }
    let gso = usize::from(c.u16() % 1500) + 1;
    let mut c = Reader(c.rest());
    let mut pkts: Vec<Vec<u8>> = Vec::new();
    for _ in 0..MAX_OPS {
        if c.is_empty() {
            break;
        }
        let op = c.u8();
        let fi = usize::from(op >> 7);
        let salt = fi as u8;
        let f = &mut flows[fi];
        match op & 7 {
            0 | 1 => {
                pkts.push(f.packet(&payload(f.seq, gso, salt), Csum::Full));
                f.seq = f.seq.wrapping_add(gso as u32);
                f.id = f.id.wrapping_add(1);
            }
            2 => {
                let len = usize::from(c.u16()) % (gso + 2);
                pkts.push(f.packet(&payload(f.seq, len, salt), Csum::Full));
                f.seq = f.seq.wrapping_add(len as u32);
                f.id = f.id.wrapping_add(1);
            }
            3 => {
                let mut p = f.packet(&payload(f.seq, gso, salt), Csum::Full);
                let at = usize::from(c.u16()) % p.len();
                p[at] ^= c.u8() | 1;
                pkts.push(p);
            }
            4 => {
                let n = usize::from(c.u8() % 100);
                pkts.push((0..n).map(|_| c.u8()).collect());
            }
            5 => f.flags = c.u8(),
            6 => {
                let mut p = f.packet(&payload(f.seq, gso, salt), Csum::Full);
                let at = usize::from(c.u8()) % f.hdr();
                p[at] = c.u8();
                refix(&mut p, f.v6);
                pkts.push(p);
                f.seq = f.seq.wrapping_add(gso as u32);
            }
            _ => f.seq = f.seq.wrapping_add(u32::from(c.u16())).wrapping_sub(0x8000),
        }
    }
    // UDP merging on (as with a USO TUN): the raw packets of op 4 also go
    // through its parser, and TCP must behave exactly as without it.
    let mut co = Coalescer::with_udp(true);
    let written = drive(&mut co, &pkts);
    assert!(co.is_empty());
    assert_same_stream(&pkts, &expand(&written));
    // The coalescer is reusable: the same stream again gives the same writes.
    assert_eq!(drive(&mut co, &pkts), written);
});
