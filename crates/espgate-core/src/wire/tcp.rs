//! TCP header view (RFC 9293 §3.1), options (§3.2) and checksum.
//!
//! ```text
//! | Src Port (2) | Dst Port (2) | Seq (4) | Ack (4) | Off/Rsvd (1) | Flags (1) |
//! | Window (2) | Checksum (2) | Urgent (2) | Options (0..40) | Payload |
//! ```
//!
//! The view covers one TCP segment: header, options and payload, cut to the
//! IP packet's length by the caller.

use super::{be16, be32, checksum, proto, put16, put32};
use crate::error::{DropReason, PResult};
use std::net::IpAddr;

/// Length of a TCP header without options (data offset 5).
pub const HEADER_LEN: usize = 20;
/// Largest TCP header (data offset 15).
pub const MAX_HEADER_LEN: usize = 60;

/// Byte ranges of the fixed header fields.
pub mod field {
    /// A range of header bytes.
    pub type Field = core::ops::Range<usize>;
    /// Source port.
    pub const SRC_PORT: Field = 0..2;
    /// Destination port.
    pub const DST_PORT: Field = 2..4;
    /// Sequence number.
    pub const SEQ_NUM: Field = 4..8;
    /// Acknowledgment number.
    pub const ACK_NUM: Field = 8..12;
    /// The byte holding the data offset (high nibble) and reserved bits.
    pub const DATA_OFFSET: usize = 12;
    /// The byte of control bits (see [`super::flags`]).
    pub const FLAGS: usize = 13;
    /// Window.
    pub const WINDOW: Field = 14..16;
    /// Checksum.
    pub const CHECKSUM: Field = 16..18;
    /// Urgent pointer.
    pub const URGENT: Field = 18..20;
    /// Where options start.
    pub const OPTIONS: usize = 20;
}

/// Control bits in [`field::FLAGS`].
pub mod flags {
    /// No more data from the sender.
    pub const FIN: u8 = 0x01;
    /// Synchronize sequence numbers.
    pub const SYN: u8 = 0x02;
    /// Reset the connection.
    pub const RST: u8 = 0x04;
    /// Push.
    pub const PSH: u8 = 0x08;
    /// The acknowledgment number is significant.
    pub const ACK: u8 = 0x10;
    /// The urgent pointer is significant.
    pub const URG: u8 = 0x20;
    /// ECN-Echo (RFC 3168).
    pub const ECE: u8 = 0x40;
    /// Congestion Window Reduced (RFC 3168).
    pub const CWR: u8 = 0x80;
}

/// Option kinds (IANA "TCP Option Kind Numbers").
pub mod option {
    /// End of option list.
    pub const END: u8 = 0;
    /// No-operation (padding).
    pub const NOP: u8 = 1;
    /// Maximum segment size: kind, length 4, 16-bit MSS.
    pub const MSS: u8 = 2;
    /// Length of a well-formed MSS option.
    pub const MSS_LEN: usize = 4;
}

/// A checked view of a TCP segment.
#[derive(Debug, Clone, Copy)]
pub struct Tcp<T> {
    buf: T,
}

impl<T: AsRef<[u8]>> Tcp<T> {
    /// A view without any check: for a header already validated with
    /// [`Tcp::new_checked`] (or a copy of one); accessors panic, like slice
    /// indexing, if `buf` is shorter than they need.
    #[inline]
    pub fn new_unchecked(buf: T) -> Self {
        Tcp { buf }
    }

    /// Checks that the fixed header fits, that the data offset is at least
    /// 5 and that the header with its options fits (`BadLength` otherwise).
    #[inline]
    pub fn new_checked(buf: T) -> PResult<Self> {
        let b = buf.as_ref();
        if b.len() < HEADER_LEN {
            return Err(DropReason::BadLength);
        }
        let hl = usize::from(b[field::DATA_OFFSET] >> 4) * 4;
        if hl < HEADER_LEN || hl > b.len() {
            return Err(DropReason::BadLength);
        }
        Ok(Tcp { buf })
    }

    /// The underlying buffer.
    #[inline]
    pub fn into_inner(self) -> T {
        self.buf
    }

    #[inline]
    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }

    /// Source port.
    #[inline]
    pub fn src_port(&self) -> u16 {
        be16(self.b(), field::SRC_PORT.start)
    }

    /// Destination port.
    #[inline]
    pub fn dst_port(&self) -> u16 {
        be16(self.b(), field::DST_PORT.start)
    }

    /// Sequence number.
    #[inline]
    pub fn seq_number(&self) -> u32 {
        be32(self.b(), field::SEQ_NUM.start)
    }

    /// Acknowledgment number.
    #[inline]
    pub fn ack_number(&self) -> u32 {
        be32(self.b(), field::ACK_NUM.start)
    }

    /// Header length in bytes, options included (data offset * 4).
    #[inline]
    pub fn header_len(&self) -> usize {
        usize::from(self.b()[field::DATA_OFFSET] >> 4) * 4
    }

    /// The control bits (see [`flags`]).
    #[inline]
    pub fn flags(&self) -> u8 {
        self.b()[field::FLAGS]
    }

    /// SYN is set.
    #[inline]
    pub fn syn(&self) -> bool {
        self.flags() & flags::SYN != 0
    }

    /// Window.
    #[inline]
    pub fn window(&self) -> u16 {
        be16(self.b(), field::WINDOW.start)
    }

    /// Checksum field.
    #[inline]
    pub fn checksum(&self) -> u16 {
        be16(self.b(), field::CHECKSUM.start)
    }

    /// Urgent pointer.
    #[inline]
    pub fn urgent(&self) -> u16 {
        be16(self.b(), field::URGENT.start)
    }

    /// The option bytes (between the fixed header and the payload).
    #[inline]
    pub fn options(&self) -> &[u8] {
        &self.b()[field::OPTIONS..self.header_len()]
    }

    /// Iterates the options.
    #[inline]
    pub fn option_iter(&self) -> TcpOptions<'_> {
        TcpOptions::new(self.options())
    }

    /// The payload after the header.
    #[inline]
    pub fn payload(&self) -> &[u8] {
        &self.b()[self.header_len()..]
    }

    /// The first well-formed MSS option (kind 2, length 4): its offset
    /// from the start of the header and its value.
    fn find_mss(&self) -> Option<(usize, u16)> {
        self.option_iter()
            .map_while(Result::ok)
            .find(|o| o.kind == option::MSS && o.data.len() == option::MSS_LEN - 2)
            .map(|o| (o.offset, be16(o.data, 0)))
    }

    /// The value of the first well-formed MSS option, if the options up
    /// to it parse.
    pub fn mss(&self) -> Option<u16> {
        self.find_mss().map(|(_, v)| v)
    }

    /// True if the checksum verifies over the whole segment with the
    /// pseudo-header of `src` and `dst`.
    pub fn verify_checksum(&self, src: IpAddr, dst: IpAddr) -> bool {
        let b = self.b();
        let ph = checksum::pseudo_header(src, dst, proto::TCP, b.len() as u32);
        checksum::finish(checksum::sum(ph, b)) == 0
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Tcp<T> {
    #[inline]
    fn bm(&mut self) -> &mut [u8] {
        self.buf.as_mut()
    }

    /// Sets the source port.
    #[inline]
    pub fn set_src_port(&mut self, v: u16) {
        put16(self.bm(), field::SRC_PORT.start, v);
    }

    /// Sets the destination port.
    #[inline]
    pub fn set_dst_port(&mut self, v: u16) {
        put16(self.bm(), field::DST_PORT.start, v);
    }

    /// Sets the sequence number.
    #[inline]
    pub fn set_seq_number(&mut self, v: u32) {
        put32(self.bm(), field::SEQ_NUM.start, v);
    }

    /// Sets the acknowledgment number.
    #[inline]
    pub fn set_ack_number(&mut self, v: u32) {
        put32(self.bm(), field::ACK_NUM.start, v);
    }

    /// Sets the header length in bytes (a multiple of 4 from 20 to 60;
    /// the reserved bits are kept).
    #[inline]
    pub fn set_header_len(&mut self, len: usize) {
        let b = self.bm();
        b[field::DATA_OFFSET] = (((len / 4) as u8) << 4) | (b[field::DATA_OFFSET] & 0x0f);
    }

    /// Sets the control bits.
    #[inline]
    pub fn set_flags(&mut self, v: u8) {
        self.bm()[field::FLAGS] = v;
    }

    /// Sets the window.
    #[inline]
    pub fn set_window(&mut self, v: u16) {
        put16(self.bm(), field::WINDOW.start, v);
    }

    /// Sets the checksum field.
    #[inline]
    pub fn set_checksum(&mut self, v: u16) {
        put16(self.bm(), field::CHECKSUM.start, v);
    }

    /// Sets the urgent pointer.
    #[inline]
    pub fn set_urgent(&mut self, v: u16) {
        put16(self.bm(), field::URGENT.start, v);
    }

    /// Computes the checksum over the whole segment with the pseudo-header
    /// of `src` and `dst` and writes it.
    pub fn fill_checksum(&mut self, src: IpAddr, dst: IpAddr) {
        self.set_checksum(0);
        let b = self.b();
        let ph = checksum::pseudo_header(src, dst, proto::TCP, b.len() as u32);
        let c = checksum::finish(checksum::sum(ph, b));
        self.set_checksum(c);
    }

    /// Rewrites the first well-formed MSS option to `mss` and updates the
    /// checksum incrementally (RFC 1624), so a valid checksum stays valid
    /// and no other byte changes. Returns the old value; `None` (and
    /// nothing written) without such an option.
    pub fn set_mss(&mut self, mss: u16) -> Option<u16> {
        let (at, old) = self.find_mss()?;
        let v = at + 2;
        put16(self.bm(), v, mss);
        // A 16-bit value at an odd offset is summed byte-swapped.
        let (o, n) = if v % 2 == 0 {
            (old, mss)
        } else {
            (old.swap_bytes(), mss.swap_bytes())
        };
        let c = checksum::update(self.checksum(), o, n);
        self.set_checksum(c);
        Some(old)
    }
}

/// One option found by [`TcpOptions`] (End-of-list and NOP padding are not
/// reported).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpOption<'a> {
    /// Offset of the kind byte from the start of the TCP header.
    pub offset: usize,
    /// Option kind (see [`option`]).
    pub kind: u8,
    /// The bytes after kind and length.
    pub data: &'a [u8],
}

/// Iterator over the options of a TCP header. It stops at End-of-list and
/// at the end of the options, skips NOPs, and yields one
/// `Err(DropReason::BadLength)` and then stops on a malformed option (no
/// length byte, a length below 2, or one that runs past the header). It
/// never panics and never reads outside the option bytes.
#[derive(Debug, Clone)]
pub struct TcpOptions<'a> {
    opts: &'a [u8],
    pos: usize,
}

impl<'a> TcpOptions<'a> {
    /// Iterates `opts`, the bytes after the fixed 20-byte header.
    pub fn new(opts: &'a [u8]) -> TcpOptions<'a> {
        TcpOptions { opts, pos: 0 }
    }
}

impl<'a> Iterator for TcpOptions<'a> {
    type Item = PResult<TcpOption<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let i = self.pos;
            let kind = *self.opts.get(i)?;
            match kind {
                option::END => {
                    self.pos = self.opts.len();
                    return None;
                }
                option::NOP => self.pos += 1,
                _ => {
                    // Stop after this one whatever happens.
                    self.pos = self.opts.len();
                    let Some(data) = self.opts.get(i + 1).and_then(|&len| {
                        let len = usize::from(len);
                        self.opts.get(i + 2..i + len.max(2)).filter(|_| len >= 2)
                    }) else {
                        return Some(Err(DropReason::BadLength));
                    };
                    let len = 2 + data.len();
                    self.pos = i + len;
                    return Some(Ok(TcpOption {
                        offset: field::OPTIONS + i,
                        kind,
                        data,
                    }));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    /// A SYN from 10.0.0.1:40000 to 10.0.0.2:80 laid out as Linux sends
    /// one: MSS 1460, SACK permitted, timestamps, NOP, window scale 7.
    const SYN: [u8; 40] = [
        0x9c, 0x40, 0x00, 0x50, // ports
        0x12, 0x34, 0x56, 0x78, // seq
        0x00, 0x00, 0x00, 0x00, // ack
        0xa0, 0x02, 0xfa, 0xf0, // data offset 10, SYN, window 64240
        0x00, 0x00, 0x00, 0x00, // checksum (filled in by the tests), urgent
        0x02, 0x04, 0x05, 0xb4, // MSS 1460
        0x04, 0x02, // SACK permitted
        0x08, 0x0a, 0x00, 0x01, 0x02, 0x03, 0x00, 0x00, 0x00, 0x00, // timestamps
        0x01, // NOP
        0x03, 0x03, 0x07, // window scale 7
    ];

    fn v4() -> (IpAddr, IpAddr) {
        (
            Ipv4Addr::new(10, 0, 0, 1).into(),
            Ipv4Addr::new(10, 0, 0, 2).into(),
        )
    }

    fn syn() -> [u8; 40] {
        let mut b = SYN;
        let (s, d) = v4();
        Tcp::new_checked(&mut b[..]).unwrap().fill_checksum(s, d);
        b
    }

    #[test]
    fn known_syn_fields() {
        let b = syn();
        let t = Tcp::new_checked(&b[..]).unwrap();
        assert_eq!((t.src_port(), t.dst_port()), (40000, 80));
        assert_eq!((t.seq_number(), t.ack_number()), (0x1234_5678, 0));
        assert_eq!(t.header_len(), 40);
        assert_eq!(t.flags(), flags::SYN);
        assert!(t.syn());
        assert_eq!((t.window(), t.urgent()), (64240, 0));
        assert_eq!(t.options().len(), 20);
        assert!(t.payload().is_empty());
        assert_eq!(t.mss(), Some(1460));
        let kinds: Vec<(usize, u8, usize)> = t
            .option_iter()
            .map(|o| o.unwrap())
            .map(|o| (o.offset, o.kind, o.data.len()))
            .collect();
        assert_eq!(kinds, [(20, 2, 2), (24, 4, 0), (26, 8, 8), (37, 3, 1)]);
        let (s, d) = v4();
        assert!(t.verify_checksum(s, d));
        // The pseudo-header counts: other addresses do not verify.
        assert!(!t.verify_checksum(d, Ipv4Addr::new(10, 0, 0, 3).into()));
    }

    #[test]
    fn known_checksum_value() {
        // An independent sum: pseudo-header (addresses, zero, protocol 6,
        // length 40) and the segment with a zero checksum, 16-bit words
        // added in a u32 and folded.
        let b = syn();
        let mut all = vec![10, 0, 0, 1, 10, 0, 0, 2, 0, 6, 0, 40];
        let mut z = b;
        z[16] = 0;
        z[17] = 0;
        all.extend_from_slice(&z);
        let mut sum: u32 = all
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        assert_eq!(Tcp::new_checked(&b[..]).unwrap().checksum(), !(sum as u16));
    }

    #[test]
    fn setters_roundtrip() {
        let mut b = [0u8; 24];
        let mut t = Tcp::new_unchecked(&mut b[..]);
        t.set_header_len(24);
        t.set_src_port(1);
        t.set_dst_port(2);
        t.set_seq_number(3);
        t.set_ack_number(4);
        t.set_flags(flags::ACK | flags::PSH);
        t.set_window(5);
        t.set_urgent(6);
        t.set_checksum(7);
        let t = Tcp::new_checked(&b[..]).unwrap();
        assert_eq!(
            (
                t.src_port(),
                t.dst_port(),
                t.seq_number(),
                t.ack_number(),
                t.header_len(),
                t.flags(),
                t.window(),
                t.urgent(),
                t.checksum()
            ),
            (1, 2, 3, 4, 24, flags::ACK | flags::PSH, 5, 6, 7)
        );
    }

    #[test]
    fn new_checked_rejects() {
        let b = syn();
        // Shorter than the fixed header.
        assert_eq!(
            Tcp::new_checked(&b[..19]).unwrap_err(),
            DropReason::BadLength
        );
        // Options cut off.
        assert_eq!(
            Tcp::new_checked(&b[..39]).unwrap_err(),
            DropReason::BadLength
        );
        // Data offset below 5.
        for off in 0..5u8 {
            let mut c = b;
            c[12] = off << 4;
            assert_eq!(Tcp::new_checked(&c[..]).unwrap_err(), DropReason::BadLength);
        }
        // Data offset 5 on a longer buffer: the rest is payload.
        let mut c = b;
        c[12] = 0x50;
        let t = Tcp::new_checked(&c[..]).unwrap();
        assert_eq!((t.header_len(), t.payload().len()), (20, 20));
        assert_eq!(t.mss(), None);
    }

    #[test]
    fn malformed_options_stop_the_iterator() {
        let bad = Err(DropReason::BadLength);
        let ok = |offset, kind, data| Ok(TcpOption { offset, kind, data });
        let cases: [(&[u8], Vec<PResult<TcpOption<'static>>>); 9] = [
            (&[], vec![]),
            (&[0, 2, 4, 5, 0xb4], vec![]), // END first: nothing after it
            (&[1, 1, 1], vec![]),          // NOPs only
            (&[2], vec![bad]),             // no length byte
            (&[2, 0, 0, 0], vec![bad]),    // length 0
            (&[2, 1, 0, 0], vec![bad]),    // length 1
            (&[2, 9, 0, 0], vec![bad]),    // runs past the end
            (&[4, 2, 2, 6, 0, 0], vec![ok(20, 4, &[][..]), bad]),
            (&[1, 3, 3, 7, 0, 2], vec![ok(21, 3, &[7][..])]),
        ];
        for (opts, want) in cases {
            let got: Vec<_> = TcpOptions::new(opts).collect();
            assert_eq!(got, want, "{opts:?}");
        }
    }

    #[test]
    fn mss_is_found_only_well_formed_and_before_garbage() {
        let mut b = [0u8; 28];
        b[12] = 0x70;
        // An MSS option of the wrong length is skipped, the next one used.
        b[20..28].copy_from_slice(&[2, 3, 9, 2, 4, 0x05, 0xb4, 0]);
        assert_eq!(Tcp::new_checked(&b[..]).unwrap().mss(), Some(1460));
        // A malformed option before the MSS hides it.
        b[20..28].copy_from_slice(&[5, 1, 1, 2, 4, 0x05, 0xb4, 0]);
        assert_eq!(Tcp::new_checked(&b[..]).unwrap().mss(), None);
        // Garbage after the MSS does not.
        b[20..28].copy_from_slice(&[2, 4, 0x05, 0xb4, 7, 0, 0, 0]);
        assert_eq!(Tcp::new_checked(&b[..]).unwrap().mss(), Some(1460));
    }

    #[test]
    fn set_mss_keeps_the_checksum_valid_at_even_and_odd_offsets() {
        let (s, d): (IpAddr, IpAddr) = (
            "2001:db8::1".parse::<Ipv6Addr>().unwrap().into(),
            "2001:db8::2".parse::<Ipv6Addr>().unwrap().into(),
        );
        for lead_nops in 0..4 {
            for payload in [0usize, 1, 2, 7] {
                let mut opts = vec![1u8; lead_nops];
                opts.extend_from_slice(&[2, 4, 0x23, 0x28]);
                while opts.len() % 4 != 0 {
                    opts.push(0);
                }
                let mut b = vec![0u8; 20 + opts.len() + payload];
                b[12] = (((20 + opts.len()) / 4) as u8) << 4;
                b[13] = flags::SYN;
                b[20..20 + opts.len()].copy_from_slice(&opts);
                for (i, x) in b[20 + opts.len()..].iter_mut().enumerate() {
                    *x = 0xa0 + i as u8;
                }
                let mut t = Tcp::new_checked(&mut b[..]).unwrap();
                t.fill_checksum(s, d);
                let before = t.into_inner().to_vec();
                let mut t = Tcp::new_checked(&mut b[..]).unwrap();
                assert_eq!(t.set_mss(1000), Some(9000));
                assert_eq!(t.mss(), Some(1000));
                assert!(
                    t.verify_checksum(s, d),
                    "nops {lead_nops} payload {payload}"
                );
                // Only the option value and the checksum changed.
                let changed: Vec<usize> = (0..b.len()).filter(|i| b[*i] != before[*i]).collect();
                let at = 20 + lead_nops + 2;
                assert!(changed.iter().all(|i| [16, 17, at, at + 1].contains(i)));
            }
        }
        let mut b = [0u8; 20];
        b[12] = 0x50;
        assert_eq!(Tcp::new_checked(&mut b[..]).unwrap().set_mss(1), None);
        assert_eq!(b, {
            let mut z = [0u8; 20];
            z[12] = 0x50;
            z
        });
    }

    proptest! {
        #[test]
        fn prop_any_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..80)) {
            if let Ok(t) = Tcp::new_checked(&b[..]) {
                prop_assert!(t.header_len() >= HEADER_LEN && t.header_len() <= b.len());
                prop_assert_eq!(t.header_len(), HEADER_LEN + t.options().len());
                prop_assert_eq!(t.options().len() + t.payload().len() + HEADER_LEN, b.len());
                let _ = (t.src_port(), t.dst_port(), t.seq_number(), t.ack_number());
                let _ = (t.flags(), t.window(), t.checksum(), t.urgent(), t.mss());
                for o in t.option_iter().flatten() {
                    prop_assert!(o.offset + 2 + o.data.len() <= t.header_len());
                }
                let mut c = b.clone();
                let mut m = Tcp::new_checked(&mut c[..]).unwrap();
                let _ = m.set_mss(536);
            } else {
                prop_assert!(b.len() < HEADER_LEN
                    || usize::from(b[12] >> 4) * 4 < HEADER_LEN
                    || usize::from(b[12] >> 4) * 4 > b.len());
            }
        }

        #[test]
        fn prop_options_iterator_never_panics(b in proptest::collection::vec(any::<u8>(), 0..48)) {
            let mut errs = 0;
            let mut last = 0;
            for o in TcpOptions::new(&b) {
                match o {
                    Ok(o) => {
                        prop_assert!(o.offset >= 20 + last);
                        prop_assert!(o.offset - 20 + 2 + o.data.len() <= b.len());
                        last = o.offset - 20 + 2 + o.data.len();
                    }
                    Err(e) => {
                        prop_assert_eq!(e, DropReason::BadLength);
                        errs += 1;
                    }
                }
            }
            prop_assert!(errs <= 1);
        }

        #[test]
        fn prop_set_mss_keeps_checksum(
            nops in 0usize..6,
            payload in proptest::collection::vec(any::<u8>(), 0..30),
            old in any::<u16>(),
            new in any::<u16>(),
        ) {
            let mut opts = vec![1u8; nops];
            opts.extend_from_slice(&[2, 4]);
            opts.extend_from_slice(&old.to_be_bytes());
            while opts.len() % 4 != 0 {
                opts.push(0);
            }
            let mut b = vec![0u8; 20];
            b[12] = (((20 + opts.len()) / 4) as u8) << 4;
            b.extend_from_slice(&opts);
            b.extend_from_slice(&payload);
            let (s, d) = v4();
            let mut t = Tcp::new_checked(&mut b[..]).unwrap();
            t.fill_checksum(s, d);
            prop_assert!(t.verify_checksum(s, d));
            prop_assert_eq!(t.set_mss(new), Some(old));
            prop_assert!(t.verify_checksum(s, d));
            prop_assert_eq!(t.mss(), Some(new));
        }
    }
}
