//! The IKE part of the status document (`espgate status`, `status
//! --ike-costs`): IKE SAs with their child SAs, engine counters and the
//! per-operation costs, and their text rendering.

use crate::table::{Column, Table};
use serde::{Deserialize, Serialize};

/// The IKE part of `espgate status`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct IkeDoc {
    /// IKE SAs with their child SAs.
    pub sas: Vec<IkeSaStatus>,
    /// Engine counters: messages, exchanges, drops by reason.
    pub counters: std::collections::BTreeMap<String, u64>,
    /// Per-operation costs over every IKE SA since start (or `costs reset`).
    pub costs: Vec<IkeOpCost>,
}

/// One IKE SA in `espgate status`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct IkeSaStatus {
    /// Connection name.
    pub connection: String,
    /// `spi_i_spi_r` as hex.
    pub spis: String,
    /// connecting / established / deleting.
    pub state: String,
    /// We initiated it.
    pub initiator: bool,
    /// Our IKE endpoint.
    pub local: String,
    /// The peer's IKE endpoint.
    pub remote: String,
    /// The peer's authenticated identity.
    pub peer_id: Option<String>,
    /// Negotiated IKE algorithms.
    pub algorithms: Option<String>,
    /// Seconds since it was established.
    pub established_secs: Option<u64>,
    /// Seconds until it is rekeyed.
    pub rekey_in_secs: Option<u64>,
    /// NAT-T in use.
    pub nat: bool,
    /// MOBIKE (RFC 4555) negotiated: the peer may move the SA.
    #[serde(default)]
    pub mobike: bool,
    /// Child SAs.
    pub children: Vec<ChildSaStatus>,
    /// Per-operation cost of this IKE SA (count, microseconds).
    pub costs: Vec<IkeOpCost>,
}

/// One child SA in `espgate status`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ChildSaStatus {
    /// Our inbound SPI.
    pub spi_in: String,
    /// Our outbound SPI.
    pub spi_out: String,
    /// `esp`, or `qesp` for a Q-ESP child SA (`docs/QESP.md` §7).
    #[serde(default = "esp")]
    pub protocol: String,
    /// installed / rekeying / rekeyed / deleting.
    pub state: String,
    /// ESP algorithms.
    pub algorithms: String,
    /// Seconds until rekey.
    pub rekey_in_secs: Option<u64>,
    /// Seconds until hard expiry.
    pub expire_in_secs: Option<u64>,
    /// Our selectors.
    pub local_ts: Vec<String>,
    /// The peer's selectors.
    pub remote_ts: Vec<String>,
    /// Its per-CPU slot (RFC 9611, `per_cpu_sas`): worker `w` sends on the
    /// `w % n`-th slot present. 0 with one child per connection.
    #[serde(default)]
    pub slot: u32,
}

/// The protocol of a child SA in a document written before Q-ESP.
fn esp() -> String {
    "esp".into()
}

/// Count and cumulative time of one IKE operation.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct IkeOpCost {
    /// Operation (dh, auth_create, auth_verify, key_derivation, encrypt, decrypt, encode, decode).
    pub op: String,
    /// Times done.
    pub count: u64,
    /// Total microseconds.
    pub micros: f64,
}

/// The text of `espgate status --ike-costs`: operations over every IKE SA
/// since start, then per IKE SA.
pub fn render_costs(d: &IkeDoc) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let table = |out: &mut String, rows: &[IkeOpCost]| {
        let total: f64 = rows.iter().map(|r| r.micros).sum();
        let mut t = Table::new([
            Column::left("operation").min_width(16),
            Column::right("count").min_width(8),
            Column::right("total us").min_width(12),
            Column::right("us each").min_width(10),
            Column::right("share").min_width(6),
        ])
        .indent(2)
        .gap(1);
        for r in rows {
            let each = if r.count == 0 {
                0.0
            } else {
                r.micros / r.count as f64
            };
            let share = if total > 0.0 {
                100.0 * r.micros / total
            } else {
                0.0
            };
            t.row([
                r.op.clone(),
                r.count.to_string(),
                format!("{:.1}", r.micros),
                format!("{each:.1}"),
                format!("{share:.1}%"),
            ]);
        }
        out.push_str(&t.render());
    };
    let _ = writeln!(
        out,
        "IKE operations since start (all IKE SAs, including failed ones):"
    );
    table(&mut out, &d.costs);
    for sa in &d.sas {
        let _ = writeln!(out, "\n{} {} ({}):", sa.connection, sa.spis, sa.state);
        table(&mut out, &sa.costs);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(op: &str, count: u64, micros: f64) -> IkeOpCost {
        IkeOpCost {
            op: op.into(),
            count,
            micros,
        }
    }

    #[test]
    fn costs_text_is_pinned() {
        let sa = IkeSaStatus {
            connection: "site-b".into(),
            spis: "0123456789abcdef_fedcba9876543210".into(),
            state: "established".into(),
            initiator: true,
            local: "192.0.2.1:500".into(),
            remote: "192.0.2.2:500".into(),
            peer_id: None,
            algorithms: None,
            established_secs: Some(5),
            rekey_in_secs: None,
            nat: false,
            mobike: false,
            children: Vec::new(),
            costs: vec![op("dh", 2, 250.5), op("auth_verify", 1, 1234.25)],
        };
        let d = IkeDoc {
            sas: vec![sa],
            counters: Default::default(),
            costs: vec![
                op("dh", 4, 501.0),
                op("key_derivation", 4, 80.125),
                op("decode", 0, 0.0),
            ],
        };
        let want = "\
IKE operations since start (all IKE SAs, including failed ones):
  operation           count     total us    us each  share
  dh                      4        501.0      125.2  86.2%
  key_derivation          4         80.1       20.0  13.8%
  decode                  0          0.0        0.0   0.0%

site-b 0123456789abcdef_fedcba9876543210 (established):
  operation           count     total us    us each  share
  dh                      2        250.5      125.2  16.9%
  auth_verify             1       1234.2     1234.2  83.1%
";
        let text = render_costs(&d);
        assert_eq!(text, want, "\n{text}");
        // Without any time, shares are 0.
        let none = render_costs(&IkeDoc {
            costs: vec![op("dh", 0, 0.0)],
            ..Default::default()
        });
        assert!(
            none.ends_with("  dh                      0          0.0        0.0   0.0%\n"),
            "{none}"
        );
    }
}
