//! A packet buffer with headroom and tailroom, so headers are prepended and
//! trailers appended in place (like an skb). Reused across packets, it makes
//! the hot path allocation-free once sized.

/// Default space kept in front of a loaded packet: outer IPv6 (40) + UDP (8)
/// + ESP header and IV (24) + AH (up to 48), rounded up.
pub const DEFAULT_HEADROOM: usize = 160;
/// Default space after a loaded packet: padding, trailer, ICV, TFC padding.
pub const DEFAULT_TAILROOM: usize = 320;

/// Bytes of a packet [`PacketBuf::load_head`] copies: enough for every
/// header the inbound path reads before it decrypts (an IPv4 header with
/// options, 60, then a Q-ESP header, 16, and the longest IV, 16; behind a
/// synthetic outer header the caller adds, the ESP header and IV alone).
pub const LOAD_HEAD: usize = 128;

/// Bytes `data[start..end]` are the packet.
#[derive(Clone, Default)]
pub struct PacketBuf {
    data: Vec<u8>,
    start: usize,
    end: usize,
}

impl std::fmt::Debug for PacketBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PacketBuf({} bytes, headroom {})",
            self.len(),
            self.start
        )
    }
}

impl PacketBuf {
    /// An empty buffer that holds packets up to `mtu` bytes without growing.
    pub fn with_capacity(mtu: usize) -> PacketBuf {
        PacketBuf {
            data: vec![0; DEFAULT_HEADROOM + mtu + DEFAULT_TAILROOM],
            start: DEFAULT_HEADROOM,
            end: DEFAULT_HEADROOM,
        }
    }

    /// A buffer holding a copy of `pkt` with default head- and tailroom.
    pub fn from_packet(pkt: &[u8]) -> PacketBuf {
        let mut b = PacketBuf::with_capacity(pkt.len());
        b.load(pkt);
        b
    }

    /// Replaces the contents with `pkt`, reusing the allocation when it fits.
    pub fn load(&mut self, pkt: &[u8]) {
        self.prepare(pkt.len()).copy_from_slice(pkt);
    }

    /// [`PacketBuf::load`] copying only the first [`LOAD_HEAD`] bytes of
    /// `pkt`: the buffer has `pkt`'s length, but the bytes after the head
    /// are whatever was there (not `pkt`'s). For the inbound path, which
    /// then decrypts the rest straight from `pkt`
    /// ([`crate::gateway::Engine::inbound_from`]) instead of copying it in
    /// first and decrypting it in place.
    pub fn load_head(&mut self, pkt: &[u8]) {
        let head = pkt.len().min(LOAD_HEAD);
        self.prepare(pkt.len())[..head].copy_from_slice(&pkt[..head]);
    }

    /// Makes room for `n` bytes of payload after the headroom and returns them
    /// (for receiving directly into the buffer).
    #[inline]
    pub fn prepare(&mut self, n: usize) -> &mut [u8] {
        let need = DEFAULT_HEADROOM + n + DEFAULT_TAILROOM;
        if self.data.len() < need {
            self.data.resize(need, 0);
        }
        self.start = DEFAULT_HEADROOM;
        self.end = DEFAULT_HEADROOM + n;
        &mut self.data[self.start..self.end]
    }

    /// Packet length.
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }

    /// The packet.
    pub fn as_slice(&self) -> &[u8] {
        &self.data[self.start..self.end]
    }

    /// The packet, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.data[self.start..self.end]
    }

    /// Grows the packet at the front by `n` bytes (contents unspecified) and
    /// returns the whole packet. Reallocates only if the headroom is short.
    ///
    /// Inlined, with the reallocation out of line: each packet calls this
    /// and [`PacketBuf::push_back`] a few times, and a call that is not
    /// inlined cost about 30 instructions each (callgrind, `hotpath`).
    #[inline]
    pub fn push_front(&mut self, n: usize) -> &mut [u8] {
        if self.start < n {
            self.grow_front(n);
        }
        self.start -= n;
        self.as_mut_slice()
    }

    #[cold]
    #[inline(never)]
    fn grow_front(&mut self, n: usize) {
        let extra = n - self.start + DEFAULT_HEADROOM;
        self.data.splice(0..0, std::iter::repeat_n(0, extra));
        self.start += extra;
        self.end += extra;
    }

    /// Grows the packet at the back by `n` bytes and returns the whole packet.
    #[inline]
    pub fn push_back(&mut self, n: usize) -> &mut [u8] {
        if self.data.len() < self.end + n {
            self.grow_back(n);
        }
        self.end += n;
        self.as_mut_slice()
    }

    #[cold]
    #[inline(never)]
    fn grow_back(&mut self, n: usize) {
        self.data.resize(self.end + n + DEFAULT_TAILROOM, 0);
    }

    /// Drops `n` bytes from the front.
    pub fn trim_front(&mut self, n: usize) {
        self.start = (self.start + n).min(self.end);
    }

    /// Keeps only the first `len` bytes.
    pub fn truncate(&mut self, len: usize) {
        self.end = self.start + len.min(self.len());
    }
}

/// The bytes a [`PacketBuf::load_head`] left out: the buffer's last
/// `src.len()` bytes stand for `src`, of which only the first
/// [`LOAD_HEAD`] are in the buffer. The inbound path decrypts its
/// outermost layer straight from `src` ([`Rest::source`]) or copies the
/// rest in first ([`Rest::fill`]) where it needs the whole packet.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rest<'a> {
    src: &'a [u8],
    /// Where `src` starts in the buffer (after a synthetic outer header).
    at: usize,
}

impl<'a> Rest<'a> {
    /// `buf`'s tail is `src`, loaded with [`PacketBuf::load_head`] (then
    /// headers may have been pushed in front). `None` if `buf` is shorter.
    pub(crate) fn of(buf: &PacketBuf, src: &'a [u8]) -> Option<Rest<'a>> {
        let at = buf.len().checked_sub(src.len())?;
        Some(Rest { src, at })
    }

    /// Copies the bytes the head left out into `buf` (unchanged since
    /// [`Rest::of`]): `buf` is then the whole packet.
    pub(crate) fn fill(&self, buf: &mut PacketBuf) {
        let head = self.src.len().min(LOAD_HEAD);
        if let Some(d) = buf.as_mut_slice().get_mut(self.at + head..) {
            if d.len() == self.src.len() - head {
                d.copy_from_slice(&self.src[head..]);
            }
        }
    }

    /// `src`'s bytes for the buffer's bytes `range`, if they lie in `src`
    /// and the buffer holds everything before `present` (the headers the
    /// caller reads from the buffer); else `None` (then [`Rest::fill`]).
    pub(crate) fn source(&self, range: std::ops::Range<usize>, present: usize) -> Option<&'a [u8]> {
        let head = self.src.len().min(LOAD_HEAD);
        if present > self.at + head || range.start < self.at {
            return None;
        }
        self.src
            .get(range.start - self.at..range.end.checked_sub(self.at)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_and_trim() {
        let mut b = PacketBuf::from_packet(&[1, 2, 3]);
        b.push_front(2)[..2].copy_from_slice(&[8, 9]);
        b.push_back(1)[5] = 7;
        assert_eq!(b.as_slice(), &[8, 9, 1, 2, 3, 7]);
        b.trim_front(1);
        b.truncate(3);
        assert_eq!(b.as_slice(), &[9, 1, 2]);
        // Growing past the headroom still works.
        b.push_front(1000);
        assert_eq!(b.len(), 1003);
        assert_eq!(&b.as_slice()[1000..], &[9, 1, 2]);
    }

    #[test]
    fn a_head_load_and_its_rest() {
        let pkt: Vec<u8> = (0..300u16).map(|i| i as u8).collect();
        let mut b = PacketBuf::with_capacity(400);
        b.load(&[0xee; 400]);
        b.load_head(&pkt);
        assert_eq!(b.len(), 300);
        assert_eq!(&b.as_slice()[..LOAD_HEAD], &pkt[..LOAD_HEAD]);
        assert_eq!(b.as_slice()[LOAD_HEAD], 0xee, "the rest is not copied");
        b.push_front(8)[..8].fill(7);
        let r = Rest::of(&b, &pkt).unwrap();
        // Bytes 8.. of the buffer are the packet; the head reaches 8 + 128.
        assert_eq!(r.source(10..308, 136), Some(&pkt[2..]));
        assert_eq!(r.source(10..308, 137), None, "a header past the head");
        assert_eq!(r.source(7..308, 20), None, "before the packet");
        assert_eq!(r.source(10..309, 20), None, "past its end");
        r.fill(&mut b);
        assert_eq!(&b.as_slice()[8..], &pkt[..]);
        assert_eq!(&b.as_slice()[..8], &[7; 8]);
        assert!(Rest::of(&b, &[0; 309]).is_none());
        // A short packet is loaded whole.
        b.load_head(&pkt[..5]);
        assert_eq!(b.as_slice(), &pkt[..5]);
    }
}
