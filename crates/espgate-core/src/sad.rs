//! The Security Association Database (RFC 4301 §4.4.2): SAs in a slab,
//! found by (protocol, SPI) in O(1).

use crate::buf::{PacketBuf, Rest};
use crate::cost::{NoProbe, Probe, Stage};
use crate::error::{DropReason, PResult};
use crate::sa::{classify, Classified, Classifier, Decapsulated, Mode, Protocol, Sa};
use rustc_hash::FxHashMap;
use std::time::Duration;

/// Handle to an SA in the SAD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SaId(pub u32);

/// Most IPsec layers one packet may carry (e.g. AH over ESP over ESP).
pub const MAX_LAYERS: usize = 3;

/// The outcome of inbound processing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InboundResult {
    /// The buffer holds the decapsulated packet; SAs applied outermost first.
    Packet(Vec<SaId>),
    /// A dummy packet was discarded by this SA.
    Dummy(SaId),
    /// IKE behind the non-ESP marker on an ESP-in-UDP port: hand it to the
    /// key manager.
    Ike,
    /// NAT keepalive: nothing to do.
    Keepalive,
}

/// The outcome of [`Sad::decapsulate_into`]: [`InboundResult`] with the
/// applied SAs left in the caller's vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InboundOutcome {
    /// The buffer holds the decapsulated packet.
    Packet,
    /// A dummy packet was discarded by this SA.
    Dummy(SaId),
    /// IKE behind the non-ESP marker on an ESP-in-UDP port.
    Ike,
    /// NAT keepalive.
    Keepalive,
    /// A cluster node (seed 003) advanced this SA's state for the packet
    /// and dropped it: another node processes it.
    Observed(SaId),
}

/// A cluster node's word on an inbound packet, asked before its SA
/// processes it ([`Sad::decapsulate_gated`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InGate {
    /// Process it.
    Process,
    /// Another node processes it: replay check, ICV and window update only.
    Observe,
    /// Nobody may process it: observe, then count it as this drop.
    ObserveDrop(DropReason),
}

/// An inbound failure, with the SA it happened on if one was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InboundError {
    /// Why.
    pub reason: DropReason,
    /// SA, when the SPI was known.
    pub sa: Option<SaId>,
    /// SPI seen, when the header could be parsed.
    pub spi: Option<u32>,
}

/// True when the packet does not parse as IP, or its next protocol is raw
/// IPsec by `classifier`: a failure to classify it then drops it.
fn ipsec_or_malformed(pkt: &[u8], classifier: &Classifier) -> bool {
    match crate::wire::ip::parse(pkt) {
        Ok(i) => classifier.ip_protocol(i.protocol).is_some(),
        Err(_) => true,
    }
}

/// SAs by id and by (protocol, SPI).
#[derive(Debug, Default)]
pub struct Sad {
    slots: Vec<Option<Sa>>,
    by_spi: FxHashMap<(Protocol, u32), SaId>,
    free: Vec<u32>,
}

impl Sad {
    /// An empty SAD.
    pub fn new() -> Sad {
        Sad::default()
    }

    /// Installs an SA. An SA with the same protocol and SPI is an error.
    pub fn insert(&mut self, sa: Sa) -> Result<SaId, String> {
        let key = (sa.config().protocol, sa.config().spi);
        if self.by_spi.contains_key(&key) {
            return Err(format!(
                "an {} SA with SPI {:#010x} is already installed",
                key.0.name(),
                key.1
            ));
        }
        let id = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = Some(sa);
                SaId(i)
            }
            None => {
                self.slots.push(Some(sa));
                SaId((self.slots.len() - 1) as u32)
            }
        };
        self.by_spi.insert(key, id);
        Ok(id)
    }

    /// Removes an SA.
    pub fn remove(&mut self, id: SaId) -> Option<Sa> {
        let sa = self.slots.get_mut(id.0 as usize)?.take()?;
        self.by_spi.remove(&(sa.config().protocol, sa.config().spi));
        self.free.push(id.0);
        Some(sa)
    }

    /// Finds an SA by protocol and SPI.
    pub fn lookup(&self, protocol: Protocol, spi: u32) -> Option<SaId> {
        self.by_spi.get(&(protocol, spi)).copied()
    }

    /// The SA with this id.
    pub fn get(&self, id: SaId) -> Option<&Sa> {
        self.slots.get(id.0 as usize)?.as_ref()
    }

    /// The SA with this id, mutable.
    pub fn get_mut(&mut self, id: SaId) -> Option<&mut Sa> {
        self.slots.get_mut(id.0 as usize)?.as_mut()
    }

    /// All installed SAs.
    pub fn iter(&self) -> impl Iterator<Item = (SaId, &Sa)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|s| (SaId(i as u32), s)))
    }

    /// Number of SAs.
    pub fn len(&self) -> usize {
        self.by_spi.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.by_spi.is_empty()
    }

    /// Removes every IPsec layer whose SA is installed, outermost first,
    /// each found by `classifier` (see [`classify`]). After a
    /// transport-mode layer, a following ESP/AH header is processed too
    /// (ESP inside AH); a tunnel-mode layer ends processing.
    pub fn decapsulate(
        &mut self,
        buf: &mut PacketBuf,
        classifier: &Classifier,
        now: Duration,
    ) -> Result<InboundResult, InboundError> {
        let mut applied = Vec::new();
        Ok(
            match self.decapsulate_into(buf, classifier, now, &mut applied)? {
                InboundOutcome::Packet => InboundResult::Packet(applied),
                InboundOutcome::Dummy(id) => InboundResult::Dummy(id),
                InboundOutcome::Ike => InboundResult::Ike,
                InboundOutcome::Keepalive => InboundResult::Keepalive,
                // Only a gate (a cluster node) makes an SA observe; there
                // is none here. Said as what it would be: nothing to pass on.
                InboundOutcome::Observed(id) => InboundResult::Dummy(id),
            },
        )
    }

    /// [`Sad::decapsulate`] without allocating: the SAs applied (outermost
    /// first) are left in `applied`, which is cleared first and whose
    /// capacity is reused from packet to packet.
    pub fn decapsulate_into(
        &mut self,
        buf: &mut PacketBuf,
        classifier: &Classifier,
        now: Duration,
        applied: &mut Vec<SaId>,
    ) -> Result<InboundOutcome, InboundError> {
        self.decapsulate_into_probed(buf, classifier, now, applied, &mut NoProbe)
    }

    /// [`Sad::decapsulate_into`], marking its stages on `probe` (see
    /// [`crate::cost`]): per layer `Lookup` (classification and SAD
    /// lookup), then the SA's own (`Replay`, `Integrity`, `Cipher`,
    /// `Replay`, `Decap`).
    pub fn decapsulate_into_probed<P: Probe + ?Sized>(
        &mut self,
        buf: &mut PacketBuf,
        classifier: &Classifier,
        now: Duration,
        applied: &mut Vec<SaId>,
        probe: &mut P,
    ) -> Result<InboundOutcome, InboundError> {
        self.decapsulate_gated(buf, classifier, now, applied, probe, &mut |_, _, _| {
            InGate::Process
        })
    }

    /// [`Sad::decapsulate_into_probed`] on a cluster node: `gate` is asked,
    /// for the outermost layer, with the SA, the low 32 bits of the
    /// sequence number on the wire and the packet's length, whether this
    /// node processes the packet.
    pub fn decapsulate_gated<P: Probe + ?Sized>(
        &mut self,
        buf: &mut PacketBuf,
        classifier: &Classifier,
        now: Duration,
        applied: &mut Vec<SaId>,
        probe: &mut P,
        gate: &mut dyn FnMut(SaId, u32, usize) -> InGate,
    ) -> Result<InboundOutcome, InboundError> {
        self.decapsulate_layers(buf, None, classifier, now, applied, probe, gate)
    }

    /// [`Sad::decapsulate_into_probed`] of a buffer loaded with
    /// [`PacketBuf::load_head`]: `src` is the packet's tail as received
    /// (the buffer's last `src.len()` bytes, of which only the head was
    /// copied). The outermost ESP layer is decrypted straight from `src`;
    /// where the whole packet is needed first (AH) it is copied in. The
    /// same outcome, SAs and bytes as loading it whole. `BadLength` if the
    /// buffer is shorter than `src`.
    pub fn decapsulate_from_probed<P: Probe + ?Sized>(
        &mut self,
        buf: &mut PacketBuf,
        src: &[u8],
        classifier: &Classifier,
        now: Duration,
        applied: &mut Vec<SaId>,
        probe: &mut P,
    ) -> Result<InboundOutcome, InboundError> {
        let Some(rest) = Rest::of(buf, src) else {
            applied.clear();
            return Err(InboundError {
                reason: DropReason::BadLength,
                sa: None,
                spi: None,
            });
        };
        self.decapsulate_layers(
            buf,
            Some(rest),
            classifier,
            now,
            applied,
            probe,
            &mut |_, _, _| InGate::Process,
        )
    }

    /// The layers of one inbound packet, outermost first; `rest` (see
    /// [`Sad::decapsulate_from_probed`]) is the outermost layer's.
    #[allow(clippy::too_many_arguments)]
    fn decapsulate_layers<P: Probe + ?Sized>(
        &mut self,
        buf: &mut PacketBuf,
        mut rest: Option<Rest<'_>>,
        classifier: &Classifier,
        now: Duration,
        applied: &mut Vec<SaId>,
        probe: &mut P,
        gate: &mut dyn FnMut(SaId, u32, usize) -> InGate,
    ) -> Result<InboundOutcome, InboundError> {
        applied.clear();
        for layer in 0..MAX_LAYERS {
            let c = classify(buf.as_slice(), classifier);
            let inb = match c {
                Ok(Classified::Ipsec(inb)) => inb,
                Ok(Classified::Ike) if layer == 0 => return Ok(InboundOutcome::Ike),
                Ok(Classified::Keepalive) if layer == 0 => return Ok(InboundOutcome::Keepalive),
                Err(reason) if layer == 0 || ipsec_or_malformed(buf.as_slice(), classifier) => {
                    return Err(InboundError {
                        reason,
                        sa: applied.last().copied(),
                        spi: None,
                    })
                }
                // Below a transport-mode layer, a well-formed packet that is
                // not another IPsec layer (raw ESP/AH, or ESP on an
                // ESP-in-UDP port) is the payload.
                _ => break,
            };
            let err = |reason, sa| InboundError {
                reason,
                sa,
                spi: Some(inb.spi),
            };
            let id = self.lookup(inb.protocol, inb.spi);
            probe.mark(Stage::Lookup);
            let id = id.ok_or_else(|| err(DropReason::UnknownSpi, None))?;
            let sa = self
                .get_mut(id)
                .ok_or_else(|| err(DropReason::UnknownSpi, None))?;
            let mode = sa.config().mode;
            if layer == 0 {
                let seq = inb.wire_seq(buf.as_slice()).unwrap_or(0);
                let g = gate(id, seq, buf.len());
                if g != InGate::Process {
                    if let Some(r) = rest.take() {
                        r.fill(buf);
                    }
                }
                match g {
                    InGate::Process => {}
                    InGate::Observe => {
                        sa.observe_inbound(buf, &inb, now)
                            .map_err(|d| err(d, Some(id)))?;
                        return Ok(InboundOutcome::Observed(id));
                    }
                    InGate::ObserveDrop(reason) => {
                        sa.observe_inbound(buf, &inb, now)
                            .map_err(|d| err(d, Some(id)))?;
                        return Err(err(reason, Some(id)));
                    }
                }
            }
            match sa
                .decapsulate_rest(buf, &inb, rest.take().as_ref(), now, probe)
                .map_err(|d| err(d, Some(id)))?
            {
                Decapsulated::Dummy => return Ok(InboundOutcome::Dummy(id)),
                Decapsulated::Packet => applied.push(id),
            }
            if mode == Mode::Tunnel {
                break;
            }
        }
        Ok(InboundOutcome::Packet)
    }

    /// Applies a bundle outbound: `ids[0]` first (innermost), e.g. ESP then AH.
    pub fn encapsulate(&mut self, ids: &[SaId], buf: &mut PacketBuf, now: Duration) -> PResult<()> {
        self.encapsulate_probed(ids, buf, now, &mut NoProbe)
    }

    /// [`Sad::encapsulate`], marking each SA's stages on `probe` (see
    /// [`crate::cost`]; the policy lookup that chose `ids` is the caller's).
    pub fn encapsulate_probed<P: Probe + ?Sized>(
        &mut self,
        ids: &[SaId],
        buf: &mut PacketBuf,
        now: Duration,
        probe: &mut P,
    ) -> PResult<()> {
        for id in ids {
            self.get_mut(*id)
                .ok_or(DropReason::UnknownSpi)?
                .encapsulate_probed(buf, now, probe)?;
        }
        Ok(())
    }
}
