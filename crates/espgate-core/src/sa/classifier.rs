//! Which outer packets carry IPsec, and where their parts are: the
//! [`Classifier`] table, built once by the caller, and [`classify`].

use super::Protocol;
use crate::error::{DropReason, PResult};
use crate::wire::esp::{EspLayout, Rfc4303};
use crate::wire::ip::{self, IpInfo};
use crate::wire::qesp::Qesp;
use crate::wire::{ah, proto, udp};

/// Most UDP ports one [`Classifier`] recognises as ESP-in-UDP.
pub const MAX_UDP_PORTS: usize = 4;

/// Room for one IP protocol number per [`Protocol`] (ESP and AH today; an
/// ESP variant with its own number adds one).
const MAX_IP_PROTOCOLS: usize = 4;

/// What outer packets carry IPsec: IP protocol numbers mapped to the SA
/// protocol they carry (ESP 50, AH 51), and UDP ports that carry
/// ESP-in-UDP with RFC 3948's non-ESP marker (IKE) and NAT keepalives.
///
/// Built once, outside the packet path (`Classifier::new().udp_port(4500)`,
/// or [`Classifier::NAT_T`]), and passed by reference to [`classify`]
/// and [`crate::sad::Sad::decapsulate`]. A lookup is a scan of at most
/// [`MAX_UDP_PORTS`] ports and a handful of protocol numbers held inline:
/// no allocation, no hashing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Classifier {
    ip: [(u8, Protocol); MAX_IP_PROTOCOLS],
    ip_len: usize,
    udp: [u16; MAX_UDP_PORTS],
    udp_len: usize,
}

impl Default for Classifier {
    fn default() -> Self {
        Classifier::new()
    }
}

impl Classifier {
    /// Raw ESP and AH over IP (their IANA protocol numbers); no UDP port.
    pub const fn new() -> Classifier {
        let none = (0, Protocol::Esp);
        let mut ip = [none; MAX_IP_PROTOCOLS];
        ip[0] = (Protocol::Esp.number(), Protocol::Esp);
        ip[1] = (Protocol::Ah.number(), Protocol::Ah);
        Classifier {
            ip,
            ip_len: 2,
            udp: [0; MAX_UDP_PORTS],
            udp_len: 0,
        }
    }

    /// Adds raw Q-ESP on IP protocol `number` (`docs/QESP.md` §1; the
    /// caller has checked it with [`crate::wire::qesp::check_ip_protocol`]).
    /// A second call replaces the number.
    pub const fn qesp(mut self, number: u8) -> Classifier {
        let mut i = 0;
        while i < self.ip_len {
            if matches!(self.ip[i].1, Protocol::Qesp) {
                self.ip[i].0 = number;
                return self;
            }
            i += 1;
        }
        self.ip[self.ip_len] = (number, Protocol::Qesp);
        self.ip_len += 1;
        self
    }

    /// Raw ESP and AH, and ESP-in-UDP on the IANA NAT-T port 4500.
    pub const NAT_T: Classifier = Classifier::new().udp_port(udp::NAT_T_PORT);

    /// Adds `port`: UDP datagrams from or to it carry ESP-in-UDP, IKE
    /// behind the non-ESP marker, or NAT keepalives (RFC 3948). Adding a
    /// port twice adds it once.
    ///
    /// # Panics
    ///
    /// With more than [`MAX_UDP_PORTS`] distinct ports (a configuration
    /// error of the caller, never a packet's doing).
    pub const fn udp_port(mut self, port: u16) -> Classifier {
        let mut i = 0;
        while i < self.udp_len {
            if self.udp[i] == port {
                return self;
            }
            i += 1;
        }
        assert!(self.udp_len < MAX_UDP_PORTS, "too many ESP-in-UDP ports");
        self.udp[self.udp_len] = port;
        self.udp_len += 1;
        self
    }

    /// The SA protocol raw packets of IP protocol `number` carry.
    #[inline]
    pub fn ip_protocol(&self, number: u8) -> Option<Protocol> {
        self.ip[..self.ip_len]
            .iter()
            .find(|(n, _)| *n == number)
            .map(|(_, p)| *p)
    }

    /// True if a UDP datagram between these ports is on an ESP-in-UDP port.
    #[inline]
    pub fn esp_in_udp(&self, src_port: u16, dst_port: u16) -> bool {
        self.udp[..self.udp_len]
            .iter()
            .any(|p| *p == dst_port || *p == src_port)
    }
}

/// Where a classified inbound IPsec packet's parts are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inbound {
    /// The outer IP header.
    pub outer: IpInfo,
    /// ESP or AH.
    pub protocol: Protocol,
    /// SPI from the header.
    pub spi: u32,
    /// Offset of the ESP/AH header.
    pub offset: usize,
    /// Offset of the UDP header for ESP-in-UDP.
    pub udp_offset: Option<usize>,
    /// End of the ESP/AH data: the end of the UDP datagram for ESP-in-UDP,
    /// else the end of the IP packet.
    pub end: usize,
}

impl Inbound {
    /// The low 32 bits of the sequence number in the packet's ESP, Q-ESP
    /// or AH header (`None` when the packet is too short to hold it).
    pub fn wire_seq(&self, pkt: &[u8]) -> Option<u32> {
        let at = self.offset
            + match self.protocol {
                Protocol::Esp => 4,
                Protocol::Qesp => 12,
                Protocol::Ah => 8,
            };
        let b = pkt.get(at..at + 4)?;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// What an inbound packet is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Classified {
    /// ESP or AH to process.
    Ipsec(Inbound),
    /// IKE behind the non-ESP marker on an ESP-in-UDP port.
    Ike,
    /// RFC 3948 NAT keepalive.
    Keepalive,
}

/// Classifies an IP packet by `classifier`: raw IPsec by its IP protocol
/// number, or UDP from or to one of its ESP-in-UDP ports. Anything else
/// is [`DropReason::NotIpsec`].
pub fn classify(pkt: &[u8], classifier: &Classifier) -> PResult<Classified> {
    let outer = ip::parse(pkt)?;
    if outer.fragment {
        return Err(DropReason::Fragment);
    }
    let end = outer.packet_len;
    let l4 = pkt
        .get(outer.payload_offset..end)
        .ok_or(DropReason::BadLength)?;
    let (protocol, offset, udp_offset, end) = match classifier.ip_protocol(outer.protocol) {
        Some(p) => (p, outer.payload_offset, None, end),
        None if outer.protocol == proto::UDP => {
            let u = udp::Udp::new_checked(l4)?;
            if !classifier.esp_in_udp(u.src_port(), u.dst_port()) {
                return Err(DropReason::NotIpsec);
            }
            match udp::classify(u.payload())? {
                udp::EncapKind::Ike => return Ok(Classified::Ike),
                udp::EncapKind::Keepalive => return Ok(Classified::Keepalive),
                udp::EncapKind::Esp => {}
            }
            (
                Protocol::Esp,
                outer.payload_offset + udp::HEADER_LEN,
                Some(outer.payload_offset),
                outer.payload_offset + u.len(),
            )
        }
        None => return Err(DropReason::NotIpsec),
    };
    let hdr = pkt.get(offset..end).ok_or(DropReason::BadLength)?;
    let spi = match protocol {
        Protocol::Esp => Rfc4303::parse_header(hdr)?.0,
        Protocol::Qesp => Qesp::parse_header(hdr)?.0,
        Protocol::Ah => ah::Ah::new_checked(hdr)?.spi(),
    };
    Ok(Classified::Ipsec(Inbound {
        outer,
        protocol,
        spi,
        offset,
        udp_offset,
        end,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_lookups() {
        let c = Classifier::new();
        assert_eq!(c.ip_protocol(proto::ESP), Some(Protocol::Esp));
        assert_eq!(c.ip_protocol(proto::AH), Some(Protocol::Ah));
        for n in (0..=255u8).filter(|n| ![proto::ESP, proto::AH].contains(n)) {
            assert_eq!(c.ip_protocol(n), None, "{n}");
        }
        assert!(!c.esp_in_udp(4500, 4500));
        assert!(!c.esp_in_udp(0, 0));

        let c = Classifier::new()
            .udp_port(4500)
            .udp_port(4501)
            .udp_port(4500);
        assert_eq!(c.udp_len, 2);
        assert!(c.esp_in_udp(4500, 1) && c.esp_in_udp(1, 4500) && c.esp_in_udp(4501, 9));
        assert!(!c.esp_in_udp(500, 501));
        assert!(!c.esp_in_udp(0, 0), "unused port slots never match");
        assert_eq!(Classifier::NAT_T, Classifier::new().udp_port(4500));
        assert_eq!(Classifier::default(), Classifier::new());
    }

    #[test]
    fn qesp_has_the_number_its_gateway_gives_it() {
        let c = Classifier::new().qesp(253);
        assert_eq!(c.ip_protocol(253), Some(Protocol::Qesp));
        assert_eq!(c.ip_protocol(proto::ESP), Some(Protocol::Esp));
        let c = c.qesp(254);
        assert_eq!(c.ip_protocol(253), None);
        assert_eq!(c.ip_protocol(254), Some(Protocol::Qesp));
        assert_eq!(c.ip_len, 3);
        // The SPI is at offset 8 of a Q-ESP header, not 0.
        let mut pkt = vec![0u8; 20 + 16 + 32];
        pkt[0] = 0x45;
        let len = pkt.len() as u16;
        pkt[2..4].copy_from_slice(&len.to_be_bytes());
        pkt[8] = 64;
        pkt[9] = 254;
        pkt[20 + 8..20 + 12].copy_from_slice(&0x1234_5678u32.to_be_bytes());
        let Classified::Ipsec(inb) = classify(&pkt, &c).unwrap() else {
            panic!("not IPsec");
        };
        assert_eq!(
            (inb.protocol, inb.spi, inb.offset),
            (Protocol::Qesp, 0x1234_5678, 20)
        );
        assert_eq!(
            classify(&pkt, &Classifier::new()).unwrap_err(),
            DropReason::NotIpsec
        );
    }

    #[test]
    fn a_full_port_table_refuses_more() {
        let mut c = Classifier::new();
        for p in 0..MAX_UDP_PORTS as u16 {
            c = c.udp_port(1000 + p);
        }
        // A known port is still fine.
        let c = c.udp_port(1000);
        assert!(std::panic::catch_unwind(|| c.udp_port(2000)).is_err());
    }
}
