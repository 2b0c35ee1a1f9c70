//! IKEv2 messages built by Scapy (`tests/python/ike_vectors.py`, using
//! `scapy.contrib.ikev2`): each must parse, match the fields Scapy was told
//! to set, and re-emit to the exact same bytes.

use std::collections::BTreeMap;
use std::path::Path;

use espgate_ike::wire::{Delete, Message, Payload, TrafficSelector};

/// A minimal JSON reader: enough for the vector files (objects, strings
/// without escapes beyond `\"` and `\\`, integers).
#[derive(Debug)]
enum Json {
    Str(String),
    Int(i64),
    Obj(Vec<(String, Json)>),
}

struct Rd<'a> {
    b: &'a [u8],
    i: usize,
}

impl Rd<'_> {
    fn ws(&mut self) {
        while self.i < self.b.len() && self.b[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }
    fn eat(&mut self, c: u8) {
        self.ws();
        assert_eq!(self.b[self.i] as char, c as char, "at {}", self.i);
        self.i += 1;
    }
    fn string(&mut self) -> String {
        self.eat(b'"');
        let mut s = String::new();
        loop {
            let c = self.b[self.i];
            self.i += 1;
            match c {
                b'"' => return s,
                b'\\' => {
                    s.push(self.b[self.i] as char);
                    self.i += 1;
                }
                _ => s.push(c as char),
            }
        }
    }
    fn value(&mut self) -> Json {
        self.ws();
        match self.b[self.i] {
            b'"' => Json::Str(self.string()),
            b'{' => {
                self.i += 1;
                let mut v = Vec::new();
                self.ws();
                if self.b[self.i] == b'}' {
                    self.i += 1;
                    return Json::Obj(v);
                }
                loop {
                    let k = self.string();
                    self.eat(b':');
                    v.push((k, self.value()));
                    self.ws();
                    let c = self.b[self.i];
                    self.i += 1;
                    match c {
                        b',' => continue,
                        b'}' => return Json::Obj(v),
                        _ => panic!("bad JSON at {}", self.i),
                    }
                }
            }
            _ => {
                let start = self.i;
                while self.i < self.b.len()
                    && (self.b[self.i] == b'-' || self.b[self.i].is_ascii_digit())
                {
                    self.i += 1;
                }
                let s = std::str::from_utf8(&self.b[start..self.i]).unwrap();
                Json::Int(
                    s.parse()
                        .unwrap_or_else(|_| panic!("bad number at {start}")),
                )
            }
        }
    }
}

fn get<'a>(o: &'a Json, key: &str) -> &'a Json {
    match o {
        Json::Obj(v) => &v.iter().find(|(k, _)| k == key).expect(key).1,
        _ => panic!("not an object"),
    }
}

/// Flattens a parsed message to the keys the generator describes.
fn flatten(m: &Message, len: usize) -> BTreeMap<String, String> {
    let mut f = BTreeMap::new();
    let mut put = |k: String, v: String| {
        f.insert(k, v);
    };
    let h = &m.header;
    put("header.spi_i".into(), format!("{:016x}", h.spi_i));
    put("header.spi_r".into(), format!("{:016x}", h.spi_r));
    put(
        "header.exchange_type".into(),
        u8::from(h.exchange_type).to_string(),
    );
    put("header.initiator".into(), u8::from(h.initiator).to_string());
    put("header.response".into(), u8::from(h.response).to_string());
    put("header.message_id".into(), h.message_id.to_string());
    put("length".into(), len.to_string());
    put("payload_count".into(), m.payloads.len().to_string());
    if let Some(t) = m.unsupported_critical() {
        put("unsupported_critical".into(), t.to_string());
    }
    for (i, p) in m.payloads.iter().enumerate() {
        let k = |s: &str| format!("payload.{i}.{s}");
        put(k("type"), u8::from(p.payload_type()).to_string());
        let critical = matches!(p, Payload::Unknown { critical: true, .. });
        put(k("critical"), u8::from(critical).to_string());
        match p {
            Payload::Sa(props) => {
                put(k("proposal_count"), props.len().to_string());
                for (j, pr) in props.iter().enumerate() {
                    let b = k(&format!("proposal.{j}"));
                    put(format!("{b}.number"), pr.number.to_string());
                    put(format!("{b}.protocol"), pr.protocol.to_string());
                    put(format!("{b}.spi"), hex::encode(&pr.spi));
                    put(
                        format!("{b}.transform_count"),
                        pr.transforms.len().to_string(),
                    );
                    for (t, tr) in pr.transforms.iter().enumerate() {
                        put(
                            format!("{b}.transform.{t}.type"),
                            tr.transform_type.to_string(),
                        );
                        put(format!("{b}.transform.{t}.id"), tr.id.to_string());
                        if let Some(kl) = tr.key_length() {
                            put(format!("{b}.transform.{t}.key_length"), kl.to_string());
                        }
                    }
                }
            }
            Payload::Ke { group, data } => {
                put(k("group"), group.to_string());
                put(k("data"), hex::encode(data));
            }
            Payload::IdI(id) | Payload::IdR(id) => {
                put(k("id_type"), id.id_type.to_string());
                put(k("data"), hex::encode(&id.data));
            }
            Payload::Cert { encoding, data } | Payload::CertReq { encoding, data } => {
                put(k("encoding"), encoding.to_string());
                put(k("data"), hex::encode(data));
            }
            Payload::Auth { method, data } => {
                put(k("method"), method.to_string());
                put(k("data"), hex::encode(data));
            }
            Payload::Nonce(d) | Payload::VendorId(d) => put(k("data"), hex::encode(d)),
            Payload::Notify(n) => {
                put(k("protocol"), n.protocol.to_string());
                put(k("spi"), hex::encode(&n.spi));
                put(k("notify_type"), u16::from(n.notify_type).to_string());
                put(k("data"), hex::encode(&n.data));
            }
            Payload::Delete(Delete::Ike) => {
                put(k("protocol"), "1".into());
                put(k("spi_count"), "0".into());
            }
            Payload::Delete(Delete::Child { protocol, spis }) => {
                put(k("protocol"), protocol.to_string());
                put(k("spi_count"), spis.len().to_string());
                for (j, s) in spis.iter().enumerate() {
                    put(k(&format!("spi.{j}")), format!("{s:08x}"));
                }
            }
            Payload::TsI(ts) | Payload::TsR(ts) => {
                put(k("ts_count"), ts.len().to_string());
                for (j, t) in ts.iter().enumerate() {
                    let b = k(&format!("ts.{j}"));
                    let (tt, proto, sp, ep, a, z) = match t {
                        TrafficSelector::Ipv4 {
                            ip_protocol,
                            start_port,
                            end_port,
                            start,
                            end,
                        } => (
                            7,
                            *ip_protocol,
                            *start_port,
                            *end_port,
                            start.to_string(),
                            end.to_string(),
                        ),
                        TrafficSelector::Ipv6 {
                            ip_protocol,
                            start_port,
                            end_port,
                            start,
                            end,
                        } => (
                            8,
                            *ip_protocol,
                            *start_port,
                            *end_port,
                            start.to_string(),
                            end.to_string(),
                        ),
                        TrafficSelector::Other {
                            ts_type,
                            ip_protocol,
                            body,
                        } => (
                            *ts_type,
                            *ip_protocol,
                            0,
                            0,
                            hex::encode(body),
                            String::new(),
                        ),
                    };
                    put(format!("{b}.type"), tt.to_string());
                    put(format!("{b}.ip_protocol"), proto.to_string());
                    put(format!("{b}.start_port"), sp.to_string());
                    put(format!("{b}.end_port"), ep.to_string());
                    put(format!("{b}.start"), a);
                    put(format!("{b}.end"), z);
                }
            }
            Payload::Sk {
                first_payload,
                data,
            } => {
                put(k("first_payload"), u8::from(*first_payload).to_string());
                put(k("data"), hex::encode(data));
            }
            Payload::Skf {
                first_payload,
                number,
                total,
                data,
            } => {
                put(k("first_payload"), u8::from(*first_payload).to_string());
                put(k("number"), number.to_string());
                put(k("total"), total.to_string());
                put(k("data"), hex::encode(data));
            }
            Payload::Unknown { body, .. } => put(k("body"), hex::encode(body)),
        }
    }
    f
}

#[test]
fn scapy_vectors_parse_match_and_reemit() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/ike");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 7, "vectors missing in {}", dir.display());
    let mut checked = 0;
    for path in &files {
        let text = std::fs::read(path).unwrap();
        let doc = Rd { b: &text, i: 0 }.value();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let Json::Str(hx) = get(&doc, "hex") else {
            panic!("{name}: hex")
        };
        let bytes = hex::decode(hx).unwrap();
        let m = Message::parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            m.emit().unwrap(),
            bytes,
            "{name}: emit(parse(x)) differs from x"
        );
        let flat = flatten(&m, bytes.len());
        let Json::Obj(fields) = get(&doc, "fields") else {
            panic!("{name}: fields")
        };
        assert!(fields.len() >= 8, "{name}: too few fields described");
        for (k, v) in fields {
            let want = match v {
                Json::Str(s) => s.clone(),
                Json::Int(n) => n.to_string(),
                Json::Obj(_) => panic!("{name}: nested field {k}"),
            };
            assert_eq!(
                flat.get(k),
                Some(&want),
                "{name}: field {k} (parsed: {:?})",
                flat.get(k)
            );
            checked += 1;
        }
    }
    assert!(checked > 100, "only {checked} fields checked");
    eprintln!("{} vectors, {checked} fields checked", files.len());
}

#[test]
fn scapy_unknown_critical_vector_is_reported() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/ike");
    let text = std::fs::read(dir.join("unknown_critical.json")).unwrap();
    let doc = Rd { b: &text, i: 0 }.value();
    let Json::Str(hx) = get(&doc, "hex") else {
        panic!("hex")
    };
    let m = Message::parse(&hex::decode(hx).unwrap()).unwrap();
    assert_eq!(m.unsupported_critical().map(u8::from), Some(200));
}
