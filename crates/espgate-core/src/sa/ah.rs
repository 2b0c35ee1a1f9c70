//! AH outbound and inbound processing (RFC 4302 §3).
//!
//! The ICV covers the IP header with mutable fields zeroed, the AH header
//! with its ICV zeroed, the payload, and with ESN the high sequence bits
//! appended at the end. The zeroed header is built in a stack copy, so the
//! packet itself is never modified for the computation.

use super::{finish_tunnel_inner, fix_transport_header, Decapsulated, Inbound, Mode, Sa};
use crate::buf::PacketBuf;
use crate::cost::{Probe, Stage};
use crate::error::{DropReason, PResult};
use crate::wire::ip::IpInfo;
use crate::wire::{ah, ipv4, ipv6, proto};
use std::time::Duration;

/// Largest IP header (with extension headers before AH) we authenticate.
const MAX_PRE_AH: usize = 512;
const ZEROS: [u8; 64] = [0; 64];

/// IPv4 options whose content does not change in transit (RFC 4302 App. A.1).
fn ipv4_option_immutable(t: u8) -> bool {
    matches!(t, 130 | 133 | 134 | 148 | 149)
}

/// Copies `hdr` (everything before AH) into `out` with mutable fields zeroed.
fn zeroed_header(hdr: &[u8], out: &mut [u8; MAX_PRE_AH]) -> PResult<usize> {
    let n = hdr.len();
    if n > MAX_PRE_AH {
        return Err(DropReason::Unsupported);
    }
    let o = &mut out[..n];
    o.copy_from_slice(hdr);
    match o.first().map(|b| b >> 4) {
        Some(4) => {
            let ihl = usize::from(o[0] & 0x0f) * 4;
            if ihl < ipv4::MIN_HEADER_LEN || ihl > n {
                return Err(DropReason::BadIpHeader);
            }
            o[1] = 0; // TOS
            o[6] = 0; // flags, fragment offset
            o[7] = 0;
            o[8] = 0; // TTL
            o[10] = 0; // checksum
            o[11] = 0;
            let mut i = ipv4::MIN_HEADER_LEN;
            while i < ihl {
                match o[i] {
                    0 => break,
                    1 => i += 1,
                    t => {
                        let len = usize::from(*o.get(i + 1).ok_or(DropReason::BadIpHeader)?);
                        if len < 2 || i + len > ihl {
                            return Err(DropReason::BadIpHeader);
                        }
                        if !ipv4_option_immutable(t) {
                            o[i..i + len].fill(0);
                        }
                        i += len;
                    }
                }
            }
        }
        Some(6) => {
            if n < ipv6::HEADER_LEN {
                return Err(DropReason::BadLength);
            }
            o[0] = 0x60; // keep the version; traffic class and flow label are mutable
            o[1] = 0;
            o[2] = 0;
            o[3] = 0;
            o[7] = 0; // hop limit
            let mut nh = o[6];
            let mut off = ipv6::HEADER_LEN;
            while off < n {
                if off + 2 > n {
                    return Err(DropReason::BadLength);
                }
                let len = match nh {
                    proto::HOPOPT | proto::IPV6_OPTS => (usize::from(o[off + 1]) + 1) * 8,
                    proto::IPV6_ROUTE => return Err(DropReason::Unsupported),
                    proto::IPV6_FRAG => return Err(DropReason::Fragment),
                    _ => return Err(DropReason::Unsupported),
                };
                if off + len > n {
                    return Err(DropReason::BadLength);
                }
                // Options with the "may change en route" bit have zeroed data.
                let mut j = off + 2;
                while j < off + len {
                    let t = o[j];
                    if t == 0 {
                        j += 1;
                        continue;
                    }
                    let olen = usize::from(*o.get(j + 1).ok_or(DropReason::BadLength)?);
                    if j + 2 + olen > off + len {
                        return Err(DropReason::BadLength);
                    }
                    if t & 0x20 != 0 {
                        o[j + 2..j + 2 + olen].fill(0);
                    }
                    j += 2 + olen;
                }
                nh = o[off];
                off += len;
            }
        }
        _ => return Err(DropReason::BadIpVersion),
    }
    Ok(n)
}

impl Sa {
    /// ICV input for the packet `pkt` whose AH header is at `off`.
    fn ah_icv(
        &self,
        pkt: &[u8],
        off: usize,
        end: usize,
        seq: u64,
        out: &mut [u8],
    ) -> PResult<bool> {
        let mac = self.transform.mac().ok_or(DropReason::Unsupported)?;
        let icv_len = mac.icv_len();
        let a = ah::Ah::new_checked(pkt.get(off..end).ok_or(DropReason::BadLength)?)?;
        let ah_len = a.len();
        if ah_len < ah::FIXED_LEN + icv_len {
            return Err(DropReason::BadLength);
        }
        let mut hdr = [0u8; MAX_PRE_AH];
        let n = zeroed_header(&pkt[..off], &mut hdr)?;
        let hi = self.esn_hi(seq);
        let parts: [&[u8]; 6] = [
            &hdr[..n],
            &pkt[off..off + ah::FIXED_LEN],
            &ZEROS[..icv_len],
            &pkt[off + ah::FIXED_LEN + icv_len..off + ah_len],
            &pkt[off + ah_len..end],
            hi.as_ref().map_or(&[][..], |h| &h[..]),
        ];
        if out.is_empty() {
            let icv = &pkt[off + ah::FIXED_LEN..off + ah::FIXED_LEN + icv_len];
            Ok(mac.verify(&parts, icv))
        } else {
            mac.compute(&parts, &mut out[..icv_len]);
            Ok(true)
        }
    }

    pub(super) fn ah_out<P: Probe + ?Sized>(
        &mut self,
        buf: &mut PacketBuf,
        info: &IpInfo,
        seq: u64,
        probe: &mut P,
    ) -> PResult<()> {
        let icv_len = self.transform.icv_len();
        let off = match self.cfg.mode {
            Mode::Tunnel => {
                let v6 = self.cfg.tunnel_dst.is_some_and(|d| d.is_ipv6());
                let ah_len = ah::header_len(icv_len, v6);
                let nh = if info.version == 4 {
                    proto::IPV4
                } else {
                    proto::IPV6
                };
                ah::emit(&mut buf.push_front(ah_len)[..ah_len], nh, self.cfg.spi, seq)?;
                self.push_outer(buf, info, proto::AH)?;
                if v6 {
                    ipv6::HEADER_LEN
                } else {
                    ipv4::MIN_HEADER_LEN
                }
            }
            Mode::Transport => {
                if info.fragment {
                    return Err(DropReason::Fragment);
                }
                let (keep, nh_field) = if info.version == 4 {
                    (info.payload_offset, info.nh_field)
                } else {
                    let w = ipv6::walk_ext(buf.as_slice())?;
                    if w.routing {
                        return Err(DropReason::Unsupported);
                    }
                    (w.insert_offset, w.insert_nh_field)
                };
                let v6 = info.version == 6;
                let ah_len = ah::header_len(icv_len, v6);
                let nh = buf.as_slice()[nh_field];
                let p = buf.push_front(ah_len);
                p.copy_within(ah_len..ah_len + keep, 0);
                ah::emit(&mut p[keep..keep + ah_len], nh, self.cfg.spi, seq)?;
                fix_transport_header(p, info.version, nh_field, proto::AH)?;
                keep
            }
        };
        probe.mark(Stage::Encap);
        let mut icv = [0u8; 64];
        let end = buf.len();
        let r = self.ah_icv(buf.as_slice(), off, end, seq, &mut icv);
        probe.mark(Stage::Integrity);
        r?;
        let p = buf.as_mut_slice();
        p[off + ah::FIXED_LEN..off + ah::FIXED_LEN + icv_len].copy_from_slice(&icv[..icv_len]);
        Ok(())
    }

    pub(super) fn ah_in<P: Probe + ?Sized>(
        &mut self,
        buf: &mut PacketBuf,
        inb: &Inbound,
        now: Duration,
        probe: &mut P,
    ) -> PResult<Decapsulated> {
        if self.life.is_hard_expired() {
            return Err(DropReason::SaExpired);
        }
        let end = inb.end;
        let pkt = buf.as_slice();
        let a = ah::Ah::new_checked(pkt.get(inb.offset..end).ok_or(DropReason::BadLength)?)?;
        let (ah_len, nh) = (a.len(), a.next_header());
        let seq = self.replay.full_seq(a.seq()).ok_or(DropReason::Replay);
        let seq = seq.and_then(|s| self.replay.check(s).map(|()| s));
        probe.mark(Stage::Replay);
        let seq = seq?;
        let ok = self.ah_icv(pkt, inb.offset, end, seq, &mut []);
        probe.mark(Stage::Integrity);
        if !ok? {
            return Err(DropReason::Integrity);
        }
        let updated = self.replay.update(seq);
        self.counters.replay_top.set(self.replay.top());
        probe.mark(Stage::Replay);
        updated?;
        let r = self.ah_unframe(buf, inb, now, (ah_len, nh));
        probe.mark(Stage::Decap);
        r
    }

    /// After authentication: the AH header removed, the inner packet
    /// restored, selectors, counters.
    fn ah_unframe(
        &mut self,
        buf: &mut PacketBuf,
        inb: &Inbound,
        now: Duration,
        (ah_len, nh): (usize, u8),
    ) -> PResult<Decapsulated> {
        let end = inb.end;
        let payload_at = inb.offset + ah_len;
        let plen = end - payload_at;
        match self.cfg.mode {
            Mode::Tunnel => finish_tunnel_inner(buf, payload_at, plen, nh, inb.outer.tos)?,
            Mode::Transport => {
                let keep = inb.offset;
                buf.as_mut_slice().copy_within(0..keep, payload_at - keep);
                buf.trim_front(payload_at - keep);
                buf.truncate(keep + plen);
                fix_transport_header(
                    buf.as_mut_slice(),
                    inb.outer.version,
                    inb.outer.nh_field,
                    nh,
                )?;
            }
        }
        // In an ESP+AH bundle the selectors belong to the ESP SA; AH checks
        // only when it carries the traffic itself.
        if !matches!(nh, proto::ESP) {
            self.check_selectors(buf.as_slice())?;
        }
        self.account(plen, now);
        Ok(Decapsulated::Packet)
    }
}
