//! A packet buffer with headroom and tailroom, so headers are prepended and
//! trailers appended in place (like an skb). Reused across packets, it makes
//! the hot path allocation-free once sized.

/// Default space kept in front of a loaded packet: outer IPv6 (40) + UDP (8)
/// + ESP header and IV (24) + AH (up to 48), rounded up.
pub const DEFAULT_HEADROOM: usize = 160;
/// Default space after a loaded packet: padding, trailer, ICV, TFC padding.
pub const DEFAULT_TAILROOM: usize = 320;

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
        let need = DEFAULT_HEADROOM + pkt.len() + DEFAULT_TAILROOM;
        if self.data.len() < need {
            self.data.resize(need, 0);
        }
        self.start = DEFAULT_HEADROOM;
        self.end = DEFAULT_HEADROOM + pkt.len();
        self.data[self.start..self.end].copy_from_slice(pkt);
    }

    /// Makes room for `n` bytes of payload after the headroom and returns them
    /// (for receiving directly into the buffer).
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
}
