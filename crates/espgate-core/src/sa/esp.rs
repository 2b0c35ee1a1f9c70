//! ESP outbound and inbound processing (RFC 4303 §3.3, §3.4), generic over
//! the header layout ([`EspLayout`]): the padding, trailer, transform,
//! replay and lifetime handling here serve every ESP header format.

use super::{finish_tunnel_inner, fix_transport_header, Decapsulated, Encap, Inbound, Mode, Sa};
use crate::buf::{PacketBuf, Rest};
use crate::cost::{NoProbe, Probe, Stage};
use crate::error::{DropReason, PResult};
use crate::wire::esp::{EspAuth, EspLayout, OuterAddrs, Rfc4303};
use crate::wire::ip::IpInfo;
use crate::wire::{checksum, esp, ipv6, proto, put16, udp};
use std::time::Duration;

/// How [`Sa::esp_wrap`] frames one packet.
struct Wrap<C> {
    /// Bytes kept in front (the IP header in transport mode).
    keep: usize,
    /// Next header for the trailer.
    nh: u8,
    /// Length of the UDP header to leave room for (0 without encapsulation).
    udp_len: usize,
    /// TFC padding bytes.
    tfc: usize,
    /// The outer addresses the packet will travel between.
    outer: OuterAddrs,
    /// What the header shows in clear ([`EspLayout::Clear`]).
    clear: C,
}

impl Sa {
    /// `buf` holds exactly one IP packet described by `info`.
    pub(super) fn esp_out<L: EspLayout, P: Probe + ?Sized>(
        &mut self,
        buf: &mut PacketBuf,
        info: &IpInfo,
        seq: u64,
        probe: &mut P,
    ) -> PResult<()> {
        // Tunnel mode: `buf` is the inner packet; transport mode: the
        // packet before protection. Either way what `clear_of` reads.
        let clear = L::clear_of(buf.as_slice())?;
        self.esp_out_showing::<L, P>(buf, info, seq, clear, probe)
    }

    /// [`Sa::esp_out`] with the header's clear fields given (the tests
    /// make a sender that lies about its ports with it).
    pub(super) fn esp_out_showing<L: EspLayout, P: Probe + ?Sized>(
        &mut self,
        buf: &mut PacketBuf,
        info: &IpInfo,
        seq: u64,
        clear: L::Clear,
        probe: &mut P,
    ) -> PResult<()> {
        let udp_len = self.udp_len();
        match self.cfg.mode {
            Mode::Tunnel => {
                let nh = tunnel_next_header(info);
                let tfc = self
                    .tfc_pad_target()
                    .map_or(0, |t| t.saturating_sub(buf.len()));
                let (Some(src), Some(dst)) = (self.cfg.tunnel_src, self.cfg.tunnel_dst) else {
                    return Err(DropReason::Unsupported);
                };
                let w = Wrap {
                    keep: 0,
                    nh,
                    udp_len,
                    tfc,
                    outer: OuterAddrs { src, dst },
                    clear,
                };
                self.esp_wrap::<L, P>(buf, &w, seq, probe)?;
                self.finish_tunnel(buf, info, udp_len)
            }
            Mode::Transport => {
                if info.fragment {
                    // Transport mode protects whole datagrams only (RFC 4301 §7).
                    return Err(DropReason::Fragment);
                }
                let (keep, nh_field) = if info.version == 4 {
                    (info.payload_offset, info.nh_field)
                } else {
                    let w = ipv6::walk_ext(buf.as_slice())?;
                    (w.insert_offset, w.insert_nh_field)
                };
                let nh = buf.as_slice()[nh_field];
                if nh == proto::NO_NEXT {
                    // ESP reads next header 59 as a dummy packet (RFC 4303
                    // §2.6); the receiver would discard it silently.
                    return Err(DropReason::BadNextHeader);
                }
                let w = Wrap {
                    keep,
                    nh,
                    udp_len,
                    tfc: 0,
                    outer: OuterAddrs {
                        src: info.src,
                        dst: info.dst,
                    },
                    clear,
                };
                self.esp_wrap::<L, P>(buf, &w, seq, probe)?;
                let outer_proto = if udp_len > 0 {
                    proto::UDP
                } else {
                    self.cfg.ip_protocol
                };
                fix_transport_header(buf.as_mut_slice(), info.version, nh_field, outer_proto)?;
                if udp_len > 0 {
                    self.finish_udp(buf.as_mut_slice(), keep, info.version == 6);
                }
                Ok(())
            }
        }
    }

    /// Whether outbound packets take [`Sa::esp_tunnel_out`]: ESP in
    /// tunnel mode with an AEAD suite, the sequence number as IV and no
    /// TFC padding (the usual gateway SA). Fixed at [`Sa::new`].
    pub(super) fn is_plain_tunnel(cfg: &super::SaConfig, t: &crate::crypto::Transform) -> bool {
        cfg.protocol == super::Protocol::Esp
            && cfg.mode == Mode::Tunnel
            && cfg.tfc_pad_to.is_none()
            && cfg.iv_source == super::IvSource::Sequence
            && t.is_aead()
    }

    /// [`Sa::encapsulate_probed`] without a probe, for the SAs of
    /// [`Sa::is_plain_tunnel`]: the same steps, bytes, counters and events,
    /// in one function compiled in this crate rather than through the
    /// generic layers (`esp_out`, `esp_wrap`, the probe's marks) that
    /// serve every protocol and mode. Measured (`hotpath out`,
    /// AES-128-GCM, medians of alternated runs): 64 B about 97 -> 94 ns,
    /// 1400 B about 178 -> 175 ns; marking the generic layers
    /// `inline(always)` instead gained nothing (docs/PERFORMANCE.md). A
    /// test checks that both ways give the same bytes, drops, counters
    /// and events.
    #[inline(never)]
    pub(super) fn esp_tunnel_out(&mut self, buf: &mut PacketBuf, now: Duration) -> PResult<()> {
        let info = crate::wire::ip::parse(buf.as_slice())?;
        buf.truncate(info.packet_len);
        let seq = self.take_seq(now)?;
        let (Some(src), Some(dst)) = (self.cfg.tunnel_src, self.cfg.tunnel_dst) else {
            return Err(DropReason::Unsupported);
        };
        let udp_len = self.udp_len();
        let nh = tunnel_next_header(&info);
        let e = self.esp_frame::<Rfc4303>(buf, 0, nh, udp_len, 0, seq, &())?;
        let auth = Rfc4303::auth(e, seq, self.cfg.esn, &OuterAddrs { src, dst });
        self.transform.seal(e, esp::HEADER_LEN, &auth.auth_ctx())?;
        self.finish_tunnel(buf, &info, udp_len)?;
        self.account(info.packet_len, now);
        Ok(())
    }

    /// Tunnel mode, sealed out of place: `clear`, one IP packet described
    /// by `info` and left as it is, becomes the packet in `out`: the same
    /// bytes [`Sa::esp_out`] makes from a copy of it in `out`, without the
    /// copy. Only where [`Sa::seals_from`] holds (no TFC padding).
    pub(super) fn esp_out_from<L: EspLayout, P: Probe + ?Sized>(
        &mut self,
        clear: &[u8],
        out: &mut PacketBuf,
        info: &IpInfo,
        seq: u64,
        probe: &mut P,
    ) -> PResult<()> {
        let shown = L::clear_of(clear)?;
        let udp_len = self.udp_len();
        let (Some(src), Some(dst)) = (self.cfg.tunnel_src, self.cfg.tunnel_dst) else {
            return Err(DropReason::Unsupported);
        };
        let t = &self.transform;
        let (iv_len, icv_len) = (t.iv_len(), t.icv_len());
        let pad = esp::pad_len(clear.len(), t.pad_align());
        // The default padding only aligns, to at most 16 bytes here (AES-
        // GCM aligns to 16): at most 15 bytes. (A larger one would be
        // refused below, never cut.)
        let mut tail = [0u8; 15 + esp::TRAILER_LEN];
        let tail = tail
            .get_mut(..pad + esp::TRAILER_LEN)
            .ok_or(DropReason::BadLength)?;
        esp::emit_trailer(tail, tunnel_next_header(info));
        let pre = udp_len + L::HEADER_LEN + iv_len;
        let p = out.prepare(pre + clear.len() + tail.len() + icv_len);
        let e = &mut p[udp_len..];
        self.esp_head::<L>(e, seq, &shown)?;
        let auth = L::auth(e, seq, self.cfg.esn, &OuterAddrs { src, dst });
        probe.mark(Stage::Encap);
        self.transform
            .seal_from(clear, tail, e, L::HEADER_LEN, &auth.auth_ctx(), probe)?;
        self.finish_tunnel(out, info, udp_len)
    }

    /// The UDP header's length with ESP-in-UDP, else 0.
    fn udp_len(&self) -> usize {
        if matches!(self.cfg.encap, Encap::Udp { .. }) {
            udp::HEADER_LEN
        } else {
            0
        }
    }

    /// Tunnel mode: puts the outer IP header (and the UDP header's fields)
    /// in front of the ESP packet in `buf`.
    #[inline(always)]
    fn finish_tunnel(&mut self, buf: &mut PacketBuf, info: &IpInfo, udp_len: usize) -> PResult<()> {
        let outer_proto = if udp_len > 0 {
            proto::UDP
        } else {
            self.cfg.ip_protocol
        };
        self.push_outer(buf, info, outer_proto)?;
        let hdr_len = if self.cfg.tunnel_dst.is_some_and(|d| d.is_ipv6()) {
            ipv6::HEADER_LEN
        } else {
            crate::wire::ipv4::MIN_HEADER_LEN
        };
        if udp_len > 0 {
            self.finish_udp(buf.as_mut_slice(), hdr_len, hdr_len == ipv6::HEADER_LEN);
        }
        Ok(())
    }

    /// Fills in the UDP header at `off` (length, ports; checksum for IPv6,
    /// zero for IPv4 as RFC 3948 §2.1 recommends).
    fn finish_udp(&self, pkt: &mut [u8], off: usize, ipv6_outer: bool) {
        let Encap::Udp { src_port, dst_port } = self.cfg.encap else {
            return;
        };
        let len = pkt.len() - off;
        // Lengths were bounded when the IP header was written.
        let _ = udp::emit(&mut pkt[off..], src_port, dst_port, len - udp::HEADER_LEN);
        if ipv6_outer && pkt[0] >> 4 == 6 {
            if let Ok(h) = ipv6::Ipv6::new_checked(&pkt[..]) {
                let ph =
                    checksum::pseudo_header(h.src().into(), h.dst().into(), proto::UDP, len as u32);
                let mut c = checksum::finish(checksum::sum(ph, &pkt[off..]));
                if c == 0 {
                    c = 0xffff;
                }
                put16(pkt, off + 6, c);
            }
        }
    }

    /// `buf` = `[keep | payload]` becomes
    /// `[keep | UDP? | header | IV | E(payload | TFC | pad | pad len | nh) | ICV]`.
    fn esp_wrap<L: EspLayout, P: Probe + ?Sized>(
        &mut self,
        buf: &mut PacketBuf,
        w: &Wrap<L::Clear>,
        seq: u64,
        probe: &mut P,
    ) -> PResult<()> {
        let e = self.esp_frame::<L>(buf, w.keep, w.nh, w.udp_len, w.tfc, seq, &w.clear)?;
        let auth = L::auth(e, seq, self.cfg.esn, &w.outer);
        probe.mark(Stage::Encap);
        self.transform
            .seal_probed(e, L::HEADER_LEN, &auth.auth_ctx(), probe)
    }

    /// The framing of [`Sa::esp_wrap`] without the seal: the trailer
    /// (after `tfc` bytes of TFC padding) appended in clear, room for the
    /// UDP header made after the `keep` bytes, and the ESP header and IV
    /// written there. Returns the ESP packet, `[header | IV | payload |
    /// TFC | pad | pad len | nh | ICV room]`, ready to seal.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn esp_frame<'b, L: EspLayout>(
        &mut self,
        buf: &'b mut PacketBuf,
        keep: usize,
        nh: u8,
        udp_len: usize,
        tfc: usize,
        seq: u64,
        clear: &L::Clear,
    ) -> PResult<&'b mut [u8]> {
        let t = &self.transform;
        let (iv_len, icv_len) = (t.iv_len(), t.icv_len());
        let len0 = buf.len();
        let payload_len = len0.checked_sub(keep).ok_or(DropReason::BadLength)?;
        let pad = esp::pad_len(payload_len + tfc, t.pad_align());
        let p = buf.push_back(tfc + pad + esp::TRAILER_LEN + icv_len);
        if tfc > 0 {
            // (A zero-length fill still costs a memset call per packet.)
            p[len0..len0 + tfc].fill(0);
        }
        esp::emit_trailer(&mut p[len0 + tfc..len0 + tfc + pad + esp::TRAILER_LEN], nh);
        let pre = udp_len + L::HEADER_LEN + iv_len;
        let p = buf.push_front(pre);
        if keep > 0 {
            // (Tunnel mode keeps nothing: no memmove call for 0 bytes.)
            p.copy_within(pre..pre + keep, 0);
        }
        let e = &mut p[keep + udp_len..];
        self.esp_head::<L>(e, seq, clear)?;
        Ok(e)
    }

    /// Writes the ESP header and the IV at the front of `e` (`[header |
    /// IV | …]`).
    #[inline]
    fn esp_head<L: EspLayout>(&mut self, e: &mut [u8], seq: u64, clear: &L::Clear) -> PResult<()> {
        let iv_len = self.transform.iv_len();
        let (hdr, rest) = e.split_at_mut(L::HEADER_LEN);
        let iv = rest.get_mut(..iv_len).ok_or(DropReason::BadLength)?;
        L::emit_header(hdr, self.cfg.spi, seq, clear)?;
        let iv_value = match self.cfg.iv_source {
            super::IvSource::Sequence => seq,
            super::IvSource::PerNode { node } => {
                // 48 bits of local counter: exhausted long after any
                // lifetime, but never wrapped.
                if self.iv_local >= 1 << 48 {
                    return Err(DropReason::SeqExhausted);
                }
                if let Some(l) = &self.lease {
                    // The lease covers the local counter here (a restart
                    // continues above it), not the shared sequence number.
                    if self.iv_local >= l.limit() {
                        return Err(DropReason::SeqNotReserved);
                    }
                    l.want(self.iv_local);
                }
                let v = (u64::from(node) << 48) | self.iv_local;
                self.iv_local += 1;
                v
            }
        };
        self.transform.fill_iv(iv, iv_value)
    }

    /// Removes this SA's ESP (or Q-ESP) layer. With `rest` (the buffer
    /// was loaded with [`PacketBuf::load_head`]), the body is decrypted
    /// straight from the bytes received where the headers up to the IV
    /// are in the buffer; otherwise the rest is copied in first.
    pub(super) fn esp_in<L: EspLayout, P: Probe + ?Sized>(
        &mut self,
        buf: &mut PacketBuf,
        inb: &Inbound,
        rest: Option<&Rest<'_>>,
        now: Duration,
        probe: &mut P,
    ) -> PResult<Decapsulated> {
        let present = inb.offset + L::HEADER_LEN + self.transform.iv_len();
        let src = rest.and_then(|r| {
            let s = r.source(inb.offset..inb.end, present);
            if s.is_none() {
                r.fill(buf);
            }
            s
        });
        let how = match src {
            Some(s) => Decrypt::From(s),
            None => Decrypt::InPlace,
        };
        let (_, clear, _) = self.esp_authenticate::<L, P>(buf, inb, how, probe)?;
        let r = self.esp_unframe::<L>(buf, inb, now, &clear);
        probe.mark(Stage::Decap);
        r
    }

    /// Seed 003's cluster, on a node that keeps this SA's state but does
    /// not process the packet: the replay check, the ICV and the window
    /// update exactly as [`Sa::esp_in`] does them (without decrypting where
    /// the suite allows), then nothing more: the packet is dropped.
    /// Returns the full sequence number.
    pub(super) fn esp_observe<L: EspLayout>(
        &mut self,
        buf: &mut PacketBuf,
        inb: &Inbound,
        now: Duration,
    ) -> PResult<u64> {
        let (seq, _, body) =
            self.esp_authenticate::<L, NoProbe>(buf, inb, Decrypt::No, &mut NoProbe)?;
        // The body length (payload, padding, trailer): what every node can
        // count alike without decrypting, for the lifetime's byte limit.
        self.observed(body, now);
        Ok(seq)
    }

    /// The common front of [`Sa::esp_in`] and [`Sa::esp_observe`]: length,
    /// header, replay check, ICV (and decryption, as `how` says), window
    /// update. Returns the full sequence number, the header's clear fields
    /// and the length of the encrypted body.
    fn esp_authenticate<L: EspLayout, P: Probe + ?Sized>(
        &mut self,
        buf: &mut PacketBuf,
        inb: &Inbound,
        how: Decrypt<'_>,
        probe: &mut P,
    ) -> PResult<(u64, L::Clear, usize)> {
        if self.life.is_hard_expired() {
            return Err(DropReason::SaExpired);
        }
        let (iv_len, icv_len) = (self.transform.iv_len(), self.transform.icv_len());
        let pkt = buf.as_mut_slice();
        let e = pkt
            .get_mut(inb.offset..inb.end)
            .ok_or(DropReason::BadLength)?;
        if e.len() < L::HEADER_LEN + iv_len + esp::TRAILER_LEN + icv_len {
            return Err(DropReason::BadLength);
        }
        let (_, seq_lo) = L::parse_header(e)?;
        let clear = L::header_clear(e)?;
        let seq = self.replay.full_seq(seq_lo).ok_or(DropReason::Replay);
        let seq = seq.and_then(|s| self.replay.check(s).map(|()| s));
        probe.mark(Stage::Replay);
        let seq = seq?;
        let outer = OuterAddrs {
            src: inb.outer.src,
            dst: inb.outer.dst,
        };
        let auth = L::auth(e, seq, self.cfg.esn, &outer);
        match how {
            Decrypt::InPlace => {
                self.transform
                    .open_probed(e, L::HEADER_LEN, &auth.auth_ctx(), probe)?
            }
            Decrypt::From(src) => {
                self.transform
                    .open_from(src, e, L::HEADER_LEN, &auth.auth_ctx(), probe)?
            }
            Decrypt::No => self.transform.verify(e, L::HEADER_LEN, &auth.auth_ctx())?,
        }
        let updated = self.replay.update(seq);
        self.counters.replay_top.set(self.replay.top());
        probe.mark(Stage::Replay);
        updated?;
        let body = e.len() - L::HEADER_LEN - iv_len - icv_len;
        Ok((seq, clear, body))
    }

    /// After authentication and decryption: trailer and padding, the inner
    /// packet restored, selectors, counters.
    fn esp_unframe<L: EspLayout>(
        &mut self,
        buf: &mut PacketBuf,
        inb: &Inbound,
        now: Duration,
        clear: &L::Clear,
    ) -> PResult<Decapsulated> {
        let (iv_len, icv_len) = (self.transform.iv_len(), self.transform.icv_len());
        let e = buf
            .as_slice()
            .get(inb.offset..inb.end)
            .ok_or(DropReason::BadLength)?;
        let body_start = L::HEADER_LEN + iv_len;
        let body_end = e.len().checked_sub(icv_len).ok_or(DropReason::BadLength)?;
        let (plen, nh) =
            esp::parse_trailer(e.get(body_start..body_end).ok_or(DropReason::BadLength)?)?;
        if nh == proto::NO_NEXT {
            self.counters.dummies.incr();
            return Ok(Decapsulated::Dummy);
        }
        let payload_at = inb.offset + body_start;
        match self.cfg.mode {
            Mode::Tunnel => finish_tunnel_inner(buf, payload_at, plen, nh, inb.outer.tos)?,
            Mode::Transport => {
                let keep = inb.udp_offset.unwrap_or(inb.offset);
                let pkt = buf.as_mut_slice();
                pkt.copy_within(0..keep, payload_at - keep);
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
        if L::clear_of(buf.as_slice())? != *clear {
            return Err(DropReason::QespPortMismatch);
        }
        self.check_selectors(buf.as_slice())?;
        self.account(plen, now);
        Ok(Decapsulated::Packet)
    }
}

/// What [`Sa::esp_authenticate`] does with the body once the ICV passes.
#[derive(Clone, Copy)]
enum Decrypt<'a> {
    /// Decrypts it in place.
    InPlace,
    /// Decrypts it from these bytes (the ESP packet as received) into the
    /// buffer, whose body is not yet there.
    From(&'a [u8]),
    /// Leaves it (a cluster node observing the packet).
    No,
}

/// The next header of a tunnel-mode packet: the inner IP version.
fn tunnel_next_header(info: &IpInfo) -> u8 {
    if info.version == 4 {
        proto::IPV4
    } else {
        proto::IPV6
    }
}
